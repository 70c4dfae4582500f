//! Private `redis-server` processes on free local ports, for the lab
//! scenarios and tests that must kill, restart or replicate Redis without
//! touching the shared server.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::process::send_signal;
use crate::{free_ports, PORT_ATTEMPTS};

/// How long a fresh redis-server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A redis-server child process; killed when dropped.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    extra_args: Vec<String>,
    /// A Redis Cluster node's bus port; `None`: not a cluster node.
    cluster_bus: Option<u16>,
    /// The server's working directory: replication writes RDB files even
    /// with saving off, and they belong in a directory removed with the
    /// server, not wherever the caller runs.
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server on a free port, keeping nothing on disk.
    pub async fn start() -> anyhow::Result<RedisServer> {
        Self::start_with(&[]).await
    }

    /// Starts a server with extra `redis-server` arguments
    /// (e.g. `["--replicaof", "127.0.0.1", "6380"]`).
    pub async fn start_with(extra_args: &[&str]) -> anyhow::Result<RedisServer> {
        Self::start_on_free_ports(extra_args, false).await
    }

    /// Starts a Redis Cluster node (`--cluster-enabled yes`, its bus on a
    /// free port of its own: the default, port + 10000, is past 65535 for a
    /// free port above 55535) with extra `redis-server` arguments; no slot
    /// is assigned yet.
    pub async fn start_cluster_node(extra_args: &[&str]) -> anyhow::Result<RedisServer> {
        Self::start_on_free_ports(extra_args, true).await
    }

    /// A server that exits at once (a port of its taken meanwhile) is
    /// started again on other free ports.
    async fn start_on_free_ports(
        extra_args: &[&str],
        cluster: bool,
    ) -> anyhow::Result<RedisServer> {
        let mut server = RedisServer {
            port: 0,
            child: None,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            cluster_bus: None,
            dir: tempfile::Builder::new().prefix("hmdp-redis-").tempdir()?,
        };
        let mut attempt = 1;
        loop {
            let [port, bus] = free_ports()?;
            server.port = port;
            server.cluster_bus = cluster.then_some(bus);
            match server.spawn().await {
                Err(error) if !server.is_running() && attempt < PORT_ATTEMPTS => {
                    tracing::debug!(error = %error, "redis-server exited at start; other ports");
                    attempt += 1;
                }
                spawned => return spawned.map(|()| server),
            }
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A connection of its own to the server.
    pub async fn connect(&self) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url())?;
        Ok(client.get_multiplexed_async_connection().await?)
    }

    /// Whether the process is running (not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILLs the server: no shutdown, no goodbye to clients.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Reaped at once (SIGKILL leaves nothing to wait for), so a
            // restart finds the port free.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP): it keeps its sockets but answers
    /// nothing, as a stalled machine would, until [`resume`](Self::resume).
    pub fn pause(&self) -> anyhow::Result<()> {
        send_signal(self.pid()?, "STOP")
    }

    /// Thaws a [`pause`](Self::pause)d server (SIGCONT).
    pub fn resume(&self) -> anyhow::Result<()> {
        send_signal(self.pid()?, "CONT")
    }

    fn pid(&self) -> anyhow::Result<u32> {
        Ok(self
            .child
            .as_ref()
            .context("the server is not running")?
            .id())
    }

    /// Starts the server again on the same port, empty.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn().await
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(self.cluster_args())
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start redis-server (is it installed? see scripts/services.sh)")?;
        self.child = Some(child);
        self.wait_until_ready().await
    }

    /// The arguments that make a cluster node, its bus on its own port.
    fn cluster_args(&self) -> Vec<String> {
        match self.cluster_bus {
            Some(bus) => [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]
            .map(String::from)
            .into_iter()
            .chain(["--cluster-port".to_owned(), bus.to_string()])
            .collect(),
            None => Vec::new(),
        }
    }

    /// Polls PING until the server answers, sleeping on tokio's timer between
    /// tries, so the runtime's other tasks keep running meanwhile; gives up
    /// at once should the process end.
    async fn wait_until_ready(&mut self) -> anyhow::Result<()> {
        let client = redis::Client::open(self.url())?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    anyhow::bail!("redis-server on {} exited at start: {status}", self.port);
                }
            }
            let pong = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            };
            match tokio::time::timeout(Duration::from_millis(200), pong).await {
                Ok(Ok(_)) => return Ok(()),
                _ if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Ok(Err(error)) => {
                    return Err(error).context(format!("redis-server on {} not ready", self.port))
                }
                Err(_) => anyhow::bail!(
                    "redis-server on {} not ready in {READY_TIMEOUT:?}",
                    self.port
                ),
            }
        }
    }
}

/// Whether the server `redis` is connected to calls itself a master (`ROLE`).
pub async fn is_master<C>(redis: &mut C) -> redis::RedisResult<bool>
where
    C: redis::aio::ConnectionLike + Send,
{
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(redis).await?;
    Ok(matches!(role.first(), Some(redis::Value::BulkString(role)) if role == b"master"))
}

/// How many times the server `redis` is connected to ran `command` (lower
/// case, as `INFO commandstats` names it) since it started.
pub async fn command_calls<C>(redis: &mut C, command: &str) -> redis::RedisResult<u64>
where
    C: redis::aio::ConnectionLike + Send,
{
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await?;
    Ok(calls_in(&stats, command))
}

/// The arguments of every `EVALSHA` the server `redis` is connected to ran
/// since this was first asked of it. The first call has the
/// server log every command in its slow log (`slowlog-log-slower-than 0`,
/// kept long): unlike `INFO commandstats`, the log tells one script's calls
/// from another's by their hash and keys.
pub async fn logged_script_calls<C>(redis: &mut C) -> redis::RedisResult<Vec<Vec<String>>>
where
    C: redis::aio::ConnectionLike + Send,
{
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .arg("slowlog-max-len")
        .arg(1_000_000)
        .query_async::<()>(redis)
        .await?;
    // Each entry: id, time, duration, arguments, client address, name.
    let entries: Vec<(u64, u64, u64, Vec<String>, String, String)> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(redis)
        .await?;
    let calls = entries
        .into_iter()
        .map(|(_, _, _, arguments, _, _)| arguments)
        .filter(|arguments| {
            arguments
                .first()
                .is_some_and(|command| command.eq_ignore_ascii_case("evalsha"))
        })
        .collect();
    Ok(calls)
}

/// How many times `command` ran, by an `INFO` answer that holds its
/// `commandstats` section (0 when the command never ran).
pub fn calls_in(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| {
            calls
                .parse()
                .expect("INFO commandstats counts calls in digits")
        })
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
