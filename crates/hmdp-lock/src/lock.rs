//! The lock's vocabulary, what every mode implements and every caller
//! uses: [`DistributedLock`], [`LockGuard`], [`Release`] and [`LockError`],
//! with the two steps every layer around a lock shares.

use std::time::Duration;

use async_trait::async_trait;

use crate::mode::LockMode;
use crate::observer::LostReason;
use crate::owner::Holder;

/// Something that went wrong talking to the lock's backing store, or a hold
/// that turned out to be gone before the work under it committed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Redis could not be reached or refused a command.
    #[error("lock backend unreachable")]
    Redis(#[from] redis::RedisError),
    /// A lock script answered with a code it is not documented to return.
    #[error("lock script returned unexpected code {0}")]
    UnexpectedReply(i64),
    /// The lease ran out, a renewal found the key gone, or a newer holder
    /// minted a later fencing token: work done under the lock must not commit.
    #[error("the lock was lost while held: {0}")]
    Lost(LostReason),
    /// Fewer replicas than asked for acknowledged the lock in time (see
    /// [`SyncReplicas`](crate::SyncReplicas)); the hold was given back.
    #[error("the lock reached {acked} replica(s) of the {wanted} asked for in time")]
    NotReplicated {
        /// Replicas that acknowledged within the timeout.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },
}

/// What a release actually did: a release is not always clean, and the
/// failures of the weaker locks show up exactly here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The lock was ours and is now free.
    Released,
    /// A reentrant hold was given back, but the holder still holds the key
    /// this many more times (an outer acquisition is still running).
    StillHeld(u32),
    /// The key was already gone: our lease expired before we released.
    Expired,
    /// Somebody else holds the key now; we left it alone.
    NotOwner,
}

impl Release {
    /// A clean release gave back a lock that was still ours.
    pub fn is_clean(self) -> bool {
        matches!(self, Release::Released | Release::StillHeld(_))
    }
}

/// A lock guarding one key per holder: what every mode implements, so the
/// code that takes a lock does not know which mode runs.
#[async_trait]
pub trait DistributedLock: Send + Sync {
    /// The mode this lock implements.
    fn mode(&self) -> LockMode;

    /// How long [`acquire`](Self::acquire) and
    /// [`acquire_as`](Self::acquire_as) wait for a busy key before they
    /// answer `Ok(None)` (zero: they try once, hmdp's `tryLock()`).
    fn wait(&self) -> Duration;

    /// Takes `key` as `holder`, waiting up to `wait` for it to be free.
    /// `Ok(None)` means the key stayed busy for the whole wait (hmdp's failed
    /// `tryLock()`). Only reentrant locks look at the holder: the others hand
    /// out a fresh identity each time, so a holder that already holds the key
    /// waits for itself, as the course's non-reentrant lock does.
    async fn acquire_as_within(
        &self,
        holder: Holder,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError>;

    /// Takes `key` as `holder`, waiting the lock's default [`wait`](Self::wait).
    async fn acquire_as(
        &self,
        holder: Holder,
        key: &str,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        self.acquire_as_within(holder, key, self.wait()).await
    }

    /// Takes `key` for a new holder, waiting up to `wait`.
    async fn acquire_within(
        &self,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        self.acquire_as_within(Holder::new(), key, wait).await
    }

    /// Takes `key` for a new holder, waiting the lock's default
    /// [`wait`](Self::wait).
    async fn acquire(&self, key: &str) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        self.acquire_within(key, self.wait()).await
    }
}

/// One holder's hold on one key. Releasing consumes it, so a holder cannot
/// release twice. Implemented by this crate's guards only (sealed).
#[async_trait]
pub trait LockGuard: sealed::InKey + Send + Sync {
    /// Gives the hold back and tells what that did. Every release returns
    /// what happened; a hold dropped without one is released in the
    /// background instead.
    async fn release(self: Box<Self>) -> Result<Release, LockError>;

    /// The fencing token minted for this hold (see [`Fenced`](crate::Fenced)): storage that
    /// records it refuses writes carrying an older one.
    fn fencing_token(&self) -> Option<u64> {
        None
    }

    /// The last check before committing work done under the lock:
    /// `Err(LockError::Lost)` when this hold is known to be gone. Modes that
    /// cannot tell (a plain lease nobody watches) always answer `Ok`.
    async fn ensure_held(&self) -> Result<(), LockError> {
        Ok(())
    }
}

/// What the crate's guards tell its layers and nobody else: a private
/// module's trait, which also keeps [`LockGuard`] implemented here only.
pub(crate) mod sealed {
    pub trait InKey {
        /// How this hold appears in the lock's own Redis key, for a check
        /// made in the same script as another step (fencing): the value of
        /// a `SET NX` key, the field of a reentrant hash. `None` when the
        /// lock keeps no such key on the main Redis (`none`, `local`,
        /// `multi`, `redlock`).
        fn owner_in_key(&self) -> Option<&str> {
            None
        }
    }
}

/// Gives back a hold that a layer around a lock will not hand out (it
/// could not fence it, or replicate it), and returns why not: the caller's
/// error, whatever the release found.
pub(crate) async fn refuse(held: Box<dyn LockGuard>, why: LockError) -> LockError {
    if let Err(error) = held.release().await {
        tracing::warn!(%error, refused = %why, "cannot give back a refused hold");
    }
    why
}

/// Gives back, in the background, the hold of a guard dropped without a
/// release (a panic, a cancelled task), so that its key is free at once
/// instead of after its lease. Without a runtime (the process shutting
/// down) the lease frees the key.
pub(crate) fn release_dropped<F>(key: String, release: F)
where
    F: std::future::Future<Output = Result<Release, LockError>> + Send + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        match release.await {
            Ok(outcome) if outcome.is_clean() => {}
            Ok(outcome) => {
                tracing::warn!(?outcome, %key, "dropped lock guard: release was not clean")
            }
            Err(error) => tracing::warn!(%error, %key, "dropped lock guard: release failed"),
        }
    });
}

/// Why a lock could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// `multi` and `redlock` need at least one node.
    #[error("lock mode {0} needs independent Redis servers (LockBuilder::nodes), none given")]
    NoNodes(LockMode),
    /// Waiting for replicas is for a lock kept on one (replicated) Redis.
    #[error("lock mode {0} keeps no lock on a replicated Redis: it cannot wait for replicas")]
    NoReplicas(LockMode),
    /// A setting the mode does not use: `nodes` but for `multi` and
    /// `redlock`, `watchdog_lease` and `max_hold` but for `reentrant`
    /// without an explicit lease, a `lease` for a lock kept in no Redis.
    #[error("lock mode {mode} does not use the setting {setting}")]
    Ignored {
        /// The mode built.
        mode: LockMode,
        /// The builder method of the setting.
        setting: &'static str,
    },
    /// A Redis URL did not parse.
    #[error("invalid Redis URL")]
    Redis(#[from] redis::RedisError),
}
