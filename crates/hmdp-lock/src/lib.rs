#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

// The source: one file per mode (`none`, `local`, `set_nx` with
// `redis_naive`, `redis_owner` and `redis_lua`, `reentrant/`, `quorum`),
// the `fencing` and `replicated` layers, `lock` (the traits and errors every
// mode shares), `release_events` (the shared pub/sub subscription),
// `scripts` (every Lua script and its reply, parsed once), `owner` (the one
// owner identity), `connection` (the connection a lock sends on and the
// Redis it runs on), `builder`, `mode`, `observer`, `faults` and `keys`.

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
