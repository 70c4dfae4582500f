//! What hmdp's tests and tools share: the servers they run against, a
//! database and a Redis key prefix of their own, private redis-servers, child
//! processes killed on drop, free ports, and the `hmdp` binary. It depends on
//! neither the product nor the lock crate, so both can test with it.

use std::net::TcpListener;

/// The `hmdp` executable for tests outside the package that builds it.
pub mod binary;
/// A uniquely named database of its own on a MySQL server, dropped with it.
pub mod database;
/// Child processes that log to a file and are killed when dropped.
pub mod process;
/// A Redis key prefix of its own, its keys removed when dropped.
pub mod redis_keys;
/// Private `redis-server` processes on free ports.
pub mod redis_server;

pub use binary::hmdp_binary;
pub use database::TestDatabase;
pub use process::{ChildProcess, Stdout};
pub use redis_keys::{remove_keys_with_prefix, RedisNamespace};
pub use redis_server::RedisServer;

/// The MySQL server tests create their databases on (`TEST_MYSQL_URL`, no
/// database in the path).
pub fn mysql_server_url() -> String {
    std::env::var("TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// The shared Redis tests run on (`TEST_REDIS_URL`), each under a prefix of
/// its own: never flushed.
pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// Distinct local ports that were free a moment ago: all are held open until
/// each is chosen, so the kernel cannot hand out one twice. Another process
/// may still take one before the caller binds it; nothing can prevent that
/// short of passing the bound socket on.
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}
