//! A request refused by a limit, and what its answer tells the client:
//! `Retry-After` and the `RateLimit` / `RateLimit-Policy` headers.

use std::time::Duration;

use super::rule::Rule;
use super::settings::Quota;

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
