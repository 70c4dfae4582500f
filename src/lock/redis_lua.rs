//! `--lock redis-lua`: the course's lock v3. Acquisition as in v1 and v2;
//! release is one compare-and-delete Lua script (`lua/unlock.lua`), so the
//! owner check and the `DEL` cannot be separated by an expiring lease.
//!
//! What it still lacks is renewal: a holder that outlives its lease loses the
//! lock without noticing (`hmdp lab lease-expiry`).

use std::sync::LazyLock;

use async_trait::async_trait;
use redis::Script;

use super::set_nx::{SetNx, Taken};
use super::{HeldLock, LockError, OrderLock, Release};
use crate::config::LockMode;

/// Built once: `invoke_async` sends `EVALSHA` with the precomputed hash and
/// loads the script only when Redis answers `NOSCRIPT`.
static UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/unlock.lua")));

/// Lock v3.
pub struct RedisLuaLock(SetNx);

impl RedisLuaLock {
    pub(super) fn new(set_nx: SetNx) -> Self {
        RedisLuaLock(set_nx)
    }
}

struct LuaHold(Taken);

#[async_trait]
impl OrderLock for RedisLuaLock {
    fn mode(&self) -> LockMode {
        LockMode::RedisLua
    }

    async fn acquire(&self, key: &str) -> Result<Option<Box<dyn HeldLock>>, LockError> {
        let taken = self.0.take(key).await?;
        Ok(taken.map(|taken| Box::new(LuaHold(taken)) as Box<dyn HeldLock>))
    }
}

#[async_trait]
impl HeldLock for LuaHold {
    async fn release(self: Box<Self>) -> Result<Release, LockError> {
        let LuaHold(mut taken) = *self;
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
