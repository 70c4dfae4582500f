//! Owner tokens: who holds a Redis lock, as written into the lock's value.
//!
//! The course first uses the thread id, which repeats across JVMs and means
//! nothing for async tasks that hop threads. Here a token is this process's
//! random UUID plus a counter bumped on every acquisition, so no two holders
//! anywhere (tasks, processes, nodes) ever share one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use uuid::Uuid;

/// Drawn once per process: tells this node's holders from every other node's.
static PROCESS: LazyLock<Uuid> = LazyLock::new(Uuid::new_v4);

/// Bumped per acquisition: tells this process's holders apart.
static NEXT_HOLDER: AtomicU64 = AtomicU64::new(1);

/// A fresh owner token, `{process uuid}:{holder id}`, never handed out twice.
pub fn next_token() -> String {
    let holder = NEXT_HOLDER.fetch_add(1, Ordering::Relaxed);
    format!("{}:{holder}", *PROCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_share_the_process_part_and_never_repeat() {
        let first = next_token();
        let second = next_token();
        assert_ne!(first, second);
        let process = |token: &str| token.rsplit_once(':').unwrap().0.to_owned();
        assert_eq!(process(&first), process(&second));
    }
}
