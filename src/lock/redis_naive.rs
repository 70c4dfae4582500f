//! `--lock redis-naive`: the course's lock v1. `SET NX PX` to take the key,
//! a plain `DEL` to release it.
//!
//! The `DEL` deletes whoever holds the key. Once a holder outlives its lease
//! (a GC pause, slow SQL) and another holder has taken the key, the first
//! one's release deletes the second one's lock, and a third gets in beside
//! the second (`hmdp lab misdelete`).

use async_trait::async_trait;
use redis::AsyncCommands;

use super::set_nx::{SetNx, Taken};
use super::{HeldLock, LockError, OrderLock, Release};
use crate::config::LockMode;

/// Lock v1.
pub struct RedisNaiveLock(SetNx);

impl RedisNaiveLock {
    pub(super) fn new(set_nx: SetNx) -> Self {
        RedisNaiveLock(set_nx)
    }
}

struct NaiveHold(Taken);

#[async_trait]
impl OrderLock for RedisNaiveLock {
    fn mode(&self) -> LockMode {
        LockMode::RedisNaive
    }

    async fn acquire(&self, key: &str) -> Result<Option<Box<dyn HeldLock>>, LockError> {
        let taken = self.0.take(key).await?;
        Ok(taken.map(|taken| Box::new(NaiveHold(taken)) as Box<dyn HeldLock>))
    }
}

#[async_trait]
impl HeldLock for NaiveHold {
    /// Reports `Released` whenever `DEL` removed a key, even when that key was
    /// somebody else's: without the token check this lock cannot tell.
    async fn release(self: Box<Self>) -> Result<Release, LockError> {
        let NaiveHold(mut taken) = *self;
        taken.before_delete().await;
        let deleted: u64 = taken.redis.del(&taken.key).await?;
        Ok(if deleted == 1 {
            Release::Released
        } else {
            Release::Expired
        })
    }
}
