//! What the lock tests share: the Redis they run on and locks built the way
//! the purchase builds them, under a key prefix of each test's own.

use std::sync::Arc;
use std::time::Duration;

use hmdp::config::{LockMode, LockSettings};
use hmdp::lock::{self, Faults, OrderLock};
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
        let redis = hmdp::startup::connect_redis(&redis_url(), Duration::from_secs(10))
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
    pub fn lock(&self, lease: Duration, wait: Duration) -> Arc<dyn OrderLock> {
        let settings = LockSettings {
            mode: self.mode,
            lock_nodes: self.nodes.iter().map(RedisServer::url).collect(),
            lock_lease_ms: Some(lease.as_millis() as u64),
            lock_wait_ms: wait.as_millis() as u64,
            lock_watchdog_ms: 30_000,
            lock_max_hold_ms: 0,
            fencing: false,
        };
        lock::build(&settings, &self.redis, &redis_url(), Faults::none())
            .expect("mode is available")
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }
}
