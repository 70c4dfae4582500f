//! A TCP proxy in front of a Redis server whose traffic a test holds back,
//! one direction at a time, without closing any connection: a slow link, a
//! late reply, or (both directions held) a peer gone silent.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Proxies every connection it accepts to one upstream; stops with the
/// test's runtime.
pub struct Proxy {
    port: u16,
    /// Client to server.
    requests: Gate,
    /// Server to client.
    replies: Gate,
}

/// One direction of every connection through the proxy.
#[derive(Clone)]
pub struct Gate {
    open: watch::Sender<bool>,
    /// Chunks that reached the proxy so far, held or not, all connections
    /// counted.
    arrived: watch::Sender<u64>,
    /// Chunks that went through so far, all connections counted.
    passed: watch::Sender<u64>,
}

impl Proxy {
    /// Proxies to the server listening on `upstream_port` on this machine.
    pub async fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (requests, replies) = (Gate::new(), Gate::new());
        tokio::spawn({
            let (requests, replies) = (requests.clone(), replies.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                        continue;
                    };
                    let (client_reads, client_writes) = client.into_split();
                    let (server_reads, server_writes) = server.into_split();
                    tokio::spawn(requests.clone().pump(client_reads, server_writes));
                    tokio::spawn(replies.clone().pump(server_reads, client_writes));
                }
            }
        });
        Proxy {
            port,
            requests,
            replies,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn requests(&self) -> &Gate {
        &self.requests
    }

    pub fn replies(&self) -> &Gate {
        &self.replies
    }
}

impl Gate {
    fn new() -> Gate {
        Gate {
            open: watch::Sender::new(true),
            arrived: watch::Sender::new(0),
            passed: watch::Sender::new(0),
        }
    }

    /// Bytes read from now on wait in the proxy until [`Gate::pass`].
    pub fn hold(&self) {
        self.open.send_replace(false);
    }

    pub fn pass(&self) {
        self.open.send_replace(true);
    }

    /// Chunks that reached the proxy so far, held ones included.
    pub fn arrived(&self) -> u64 {
        *self.arrived.borrow()
    }

    /// Waits until more than `count` chunks reached the proxy.
    pub async fn arrived_more_than(&self, count: u64) {
        more_than(&self.arrived, count).await;
    }

    /// Chunks that went through so far.
    pub fn passed(&self) -> u64 {
        *self.passed.borrow()
    }

    /// Waits until more than `count` chunks went through.
    pub async fn passed_more_than(&self, count: u64) {
        more_than(&self.passed, count).await;
    }

    /// Forwards `from` to `to`, holding each chunk while the gate is closed.
    /// Either side closing ends it; dropping the halves closes the other.
    async fn pump(self, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
        let mut buffer = vec![0; 64 * 1024];
        let mut open = self.open.subscribe();
        loop {
            let read = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            self.arrived.send_modify(|arrived| *arrived += 1);
            if open.wait_for(|&open| open).await.is_err()
                || to.write_all(&buffer[..read]).await.is_err()
            {
                return;
            }
            self.passed.send_modify(|passed| *passed += 1);
        }
    }
}

/// Waits until `counter` is above `count`.
async fn more_than(counter: &watch::Sender<u64>, count: u64) {
    let _ = counter.subscribe().wait_for(|&seen| seen > count).await;
}
