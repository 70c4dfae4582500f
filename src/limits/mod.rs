//! Request limits shared by every node: per user, per client IP and for
//! everyone together, each a GCRA allowance kept in Redis
//! (`lua/gcra_count.lua`) so that two nodes enforce one limit, on a Redis
//! Cluster too (one key per subject). Should Redis not answer, each node
//! limits on its own (`fallback.rs`): looser by the number of nodes, but
//! never unlimited.
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
mod owed;
mod refusal;
mod rule;
mod settings;

use fallback::Fallback;
pub use owed::{Counting, Owed};
pub use refusal::Limited;
pub use rule::{Rule, EVERYONE};
pub use settings::{Enforced, LimitSettings, Quota, QuotaSetting};

/// The GCRA count, put in front of each script that counts requests
/// against limits: `lua/gcra.lua`, and an admission that counts its
/// purchase's limits in its own call ([`Owed::folded_into`]).
pub const GCRA_COUNT: &str = include_str!("../../lua/gcra_count.lua");

static GCRA: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[GCRA_COUNT, include_str!("../../lua/gcra.lua")].concat()));

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
                // Nothing before it to count costs no call.
                owed.pay().await?;
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
