//! Two `hmdp serve` nodes and nginx in front of them, as local child
//! processes on free ports with a private nginx prefix: what `hmdp demo` runs
//! and what the tools' tests of two nodes start, the same way; Prometheus beside them
//! when asked (`prometheus`).

pub mod demo;
pub mod nginx;
pub mod node;
pub mod prometheus;
mod sandbox;
pub mod soak;
pub mod up;

use std::path::PathBuf;

use anyhow::Context;
use hmdp::config::SeckillMode;
use hmdp_lock::LockMode;
use hmdp_test_support::ChildProcess;
use tempfile::TempDir;

pub(crate) use node::Node;
pub use sandbox::Sandbox;

/// Runs `work` to its end unless Ctrl-C (SIGINT) or SIGTERM comes first:
/// then `work` is dropped, and with it every child process it started, and
/// the signal's name comes back instead.
pub async fn until_signal<T>(
    work: impl std::future::Future<Output = T>,
) -> Result<T, &'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        outcome = work => Ok(outcome),
        _ = tokio::signal::ctrl_c() => Err("Ctrl-C"),
        _ = term.recv() => Err("SIGTERM"),
    }
}

/// The flags each node gets for one lock mode and purchase path.
pub fn node_flags(mode: LockMode, seckill: SeckillMode, chaos_hold_ms: u64) -> Vec<String> {
    vec![
        format!("--lock={mode}"),
        format!("--seckill={seckill}"),
        format!("--chaos-hold-ms={chaos_hold_ms}"),
    ]
}

/// Ids of the two nodes, as they answer in `x-served-by`.
pub const NODE_IDS: [&str; 2] = ["node1", "node2"];

/// What every node of the two shares.
#[derive(Debug, Clone)]
pub struct NodesSpec {
    /// The `hmdp` executable the nodes run.
    pub exe: PathBuf,
    /// A migrated database (the nodes start with `--no-migrate`).
    pub database_url: String,
    pub redis_url: String,
    pub redis_prefix: String,
    /// The admin token of every node, to create vouchers.
    pub admin_token: String,
}

impl NodesSpec {
    /// The spec of nodes living in `sandbox`, run from `exe`.
    pub fn in_sandbox(exe: PathBuf, sandbox: &Sandbox) -> NodesSpec {
        NodesSpec {
            exe,
            database_url: sandbox.database.url.clone(),
            redis_url: sandbox.redis.redis_url.clone(),
            redis_prefix: sandbox.redis.prefix.clone(),
            admin_token: uuid::Uuid::new_v4().simple().to_string(),
        }
    }
}

/// Two running nodes behind a running nginx. Dropping it kills them all
/// (`kill_on_drop`) and removes nginx's prefix directory.
pub struct Nodes {
    spec: NodesSpec,
    members: Vec<Node>,
    nginx: ChildProcess,
    nginx_port: u16,
    /// nginx's prefix: config, pid, temp files, logs. Only held to be
    /// removed on drop, last, after the children are gone.
    _dir: TempDir,
}

impl Nodes {
    /// Starts the two nodes with `node_flags` (`--lock=...`, ...) and nginx
    /// rendered from the top-level `nginx.conf`; returns once nginx answers.
    pub async fn start(spec: NodesSpec, node_flags: &[String]) -> anyhow::Result<Nodes> {
        let nginx_bin = nginx::find()?;
        let dir = tempfile::Builder::new()
            .prefix("hmdp-nodes-")
            .tempdir()
            .context("cannot create nginx's prefix directory")?;
        let mut nodes = Vec::with_capacity(NODE_IDS.len());
        for id in NODE_IDS {
            let log = dir.path().join(format!("{id}.log"));
            nodes.push(Node::start_on_a_free_port(id, log, &spec, node_flags).await?);
        }
        let node_ports: Vec<u16> = nodes.iter().map(|node| node.port).collect();
        let (nginx, nginx_port) = nginx::start(&nginx_bin, dir.path(), &node_ports).await?;
        Ok(Nodes {
            spec,
            members: nodes,
            nginx,
            nginx_port,
            _dir: dir,
        })
    }

    /// nginx's base URL: the nodes' front door.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.nginx_port)
    }

    pub fn spec(&self) -> &NodesSpec {
        &self.spec
    }

    /// Restarts both nodes, on the same ports, with other flags (another
    /// lock mode); nginx keeps running and reconnects to them.
    pub async fn restart_nodes(&mut self, node_flags: &[String]) -> anyhow::Result<()> {
        for index in 0..self.members.len() {
            self.start_node(index, node_flags).await?;
        }
        Ok(())
    }

    /// Each node's own base URL, bypassing nginx (for its `/metrics`).
    pub fn node_urls(&self) -> Vec<String> {
        self.members.iter().map(Node::url).collect()
    }

    /// Process ids of the running nodes.
    pub fn node_pids(&self) -> Vec<u32> {
        self.members.iter().filter_map(Node::pid).collect()
    }

    /// Process id of nginx (`None` once it has been reaped).
    pub fn nginx_pid(&self) -> Option<u32> {
        self.nginx.id()
    }

    /// (Re)starts one node on its port, e.g. after [`Nodes::kill_node`].
    pub async fn start_node(&mut self, index: usize, node_flags: &[String]) -> anyhow::Result<()> {
        self.members[index].start(&self.spec, node_flags).await
    }

    /// Kills one node with SIGKILL, as a crash would.
    pub async fn kill_node(&mut self, index: usize) {
        self.members[index].kill().await;
    }
}
