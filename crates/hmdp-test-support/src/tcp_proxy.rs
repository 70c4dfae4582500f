//! A TCP proxy for fault tests: every connection it accepts is relayed to
//! one upstream server on this machine, and each chunk read in either
//! direction is shown to the test's [`Faults`] before it goes on, which may
//! hold it (a slow link, a silent peer), or end the connection instead (a
//! reply lost on the way). Its upstream can move
//! ([`TcpProxy::move_to`]): an address that follows a Redis master from one
//! server to the one promoted after it, as a shop's haproxy or virtual IP
//! does.

use std::future::Future;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// Which way a chunk goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to server.
    Requests,
    /// Server to client.
    Replies,
}

/// What becomes of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It goes on.
    Pass,
    /// It is dropped and its connection closed, both ways.
    Close,
}

/// What a test does to the traffic through a [`TcpProxy`].
pub trait Faults: Send + Sync + 'static {
    /// Decides on `chunk`, read on connection number `connection` (counted
    /// from 0 as the proxy accepts them) going `direction`. The chunk, and
    /// the rest of its direction on that connection, wait for the answer.
    fn chunk(
        &self,
        connection: u64,
        direction: Direction,
        chunk: &[u8],
    ) -> impl Future<Output = Verdict> + Send;

    /// A chunk has been written on: called after the write, never before.
    fn passed(&self, _connection: u64, _direction: Direction) {}
}

/// A proxy listening on a port of its own; it stops with the test's
/// runtime.
pub struct TcpProxy {
    port: u16,
    upstream: Arc<AtomicU16>,
}

impl TcpProxy {
    /// Relays every connection to the server listening on `upstream_port`
    /// on this machine, through `faults`.
    pub async fn start<F: Faults>(upstream_port: u16, faults: Arc<F>) -> std::io::Result<TcpProxy> {
        Ok(TcpProxy::listen().await?.relay_to(upstream_port, faults))
    }

    /// A port for a proxy whose upstream must know it first (a Redis
    /// Cluster node announcing the proxy's port), relaying nothing yet.
    pub async fn listen() -> std::io::Result<Listening> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Ok(Listening {
            port: listener.local_addr()?.port(),
            listener,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Relays the connections accepted from now on to the server listening
    /// on `upstream_port`; those relayed already stay where they are.
    pub fn move_to(&self, upstream_port: u16) {
        self.upstream.store(upstream_port, Ordering::SeqCst);
    }
}

/// A proxy's port, bound, before it relays ([`TcpProxy::listen`]).
pub struct Listening {
    listener: TcpListener,
    port: u16,
}

impl Listening {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Relays every connection to the server listening on `upstream_port`
    /// on this machine, through `faults`.
    pub fn relay_to<F: Faults>(self, upstream_port: u16, faults: Arc<F>) -> TcpProxy {
        let Listening { listener, port } = self;
        let connections = AtomicU64::new(0);
        let upstream = Arc::new(AtomicU16::new(upstream_port));
        let moved = upstream.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream_port = moved.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                    continue;
                };
                let number = connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(relay(client, server, number, faults.clone()));
            }
        });
        TcpProxy { port, upstream }
    }
}

/// Relays one connection both ways; either direction ending (a side
/// closing, a [`Verdict::Close`]) closes both, as the halves are dropped.
async fn relay<F: Faults>(client: TcpStream, server: TcpStream, number: u64, faults: Arc<F>) {
    let (client_reads, client_writes) = client.into_split();
    let (server_reads, server_writes) = server.into_split();
    let requests = pump(
        client_reads,
        server_writes,
        number,
        Direction::Requests,
        &*faults,
    );
    let replies = pump(
        server_reads,
        client_writes,
        number,
        Direction::Replies,
        &*faults,
    );
    tokio::select! {
        () = requests => {}
        () = replies => {}
    }
}

async fn pump<F: Faults>(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    number: u64,
    direction: Direction,
    faults: &F,
) {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let chunk = &buffer[..read];
        if faults.chunk(number, direction, chunk).await == Verdict::Close
            || to.write_all(chunk).await.is_err()
        {
            return;
        }
        faults.passed(number, direction);
    }
}
