//! Request limits shared by every node: per user, per client IP and for
//! everyone together, each a GCRA allowance kept in Redis (`lua/gcra.lua`)
//! so that two nodes enforce one limit, on a Redis Cluster too (one key per
//! subject). Should Redis not answer, each node limits on its own
//! (`fallback.rs`): looser by the number of nodes, but never unlimited.
//!
//! A request over a limit is refused before it costs anything else, with
//! 429 `RATE_LIMITED`, `Retry-After` and the `RateLimit` / `RateLimit-Policy`
//! headers of the IETF httpapi draft (`api/response.rs`).

use std::fmt::Display;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;

use crate::keys::Keys;
use crate::metrics;
use crate::redis_handle::RedisConnection;

mod fallback;
mod settings;

use fallback::Fallback;
pub use settings::{Enforced, LimitSettings, Quota, QuotaSetting};

/// The GCRA count, put in front of each script that counts requests
/// against limits: `lua/gcra.lua`, and an admission that counts its
/// purchase's limits in its own call ([`Owed::folded_into`]).
pub const GCRA_COUNT: &str = include_str!("../../lua/gcra_count.lua");

static GCRA: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[GCRA_COUNT, include_str!("../../lua/gcra.lua")].concat()));

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
    /// ([`LimitSettings`]).
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

/// A request refused by a limit, with what its answer tells the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub rule: Rule,
    pub quota: Quota,
    /// How long until the limit lets one more request through.
    pub retry_after: Duration,
    /// How long until the subject's whole quota is back.
    pub reset: Duration,
}

impl Limited {
    /// `Retry-After`, whole seconds, rounded up: never 0, which would
    /// invite the client straight back.
    pub fn retry_after_secs(&self) -> u64 {
        whole_secs(self.retry_after).max(1)
    }

    /// `RateLimit-Policy`: the rule's name, its quota and window (seconds).
    pub fn policy_header(&self) -> String {
        format!(
            "\"{}\";q={};w={}",
            self.rule.name(),
            self.quota.count(),
            whole_secs(self.quota.window()).max(1)
        )
    }

    /// `RateLimit`: nothing left under the rule, and the seconds until the
    /// quota is whole again.
    pub fn rate_limit_header(&self) -> String {
        format!(
            "\"{}\";r=0;t={}",
            self.rule.name(),
            whole_secs(self.reset).max(self.retry_after_secs())
        )
    }
}

fn whole_secs(duration: Duration) -> u64 {
    duration.as_micros().div_ceil(1_000_000) as u64
}

/// What a call of the limit script does with its subject's allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    /// Counts one request, if allowed.
    Request,
    /// Gives one back.
    GiveBack,
}

/// The node's limits.
#[derive(Clone)]
pub struct Limits {
    shared: Arc<Shared>,
}

struct Shared {
    redis: RedisConnection,
    keys: Keys,
    settings: LimitSettings,
    fallback: Fallback,
    /// The subjects this node saw refused, by key, until when: a subject
    /// refused until T stays refused until T whatever any node counts
    /// meanwhile, so its requests until then are refused from memory,
    /// without a trip to Redis (a bot hammering costs the node little).
    refused: moka::sync::Cache<String, Refused>,
}

/// One rule to count a request under: its quota and its subject's key.
struct Asked {
    rule: Rule,
    quota: Quota,
    key: String,
}

/// A refusal remembered: until when it holds, and when its subject's
/// quota is whole again.
#[derive(Debug, Clone, Copy)]
struct Refused {
    limited: Limited,
    until: Instant,
    whole_at: Instant,
}

/// The most subjects remembered as refused: a flood of distinct ones
/// evicts the oldest, which are then asked of Redis again.
const REMEMBERED_REFUSALS: u64 = 100_000;

/// A request's count under its limits, still to be made in Redis: the
/// rules this node could not answer from memory. [`Owed::pay`] makes it in
/// a call of its own; a script that does something else for the request in
/// Redis may make it in the same call, on a single Redis
/// ([`Owed::folded_into`], then [`Owed::settle`]).
#[must_use = "a request's limits are counted only when what it owes is paid or settled"]
pub struct Owed {
    limits: Limits,
    asked: Vec<Asked>,
}

/// A request's count under its limits, as far as it is made.
pub enum Counting {
    /// Made, or nothing to make.
    Done,
    /// Still owed.
    Owed(Owed),
}

impl From<Owed> for Counting {
    fn from(owed: Owed) -> Self {
        Counting::Owed(owed)
    }
}

impl Counting {
    /// Makes the count still owed, in calls of its own.
    pub async fn pay_now(&mut self) -> Result<(), Limited> {
        match std::mem::replace(self, Counting::Done) {
            Counting::Done => Ok(()),
            Counting::Owed(owed) => owed.pay().await,
        }
    }

