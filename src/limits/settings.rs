//! The limits' settings: one quota per rule, each a flag and an environment
//! variable, `off` turning that rule off.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::rule::Rule;

/// At most `count` requests per `window`, and at most all of them at once:
/// a subject that kept quiet for a whole window may spend its whole quota
/// in one burst, then one request per `window / count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    count: u32,
    window: Duration,
}

impl Quota {
    /// `count` requests per `window`; `None` if either is zero.
    pub fn new(count: u32, window: Duration) -> Option<Quota> {
        (count > 0 && !window.is_zero()).then_some(Quota { count, window })
    }

    pub fn count(self) -> u32 {
        self.count
    }

    pub fn window(self) -> Duration {
        self.window
    }

    /// One request's share of the window: the pace a subject that spent
    /// its quota may go on at.
    pub fn interval(self) -> Duration {
        self.window / self.count
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.count,
            humantime::format_duration(self.window)
        )
    }
}

/// A rule's setting: a quota, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSetting(pub Option<Quota>);

impl FromStr for QuotaSetting {
    type Err = String;

    /// `COUNT/WINDOW` (`5/10s`, `20/1s`, `10/1h`, `100/500ms`), or `off`.
    fn from_str(raw: &str) -> Result<QuotaSetting, String> {
        if raw.trim().eq_ignore_ascii_case("off") {
            return Ok(QuotaSetting(None));
        }
        let (count, window) = raw
            .split_once('/')
            .ok_or_else(|| format!("`{raw}` is not COUNT/WINDOW (such as 5/10s) or off"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("`{count}` is not a whole number of requests"))?;
        let window = humantime::parse_duration(window.trim())
            .map_err(|error| format!("`{window}` is not a window such as 10s or 1h: {error}"))?;
        if window > Duration::from_secs(24 * 60 * 60) {
            return Err(format!("a window of `{raw}` is longer than a day"));
        }
        let quota = Quota::new(count, window)
            .ok_or_else(|| format!("`{raw}` allows nothing: write off to turn the limit off"))?;
        if quota.interval() < Duration::from_micros(1) {
            return Err(format!(
                "`{raw}` allows more than one request per microsecond"
            ));
        }
        Ok(QuotaSetting(Some(quota)))
    }
}

impl fmt::Display for QuotaSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(quota) => quota.fmt(f),
            None => f.write_str("off"),
        }
    }
}

/// Whether the limits are enforced at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Enforced {
    On,
    Off,
}

impl fmt::Display for Enforced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Enforced::On => "on",
            Enforced::Off => "off",
        })
    }
}

/// How often each client may call the endpoints a crowd or a guesser
/// hammers, counted in Redis so that every node enforces one limit
/// (docs/limits.md). A quota is `COUNT/WINDOW`: up to COUNT at once, then
/// one per WINDOW/COUNT; `off` turns the rule off. Requests over a limit are
/// answered 429 RATE_LIMITED with `Retry-After`.
#[derive(Debug, Clone, Args)]
pub struct LimitSettings {
    /// `off` turns every limit below off (the labs and the demo show what
    /// the locks do with nothing in front of them).
    #[arg(long = "limits", env = "HMDP_LIMITS", value_enum, default_value_t = Enforced::On)]
    pub enforced: Enforced,

    /// Purchases (`POST /voucher-order/seckill/{id}`) per user.
    #[arg(long, env = "HMDP_LIMIT_PURCHASE_USER", default_value = "5/10s")]
    pub limit_purchase_user: QuotaSetting,

    /// Purchases per client IP.
    #[arg(long, env = "HMDP_LIMIT_PURCHASE_IP", default_value = "10/1s")]
    pub limit_purchase_ip: QuotaSetting,

    /// Order actions (pay, cancel) per user.
    #[arg(long, env = "HMDP_LIMIT_ORDER_USER", default_value = "10/10s")]
    pub limit_order_user: QuotaSetting,

    /// Order actions per client IP.
    #[arg(long, env = "HMDP_LIMIT_ORDER_IP", default_value = "50/1s")]
    pub limit_order_ip: QuotaSetting,

    /// Login code requests (`POST /user/code`) per client IP.
    #[arg(long, env = "HMDP_LIMIT_CODE_IP", default_value = "5/1m")]
    pub limit_code_ip: QuotaSetting,

    /// Login code requests of every client together (each is an SMS).
    #[arg(long, env = "HMDP_LIMIT_CODE_ALL", default_value = "200/1s")]
    pub limit_code_all: QuotaSetting,

    /// Login attempts (`POST /user/login`) per client IP.
    #[arg(long, env = "HMDP_LIMIT_LOGIN_IP", default_value = "10/1m")]
    pub limit_login_ip: QuotaSetting,

    /// Login attempts of every client together.
    #[arg(long, env = "HMDP_LIMIT_LOGIN_ALL", default_value = "500/1s")]
    pub limit_login_all: QuotaSetting,

    /// Wrong login codes per phone: past them the phone's logins are refused
    /// until its allowance grows back (10/1h: at most 250 guesses a day).
    #[arg(long, env = "HMDP_LIMIT_WRONG_CODES", default_value = "10/1h")]
    pub limit_wrong_codes: QuotaSetting,
}

impl LimitSettings {
    /// The rule's quota; `None` when it is off.
    pub fn quota(&self, rule: Rule) -> Option<Quota> {
        if self.enforced == Enforced::Off {
            return None;
        }
        let setting = match rule {
            Rule::PurchaseByUser => self.limit_purchase_user,
            Rule::PurchaseByIp => self.limit_purchase_ip,
            Rule::OrderByUser => self.limit_order_user,
            Rule::OrderByIp => self.limit_order_ip,
            Rule::CodeByIp => self.limit_code_ip,
            Rule::CodeByAll => self.limit_code_all,
            Rule::LoginByIp => self.limit_login_ip,
            Rule::LoginByAll => self.limit_login_all,
            Rule::WrongCodesByPhone => self.limit_wrong_codes,
        };
        setting.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Result<Option<Quota>, String> {
        raw.parse::<QuotaSetting>().map(|setting| setting.0)
    }

    #[test]
    fn a_quota_is_count_over_window_or_off() {
        let quota = parsed("5/10s").unwrap().unwrap();
        assert_eq!(
            (quota.count(), quota.window()),
            (5, Duration::from_secs(10))
        );
        assert_eq!(quota.interval(), Duration::from_secs(2));
        assert_eq!(
            parsed("10/1h").unwrap().unwrap().window(),
            Duration::from_secs(3600)
        );
        assert_eq!(parsed(" OFF ").unwrap(), None);
        assert_eq!(parsed("5/10s").unwrap().unwrap().to_string(), "5/10s");
    }

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        limits: LimitSettings,
    }

    #[test]
    fn each_rule_is_set_by_its_own_flag() {
        use clap::Parser;
        for rule in Rule::ALL {
            let flags = Rule::flags_enforcing_only(&[(rule, "3/1m")]);
            let args = std::iter::once("hmdp".to_owned()).chain(flags);
            let limits = Flags::try_parse_from(args).expect("flags parse").limits;
            for other in Rule::ALL {
                let quota = limits.quota(other).map(Quota::count);
                assert_eq!(quota, (other == rule).then_some(3), "{}", rule.flag());
            }
        }
    }

    #[test]
    fn a_quota_that_allows_nothing_or_cannot_be_read_is_refused() {
        for raw in [
            "0/1s", "5/0s", "5", "five/1s", "5/soon", "-1/1s", "5/2days", "",
        ] {
            assert!(parsed(raw).is_err(), "{raw} was accepted");
        }
    }
}
