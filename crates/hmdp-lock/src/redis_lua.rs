//! `--lock redis-lua`: the course's lock v3. Acquisition as in v1 and v2;
//! release is one compare-and-delete Lua script (`lua/unlock.lua`), so the
//! owner check and the `DEL` cannot be separated by an expiring lease.
//!
//! What it still lacks is renewal: a holder that outlives its lease loses the
//! lock without noticing (`hmdp lab lease-expiry`).

use std::sync::LazyLock;

use async_trait::async_trait;
use redis::Script;

use crate::set_nx::{SetNxLock, Taken, Unlock};
use crate::LockMode;
use crate::{LockError, Release};

/// Built once: `invoke_async` sends `EVALSHA` with the precomputed hash and
/// loads the script only when Redis answers `NOSCRIPT`.
static UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/unlock.lua")));

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
        let code: i64 = UNLOCK
            .key(&taken.key)
            .arg(&taken.token)
            .invoke_async(&mut taken.redis)
            .await?;
        match code {
            1 => Ok(Release::Released),
            0 => Ok(Release::Expired),
            -1 => Ok(Release::NotOwner),
            other => Err(LockError::UnexpectedReply(other)),
        }
    }
}
