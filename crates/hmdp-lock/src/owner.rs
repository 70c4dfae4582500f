//! Who holds a lock: one identity, minted here and formatted here.
//!
//! The course first uses the thread id, which repeats across JVMs and means
//! nothing for async tasks that hop threads. Here an owner is this process's
//! random UUID plus a [`Holder`] id bumped on every new holder (Redisson's
//! `id + ":" + threadId`, with a value the code passes down instead of a
//! thread), so no two holders anywhere (tasks, processes, nodes) share one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

/// Drawn once per process: tells this process's holders from every other's.
static PROCESS: LazyLock<String> = LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());

/// Bumped per holder, and per name drawn from an owner.
static NEXT: AtomicU64 = AtomicU64::new(1);

fn next() -> u64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Who holds a lock, independent of threads: async tasks move between
/// threads, so a holder is a value the code passes down to nested steps.
/// Acquiring again as the same holder re-enters a reentrant lock; every other
/// mode treats it as just another contender (and so blocks itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder(u64);

impl Holder {
    /// A holder no other holder in this process shares.
    pub fn new() -> Self {
        Holder(next())
    }

    /// How this holder is written into Redis: `{process uuid}:{holder id}`.
    pub(crate) fn owner(self) -> String {
        joined(&PROCESS, self.0)
    }
}

impl Default for Holder {
    fn default() -> Self {
        Holder::new()
    }
}

/// A name no other call in any process returns, derived from `owner`: for a
/// release's idempotency latch or a round's take marker.
pub(crate) fn unique_name(owner: &str) -> String {
    // A counter, not a random id: a random id costs a getrandom call per hold.
    joined(owner, next())
}

/// `{name}:{number}`, built without `format!`: names are minted on every
/// acquisition and release, where the formatting machinery showed.
fn joined(name: &str, number: u64) -> String {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(number);
    let mut joined = String::with_capacity(name.len() + 1 + digits.len());
    joined.push_str(name);
    joined.push(':');
    joined.push_str(digits);
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_share_the_process_part_and_never_repeat() {
        let first = Holder::new().owner();
        let second = Holder::new().owner();
        assert_ne!(first, second);
        let process = |owner: &str| owner.rsplit_once(':').unwrap().0.to_owned();
        assert_eq!(process(&first), process(&second));
    }
}
