//! Taking a key with `SET key token NX PX lease`: the acquisition shared by
//! the course's three hand-written Redis locks, which differ only in how
//! they release ([`Unlock`]).

use std::time::Duration;

use crate::connection::Connection;
use async_trait::async_trait;
use rand::RngExt;
use tokio::time::Instant;

#[cfg(feature = "fault-injection")]
use crate::faults::Faults;
use crate::lock::{release_dropped, DistributedLock, LockError, LockGuard, Release};
use crate::mode::LockMode;
use crate::owner::Holder;

/// How a `SET NX` lock gives its key back: the one step in which lock v1,
/// v2 and v3 differ.
#[async_trait]
pub(crate) trait Unlock: Send + Sync + 'static {
    const MODE: LockMode;

    async fn unlock(&self, taken: Taken) -> Result<Release, LockError>;
}

/// A `SET NX PX` lock releasing with `U`.
pub(crate) struct SetNxLock<U> {
    set_nx: SetNx,
    unlock: std::sync::Arc<U>,
}

impl<U: Unlock> SetNxLock<U> {
    pub(crate) fn new(set_nx: SetNx, unlock: U) -> Self {
        SetNxLock {
            set_nx,
            unlock: std::sync::Arc::new(unlock),
        }
    }
}

struct SetNxHold<U: Unlock> {
    /// `None` once a release has started.
    taken: Option<Taken>,
    unlock: std::sync::Arc<U>,
}

#[async_trait]
impl<U: Unlock> DistributedLock for SetNxLock<U> {
    fn mode(&self) -> LockMode {
        U::MODE
    }

    fn wait(&self) -> Duration {
        self.set_nx.wait
    }

    async fn acquire_as_within(
        &self,
        _holder: Holder,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        let taken = self.set_nx.take(key, wait).await?;
        Ok(taken.map(|taken| {
            Box::new(SetNxHold {
                taken: Some(taken),
                unlock: self.unlock.clone(),
            }) as Box<dyn LockGuard>
        }))
    }
}

#[async_trait]
impl<U: Unlock> LockGuard for SetNxHold<U> {
    async fn release(mut self: Box<Self>) -> Result<Release, LockError> {
        let taken = self.taken.take().expect("a hold is released once");
        self.unlock.unlock(taken).await
    }
}

impl<U: Unlock> crate::lock::sealed::InKey for SetNxHold<U> {
    fn owner_in_key(&self) -> Option<&str> {
        self.taken.as_ref().map(|taken| taken.token.as_str())
    }
}

impl<U: Unlock> Drop for SetNxHold<U> {
    fn drop(&mut self) {
        if let Some(taken) = self.taken.take() {
            let unlock = self.unlock.clone();
            release_dropped(taken.key.clone(), async move { unlock.unlock(taken).await });
        }
    }
}

/// Pause between two attempts while waiting for a busy key. These locks have
/// no release notification to wait on, so they poll; the jitter keeps many
/// waiters from retrying in lockstep.
const RETRY_PAUSE_MS: std::ops::RangeInclusive<u64> = 5..=15;

/// Settings and connection shared by the `SET NX PX` locks.
pub(crate) struct SetNx {
    redis: Connection,
    lease: Duration,
    /// Zero: try once (hmdp's `tryLock()`); otherwise retry until this has passed.
    wait: Duration,
    #[cfg(feature = "fault-injection")]
    faults: Faults,
}

/// A key this process set with its own token.
pub(crate) struct Taken {
    pub redis: Connection,
    pub key: String,
    pub token: String,
    #[cfg(feature = "fault-injection")]
    pub faults: Faults,
}

impl SetNx {
    pub(crate) fn new(
        redis: Connection,
        lease: Duration,
        wait: Duration,
        #[cfg(feature = "fault-injection")] faults: Faults,
    ) -> Self {
        SetNx {
            redis,
            lease,
            wait,
            #[cfg(feature = "fault-injection")]
            faults,
        }
    }

    /// Sets `key` to a fresh owner token (a new holder's: these locks do not
    /// re-enter) unless somebody holds it, retrying
    /// for `wait`; `None` when it stayed busy throughout.
    pub(crate) async fn take(&self, key: &str, wait: Duration) -> Result<Option<Taken>, LockError> {
        let token = Holder::new().owner();
        // PX 0 is an error in Redis; a sub-millisecond lease rounds up.
        let lease_ms = self.lease.as_millis().max(1) as u64;
        let deadline = Instant::now() + wait;
        let mut redis = self.redis.clone();
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(lease_ms)
                .query_async(&mut redis)
                .await?;
            if set.is_some() {
                return Ok(Some(Taken {
                    redis,
                    key: key.to_owned(),
                    token,
                    #[cfg(feature = "fault-injection")]
                    faults: self.faults.clone(),
                }));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let pause = Duration::from_millis(rand::rng().random_range(RETRY_PAUSE_MS));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }
}

impl Taken {
    /// `DEL` without any check: `Released` when a key was removed (whoever's
    /// it was: this step cannot tell), `Expired` when none was there.
    #[cfg(feature = "teaching")]
    pub(crate) async fn delete(&mut self) -> Result<Release, LockError> {
        let deleted: u64 = redis::AsyncCommands::del(&mut self.redis, &self.key).await?;
        Ok(if deleted == 1 {
            Release::Released
        } else {
            Release::Expired
        })
    }

    /// Runs the fault injected before the deleting command, if any.
    pub(crate) async fn before_delete(&self) {
        #[cfg(feature = "fault-injection")]
        if let Some(pause) = &self.faults.before_delete {
            pause().await;
        }
    }
}
