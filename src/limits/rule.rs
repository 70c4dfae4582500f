//! What is limited, and per what: the rules, their names and flags.

/// What is limited, and per what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    PurchaseByUser,
    PurchaseByIp,
    /// Pay and cancel.
    OrderByUser,
    OrderByIp,
    CodeByIp,
    /// Code requests of every client together.
    CodeByAll,
    LoginByIp,
    LoginByAll,
    /// Wrong login codes per phone: every login attempt is counted before
    /// its code is checked, and a right code's count given back.
    WrongCodesByPhone,
}

impl Rule {
    pub const ALL: [Rule; 9] = [
        Rule::PurchaseByUser,
        Rule::PurchaseByIp,
        Rule::OrderByUser,
        Rule::OrderByIp,
        Rule::CodeByIp,
        Rule::CodeByAll,
        Rule::LoginByIp,
        Rule::LoginByAll,
        Rule::WrongCodesByPhone,
    ];

    /// The rule's name: in its Redis keys, its `RateLimit` policy and the
    /// `rule` label of `hmdp_rate_limited_total`.
    pub fn name(self) -> &'static str {
        match self {
            Rule::PurchaseByUser => "purchase-user",
            Rule::PurchaseByIp => "purchase-ip",
            Rule::OrderByUser => "order-user",
            Rule::OrderByIp => "order-ip",
            Rule::CodeByIp => "code-ip",
            Rule::CodeByAll => "code-all",
            Rule::LoginByIp => "login-ip",
            Rule::LoginByAll => "login-all",
            Rule::WrongCodesByPhone => "wrong-codes-phone",
        }
    }

    /// The `hmdp serve` flag that sets the rule's quota
    /// ([`LimitSettings`](super::LimitSettings)).
    pub fn flag(self) -> &'static str {
        match self {
            Rule::PurchaseByUser => "--limit-purchase-user",
            Rule::PurchaseByIp => "--limit-purchase-ip",
            Rule::OrderByUser => "--limit-order-user",
            Rule::OrderByIp => "--limit-order-ip",
            Rule::CodeByIp => "--limit-code-ip",
            Rule::CodeByAll => "--limit-code-all",
            Rule::LoginByIp => "--limit-login-ip",
            Rule::LoginByAll => "--limit-login-all",
            Rule::WrongCodesByPhone => "--limit-wrong-codes",
        }
    }

    /// The `hmdp serve` flags that turn the limits on with only `quotas`
    /// (`(Rule::PurchaseByUser, "2/1m")`) enforced, every other rule off:
    /// for a node that must limit one thing and nothing else.
    pub fn flags_enforcing_only(quotas: &[(Rule, &str)]) -> Vec<String> {
        let each = Rule::ALL.iter().map(|rule| {
            let quota = quotas.iter().find(|(named, _)| named == rule);
            format!(
                "{}={}",
                rule.flag(),
                quota.map_or("off", |(_, quota)| quota)
            )
        });
        std::iter::once("--limits=on".to_owned())
            .chain(each)
            .collect()
    }
}

/// The subject of a rule counted for every client together.
pub const EVERYONE: &str = "all";