    /// Makes the count still owed in calls of its own where no script of
    /// the caller's could make it in its call: on a Redis Cluster, or when
    /// there is nothing left to count.
    pub async fn pay_unless_scripted(&mut self) -> Result<(), Limited> {
        match self {
            Counting::Owed(owed) if !owed.asked.is_empty() && owed.limits.countable_in_script() => {
                Ok(())
            }
            _ => self.pay_now().await,
        }
    }

    /// The count still owed, for a script of the caller's to make in its
    /// call ([`Owed::folded_into`], then [`Owed::settle`]).
    pub fn for_script(&mut self) -> Option<Owed> {
        match std::mem::replace(self, Counting::Done) {
            Counting::Done => None,
            Counting::Owed(owed) => Some(owed),
        }
    }
}

impl Limits {
    pub fn new(redis: RedisConnection, keys: Keys, settings: LimitSettings) -> Limits {
        for rule in Rule::ALL {
            metrics::RATE_LIMITED.with_label_values(&[rule.name()]);
        }
        let fallback = Fallback::new(&settings);
        let shared = Shared {
            redis,
            keys,
            settings,
            fallback,
            refused: moka::sync::Cache::new(REMEMBERED_REFUSALS),
        };
        Limits {
            shared: Arc::new(shared),
        }
    }

    /// Counts one request under each `(rule, subject)` in turn: refused
    /// (answered 429) by the first rule it is over, and not
    /// counted by the rules after that one. So the narrowest rule comes
    /// first: a client refused per user or per address spends nothing of
    /// what it shares with others (its address's quota, everyone's). One
    /// call of the limit script counts them all on a single Redis; on a
    /// Redis Cluster, whose slots part the keys, one call a rule.
    pub async fn take(&self, checks: &[(Rule, &dyn Display)]) -> Result<(), Limited> {
        self.owe(checks).await?.pay().await
    }

    /// What counting one request under `checks` (as [`Limits::take`] does)
    /// leaves to Redis: every rule, unless this node remembers refusing the
    /// request's subject under one of them. Then the request is refused,
    /// the rules before that one counted first (as the limit script counts
    /// rules in turn until one refuses) — nothing is owed, and no script
    /// ever counts a request already refused.
    pub async fn owe(&self, checks: &[(Rule, &dyn Display)]) -> Result<Owed, Limited> {
        let mut asked = Vec::new();
        let mut remembered = None;
        for (rule, subject) in checks {
            let Some(quota) = self.shared.settings.quota(*rule) else {
                continue;
            };
            let key = self.shared.keys.limit(rule.name(), &subject.to_string());
            if let Some(limited) = self.still_refused(&key) {
                remembered = Some(limited);
                break;
            }
            asked.push(Asked {
                rule: *rule,
                quota,
                key,
            });
        }
        let owed = Owed {
            limits: self.clone(),
            asked,
        };
        match remembered {
            None => Ok(owed),
            Some(limited) => {
                let counted = match owed.asked.is_empty() {
                    true => Ok(()),
                    false => owed.pay().await,
                };
                counted?;
                Err(told(limited))
            }
        }
    }

    /// Gives back one request counted under `rule` for `subject`: one
    /// that turned out not to count (a login whose code was right, under
    /// [`Rule::WrongCodesByPhone`]). Best effort: a give-back Redis cannot
    /// take leaves the request counted.
    pub async fn give_back(&self, rule: Rule, subject: &dyn Display) {
        if let Some(quota) = self.shared.settings.quota(rule) {
            let key = self.shared.keys.limit(rule.name(), &subject.to_string());
            self.count(&[Asked { rule, quota, key }], Count::GiveBack)
                .await;
        }
    }

    /// Whether a script of the caller's can count a request's limits in
    /// its own call: only on a single Redis, where every key is at hand.
    fn countable_in_script(&self) -> bool {
        !matches!(self.shared.redis, RedisConnection::Cluster(_))
    }

    /// One call of the limit script over `asked`, in turn: the refusal of
    /// the first rule over its limit, remembered until it lifts.
    async fn count(&self, asked: &[Asked], count: Count) -> Option<Limited> {
        if asked.is_empty() {
            return None;
        }
        let mut call = GCRA.prepare_invoke();
        call.arg(match count {
            Count::Request => "1",
            Count::GiveBack => "-1",
        });
        for one in asked {
            call.key(&one.key)
                .arg(one.quota.interval().as_micros() as u64)
                .arg(one.quota.window().as_micros() as u64);
        }
        let answer: redis::RedisResult<(u8, u64, u64, u64, usize)> =
            call.invoke_async(&mut self.shared.redis.clone()).await;
        match answer {
            Ok((1, ..)) => None,
            Ok((_, _, retry_after, reset, which)) => {
                self.refused_by(asked, which, retry_after, reset)
            }
            Err(error) => match count {
                // This node's own count keeps what it counted: it only
                // loosens once Redis is back.
                Count::GiveBack => None,
                Count::Request => self.count_alone(asked, &error),
            },
        }
    }

