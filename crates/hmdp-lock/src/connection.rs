//! The Redis connection a lock sends its commands on: a reconnecting
//! connection per thread ([`PerThread`]), what a service wants, redis-rs's
//! reconnecting [`ConnectionManager`] or a plain [`MultiplexedConnection`],
//! for a caller that already has one, or a Redis Cluster connection, which
//! routes each command to the master of its key's slot. [`connect`] opens
//! the one a URL names, [`connection_manager`] a reconnecting one to one
//! server, [`cluster_nodes`] reads a Redis Cluster URL.

mod per_thread;

#[cfg(feature = "cluster")]
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClient;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

#[cfg(feature = "cluster")]
use tokio::sync::OnceCell;

pub use per_thread::PerThread;

/// Where a lock's commands go. Cloning shares the connection, as cloning
/// each of redis-rs's types does; build one with `.into()` or [`connect`].
///
/// A `ConnectionManager` reconnects by itself after Redis restarts or a
/// socket breaks, at the price of a little work per command (it looks up
/// the current connection and awaits it); a `MultiplexedConnection` skips
/// that, and once its socket breaks every later command fails. Either is
/// driven by one thread, which the others wake for each command and its
/// reply; `PerThread` gives each thread its own.
#[derive(Clone)]
pub enum Connection {
    /// A reconnecting connection per thread.
    PerThread(PerThread),
    /// Reconnects by itself.
    Reconnecting(ConnectionManager),
    /// Fails for good once its socket breaks.
    Multiplexed(MultiplexedConnection),
    /// A Redis Cluster: follows `MOVED` / `ASK` redirections and refreshes
    /// its slot map after a failover by itself (feature `cluster`).
    #[cfg(feature = "cluster")]
    Cluster(LazyCluster),
}

/// A cluster connection opened on first use, as a `ConnectionManager` is:
/// building a lock (or a node) must not need Redis up, nor an `.await`.
/// Clones share the one connection.
#[cfg(feature = "cluster")]
#[derive(Clone)]
pub struct LazyCluster {
    /// One allocation shared by the clones (and a small enum variant).
    shared: Arc<(ClusterClient, OnceCell<ClusterConnection>)>,
}

#[cfg(feature = "cluster")]
impl LazyCluster {
    fn new(client: ClusterClient) -> Self {
        LazyCluster {
            shared: Arc::new((client, OnceCell::new())),
        }
    }

    /// The shared connection, opened by the first caller (a failed attempt
    /// leaves the cell empty, so the next caller tries again).
    async fn connection(&self) -> redis::RedisResult<ClusterConnection> {
        let (client, connection) = &*self.shared;
        connection
            .get_or_try_init(|| client.get_async_connection())
            .await
            .cloned()
    }
}

impl From<ConnectionManager> for Connection {
    fn from(connection: ConnectionManager) -> Self {
        Connection::Reconnecting(connection)
    }
}

impl From<MultiplexedConnection> for Connection {
    fn from(connection: MultiplexedConnection) -> Self {
        Connection::Multiplexed(connection)
    }
}

