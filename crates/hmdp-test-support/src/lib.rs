//! What hmdp's tests and tools share: the servers they run against, a
//! database and a Redis key prefix of their own, private redis-servers, child
//! processes killed on drop (nodes among them), free ports, and the
//! tables as a test reads and breaks them. It depends on
//! neither the product nor the lock crate, so both can test with it.

use std::future::Future;
use std::net::TcpListener;
use std::time::Duration;

pub mod database;
pub mod mariadb_server;
pub mod node;
pub mod process;
pub mod redis_cluster;
pub mod redis_keys;
pub mod redis_server;
pub mod tables;
pub mod tcp_proxy;

pub use database::TestDatabase;
pub use mariadb_server::MariaDbServer;
pub use node::{NodeCommand, NodeProcess, Probe};
pub use process::{moving_if_taken, port_was_taken, send_signal, ChildProcess, Stdout};
pub use redis_cluster::RedisCluster;
pub use redis_keys::{remove_keys_with_prefix, RedisNamespace};
pub use redis_server::{calls_in, command_calls, is_master, logged_script_calls, RedisServer};
pub use tables::Tables;
pub use tcp_proxy::{Direction, Faults, Listening, TcpProxy, Verdict};

/// The window of a sale open whenever a test or a load runs: begun long
/// ago, ending years ahead (`yyyy-MM-ddTHH:mm:ss`, as hmdp's API takes it).
pub const OPEN_SALE: (&str, &str) = ("2020-01-01T00:00:00", "2037-12-31T00:00:00");

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

/// The `i`-th phone number valid for hmdp's pattern: `138` and `i` in eight
/// digits (13800000000, 13800000001, ...). The users of the tests and of
/// the load tools log in with these.
pub fn phone(i: usize) -> String {
    format!("138{i:08}")
}

/// Polls `condition` every 10 ms until it holds; panics, saying it was
/// waiting for `what`, if it has not within `within`. For tests that wait for
/// a state instead of sleeping for as long as it usually takes.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, within, || {
        let holds = condition();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// Polls `attempt` every 10 ms until it yields a value, and returns that
/// value; panics, saying it was waiting for `what`, if none came within
/// `within`. [`wait_until`] for a state that is only seen by taking it: a
/// lock that becomes free, taken by the attempt that finds it so.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let found = std::sync::Mutex::new(None);
    let waited = poll_until(what, within, Duration::from_millis(10), || {
        let (attempt, found) = (attempt(), &found);
        async move {
            let value = attempt.await;
            let came = value.is_some();
            *found.lock().expect("not poisoned") = value;
            Ok(came)
        }
    });
    if let Err(error) = waited.await {
        panic!("{error}");
    }
    let value = found.into_inner().expect("not poisoned");
    value.expect("the poll ends once a value came")
}

/// Polls `condition` every `every` until it holds; an error saying it was
/// still waiting for `what` if it has not within `within`, or the
/// condition's own error at once. For a state the servers reach by
/// themselves (a replica in sync, a failover done).
pub async fn poll_until<F, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    mut condition: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !condition().await? {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "still waiting for {what} after {within:?}"
        );
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// Runs `work` to its end on a thread and runtime of its own, for the
/// clean-up in a `Drop`: `drop` cannot await, and it may run inside another
/// runtime's task, where blocking on that runtime would panic.
pub(crate) fn finish_from_drop<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> std::thread::Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the clean-up")
            .block_on(work)
    })
    .join()
}

/// How many times a server is started on ports found free before giving up:
/// another process may take a port between its choice and the server's
/// bind (most often as the local end of an outgoing connection, from the
/// same ephemeral range).
pub const PORT_ATTEMPTS: usize = 5;

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
