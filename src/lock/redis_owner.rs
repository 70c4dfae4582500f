//! `--lock redis-owner`: the course's lock v2. The value is the holder's
//! owner token; release reads it with `GET`, compares, then `DEL`s.
//!
//! That fixes lock v1's deletion of another holder's lock, but the check and
//! the delete are two commands: if the lease runs out between them and
//! another holder takes the key, the `DEL` still deletes the newcomer's lock
//! (`hmdp lab check-then-delete`).

use async_trait::async_trait;
use redis::AsyncCommands;

use super::set_nx::{SetNx, Taken};
use super::{HeldLock, LockError, OrderLock, Release};
use crate::config::LockMode;

/// Lock v2.
pub struct RedisOwnerLock(SetNx);

impl RedisOwnerLock {
    pub(super) fn new(set_nx: SetNx) -> Self {
        RedisOwnerLock(set_nx)
    }
}

struct OwnerHold(Taken);

#[async_trait]
impl OrderLock for RedisOwnerLock {
    fn mode(&self) -> LockMode {
        LockMode::RedisOwner
    }

    async fn acquire(&self, key: &str) -> Result<Option<Box<dyn HeldLock>>, LockError> {
        let taken = self.0.take(key).await?;
        Ok(taken.map(|taken| Box::new(OwnerHold(taken)) as Box<dyn HeldLock>))
    }
}

#[async_trait]
impl HeldLock for OwnerHold {
    async fn release(self: Box<Self>) -> Result<Release, LockError> {
        let OwnerHold(mut taken) = *self;
        let holder: Option<String> = taken.redis.get(&taken.key).await?;
        match holder {
            None => return Ok(Release::Expired),
            Some(holder) if holder != taken.token => return Ok(Release::NotOwner),
            Some(_) => {}
        }
        // The gap of lock v2: whatever happens to the key from here on, the
        // `DEL` below no longer checks who holds it.
        taken.before_delete().await;
        let deleted: u64 = taken.redis.del(&taken.key).await?;
        Ok(if deleted == 1 {
            Release::Released
        } else {
            Release::Expired
        })
    }
}
