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
mod lock;
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

pub use builder::LockBuilder;
pub use connection::Connection;
pub use connection::RedisSource;
#[cfg(feature = "fault-injection")]
pub use faults::{Faults, Pause};
pub use fencing::Fenced;
pub use keys::sibling;
pub use lock::{BuildError, DistributedLock, LockError, LockGuard, Release};
pub use mode::LockMode;
pub use observer::{LockEvent, LostReason, Observer, Unobserved};
pub use owner::Holder;
pub use quorum::{NodeReport, QuorumLock, Vote};
pub use reentrant::{ReentrantLock, ReentrantOptions};
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
