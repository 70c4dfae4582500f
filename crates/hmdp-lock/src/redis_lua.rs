//! `redis-lua`: the course's lock v3. Acquisition as in v1 and v2;
//! release is one compare-and-delete Lua script (`lua/unlock.lua`), so the
//! owner check and the `DEL` cannot be separated by an expiring lease.
//!
//! What it still lacks is renewal: a holder that outlives its lease loses the
//! lock without noticing (`hmdp lab lease-expiry`).

use async_trait::async_trait;

use crate::lock::{LockError, Release};
use crate::mode::LockMode;
use crate::scripts::{compare_and_delete, CompareAndDelete};
use crate::set_nx::{SetNxLock, Taken, Unlock};

/// Lock v3.
pub(crate) type RedisLuaLock = SetNxLock<LuaUnlock>;

/// Release of lock v3.
pub(crate) struct LuaUnlock;

#[async_trait]
impl Unlock for LuaUnlock {
    const MODE: LockMode = LockMode::RedisLua;

    async fn unlock(&self, mut taken: Taken) -> Result<Release, LockError> {
        // Check and delete are one step here: a pause can only come before it.
        taken.before_delete().await;
        let deleted = compare_and_delete(&mut taken.redis, &taken.key, &taken.token).await?;
        Ok(match deleted {
            CompareAndDelete::Deleted => Release::Released,
            CompareAndDelete::Gone => Release::Expired,
            CompareAndDelete::OtherOwner => Release::NotOwner,
        })
    }
}
