//! The count a request owes its limits once this node's memory of
//! refusals has answered: made in a call of its own ([`Owed::pay`]), or in
//! the call of a script that does something else for the request in Redis
//! ([`Owed::folded_into`], then [`Owed::settle`]), as the admission script
//! does on a single Redis.

use super::refusal::Limited;
use super::{answer, Asked, Count, Limits};

/// A request's count under its limits, still to be made in Redis: the
/// rules this node could not answer from memory. [`Owed::pay`] makes it in
/// a call of its own; a script that does something else for the request in
/// Redis may make it in the same call, on a single Redis
/// ([`Owed::folded_into`], then [`Owed::settle`]).
#[must_use = "a request's limits are counted only when what it owes is paid or settled"]
pub struct Owed {
    pub(super) limits: Limits,
    pub(super) asked: Vec<Asked>,
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
    /// `lua/gcra_count.lua` ([`GCRA_COUNT`](super::GCRA_COUNT)): the keys
    /// after the script's own, and at the first argument after its own how
    /// many, then each one's interval and window, which the script hands
    /// `gcra_count`.
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
