//! The one launcher of child processes (nodes, nginx): output appended to a
//! log file, readiness polled (over HTTP, or by a check of the caller's)
//! with a deadline, SIGKILL when dropped.

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::process::{Child, Command};

use crate::{free_ports, poll_until, PORT_ATTEMPTS};

/// The line each start writes to its process's log before the process's
/// own output, followed by the process's name.
const STARTING: &str = "--- starting ";

/// Where a child's standard output goes; its standard error always goes to
/// its log.
pub enum Stdout {
    Log,
    /// For output nobody reads that would cost a write per line (nginx's
    /// access log under load).
    Discard,
}

/// A running child process; killed when dropped.
pub struct ChildProcess {
    /// Names the process in error messages.
    name: String,
    child: Child,
    log: PathBuf,
}

impl ChildProcess {
    /// Starts `command` with stdin closed and stderr (and `stdout`, if so
    /// chosen) appended to `log`, after a header line naming it (not its
    /// arguments: they may hold a database password).
    pub fn spawn(
        name: &str,
        mut command: Command,
        log: &Path,
        stdout: Stdout,
    ) -> anyhow::Result<ChildProcess> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        writeln!(file, "{STARTING}{name}")?;
        let stdout = match stdout {
            Stdout::Log => Stdio::from(file.try_clone()?),
            Stdout::Discard => Stdio::null(),
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!("cannot start {name}: {:?}", command.as_std().get_program())
            })?;
        Ok(ChildProcess {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        })
    }

    /// Polls `url` until it answers 2xx; fails, with the end of the log, if
    /// the process exits first or `within` passes.
    pub async fn wait_until_answers(&mut self, url: &str, within: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()?;
        let answers = || async {
            let response = client.get(url).send().await;
            response.is_ok_and(|response| response.status().is_success())
        };
        let every = Duration::from_millis(20);
        (self.wait_until_ready(&format!("answer {url}"), within, every, answers)).await
    }

    /// Polls `ready` every `every` until it holds ([`poll_until`]); fails,
    /// with the end of the log, if the process exits first or `within`
    /// passes (`what` it was to do, in the message: "answer http://...").
    pub async fn wait_until_ready<F, Fut>(
        &mut self,
        what: &str,
        within: Duration,
        every: Duration,
        mut ready: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let (name, child) = (&self.name, &mut self.child);
        let waiting_for = format!("{name} to {what}");
        let waited = poll_until(&waiting_for, within, every, || {
            let exited = child.try_wait();
            let ready = ready();
            async move {
                match exited? {
                    Some(status) => bail!("{name} exited ({status}) while starting"),
                    None => Ok(ready.await),
                }
            }
        });
        (waited.await)
            .map_err(|error| anyhow::anyhow!("{error}; its log ends with:\n{}", self.log_tail()))
    }

    /// The process id, until the process has been reaped.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGKILL, like a crash or `kill -9`: nothing in flight is finished.
    pub async fn kill(&mut self) {
        // An error means it has already exited, which is what we want.
        let _ = self.child.kill().await;
    }

    /// Sends SIGTERM: a graceful stop.
    pub fn terminate(&self) -> anyhow::Result<()> {
        send_signal(self.id().context("the process has exited")?, "TERM")
    }

    /// Freezes the process (SIGSTOP): it keeps its sockets open but answers
    /// nothing, as a stalled machine would, until [`resume`](Self::resume).
    pub fn pause(&self) -> anyhow::Result<()> {
        send_signal(self.id().context("the process has exited")?, "STOP")
    }

    /// Thaws a [`pause`](Self::pause)d process (SIGCONT).
    pub fn resume(&self) -> anyhow::Result<()> {
        send_signal(self.id().context("the process has exited")?, "CONT")
    }

    /// Waits for the process to exit by itself; `None` if it has not within
    /// `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Everything the process has written so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the log, for an error message.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }
}

/// Sends `signal` (as `kill` names it: `TERM`, `STOP`, `CONT`) to `pid`:
/// for a process a test started some other way than [`ChildProcess`].
pub fn send_signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .context("cannot run kill")?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid}: {status}");
    Ok(())
}

/// Whether the last process started with its output in `log` (the lines
/// after its `--- starting` line) could not bind a port because another
/// process had taken it. Read from the whole log, not the tail an error
/// carries: a backtrace may follow the line that says so.
pub fn port_was_taken(log: &Path) -> bool {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let last_start = text.rsplit(STARTING).next().unwrap_or_default();
    last_start.contains("Address already in use")
}

/// `start` on `port`, and again on another port found free while it fails
/// with its log, `log`, saying the port was taken ([`port_was_taken`]):
/// [`PORT_ATTEMPTS`] starts at most. `start` is handed the port to use.
pub async fn moving_if_taken<T>(
    log: &Path,
    mut port: u16,
    mut start: impl AsyncFnMut(u16) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let mut attempt = 1;
    loop {
        match start(port).await {
            Err(_) if port_was_taken(log) && attempt < PORT_ATTEMPTS => {
                tracing::debug!(%port, log = %log.display(), "the port was taken; another");
                [port] = free_ports().context("no free local port")?;
                attempt += 1;
            }
            started => return started,
        }
    }
}

/// The last lines of a log file, for an error message.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
