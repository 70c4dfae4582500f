//! `redis-naive`: the course's lock v1. `SET NX PX` to take the key,
//! a plain `DEL` to release it.
//!
//! The `DEL` deletes whoever holds the key. Once a holder outlives its lease
//! (a GC pause, slow SQL) and another holder has taken the key, the first
//! one's release deletes the second one's lock, and a third gets in beside
//! the second (`hmdp lab misdelete`).

use async_trait::async_trait;

use crate::lock::{LockError, Release};
use crate::mode::LockMode;
use crate::set_nx::{SetNxLock, Taken, Unlock};

/// Lock v1.
pub(crate) type RedisNaiveLock = SetNxLock<DelUnlock>;

/// Release of lock v1.
pub(crate) struct DelUnlock;

#[async_trait]
impl Unlock for DelUnlock {
    const MODE: LockMode = LockMode::RedisNaive;

    /// Reports `Released` whenever `DEL` removed a key, even when that key was
    /// somebody else's: without the token check this lock cannot tell.
    async fn unlock(&self, mut taken: Taken) -> Result<Release, LockError> {
        taken.before_delete().await;
        taken.delete().await
    }
}
