//! One entry point from settings to a lock: the caller names a mode and its
//! durations, and gets the [`DistributedLock`] without knowing which type runs.

use std::sync::Arc;
use std::time::Duration;

use crate::redis_lua::{LuaUnlock, RedisLuaLock};
#[cfg(feature = "teaching")]
use crate::redis_naive::{DelUnlock, RedisNaiveLock};
#[cfg(feature = "teaching")]
use crate::redis_owner::{GetThenDelUnlock, RedisOwnerLock};
use crate::release_events::ReleaseSource;
use crate::set_nx::SetNx;
#[cfg(feature = "teaching")]
use crate::teaching::{LocalLock, NoLock};
use crate::Connection;
#[cfg(feature = "fault-injection")]
use crate::Faults;
use crate::{
    DistributedLock, Fenced, LockMode, Observer, QuorumLock, ReentrantLock, ReentrantOptions,
    SyncReplicas, Unobserved,
};

/// How [`build`] makes a lock.
#[derive(Clone)]
pub struct Options {
    /// Which lock.
    pub mode: LockMode,
    /// An explicit lease. The simple Redis locks and the quorum locks use
    /// [`Options::DEFAULT_LEASE`] without one; `reentrant` runs its watchdog
    /// instead, and an explicit lease turns the watchdog off.
    pub lease: Option<Duration>,
    /// `reentrant` without an explicit lease: the lease the watchdog keeps
    /// renewing, every third of it, while the holder lives.
    pub watchdog_lease: Duration,
    /// `reentrant`: the watchdog stops renewing after a hold has lasted this
    /// long, so a stuck holder cannot keep a key locked forever.
    pub max_hold: Option<Duration>,
    /// How long an acquisition waits for a busy key; zero fails at once.
    pub wait: Duration,
    /// `multi` and `redlock`: URLs of independent Redis servers.
    pub nodes: Vec<String>,
    /// Wraps the lock in [`Fenced`]: every hold gets a fencing token.
    pub fencing: bool,
    /// Above 0, wraps the lock in [`SyncReplicas`]: a hold is handed out once
    /// this many replicas acknowledged it (single-Redis modes only).
    pub sync_replicas: u32,
    /// How long an acquisition waits for those acknowledgements.
    pub sync_replicas_timeout: Duration,
    /// Fault injection points (see [`Faults`]); none by default.
    #[cfg(feature = "fault-injection")]
    pub faults: Faults,
    /// Receives the lock's events; ignored by default.
    pub observer: Arc<dyn Observer>,
}

impl Options {
    /// Lease of the simple Redis locks and the quorum locks when none is given.
    pub const DEFAULT_LEASE: Duration = Duration::from_millis(10_000);
    /// The watchdog's default lease, Redisson's `lockWatchdogTimeout`.
    pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);
    /// How long an acquisition waits for its replicas by default.
    pub const DEFAULT_SYNC_REPLICAS_TIMEOUT: Duration = Duration::from_millis(1000);

    /// `mode` with the defaults: default leases, no maximum hold, no wait
    /// (a busy key fails at once), no fencing, no faults, no observer.
    pub fn new(mode: LockMode) -> Self {
        Options {
            mode,
            lease: None,
            watchdog_lease: Self::DEFAULT_WATCHDOG_LEASE,
            max_hold: None,
            wait: Duration::ZERO,
            nodes: Vec::new(),
            fencing: false,
            sync_replicas: 0,
            sync_replicas_timeout: Self::DEFAULT_SYNC_REPLICAS_TIMEOUT,
            #[cfg(feature = "fault-injection")]
            faults: Faults::none(),
            observer: Unobserved::shared(),
        }
    }

    /// The lease of the modes that always lease.
    fn fixed_lease(&self) -> Duration {
        self.lease.unwrap_or(Self::DEFAULT_LEASE)
    }

    fn reentrant(&self) -> ReentrantOptions {
        ReentrantOptions {
            lease: self.lease,
            watchdog_lease: self.watchdog_lease,
            max_hold: self.max_hold,
            wait: self.wait,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("mode", &self.mode)
            .field("lease", &self.lease)
            .field("watchdog_lease", &self.watchdog_lease)
            .field("max_hold", &self.max_hold)
            .field("wait", &self.wait)
            .field("nodes", &self.nodes.len())
            .field("fencing", &self.fencing)
            .field("sync_replicas", &self.sync_replicas)
            .field("sync_replicas_timeout", &self.sync_replicas_timeout)
            .finish_non_exhaustive()
    }
}

