//! Private `mariadbd` processes on free local ports, for the tests and tools
//! that must freeze, kill or restart MySQL without touching the machine's
//! server.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use sqlx::Connection;

use crate::process::{ChildProcess, Stdout};
use crate::{free_ports, moving_if_taken};

/// How long a fresh or restarted server may take to accept a connection
/// (a restart after a SIGKILL runs InnoDB's crash recovery first).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one readiness check waits for the server's greeting.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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
        let [port] = free_ports()?;
        Self::start_from_port(port, extra_args).await
    }

    /// [`MariaDbServer::start_with`], on `port` first, on another while the
    /// port it tried was taken by then.
    async fn start_from_port(port: u16, extra_args: &[&str]) -> anyhow::Result<MariaDbServer> {
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
        let mut server = MariaDbServer {
            process: None,
            port,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            data,
            dir,
        };
        let log = server.log();
        moving_if_taken(&log, port, async |port| {
            server.port = port;
            server.spawn().await
        })
        .await?;
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
        let url = self.url();
        let process = ChildProcess::spawn("mariadbd", command, &self.log(), Stdout::Log)?;
        let accepts = || async {
            // Bounded: whatever holds the port may accept the connection
            // and never greet it.
            let connect = sqlx::MySqlConnection::connect(&url);
            matches!(
                tokio::time::timeout(CONNECT_TIMEOUT, connect).await,
                Ok(Ok(_))
            )
        };
        // A server that exits at start (its port taken) is seen at once,
        // not after the readiness timeout.
        let (what, every) = (
            format!("accept connections on {}", self.port),
            Duration::from_millis(100),
        );
        (self.process.insert(process))
            .wait_until_ready(&what, READY_TIMEOUT, every, accepts)
            .await
    }

    /// Where the server writes its log, each start after a line of its own.
    fn log(&self) -> PathBuf {
        self.dir.path().join("mariadbd.log")
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[tokio::test]
    async fn a_server_whose_port_was_taken_says_so_and_moves_to_another() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let server = MariaDbServer::start_from_port(port, &[]).await.unwrap();
        assert_ne!(server.port, port);
        let log = std::fs::read_to_string(server.log()).unwrap();
        assert!(log.contains("Address already in use"), "{log}");
        let mut conn = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
        let one: i64 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(one, 1);
    }
}
