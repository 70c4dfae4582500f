//! One `hmdp serve` child process: started with the shared
//! settings plus per-run flags, waited for until `/ready`, killed on demand
//! or when dropped.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use hmdp_test_support::{free_ports, moving_if_taken, NodeCommand, NodeProcess, Probe};

use super::NodesSpec;

/// How long a node may take to answer `/ready`: a debug build on a busy
/// two-core machine connects to MySQL and Redis well within this.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// One of the two nodes, running or not.
pub struct Node {
    pub id: String,
    pub port: u16,
    log: PathBuf,
    process: Option<NodeProcess>,
}

impl Node {
    pub fn new(id: &str, port: u16, log: PathBuf) -> Node {
        Node {
            id: id.to_owned(),
            port,
            log,
            process: None,
        }
    }

    /// Node `id`, started with `flags` after the shared settings on a port
    /// found free (see [`Node::start_moving_if_taken`]).
    pub async fn start_on_a_free_port(
        id: &str,
        log: PathBuf,
        spec: &NodesSpec,
        flags: &[String],
    ) -> anyhow::Result<Node> {
        let [port] = free_ports().context("no free local port")?;
        let mut node = Node::new(id, port, log);
        node.start_moving_if_taken(spec, flags).await?;
        Ok(node)
    }

    /// [`Node::start`], on another port found free should this node's be
    /// taken before it bound it (another process's, often an outgoing
    /// connection's local end): for a node reached through [`Node::url`]
    /// read after its start, not one nginx was told the port of.
    pub async fn start_moving_if_taken(
        &mut self,
        spec: &NodesSpec,
        flags: &[String],
    ) -> anyhow::Result<()> {
        let log = self.log.clone();
        moving_if_taken(&log, self.port, async |port| {
            self.port = port;
            self.start(spec, flags).await
        })
        .await
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the node with `flags` after the shared settings and waits
    /// until it is ready. Migrations were applied once before the nodes started, so the
    /// two nodes never race to apply them.
    pub async fn start(&mut self, spec: &NodesSpec, flags: &[String]) -> anyhow::Result<()> {
        self.kill().await;
        let mut command = NodeCommand::serve(&spec.exe, self.port);
        command
            .arg(format!("--node-id={}", self.id))
            .arg(format!("--database-url={}", spec.database_url))
            .arg(format!("--redis-url={}", spec.redis_url))
            .arg(format!("--redis-prefix={}", spec.redis_prefix))
            .arg(format!("--admin-token={}", spec.admin_token))
            .arg("--no-migrate")
            .args(flags);
        // A node logging every request at `info` spends the CPU that the load
        // test wants to measure; keep warnings unless the user asks for more.
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "warn");
        }
        // The tools drive the nodes from this machine's one address, which
        // the per-address limits would throttle as one client: the limits
        // stay off unless asked for (`HMDP_LIMITS=on`, `--limits=on`).
        if std::env::var_os("HMDP_LIMITS").is_none() {
            command.env("HMDP_LIMITS", "off");
        }
        // Nor do they shed load unless asked (`HMDP_SHED_LATENCY_MS`): the
        // labs hold purchases on purpose, and the benchmarks measure what
        // the nodes finish.
        if std::env::var_os("HMDP_SHED_LATENCY_MS").is_none() {
            command.env("HMDP_SHED_LATENCY_MS", "0");
        }
        // Two nodes share this machine: each gets half of its cores for HTTP
        // workers instead of one per core, which would double the threads
        // competing for them (measured: 15% less CPU per purchase).
        if std::env::var_os("HMDP_WORKERS").is_none() {
            let cores = std::thread::available_parallelism().map_or(2, usize::from);
            command.env("HMDP_WORKERS", (cores / 2).max(1).to_string());
        }
        let name = format!("{} {flags:?}", self.id);
        let process = command
            .start(&name, &self.log, Probe::Ready, READY_TIMEOUT)
            .await?;
        self.process = Some(process);
        Ok(())
    }

    /// The process id while the node runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(NodeProcess::pid)
    }

    /// SIGKILL, like a crash or `kill -9`: nothing in flight is finished.
    pub async fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill().await;
        }
    }
}
