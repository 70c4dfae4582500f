//! Fencing tokens: a layer around any lock mode that mints a fencing token per
//! acquisition (`lua/fence.lua`), for storage to refuse writes of a holder
//! whose lock has since passed to someone else (Kleppmann's fencing tokens,
//! Redisson's `RFencedLock`).
//!
//! A lease can run out under a paused holder whatever the lock does; only the
//! storage can tell an old holder from a new one: it records the token with
//! the write (hmdp's purchase does so as the first statement of its
//! transaction) and refuses a write carrying an older one.
//! Before committing, [`LockGuard::ensure_held`] also asks Redis whether a
//! newer token exists, so a stale holder steps aside instead of committing
//! ahead of the newer one whose transaction is waiting on the fence row.

use std::sync::Arc;
use std::time::Duration;

use crate::connection::Connection;
use async_trait::async_trait;
use redis::AsyncCommands;

use crate::keys::sibling;
use crate::lock::{refuse, DistributedLock, LockError, LockGuard, Release};
use crate::mode::LockMode;
use crate::observer::{LockEvent, LostReason, Observer, Unobserved};
use crate::owner::Holder;
use crate::scripts::{MintFencingToken, Minted};

/// How long a key's counter outlives its last acquisition. Far longer than
/// any lease, short enough that idle users' counters go away; tokens stay
/// monotonic across its expiry because they never fall below Redis' clock.
const COUNTER_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Any lock, with a fencing token minted for every acquisition.
pub struct Fenced {
    inner: Arc<dyn DistributedLock>,
    redis: Connection,
    observer: Arc<dyn Observer>,
}

impl Fenced {
    /// Fences `inner`, keeping the counters on `redis`.
    pub fn new(inner: Arc<dyn DistributedLock>, redis: impl Into<Connection>) -> Self {
        Self::observed(inner, redis, Unobserved::shared())
    }

    /// Like [`Fenced::new`], reporting rejections to `observer`.
    pub fn observed(
        inner: Arc<dyn DistributedLock>,
        redis: impl Into<Connection>,
        observer: Arc<dyn Observer>,
    ) -> Self {
        Fenced {
            inner,
            redis: redis.into(),
            observer,
        }
    }

    async fn fence(
        &self,
        holder: Holder,
        key: &str,
        held: Option<Box<dyn LockGuard>>,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        let Some(held) = held else {
            return Ok(None);
        };
        // The script reads the lock key too, so the counter lives in the
        // lock key's Cluster slot.
        let counter = sibling(key, "fence");
        let minted = MintFencingToken {
            counter: &counter,
            lock_key: key,
            owner: &holder.owner(),
            retention: COUNTER_RETENTION,
            owner_in_key: held.owner_in_key().unwrap_or(""),
        }
        .run(&mut self.redis.clone())
        .await;
        let failure = match minted {
            Ok(Minted::Token(token)) => {
                return Ok(Some(Box::new(FencedHold {
                    inner: held,
                    redis: self.redis.clone(),
                    counter,
                    token,
                    observer: self.observer.clone(),
                })))
            }
            Ok(Minted::NotHeld) => LockError::Lost(LostReason::LeaseExpired),
            Err(error) => error,
        };
        // Without a token the hold is useless to a fenced purchase.
        Err(refuse(held, failure).await)
    }
}

#[async_trait]
impl DistributedLock for Fenced {
    fn mode(&self) -> LockMode {
        self.inner.mode()
    }

    fn wait(&self) -> Duration {
        self.inner.wait()
    }

    async fn acquire_as_within(
        &self,
        holder: Holder,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        let held = self.inner.acquire_as_within(holder, key, wait).await?;
        self.fence(holder, key, held).await
    }
}

struct FencedHold {
    inner: Box<dyn LockGuard>,
    redis: Connection,
    counter: String,
    token: u64,
    observer: Arc<dyn Observer>,
}

impl crate::lock::sealed::InKey for FencedHold {}

#[async_trait]
impl LockGuard for FencedHold {
    async fn release(self: Box<Self>) -> Result<Release, LockError> {
        self.inner.release().await
    }

    fn fencing_token(&self) -> Option<u64> {
        Some(self.token)
    }

    async fn ensure_held(&self) -> Result<(), LockError> {
        self.inner.ensure_held().await?;
        let newest: Option<u64> = self.redis.clone().hget(&self.counter, "token").await?;
        match newest {
            Some(newest) if newest > self.token => {
                self.observer.observe(LockEvent::FencingRejected);
                Err(LockError::Lost(LostReason::FencedOut))
            }
            _ => Ok(()),
        }
    }
}
