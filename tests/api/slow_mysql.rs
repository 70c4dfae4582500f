//! MySQL made slow in two ways, to widen the moments a cancelled request
//! can land in: a private MariaDB whose every commit takes about 20 ms
//! (binary log on, group commit waiting for companions that never come,
//! standing in for a slow disk or a replica's acknowledgement), and a proxy
//! that delivers every reply of the machine's MySQL a few milliseconds late
//! (a statement such as `BEGIN` then stays in flight that long).

use std::time::Duration;

use hmdp_test_support::MariaDbServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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

/// A TCP proxy in front of a MySQL server that holds back every chunk of
/// the server's replies for `delay`; requests pass at once. Stops with the
/// test's runtime.
pub struct DelayedReplies {
    port: u16,
}

impl DelayedReplies {
    /// Proxies to `upstream` (`host:port`).
    pub async fn start(upstream: &str, delay: Duration) -> DelayedReplies {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = upstream.to_owned();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, delay));
            }
        });
        DelayedReplies { port }
    }

    /// `url` (a `mysql://` URL of the upstream server) pointed at the proxy.
    pub fn url(&self, url: &str) -> String {
        let mut url = reqwest::Url::parse(url).expect("a MySQL URL");
        url.set_port(Some(self.port))
            .expect("a host to set a port on");
        url.to_string()
    }
}

async fn relay(client: TcpStream, server: TcpStream, delay: Duration) {
    let (mut client_reads, mut client_writes) = client.into_split();
    let (mut server_reads, mut server_writes) = server.into_split();
    let requests = tokio::io::copy(&mut client_reads, &mut server_writes);
    let replies = async {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let read = server_reads.read(&mut buffer).await?;
            if read == 0 {
                return Ok::<_, std::io::Error>(());
            }
            tokio::time::sleep(delay).await;
            client_writes.write_all(&buffer[..read]).await?;
        }
    };
    // Either side closing ends the relay; dropping the halves closes both.
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
    }
}