/// Why [`build`] could not make a lock.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// `multi` and `redlock` need at least one node.
    #[error("lock mode {0} needs independent Redis servers (Options::nodes), none given")]
    NoNodes(LockMode),
    /// Waiting for replicas is for a lock kept on one (replicated) Redis.
    #[error("lock mode {0} keeps no lock on a replicated Redis: it cannot wait for replicas")]
    NoReplicas(LockMode),
    /// A Redis URL did not parse.
    #[error("invalid Redis URL")]
    Redis(#[from] redis::RedisError),
}

/// Builds the lock `options` describe on `redis` (from [`connect`], or any
/// [`Connection`]); `redis_url` lets modes that need a dedicated connection
/// of their own (the release subscription of `reentrant`) open one. Nothing
/// connects yet: connections open on first use.
///
/// With [`Options::sync_replicas`], the lock opens a connection of its own
/// to `redis_url` instead: `WAIT` counts the replicas that have every write
/// sent *on its connection*, so the lock's writes and its `WAIT` share one;
/// and `WAIT` blocks that connection while it waits, which on the shared
/// connection would hold up every other command queued behind it (sessions,
/// ids, scripts). A slow replica then costs acquisitions their wait, and
/// nothing else.
pub fn build(
    options: &Options,
    redis: impl Into<Connection>,
    redis_url: &str,
) -> Result<Arc<dyn DistributedLock>, BuildError> {
    let redis = if options.sync_replicas > 0 && options.mode.uses_main_redis() {
        // A command queued behind a `WAIT` waits for it: its reply may take
        // the `WAIT`'s timeout and a round trip.
        connect(redis_url, options.sync_replicas_timeout + SYNC_REPLY_MARGIN)?
    } else {
        redis.into()
    };
    let set_nx = || {
        SetNx::new(
            redis.clone(),
            options.fixed_lease(),
            options.wait,
            #[cfg(feature = "fault-injection")]
            options.faults.clone(),
        )
    };
    let lock: Arc<dyn DistributedLock> = match options.mode {
        #[cfg(feature = "teaching")]
        LockMode::NoLock => Arc::new(NoLock),
        #[cfg(feature = "teaching")]
        LockMode::Local => Arc::new(LocalLock::new(options.wait)),
        #[cfg(feature = "teaching")]
        LockMode::RedisNaive => Arc::new(RedisNaiveLock::new(set_nx(), DelUnlock)),
        #[cfg(feature = "teaching")]
        LockMode::RedisOwner => Arc::new(RedisOwnerLock::new(set_nx(), GetThenDelUnlock)),
        LockMode::RedisLua => Arc::new(RedisLuaLock::new(set_nx(), LuaUnlock)),
        LockMode::Reentrant => Arc::new(ReentrantLock::observed(
            release_source(redis_url)?,
            redis.clone(),
            options.reentrant(),
            options.observer.clone(),
        )),
        LockMode::Multi => Arc::new(QuorumLock::multi(
            &options.nodes,
            options.fixed_lease(),
            options.wait,
        )?),
        LockMode::Redlock => Arc::new(QuorumLock::redlock(
            &options.nodes,
            options.fixed_lease(),
            options.wait,
        )?),
    };
    let lock: Arc<dyn DistributedLock> = if options.fencing {
        Arc::new(Fenced::observed(
            lock,
            redis.clone(),
            options.observer.clone(),
        ))
    } else {
        lock
    };
    if options.sync_replicas == 0 {
        return Ok(lock);
    }
    if !options.mode.uses_main_redis() {
        return Err(BuildError::NoReplicas(options.mode));
    }
    // Outermost, so that the fencing counter's write is waited for too.
    Ok(Arc::new(SyncReplicas::new(
        lock,
        redis,
        options.sync_replicas,
        options.sync_replicas_timeout,
    )))
}

