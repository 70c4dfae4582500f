//! One entry point from settings to a lock, [`LockBuilder`]: the caller
//! names a mode and what applies to it, and gets the [`DistributedLock`]
//! without knowing which type runs.

use std::sync::Arc;
use std::time::Duration;

use crate::connection::RedisSource;
use crate::connection::{open, Connection};
#[cfg(feature = "fault-injection")]
use crate::faults::Faults;
use crate::fencing::Fenced;
#[cfg(feature = "teaching")]
use crate::local::LocalLock;
use crate::lock::{BuildError, DistributedLock};
use crate::mode::LockMode;
#[cfg(feature = "teaching")]
use crate::none::NoLock;
use crate::observer::{Observer, Unobserved};
use crate::quorum::QuorumLock;
use crate::redis_lua::{LuaUnlock, RedisLuaLock};
#[cfg(feature = "teaching")]
use crate::redis_naive::{DelUnlock, RedisNaiveLock};
#[cfg(feature = "teaching")]
use crate::redis_owner::{GetThenDelUnlock, RedisOwnerLock};
use crate::reentrant::{ReentrantLock, ReentrantOptions};
use crate::replicated::SyncReplicas;
use crate::set_nx::SetNx;

/// How to make a lock: its mode, then what applies to it, one method each;
/// [`build`](Self::build) makes it on a Redis (a `redis::Client`, or a Redis
/// Cluster's nodes: a [`RedisSource`]), on a connection of its own or, with
/// [`sharing`](Self::sharing), on one the caller already has.
///
/// ```
/// use std::time::Duration;
///
/// use hmdp_lock::LockBuilder;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = redis::Client::open("redis://127.0.0.1:6379/0")?;
/// // Nothing connects until the first acquisition.
/// let lock = LockBuilder::reentrant()
///     .wait(Duration::from_millis(100))
///     .max_hold(Duration::from_secs(60))
///     .fencing(true)
///     .build(redis)?;
/// # let _ = lock;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockBuilder {
    mode: LockMode,
    lease: Option<Duration>,
    watchdog_lease: Option<Duration>,
    max_hold: Option<Duration>,
    wait: Duration,
    nodes: Vec<String>,
    fencing: bool,
    sync_replicas: u32,
    sync_replicas_timeout: Duration,
    reply_timeout: Duration,
    /// The caller's connection the lock sends its commands on, if any.
    shared: Option<Connection>,
    #[cfg(feature = "fault-injection")]
    faults: Faults,
    observer: Arc<dyn Observer>,
}