#[cfg(feature = "cluster")]
impl From<ClusterClient> for Connection {
    fn from(client: ClusterClient) -> Self {
        Connection::Cluster(LazyCluster::new(client))
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::PerThread(connection) => connection.req_packed_command(cmd),
            Connection::Reconnecting(connection) => connection.req_packed_command(cmd),
            Connection::Multiplexed(connection) => connection.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => {
                Box::pin(async move { cluster.connection().await?.req_packed_command(cmd).await })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::PerThread(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Connection::Reconnecting(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Connection::Multiplexed(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => Box::pin(async move {
                cluster
                    .connection()
                    .await?
                    .req_packed_commands(pipeline, offset, count)
                    .await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::PerThread(connection) => connection.get_db(),
            Connection::Reconnecting(connection) => connection.get_db(),
            Connection::Multiplexed(connection) => connection.get_db(),
            // A cluster has database 0 only.
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => 0,
        }
    }
}

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

/// The Redis a lock runs on: one server, or the seed nodes of a Redis
/// Cluster. [`LockBuilder::build`](crate::LockBuilder::build) connects to it,
/// and `reentrant`'s release subscription too.
#[derive(Clone)]
pub enum RedisSource {
    /// One server: classic pub/sub for the release notices.
    Server(redis::Client),
    /// A Redis Cluster (any of its nodes; the rest is discovered): sharded
    /// pub/sub for the release notices (feature `cluster`).
    #[cfg(feature = "cluster")]
    Cluster(Vec<redis::ConnectionInfo>),
}

impl RedisSource {
    /// The source that hears what the release script announces on
    /// `commands`: a cluster connection's releases are `SPUBLISH`ed, which
    /// only a sharded subscription hears, so a server's client given for
    /// one becomes a seed node of a sharded subscription. (The other way
    /// round, a sharded subscription cannot be opened on one server, and
    /// waiters poll.)
    pub(crate) fn matching(self, commands: &Connection) -> RedisSource {
        match (self, commands) {
            #[cfg(feature = "cluster")]
            (RedisSource::Server(client), Connection::Cluster(_)) => {
                RedisSource::Cluster(vec![client.get_connection_info().clone()])
            }
            (source, _) => source,
        }
    }
}

impl From<redis::Client> for RedisSource {
    fn from(client: redis::Client) -> Self {
        RedisSource::Server(client)
    }
}

impl RedisSource {
    /// The Redis at `url`: one server (`redis://host:port/db`) or a Redis
    /// Cluster (`redis+cluster://host:port,host:port,...`: any of its nodes,
    /// the rest is discovered).
    pub fn from_url(url: &str) -> redis::RedisResult<RedisSource> {
        match cluster_nodes(url) {
            #[cfg(feature = "cluster")]
            Some(nodes) => nodes
                .into_iter()
                .map(redis::IntoConnectionInfo::into_connection_info)
                .collect::<redis::RedisResult<_>>()
                .map(RedisSource::Cluster),
            #[cfg(not(feature = "cluster"))]
            Some(_) => Err(no_cluster_support()),
            None => redis::Client::open(url).map(RedisSource::from),
        }
    }
}

/// A connection to `source` that waits no longer than `timeout` to connect
/// or for a reply, and connects on first use.
pub(crate) fn open(source: &RedisSource, timeout: Duration) -> redis::RedisResult<Connection> {
    match source {
        #[cfg(feature = "cluster")]
        RedisSource::Cluster(nodes) => Ok(redis::cluster::ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            // A failover answers MOVED until the slot map is refreshed, and
            // a MOVED followed counts as a retry: a few, quickly.
            .retries(3)
            .max_retry_wait(200)
            .build()?
            .into()),
        RedisSource::Server(client) => Ok(Connection::PerThread(PerThread::new(
            client.clone(),
            timed_config(timeout, 1),
        ))),
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
/// (`redis://host:port/db`, a [`connection_manager`] per thread) or a Redis
/// Cluster (`redis+cluster://host:port,host:port,...`: any of its nodes, the
/// rest is discovered), never waiting longer than `timeout` to connect or
/// for a reply. Connects on first use.
pub fn connect(url: &str, timeout: Duration) -> redis::RedisResult<Connection> {
    open(&RedisSource::from_url(url)?, timeout)
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

/// [`connection_manager`] on `client`, trying `retries` more times to
/// connect: a quorum round, bounded by its own deadline, tries once.
pub(crate) fn timed_connection(
    client: redis::Client,
    timeout: Duration,
    retries: usize,
) -> redis::RedisResult<redis::aio::ConnectionManager> {
    redis::aio::ConnectionManager::new_lazy_with_config(client, timed_config(timeout, retries))
}

/// A reconnecting connection's settings: no longer than `timeout` to
/// connect or for a reply, `retries` more attempts to connect.
fn timed_config(timeout: Duration, retries: usize) -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(retries)
        .set_max_delay(Duration::from_millis(200))
}
