//! The Redis connection a lock sends its commands on: redis-rs's
//! reconnecting [`ConnectionManager`], what a service wants, or a plain
//! [`MultiplexedConnection`], for a caller that already has one.

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Where a lock's commands go. Cloning shares the connection, as cloning
/// either of redis-rs's types does; build one with `.into()`.
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

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Reconnecting(connection) => connection.req_packed_command(cmd),
            Connection::Multiplexed(connection) => connection.req_packed_command(cmd),
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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Reconnecting(connection) => connection.get_db(),
            Connection::Multiplexed(connection) => connection.get_db(),
        }
    }
}