/// What a reply on the connection of a lock that waits for replicas may
/// take beyond the `WAIT`'s own timeout.
const SYNC_REPLY_MARGIN: Duration = Duration::from_secs(1);

/// The scheme of a Redis Cluster URL: `redis+cluster://host:port,host:port`.
const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The seed nodes of a Redis Cluster URL (`redis+cluster://h1:p1,h2:p2,...`,
/// each `[user:password@]host:port`) as `redis://` URLs; `None` for a URL of
/// one server.
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let nodes = url.strip_prefix(CLUSTER_SCHEME)?;
    Some(
        nodes
            .split(',')
            .map(|node| format!("redis://{}", node.trim().trim_end_matches('/')))
            .collect(),
    )
}

/// Where the release subscription of `reentrant` connects: the server, or
/// on a cluster its seed nodes (sharded pub/sub, each channel on the master
/// of its lock's slot).
fn release_source(redis_url: &str) -> redis::RedisResult<ReleaseSource> {
    match cluster_nodes(redis_url) {
        #[cfg(feature = "cluster")]
        Some(nodes) => nodes
            .into_iter()
            .map(redis::IntoConnectionInfo::into_connection_info)
            .collect::<redis::RedisResult<_>>()
            .map(ReleaseSource::Cluster),
        #[cfg(not(feature = "cluster"))]
        Some(_) => Err(no_cluster_support()),
        None => redis::Client::open(redis_url).map(ReleaseSource::from),
    }
}

/// A `redis+cluster://` URL given to a build without the `cluster` feature.
#[cfg(not(feature = "cluster"))]
fn no_cluster_support() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "a Redis Cluster URL needs hmdp-lock's `cluster` feature",
    ))
}

/// The shared connection to the Redis at `url`: one server
/// (`redis://host:port/db`, [`connection_manager`]) or a Redis Cluster
/// (`redis+cluster://host:port,host:port,...`: any of its nodes, the rest is
/// discovered), never waiting longer than `timeout` to connect or for a
/// reply. Connects on first use.
pub fn connect(url: &str, timeout: Duration) -> redis::RedisResult<Connection> {
    match cluster_nodes(url) {
        #[cfg(feature = "cluster")]
        Some(nodes) => Ok(redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            // A failover answers MOVED until the slot map is refreshed, and
            // a MOVED followed counts as a retry: a few, quickly.
            .retries(3)
            .max_retry_wait(200)
            .build()?
            .into()),
        #[cfg(not(feature = "cluster"))]
        Some(_) => Err(no_cluster_support()),
        None => connection_manager(url, timeout).map(Connection::from),
    }
}

/// A connection for the locks to share: it reconnects by itself, and never
/// waits longer than `timeout` to connect or for a reply, so that a dead or
/// frozen Redis turns into a prompt error for the holder instead of a wait
/// that outlasts its lease. Connects on first use.
pub fn connection_manager(
    url: &str,
    timeout: Duration,
) -> redis::RedisResult<redis::aio::ConnectionManager> {
    timed_connection(redis::Client::open(url)?, timeout, 1)
}

/// [`connection_manager`] on `client`, retrying a failed command `retries`
/// times: a quorum round, bounded by its own deadline, retries none.
pub(crate) fn timed_connection(
    client: redis::Client,
    timeout: Duration,
    retries: usize,
) -> redis::RedisResult<redis::aio::ConnectionManager> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(retries)
        .set_max_delay(Duration::from_millis(200));
    redis::aio::ConnectionManager::new_lazy_with_config(client, config)
}
