//! Private `mariadbd` processes on free local ports, for the tests and tools
//! that must freeze, kill or restart MySQL without touching the machine's
//! server.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use sqlx::Connection;

use crate::process::{ChildProcess, Stdout};
use crate::{free_ports, poll_until};

/// How long a fresh or restarted server may take to accept a connection
/// (a restart after a SIGKILL runs InnoDB's crash recovery first).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A `mariadbd` of its own on a free port, its data in a temporary directory;
/// killed and its files removed when dropped. `root` has no password.
pub struct MariaDbServer {
    process: Option<ChildProcess>,
    port: u16,
    extra_args: Vec<String>,
    data: PathBuf,
    /// Declared last: removed after the server is gone.
    dir: tempfile::TempDir,
}

impl MariaDbServer {
    /// Creates the data directory (`mariadb-install-db`) and starts the
    /// server with `extra_args` besides its own (port, paths, a small buffer
    /// pool).
    pub async fn start_with(extra_args: &[&str]) -> anyhow::Result<MariaDbServer> {
        let dir = tempfile::Builder::new().prefix("hmdp-mariadb-").tempdir()?;
        let data = dir.path().join("data");
        let installed = tokio::process::Command::new("mariadb-install-db")
            .args(["--no-defaults", "--user=root", "--skip-test-db"])
            .arg("--auth-root-authentication-method=normal")
            .arg(format!("--datadir={}", data.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .await
            .context("cannot run mariadb-install-db (see scripts/services.sh)")?;
        if !installed.status.success() {
            bail!(
                "mariadb-install-db failed: {}",
                String::from_utf8_lossy(&installed.stderr)
            );
        }
        let [port] = free_ports()?;
        let mut server = MariaDbServer {
            process: None,
            port,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            data,
            dir,
        };
        server.spawn().await?;
        Ok(server)
    }

    /// `mysql://root@127.0.0.1:{port}`, without a database.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is
    /// answered, as with a stalled machine or a network that drops packets.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.running()?.pause()
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) -> anyhow::Result<()> {
        self.running()?.resume()
    }

    /// SIGKILLs the server, as a crash would, and starts it again on the
    /// same port and data: InnoDB recovers every committed transaction, and
    /// every connection open before is gone.
    pub async fn crash_and_restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut process) = self.process.take() {
            process.kill().await;
        }
        self.spawn().await
    }

    fn running(&self) -> anyhow::Result<&ChildProcess> {
        self.process.as_ref().context("mariadbd is not running")
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let dir = self.dir.path();
        let mut command = tokio::process::Command::new("mariadbd");
        command
            .args([
                "--no-defaults",
                "--user=root",
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
                "--max-connections=500",
            ])
            .arg(format!("--datadir={}", self.data.display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .args(&self.extra_args);
        let log = dir.join("mariadbd.log");
        self.process = Some(ChildProcess::spawn("mariadbd", command, &log, Stdout::Log)?);
        let url = self.url();
        poll_until(
            &format!("mariadbd on {} to accept connections", self.port),
            READY_TIMEOUT,
            Duration::from_millis(100),
            || async { Ok(sqlx::MySqlConnection::connect(&url).await.is_ok()) },
        )
        .await
    }
}
