//! The node's own limits, for when Redis cannot count: the same quotas,
//! counted in this process alone (with N nodes, a subject gets up to N
//! times its quota until Redis is back).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::DefaultKeyedRateLimiter;

use super::refusal::Limited;
use super::rule::Rule;
use super::settings::{LimitSettings, Quota};

/// Subjects remembered per rule before the idle ones are forgotten.
const REMEMBERED_SUBJECTS: usize = 100_000;

/// One in-memory limiter per rule that is on.
#[derive(Clone)]
pub(super) struct Fallback {
    limiters: Arc<HashMap<Rule, DefaultKeyedRateLimiter<String>>>,
}

impl Fallback {
    pub fn new(settings: &LimitSettings) -> Fallback {
        let limiters = (Rule::ALL.into_iter())
            .filter_map(|rule| {
                let quota = settings.quota(rule)?;
                Some((rule, governor::RateLimiter::keyed(governor_quota(quota))))
            })
            .collect();
        Fallback {
            limiters: Arc::new(limiters),
        }
    }

    /// Counts one request of the subject `key` under `rule`.
    pub fn take(&self, rule: Rule, quota: Quota, key: &str) -> Option<Limited> {
        let limiter = self.limiters.get(&rule)?;
        let verdict = limiter.check_key(&key.to_owned());
        if limiter.len() > REMEMBERED_SUBJECTS {
            limiter.retain_recent();
        }
        let not_until = verdict.err()?;
        let retry_after = not_until.wait_time_from(DefaultClock::default().now());
        Some(Limited {
            rule,
            quota,
            retry_after,
            reset: retry_after + quota.window().saturating_sub(quota.interval()),
        })
    }
}

/// The quota as governor counts it: the same pace, the same burst.
fn governor_quota(quota: Quota) -> governor::Quota {
    let burst = NonZeroU32::new(quota.count()).expect("a quota allows at least one request");
    governor::Quota::with_period(quota.interval().max(Duration::from_nanos(1)))
        .expect("a quota's interval is never zero")
        .allow_burst(burst)
}
