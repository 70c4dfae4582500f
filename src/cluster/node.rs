//! One `hmdp serve` child process: started with the cluster's shared
//! settings plus per-run flags, waited for until `/ready`, killed on demand
//! or when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::process::{Child, Command};

use super::ClusterSpec;

/// How long a node may take to answer `/ready`: a debug build on a busy
/// two-core machine connects to MySQL and Redis well within this.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A node of the cluster, running or not.
pub struct Node {
    pub id: String,
    pub port: u16,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    pub fn new(id: &str, port: u16, log: PathBuf) -> Node {
        Node {
            id: id.to_owned(),
            port,
            log,
            child: None,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the node with `flags` after the cluster's own settings and waits
    /// until it is ready. Migrations were applied once by the cluster, so the
    /// two nodes never race to apply them.
    pub async fn start(
        &mut self,
        spec: &ClusterSpec,
        flags: &[String],
        client: &reqwest::Client,
    ) -> anyhow::Result<()> {
        self.kill().await;
        let log = open_log(&self.log, &format!("starting {} {flags:?}", self.id))?;
        let mut command = Command::new(&spec.exe);
        command
            .arg("serve")
            .arg("--host=127.0.0.1")
            .arg(format!("--port={}", self.port))
            .arg(format!("--node-id={}", self.id))
            .arg(format!("--database-url={}", spec.database_url))
            .arg(format!("--redis-url={}", spec.redis_url))
            .arg(format!("--redis-prefix={}", spec.redis_prefix))
            .arg(format!("--admin-token={}", spec.admin_token))
            .arg("--no-migrate")
            .args(flags)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        // A node logging every request at `info` spends the CPU that the load
        // test wants to measure; keep warnings unless the user asks for more.
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "warn");
        }
        // Two nodes share this machine: each gets half of its cores for HTTP
        // workers instead of one per core, which would double the threads
        // competing for them (measured: 15% less CPU per purchase).
        if std::env::var_os("HMDP_WORKERS").is_none() {
            let cores = std::thread::available_parallelism().map_or(2, usize::from);
            command.env("HMDP_WORKERS", (cores / 2).max(1).to_string());
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", spec.exe.display()))?;
        self.child = Some(child);
        self.wait_ready(client).await
    }

    async fn wait_ready(&mut self, client: &reqwest::Client) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let ready = format!("{}/ready", self.url());
        loop {
            let child = self.child.as_mut().expect("started");
            if let Some(status) = child.try_wait()? {
                self.child = None;
                bail!(
                    "{} exited ({status}) while starting; its log ends with:\n{}",
                    self.id,
                    log_tail(&self.log)
                );
            }
            if let Ok(response) = client.get(&ready).send().await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not ready after {READY_TIMEOUT:?}; its log ends with:\n{}",
                    self.id,
                    log_tail(&self.log)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process id while the node runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// SIGKILL, like a crash or `kill -9`: nothing in flight is finished.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // An error means it has already exited, which is what we want.
            let _ = child.kill().await;
        }
    }
}

/// Opens a log for appending and writes a header line to it.
pub fn open_log(path: &Path, header: &str) -> anyhow::Result<std::fs::File> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(file, "--- {header}")?;
    Ok(file)
}

/// The last lines of a log, for an error message.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
