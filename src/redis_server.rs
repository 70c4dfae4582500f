//! Private `redis-server` processes on free local ports, for the lab
//! scenarios and tests that must kill, restart or replicate Redis without
//! touching the shared server.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// A redis-server child process; killed when dropped.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    extra_args: Vec<String>,
    /// The server's working directory: replication writes RDB files even
    /// with saving off, and they belong in a directory removed with the
    /// server, not wherever the caller runs.
    dir: tempfile::TempDir,
}

/// A TCP port that was free a moment ago (the OS picks it).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl RedisServer {
    /// Starts a server on a free port, keeping nothing on disk.
    pub fn start() -> anyhow::Result<RedisServer> {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments
    /// (e.g. `["--replicaof", "127.0.0.1", "6380"]`).
    pub fn start_with(extra_args: &[&str]) -> anyhow::Result<RedisServer> {
        let mut server = RedisServer {
            port: free_port()?,
            child: None,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            dir: tempfile::Builder::new().prefix("hmdp-redis-").tempdir()?,
        };
        server.spawn()?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Whether the process is running (not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILLs the server: no shutdown, no goodbye to clients.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start redis-server (is it installed? see scripts/services.sh)")?;
        self.child = Some(child);
        self.wait_until_ready()
    }

    fn wait_until_ready(&self) -> anyhow::Result<()> {
        let client = redis::Client::open(self.url())?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pong = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn));
            match pong {
                Ok(_) => return Ok(()),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(error) => {
                    return Err(error).context(format!("redis-server on {} not ready", self.port))
                }
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
