//! What the lock tests share: the Redis they run on and locks built the way
//! the purchase builds them, under a key prefix of each test's own.

use std::sync::Arc;
use std::time::Duration;

use hmdp::config::{LockMode, LockSettings};
use hmdp::lock::{self, Faults, OrderLock};
use redis::aio::ConnectionManager;

pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// One mode under test, with a key namespace no other test touches.
pub struct Subject {
    pub mode: LockMode,
    redis: ConnectionManager,
    prefix: String,
}

impl Subject {
    pub fn new(mode: LockMode) -> Self {
        let redis = hmdp::startup::connect_redis(&redis_url(), Duration::from_secs(10))
            .expect("valid Redis URL");
        Subject {
            mode,
            redis,
            prefix: format!("test:{}:", uuid::Uuid::new_v4().simple()),
        }
    }

    /// A lock of this mode, as `--lock-lease-ms` and `--lock-wait-ms` would build it.
    pub fn lock(&self, lease: Duration, wait: Duration) -> Arc<dyn OrderLock> {
        let settings = LockSettings {
            mode: self.mode,
            lock_nodes: Vec::new(),
            lock_lease_ms: Some(lease.as_millis() as u64),
            lock_wait_ms: wait.as_millis() as u64,
            fencing: false,
        };
        lock::build(&settings, &self.redis, Faults::none()).expect("mode is available")
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }
}
