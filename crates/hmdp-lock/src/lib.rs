//! Distributed locks on Redis for async Rust (tokio, redis-rs), for code
//! that must do one thing at a time across processes: one purchase per user
//! on two nodes, one cache rebuild per key, one job per tick.
//!
//! A Redis lock is easy to write and easy to get wrong: a release that
//! deletes someone else's key, a lease that runs out under a slow holder
//! who then commits anyway, a waiter that polls Redis in a loop, a holder
//! that calls into code which takes the same lock again. This crate is the
//! lock with those holes closed — Redisson's reentrant lock with pub/sub
//! waiting and a watchdog, fencing tokens, quorum locks — behind one trait,
//! [`DistributedLock`]: [`acquire`](DistributedLock::acquire) a key (or
//! [`acquire_within`](DistributedLock::acquire_within) a wait of the call's
//! own), get a [`LockGuard`], [`release`](LockGuard::release) it and learn
//! what the release did ([`Release`]: released, still held n times, already
//! expired, not the owner). Every wait has a deadline; a guard dropped
//! without a release (a panic, a cancelled task) gives its hold back in the
//! background. [`LockBuilder`] makes the lock a [`LockMode`] names, on a
//! `redis::Client` or a Redis Cluster's nodes ([`RedisSource`]), so the code
//! that takes the lock does not know which one runs.
//!
//! It grew out of a Rust rewrite of the flash-sale backend of the Heima
//! Dianping (黑马点评, "hmdp") course, which walks through every way a
//! per-user purchase lock breaks; the broken locks are here too, behind the
//! `teaching` feature, so their failures can be shown side by side.
//!
//! # Modes
//!
//! | [`LockMode`] | what it is | what it shows |
//! |---|---|---|
//! | `redis-lua` | `SET NX PX`, compare-and-delete in one script | no renewal: a slow holder loses the key |
//! | `reentrant` | Redisson `RLock` ([`ReentrantLock`]) | the fix: see below |
//! | `multi` | all of several independent Redis servers ([`QuorumLock`]) | survives losing a server's writes |
//! | `redlock` | a majority of them, within a validity time | the same, with a server down |
//! | `none` (`teaching`) | no lock (`teaching::NoLock`) | duplicates even on one node |
//! | `local` (`teaching`) | a per-key mutex in this process (`teaching::LocalLock`) | correct on one node, not on two |
//! | `redis-naive` (`teaching`) | `SET NX PX`, release = `DEL` | deletes whoever holds the key |
//! | `redis-owner` (`teaching`) | owner token checked with `GET`, then `DEL` | a gap between check and delete |
//!
//! [`Fenced`] wraps any mode with fencing tokens, [`SyncReplicas`] makes an
//! acquisition wait for replicas (`WAIT`).
//!
//! # Features
//!
//! - `teaching`: the four locks that exist to show a failure (above).
//! - `fault-injection`: `LockBuilder::faults`, pauses a test stops a holder
//!   with inside a release.
//! - `clap`: [`LockMode`] as a `clap::ValueEnum`, for a `--lock` flag.
//!
//! # What it offers that other Rust lock crates lack
//!
//! - **Reentrancy**: a hash of owner → hold count, as Redisson's `RLock`.
//!   The owner is a per-process UUID plus a [`Holder`] value the code passes
//!   down (async tasks hop threads, so no thread id).
//! - **Waiting by pub/sub**: a waiter sleeps until a release message or the
//!   holder's lease, not in a polling loop; one subscription connection
//!   serves every waiter of the process, pinged so a silent one is noticed.
//! - **A watchdog** renewing the lease while the hold lives, **with a maximum
//!   hold time** and a **lost-lock signal**: [`LockGuard::ensure_held`] fails
//!   once a renewal found the key gone or could not reach Redis in time, and
//!   an [`Observer`] hears of it ([`LockEvent::HoldLost`]). Redisson users ask
//!   for these (redisson#4698, #4405, #7272).
//! - **Idempotent release**: a release whose reply was lost is retried and
//!   gets the first attempt's answer, never takes a second hold away.
//! - **Fencing tokens** ([`Fenced`]): monotonic per key, even across the
//!   counter's expiry, minted in the same step that checks the hold.
//! - **Quorum locks** ([`QuorumLock`]): `multi` and RedLock over independent
//!   servers, with a report of what each node said.
//!
//! Every key a script touches beside the lock key is its [`sibling`], in the
//! same Redis Cluster slot.
//!
//! # Example
//!
//! Needs a Redis server (`REDIS_URL`); the crate's `examples/` show
//! reentrancy, fencing, RedLock and an observer the same way.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use hmdp_lock::{Holder, LockBuilder, Release};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
//! let lock = LockBuilder::reentrant()
//!     .wait(Duration::from_millis(100))
//!     .build(redis::Client::open(url.as_str())?)?;
//! let key = format!("doc:{}:lock", std::process::id());
//!
//! // The same holder re-enters; anybody else waits, then gives up.
//! let me = Holder::new();
//! let outer = lock.acquire_as(me, &key).await?.expect("a free key");
//! let inner = lock.acquire_as(me, &key).await?.expect("re-entered");
//! assert!(lock.acquire(&key).await?.is_none(), "busy for another holder");
//!
//! // The watchdog keeps the lease alive; check before committing work.
//! inner.ensure_held().await?;
//! assert_eq!(inner.release().await?, Release::StillHeld(1));
//! assert_eq!(outer.release().await?, Release::Released);
//! # Ok(())
//! # }
//! ```
//!
//! # Modules of the source
//!
//! One file per mode (`none`, `local`, `set_nx` with `redis_naive`,
//! `redis_owner` and `redis_lua`, `reentrant/`, `quorum`), the `fencing`
//! layer, `release_events` (the shared pub/sub subscription), `scripts`
//! (every Lua script and its reply, parsed once), `owner` (the one owner
//! identity), `connection` (the connection a lock sends on), `builder`,
//! `mode`, `observer`, `faults` and `keys`.

