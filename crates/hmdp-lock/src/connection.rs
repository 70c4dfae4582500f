//! The Redis connection a lock sends its commands on: redis-rs's
//! reconnecting [`ConnectionManager`], what a service wants, a plain
//! [`MultiplexedConnection`], for a caller that already has one, or a Redis
//! Cluster connection, which routes each command to the master of its key's
//! slot.

#[cfg(feature = "cluster")]
use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClient;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
#[cfg(feature = "cluster")]
use tokio::sync::OnceCell;

/// Where a lock's commands go. Cloning shares the connection, as cloning
/// each of redis-rs's types does; build one with `.into()` or [`connect`].
///
/// [`connect`]: crate::connect
///
/// A `ConnectionManager` reconnects by itself after Redis restarts or a
/// socket breaks, at the price of a little work per command (it looks up
/// the current connection and awaits it); a `MultiplexedConnection` skips
/// that, and once its socket breaks every later command fails.
#[derive(Clone)]
pub enum Connection {
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
    pub fn new(client: ClusterClient) -> Self {
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
            Connection::Reconnecting(connection) => connection.get_db(),
            Connection::Multiplexed(connection) => connection.get_db(),
            // A cluster has database 0 only.
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => 0,
        }
    }
}
