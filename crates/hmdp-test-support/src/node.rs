//! The `serve` of a node binary (the product's `hmdp-server`, the tools'
//! `hmdp`) in a child process on 127.0.0.1: its output in a log file, waited
//! for until it answers, stopped with SIGKILL or SIGTERM.

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::Command;

use crate::process::{ChildProcess, Stdout};

/// What a starting node must answer (2xx) before it counts as started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `/ready`: the node reaches MySQL and Redis too.
    Ready,
    /// `/health`: the process answers, whatever its backends do (for a node
    /// started to find them unreachable).
    Health,
}

impl Probe {
    fn path(self) -> &'static str {
        match self {
            Probe::Ready => "/ready",
            Probe::Health => "/health",
        }
    }
}

/// A node about to start: `serve` of a node binary on a port of 127.0.0.1,
/// with the caller's flags and environment.
pub struct NodeCommand {
    command: Command,
    port: u16,
}

impl NodeCommand {
    /// `binary serve`, given its address through the environment
    /// (`HMDP_HOST`, `HMDP_PORT`), so a flag still overrides it, as flags
    /// override the environment.
    pub fn serve(binary: impl AsRef<OsStr>, port: u16) -> NodeCommand {
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .env("HMDP_HOST", "127.0.0.1")
            .env("HMDP_PORT", port.to_string());
        NodeCommand { command, port }
    }

    /// Adds a flag.
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut NodeCommand {
        self.command.arg(arg);
        self
    }

    /// Adds flags.
    pub fn args<I, S>(&mut self, args: I) -> &mut NodeCommand
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    /// Sets an environment variable of the node.
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut NodeCommand {
        self.command.env(key, value);
        self
    }

    /// Starts the node, its standard output and error appended to `log`
    /// after a header line naming it `name`, and waits until it answers
    /// `probe`; fails, with the end of its log, if it has not within
    /// `within` or it exits first.
    pub async fn start(
        self,
        name: &str,
        log: &Path,
        probe: Probe,
        within: Duration,
    ) -> anyhow::Result<NodeProcess> {
        let mut process = ChildProcess::spawn(name, self.command, log, Stdout::Log)?;
        let node_url = url(self.port);
        process
            .wait_until_answers(&format!("{node_url}{}", probe.path()), within)
            .await?;
        Ok(NodeProcess {
            process,
            port: self.port,
        })
    }
}

/// A started node; killed with SIGKILL when dropped.
pub struct NodeProcess {
    process: ChildProcess,
    port: u16,
}

impl NodeProcess {
    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its base URL, `http://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        url(self.port)
    }

    /// The process id, until the process has been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// SIGKILL, like a crash or `kill -9`: nothing in flight is finished.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }

    /// Sends SIGTERM: the node stops accepting and finishes what is in
    /// flight.
    pub fn terminate(&self) -> anyhow::Result<()> {
        self.process.terminate()
    }

    /// Waits for the process to exit by itself; `None` if it has not within
    /// `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        self.process.wait_exit(within).await
    }

    /// Everything in its log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}