    /// The refusal of `asked`'s `which`th rule (from 1), as the limit
    /// script answered it, remembered until it lifts.
    fn refused_by(
        &self,
        asked: &[Asked],
        which: usize,
        retry_after_us: u64,
        reset_us: u64,
    ) -> Option<Limited> {
        let one = asked.get(which.checked_sub(1)?)?;
        let limited = Limited {
            rule: one.rule,
            quota: one.quota,
            retry_after: Duration::from_micros(retry_after_us),
            reset: Duration::from_micros(reset_us),
        };
        self.remember(&one.key, limited);
        Some(limited)
    }

    /// Counts `asked` in this node alone, Redis having failed with `error`.
    fn count_alone(&self, asked: &[Asked], error: &redis::RedisError) -> Option<Limited> {
        tracing::warn!(%error, "limits unreadable in Redis; this node limits alone");
        metrics::RATE_LIMIT_FALLBACKS.inc();
        let (limited, key) = asked.iter().find_map(|one| {
            let limited = (self.shared.fallback).take(one.rule, one.quota, &one.key)?;
            Some((limited, &one.key))
        })?;
        self.remember(key, limited);
        Some(limited)
    }

    fn remember(&self, key: &str, limited: Limited) {
        let now = Instant::now();
        let remembered = Refused {
            limited,
            until: now + limited.retry_after,
            whole_at: now + limited.reset,
        };
        self.shared.refused.insert(key.to_owned(), remembered);
    }

    /// The refusal this node remembers for `key`, if it still holds.
    fn still_refused(&self, key: &str) -> Option<Limited> {
        let refused = self.shared.refused.get(key)?;
        let now = Instant::now();
        if now >= refused.until {
            self.shared.refused.invalidate(key);
            return None;
        }
        Some(Limited {
            retry_after: refused.until - now,
            reset: refused.whole_at.saturating_duration_since(now),
            ..refused.limited
        })
    }
}

impl Owed {
    /// Counts the request in calls of its own (see [`Limits::take`]).
    pub async fn pay(self) -> Result<(), Limited> {
        let limits = &self.limits;
        let refused = match limits.countable_in_script() {
            true => limits.count(&self.asked, Count::Request).await,
            false => {
                let mut refused = None;
                for one in self.asked.chunks(1) {
                    refused = limits.count(one, Count::Request).await;
                    if refused.is_some() {
                        break;
                    }
                }
                refused
            }
        };
        answer(refused)
    }

    /// Adds the count to `call`, a script that starts with
    /// `lua/gcra_count.lua` ([`GCRA_COUNT`]): the keys after the script's
    /// own, and at the first argument after its own how many, then each
    /// one's interval and window, which the script hands `gcra_count`.
    pub fn folded_into(&self, call: &mut redis::ScriptInvocation<'_>) {
        call.arg(self.asked.len());
        for one in &self.asked {
            call.key(&one.key)
                .arg(one.quota.interval().as_micros() as u64)
                .arg(one.quota.window().as_micros() as u64);
        }
    }

    /// The count made in a script's call, from its `reply`: refused when
    /// the script answered `gcra_refused`'s `{'limited', ...}`, counted in
    /// this node alone when the call failed (`reply` an error).
    pub fn settle(self, reply: Result<&redis::Value, &redis::RedisError>) -> Result<(), Limited> {
        let limits = &self.limits;
        let refused = match reply {
            Ok(redis::Value::Array(refusal)) => match refusal.as_slice() {
                [redis::Value::BulkString(limited), redis::Value::Int(retry_after), redis::Value::Int(reset), redis::Value::Int(which)]
                    if limited == b"limited" =>
                {
                    limits.refused_by(
                        &self.asked,
                        usize::try_from(*which).unwrap_or(0),
                        u64::try_from(*retry_after).unwrap_or(0),
                        u64::try_from(*reset).unwrap_or(0),
                    )
                }
                _ => None,
            },
            Ok(_) => None,
            Err(error) => limits.count_alone(&self.asked, error),
        };
        answer(refused)
    }
}

/// A request's answer from its limits: refused by `refused`, if any.
fn answer(refused: Option<Limited>) -> Result<(), Limited> {
    refused.map_or(Ok(()), |limited| Err(told(limited)))
}

/// A refusal, as told: counted in `hmdp_rate_limited_total`.
fn told(limited: Limited) -> Limited {
    metrics::RATE_LIMITED
        .with_label_values(&[limited.rule.name()])
        .inc();
    limited
}
