//! What the lock tests share: the Redis they run on and locks built the way
//! `--lock-lease-ms` and `--lock-wait-ms` build them, under a key prefix of
//! each test's own; waiters queued on held keys.

use hmdp_lock::{DistributedLock, LockBuilder, LockGuard, LockMode, RedisSource, Release};
use std::sync::Arc;
use std::time::Duration;

use hmdp_test_support::RedisServer;
use redis::aio::ConnectionManager;

pub use hmdp_test_support::redis_url;

/// A plain connection to `url`, for a test to look at or change the keys.
pub async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// One mode under test, with a key namespace no other test touches.
pub struct Subject {
    pub mode: LockMode,
    redis: ConnectionManager,
    prefix: String,
    /// `multi` and `redlock`: three independent servers of the test's own,
    /// killed when the subject is dropped.
    nodes: Vec<RedisServer>,
}

impl Subject {
    pub async fn new(mode: LockMode) -> Self {
        let redis =
            hmdp_lock::connection::connection_manager(&redis_url(), Duration::from_secs(10))
                .expect("valid Redis URL");
        let mut nodes = Vec::new();
        if matches!(mode, LockMode::Multi | LockMode::Redlock) {
            for _ in 0..3 {
                nodes.push(RedisServer::start().await.expect("redis-server starts"));
            }
        }
        Subject {
            mode,
            redis,
            prefix: format!("test:{}:", uuid::Uuid::new_v4().simple()),
            nodes,
        }
    }

    /// A lock of this mode, as `--lock-lease-ms` and `--lock-wait-ms` would build it.
    pub fn lock(&self, lease: Duration, wait: Duration) -> Arc<dyn DistributedLock> {
        let mut builder = LockBuilder::new(self.mode)
            .wait(wait)
            .nodes(self.nodes.iter().map(RedisServer::url));
        if self.mode.leased() {
            builder = builder.lease(lease);
        }
        builder
            .sharing(self.redis.clone())
            .build(RedisSource::from_url(&redis_url()).expect("a Redis URL"))
            .expect("mode is available")
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }
}

/// How long a test waits for what it expects to happen before it fails: a
/// guard against a hang, far beyond how long it takes even on a loaded
/// machine, not a measure of speed.
pub const HANG_GUARD: Duration = Duration::from_secs(10);

/// Runs `future`, failing the test if it has not finished after
/// [`HANG_GUARD`].
pub async fn without_hanging<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("hung for {HANG_GUARD:?}: {what}"))
}

/// Takes each of `keys` with `lock`, then starts `waiters` tasks, each
/// waiting for one of the keys in turn and releasing it once served.
/// Returns the holds and the waiters' releases.
pub async fn held_with_waiters<L: DistributedLock + ?Sized + 'static>(
    lock: &Arc<L>,
    keys: &[String],
    waiters: usize,
) -> (
    Vec<Box<dyn LockGuard>>,
    Vec<tokio::task::JoinHandle<Release>>,
) {
    let mut holds = Vec::new();
    for key in keys {
        holds.push(lock.acquire(key).await.unwrap().unwrap());
    }
    let waiters = (0..waiters)
        .map(|i| {
            let (lock, key) = (lock.clone(), keys[i % keys.len()].clone());
            tokio::spawn(async move {
                let held = lock.acquire(&key).await.unwrap().expect("served");
                held.release().await.unwrap()
            })
        })
        .collect();
    (holds, waiters)
}