impl LockBuilder {
    /// Lease of the simple Redis locks and the quorum locks when none is given.
    pub const DEFAULT_LEASE: Duration = Duration::from_millis(10_000);
    /// The watchdog's default lease, Redisson's `lockWatchdogTimeout`.
    pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);
    /// How long an acquisition waits for its replicas by default.
    pub const DEFAULT_SYNC_REPLICAS_TIMEOUT: Duration = Duration::from_millis(1000);
    /// How long a connection [`build`](Self::build) opens waits to connect
    /// or for a reply by default.
    pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(2);

    /// A lock of `mode` with the defaults: default leases, no maximum hold,
    /// no wait (a busy key fails at once), no fencing, no observer.
    pub fn new(mode: LockMode) -> Self {
        LockBuilder {
            mode,
            lease: None,
            watchdog_lease: None,
            max_hold: None,
            wait: Duration::ZERO,
            nodes: Vec::new(),
            fencing: false,
            sync_replicas: 0,
            sync_replicas_timeout: Self::DEFAULT_SYNC_REPLICAS_TIMEOUT,
            reply_timeout: Self::DEFAULT_REPLY_TIMEOUT,
            shared: None,
            #[cfg(feature = "fault-injection")]
            faults: Faults::none(),
            observer: Unobserved::shared(),
        }
    }

    /// `reentrant`: Redisson's `RLock`, with pub/sub waiting and a watchdog.
    pub fn reentrant() -> Self {
        Self::new(LockMode::Reentrant)
    }

    /// `redis-lua`: `SET NX PX` and a compare-and-delete release.
    pub fn redis_lua() -> Self {
        Self::new(LockMode::RedisLua)
    }

    /// `multi`: all of these independent Redis servers (`redis://` URLs).
    pub fn multi(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::new(LockMode::Multi).nodes(nodes)
    }

    /// `redlock`: a majority of these independent Redis servers, within a
    /// validity time.
    pub fn redlock(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::new(LockMode::Redlock).nodes(nodes)
    }

    /// `multi` and `redlock`: the URLs of their independent Redis servers.
    pub fn nodes(mut self, nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.nodes = nodes.into_iter().map(Into::into).collect();
        self
    }

    /// How long an acquisition waits for a busy key by default; zero (the
    /// default) fails at once. A call may wait otherwise
    /// ([`DistributedLock::acquire_within`]).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// An explicit lease. The simple Redis locks and the quorum locks use
    /// [`DEFAULT_LEASE`](Self::DEFAULT_LEASE) without one; `reentrant` runs
    /// its watchdog instead, and an explicit lease turns the watchdog off.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// `reentrant` without an explicit lease: the lease the watchdog keeps
    /// renewing, every third of it, while the hold lives
    /// ([`DEFAULT_WATCHDOG_LEASE`](Self::DEFAULT_WATCHDOG_LEASE) by default).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.watchdog_lease = Some(lease);
        self
    }

    /// `reentrant` without an explicit lease: the watchdog stops renewing
    /// after a hold has lasted this long, so a stuck holder cannot keep a key locked forever.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Wraps the lock in [`Fenced`]: every hold gets a fencing token.
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// Wraps the lock in [`SyncReplicas`]: a hold is handed out once
    /// `replicas` replicas acknowledged it, waiting up to `timeout` (modes
    /// kept on one replicated Redis only; 0 replicas: no waiting).
    pub fn sync_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.sync_replicas = replicas;
        self.sync_replicas_timeout = timeout;
        self
    }

    /// How long the connections the lock opens itself wait to connect or
    /// for a reply ([`DEFAULT_REPLY_TIMEOUT`](Self::DEFAULT_REPLY_TIMEOUT)).
    pub fn reply_timeout(mut self, timeout: Duration) -> Self {
        self.reply_timeout = timeout;
        self
    }

    /// Receives the lock's events ([`Observer`]); ignored by default.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Fault injection points (see [`Faults`]); none by default.
    #[cfg(feature = "fault-injection")]
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The mode this builder makes.
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// The lease of the modes that always lease.
    fn fixed_lease(&self) -> Duration {
        self.lease.unwrap_or(Self::DEFAULT_LEASE)
    }

    fn reentrant_options(&self) -> ReentrantOptions {
        ReentrantOptions {
            lease: self.lease,
            watchdog_lease: self.watchdog_lease.unwrap_or(Self::DEFAULT_WATCHDOG_LEASE),
            max_hold: self.max_hold,
            wait: self.wait,
        }
    }

    /// Sends the lock's commands on `connection`, which the caller shares
    /// with its other commands, instead of a connection of the lock's own.
    /// [`build`](Self::build)'s Redis must be the same Redis: the lock still
    /// opens a connection of its own for the release subscription of
    /// `reentrant`, and for its commands when it waits for replicas
    /// ([`sync_replicas`](Self::sync_replicas)): `WAIT` counts the replicas
    /// that have every write sent *on its connection*, so the lock's writes
    /// and its `WAIT` share one; and `WAIT` blocks that connection while it
    /// waits, which on the shared connection would hold up every other
    /// command queued behind it. A slow replica then costs acquisitions
    /// their wait, and nothing else. Modes that send nothing to that Redis
    /// (`local`, `none`, the quorum modes without fencing) leave it unused.
    pub fn sharing(mut self, connection: impl Into<Connection>) -> Self {
        self.shared = Some(connection.into());
        self
    }

    /// Builds the lock on `redis`: on the connection given to
    /// [`sharing`](Self::sharing), else on a connection of its own (a
    /// reconnecting one, or a cluster connection) that waits no longer than
    /// the reply timeout. Nothing connects yet: connections open on first
    /// use. Call it inside a Tokio runtime (the reconnecting connection
    /// starts a task of its own).
    pub fn build(
        &self,
        redis: impl Into<RedisSource>,
    ) -> Result<Arc<dyn DistributedLock>, BuildError> {
        self.ensure_used()?;
        let source = redis.into();
        let redis = match &self.shared {
            // A command queued behind a `WAIT` waits for it: its reply may
            // take the `WAIT`'s timeout and a round trip.
            _ if self.sync_replicas > 0 && self.mode.uses_main_redis() => {
                open(&source, self.sync_replicas_timeout + SYNC_REPLY_MARGIN)?
            }
            Some(shared) => shared.clone(),
            None => open(&source, self.reply_timeout)?,
        };
        let set_nx = || {
            SetNx::new(
                redis.clone(),
                self.fixed_lease(),
                self.wait,
                #[cfg(feature = "fault-injection")]
                self.faults.clone(),
            )
        };
        let lock: Arc<dyn DistributedLock> = match self.mode {
            #[cfg(feature = "teaching")]
            LockMode::NoLock => Arc::new(NoLock),
            #[cfg(feature = "teaching")]
            LockMode::Local => Arc::new(LocalLock::new(self.wait)),
            #[cfg(feature = "teaching")]
            LockMode::RedisNaive => Arc::new(RedisNaiveLock::new(set_nx(), DelUnlock)),
            #[cfg(feature = "teaching")]
            LockMode::RedisOwner => Arc::new(RedisOwnerLock::new(set_nx(), GetThenDelUnlock)),
            LockMode::RedisLua => Arc::new(RedisLuaLock::new(set_nx(), LuaUnlock)),
            LockMode::Reentrant => Arc::new(ReentrantLock::observed(
                source,
                redis.clone(),
                self.reentrant_options(),
                self.observer.clone(),
            )),
            LockMode::Multi => Arc::new(QuorumLock::multi(
                &self.nodes,
                self.fixed_lease(),
                self.wait,
            )?),
            LockMode::Redlock => Arc::new(QuorumLock::redlock(
                &self.nodes,
                self.fixed_lease(),
                self.wait,
            )?),
        };
        let lock: Arc<dyn DistributedLock> = if self.fencing {
            Arc::new(Fenced::observed(lock, redis.clone(), self.observer.clone()))
        } else {
            lock
        };
        if self.sync_replicas == 0 {
            return Ok(lock);
        }
        if !self.mode.uses_main_redis() {
            return Err(BuildError::NoReplicas(self.mode));
        }
        // Outermost, so that the fencing counter's write is waited for too.
        Ok(Arc::new(SyncReplicas::new(
            lock,
            redis,
            self.sync_replicas,
            self.sync_replicas_timeout,
        )))
    }
}

