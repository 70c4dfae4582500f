//! `redis-owner`: the course's lock v2. The value is the holder's
//! owner token; release reads it with `GET`, compares, then `DEL`s.
//!
//! That fixes lock v1's deletion of another holder's lock, but the check and
//! the delete are two commands: if the lease runs out between them and
//! another holder takes the key, the `DEL` still deletes the newcomer's lock
//! (`hmdp lab check-then-delete`).

use async_trait::async_trait;
use redis::AsyncCommands;

use crate::lock::{LockError, Release};
use crate::mode::LockMode;
use crate::set_nx::{SetNxLock, Taken, Unlock};

/// Lock v2.
pub(crate) type RedisOwnerLock = SetNxLock<GetThenDelUnlock>;

/// Release of lock v2.
pub(crate) struct GetThenDelUnlock;

#[async_trait]
impl Unlock for GetThenDelUnlock {
    const MODE: LockMode = LockMode::RedisOwner;

    async fn unlock(&self, mut taken: Taken) -> Result<Release, LockError> {
        let holder: Option<String> = taken.redis.get(&taken.key).await?;
        match holder {
            None => return Ok(Release::Expired),
            Some(holder) if holder != taken.token => return Ok(Release::NotOwner),
            Some(_) => {}
        }
        // The gap of lock v2: whatever happens to the key from here on, the
        // `DEL` below no longer checks who holds it.
        taken.before_delete().await;
        taken.delete().await
    }
}
