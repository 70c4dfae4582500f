//! The per-user order lock: one trait, one file per mode (DESIGN.md "Lock modes").
//!
//! The purchase only sees [`OrderLock`] and the [`HeldLock`] it hands out, so
//! swapping `--lock` changes how mutual exclusion is achieved (or broken)
//! without touching the purchase code.

mod local;
mod none;
mod owner;
mod redis_lua;
mod redis_naive;
mod redis_owner;
mod set_nx;

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use redis::aio::ConnectionManager;

use crate::config::{LockMode, LockSettings};

pub use local::LocalLock;
pub use none::NoLock;
pub use redis_lua::RedisLuaLock;
pub use redis_naive::RedisNaiveLock;
pub use redis_owner::RedisOwnerLock;
use set_nx::SetNx;

/// Something that went wrong talking to the lock's backing store.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("lock backend unreachable")]
    Redis(#[from] redis::RedisError),
    /// A lock script answered with a code it is not documented to return.
    #[error("lock script returned unexpected code {0}")]
    UnexpectedReply(i64),
}

/// What a release actually did: a release is not always clean, and the
/// failures of the course's early locks show up exactly here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The lock was ours and is now free.
    Released,
    /// The key was already gone: our lease expired before we released.
    Expired,
    /// Somebody else holds the key now; we left it alone.
    NotOwner,
}

impl Release {
    /// A clean release freed a lock that was still ours.
    pub fn is_clean(self) -> bool {
        self == Release::Released
    }
}

/// A lock guarding one key per holder.
#[async_trait]
pub trait OrderLock: Send + Sync {
    /// The mode this lock implements.
    fn mode(&self) -> LockMode;

    /// Takes `key` for a new holder. `Ok(None)` means the key stayed busy for
    /// the whole configured wait (hmdp's failed `tryLock()`).
    async fn acquire(&self, key: &str) -> Result<Option<Box<dyn HeldLock>>, LockError>;
}

/// One holder's hold on one key. Releasing consumes it, so a holder cannot
/// release twice.
#[async_trait]
pub trait HeldLock: Send {
    async fn release(self: Box<Self>) -> Result<Release, LockError>;
}

/// A pause a fault injection point runs, e.g. sleeping until a chosen moment.
pub type Pause = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Fault injection points a lock honours, so the lab can stop a holder at
/// the exact moment the course's failures need. The purchase injects none.
#[derive(Clone, Default)]
pub struct Faults {
    /// Runs inside a release right before the command that deletes the key:
    /// for `redis-owner` between its `GET` check and its `DEL` (lock v2's
    /// gap), for `redis-naive` before its unchecked `DEL`, for `redis-lua`
    /// before its script, whose check and delete are one step. Locks without
    /// such a command (`none`, `local`) ignore it.
    pub before_delete: Option<Pause>,
}

impl Faults {
    /// No faults: what the purchase runs with.
    pub fn none() -> Self {
        Faults::default()
    }
}

/// Builds the lock of the configured mode on `redis`, with `faults` injected.
pub fn build(
    settings: &LockSettings,
    redis: &ConnectionManager,
    faults: Faults,
) -> anyhow::Result<Arc<dyn OrderLock>> {
    let set_nx = || {
        SetNx::new(
            redis.clone(),
            settings.lease(),
            settings.wait(),
            faults.clone(),
        )
    };
    match settings.mode {
        LockMode::None => Ok(Arc::new(NoLock)),
        LockMode::Local => Ok(Arc::new(LocalLock::new(settings.wait()))),
        LockMode::RedisNaive => Ok(Arc::new(RedisNaiveLock::new(set_nx()))),
        LockMode::RedisOwner => Ok(Arc::new(RedisOwnerLock::new(set_nx()))),
        LockMode::RedisLua => Ok(Arc::new(RedisLuaLock::new(set_nx()))),
        other => anyhow::bail!("lock mode `{other}` is not available in this build"),
    }
}
