//! What hmdp's tests and tools share: the servers they run against, a
//! database and a Redis key prefix of their own, private redis-servers, child
//! processes killed on drop (nodes among them), and free ports. It depends on
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

pub use database::TestDatabase;
pub use mariadb_server::MariaDbServer;
pub use node::{NodeCommand, NodeProcess, Probe};
pub use process::{ChildProcess, Stdout};
pub use redis_cluster::RedisCluster;
pub use redis_keys::{remove_keys_with_prefix, RedisNamespace};
pub use redis_server::{calls_in, command_calls, is_master, RedisServer};

pub fn mysql_server_url() -> String {
    std::env::var("TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

pub fn phone(i: usize) -> String {
    format!("138{i:08}")
}

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