impl LockBuilder {
    /// Refuses a setting the mode would ignore: a lock built with one is
    /// not the lock its caller described.
    fn ensure_used(&self) -> Result<(), BuildError> {
        let mode = self.mode;
        let watchdog = mode == LockMode::Reentrant && self.lease.is_none();
        let quorum = matches!(mode, LockMode::Multi | LockMode::Redlock);
        let ignored = [
            ("nodes", !self.nodes.is_empty() && !quorum),
            ("watchdog_lease", self.watchdog_lease.is_some() && !watchdog),
            ("max_hold", self.max_hold.is_some() && !watchdog),
            (
                "lease",
                self.lease.is_some() && !mode.uses_main_redis() && !quorum,
            ),
        ];
        match ignored.into_iter().find(|(_, ignored)| *ignored) {
            Some((setting, _)) => Err(BuildError::Ignored { mode, setting }),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for LockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockBuilder")
            .field("mode", &self.mode)
            .field("lease", &self.lease)
            .field("watchdog_lease", &self.watchdog_lease)
            .field("max_hold", &self.max_hold)
            .field("wait", &self.wait)
            .field("nodes", &self.nodes.len())
            .field("fencing", &self.fencing)
            .field("sync_replicas", &self.sync_replicas)
            .field("sync_replicas_timeout", &self.sync_replicas_timeout)
            .field("reply_timeout", &self.reply_timeout)
            .field("sharing", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}

/// What a reply on the connection of a lock that waits for replicas may
/// take beyond the `WAIT`'s own timeout.
const SYNC_REPLY_MARGIN: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    const SOON: Duration = Duration::from_millis(500);

    #[tokio::test]
    async fn a_setting_the_mode_ignores_is_refused() {
        // Nothing connects while building: no server need listen here.
        let redis = || redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let node = ["redis://127.0.0.1:1/"];
        let refused = [
            (LockBuilder::redis_lua().max_hold(SOON), "max_hold"),
            (
                LockBuilder::redis_lua().watchdog_lease(SOON),
                "watchdog_lease",
            ),
            (
                LockBuilder::reentrant().lease(SOON).max_hold(SOON),
                "max_hold",
            ),
            (LockBuilder::reentrant().nodes(node), "nodes"),
            (
                LockBuilder::multi(node).watchdog_lease(SOON),
                "watchdog_lease",
            ),
        ];
        for (builder, ignored) in refused {
            match builder.build(redis()).err() {
                Some(BuildError::Ignored { setting, .. }) => assert_eq!(setting, ignored),
                other => panic!("{builder:?}: {other:?}, not {ignored} refused"),
            }
        }
        let used = [
            LockBuilder::reentrant().watchdog_lease(SOON).max_hold(SOON),
            LockBuilder::reentrant().lease(SOON),
            LockBuilder::redis_lua().lease(SOON),
            LockBuilder::redlock(node).lease(SOON),
        ];
        for builder in used {
            assert!(builder.build(redis()).is_ok(), "{builder:?}");
        }
    }
}