#![deny(missing_docs)]

mod builder;
pub mod connection;
#[cfg(feature = "fault-injection")]
mod faults;
mod fencing;
mod keys;
#[cfg(feature = "teaching")]
mod local;
mod mode;
#[cfg(feature = "teaching")]
mod none;
mod observer;
mod owner;
mod quorum;
mod redis_lua;
#[cfg(feature = "teaching")]
mod redis_naive;
#[cfg(feature = "teaching")]
mod redis_owner;
mod reentrant;
mod release_events;
mod replicated;
mod scripts;
mod set_nx;

use std::time::Duration;

use async_trait::async_trait;

pub use builder::{BuildError, LockBuilder};
pub use connection::Connection;
#[cfg(feature = "fault-injection")]
pub use faults::{Faults, Pause};
pub use fencing::Fenced;
pub use keys::sibling;
pub use mode::LockMode;
pub use observer::{LockEvent, LostReason, Observer, Unobserved};
pub use owner::Holder;
pub use quorum::{NodeReport, QuorumLock, Vote};
pub use reentrant::{ReentrantLock, ReentrantOptions};
pub use release_events::RedisSource;
pub use replicated::SyncReplicas;

/// The locks that exist to show how a lock fails (feature `teaching`): no
/// lock at all, and a lock that holds only within one process. The two
/// weaker Redis locks of the course (`redis-naive`, `redis-owner`) are made
/// by [`LockBuilder`] from their [`LockMode`].
#[cfg(feature = "teaching")]
pub mod teaching {
    pub use crate::local::LocalLock;
    pub use crate::none::NoLock;
}

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
    /// [`SyncReplicas`]); the hold was given back.
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
/// release twice.
#[async_trait]
pub trait LockGuard: Send + Sync {
    /// Gives the hold back and tells what that did. Every release returns
    /// what happened; a hold dropped without one is released in the
    /// background instead.
    async fn release(self: Box<Self>) -> Result<Release, LockError>;

    /// The fencing token minted for this hold (see [`Fenced`]): storage that
    /// records it refuses writes carrying an older one.
    fn fencing_token(&self) -> Option<u64> {
        None
    }

    /// How this hold appears in the lock's own Redis key, for a check made
    /// in the same script as another step: the value of a `SET NX` key, the
    /// field of a reentrant hash. `None` when the lock keeps no such key on
    /// the main Redis (`none`, `local`, `multi`, `redlock`).
    fn owner_in_key(&self) -> Option<&str> {
        None
    }

    /// The last check before committing work done under the lock:
    /// `Err(LockError::Lost)` when this hold is known to be gone. Modes that
    /// cannot tell (a plain lease nobody watches) always answer `Ok`.
    async fn ensure_held(&self) -> Result<(), LockError> {
        Ok(())
    }
}

/// Gives back a hold that a layer around a lock will not hand out (it
/// could not fence it, or replicate it), and returns why not: the caller's
/// error, whatever the release found.
async fn refuse(held: Box<dyn LockGuard>, why: LockError) -> LockError {
    if let Err(error) = held.release().await {
        tracing::warn!(%error, refused = %why, "cannot give back a refused hold");
    }
    why
}

/// Gives back, in the background, the hold of a guard dropped without a
/// release (a panic, a cancelled task), so that its key is free at once
/// instead of after its lease. Without a runtime (the process shutting
/// down) the lease frees the key.
fn release_dropped<F>(key: String, release: F)
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
