//! MySQL made slow in two ways, to widen the moments a cancelled request
//! can land in: a private MariaDB whose every commit takes about 20 ms
//! (binary log on, group commit waiting for companions that never come,
//! standing in for a slow disk or a replica's acknowledgement), and a proxy
//! that delivers every reply of the machine's MySQL a few milliseconds late
//! (a statement such as `BEGIN` then stays in flight that long).

use std::sync::Arc;
use std::time::Duration;

use hmdp_test_support::{Direction, Faults, MariaDbServer, TcpProxy, Verdict};

/// How long the server holds each commit back.
pub const COMMIT_DELAY: Duration = Duration::from_millis(20);

/// A `mariadbd` of the test's own on a free port whose commits wait
/// [`COMMIT_DELAY`]; killed and its files removed when dropped.
pub struct SlowCommitMariaDb(MariaDbServer);

impl SlowCommitMariaDb {
    pub async fn start() -> SlowCommitMariaDb {
        let wait_usec = format!("--binlog-commit-wait-usec={}", COMMIT_DELAY.as_micros());
        let server = MariaDbServer::start_with(&[
            "--log-bin=binlog",
            "--server-id=1",
            // A group commit waits for this many commits or this long: the
            // count is never reached, so each commit waits the whole time.
            "--binlog-commit-wait-count=1000",
            &wait_usec,
            // The last 40 statements of each session, for a test to tell
            // what a transaction left open was doing.
            "--performance-schema=ON",
            "--performance-schema-instrument=statement/%=ON",
            "--performance-schema-consumer-events-statements-current=ON",
            "--performance-schema-consumer-events-statements-history=ON",
            "--performance-schema-events-statements-history-size=40",
        ])
        .await
        .expect("a private mariadbd starts (scripts/services.sh installs it)");
        SlowCommitMariaDb(server)
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is
    /// answered, as with a stalled machine or a network that drops packets.
    pub fn pause(&self) {
        self.0.pause().expect("mariadbd stops");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.0.resume().expect("mariadbd continues");
    }

    /// `mysql://root@127.0.0.1:{port}`, without a database.
    pub fn url(&self) -> String {
        self.0.url()
    }
}

/// A TCP proxy in front of a MySQL server on this machine that holds back
/// every chunk of the server's replies for a delay; requests pass at once.
/// Stops with the test's runtime.
pub struct DelayedReplies(TcpProxy);

/// The proxy's faults: each reply chunk late by this much.
struct ReplyDelay(Duration);

impl Faults for ReplyDelay {
    async fn chunk(&self, _connection: u64, direction: Direction, _chunk: &[u8]) -> Verdict {
        if direction == Direction::Replies {
            tokio::time::sleep(self.0).await;
        }
        Verdict::Pass
    }
}

impl DelayedReplies {
    /// Proxies to the server listening on `upstream_port`.
    pub async fn start(upstream_port: u16, delay: Duration) -> DelayedReplies {
        let proxy = TcpProxy::start(upstream_port, Arc::new(ReplyDelay(delay)));
        DelayedReplies(proxy.await.expect("the proxy listens"))
    }

    /// `url` (a `mysql://` URL of the upstream server) pointed at the proxy.
    pub fn url(&self, url: &str) -> String {
        let mut url = reqwest::Url::parse(url).expect("a MySQL URL");
        url.set_port(Some(self.0.port()))
            .expect("a host to set a port on");
        url.to_string()
    }
}
