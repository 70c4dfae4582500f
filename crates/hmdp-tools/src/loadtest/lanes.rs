//! The load generator's connections: at most `concurrency` keep-alive
//! HTTP/1.1 connections to one target, each carrying one request at a time,
//! from one client or, spread over loopback source addresses, from many.
//!
//! Built on hyper's connection API rather than a general client: the
//! generator shares the machine's cores with the nginx, nodes, Redis and
//! MySQL it measures, so CPU spent per request on parsing a URL or looking
//! up a shared pool is CPU taken from the system under test. Here the
//! request line is fixed once and a connection is a `Vec` pop.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::future::join_all;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Longest wait for one answer; a request past it counts as `TIMEOUT`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Keep-alive connections to one `http://host:port`, shared by the shots of
/// a run; the semaphore is the run's concurrency budget.
pub struct Lanes {
    /// `host:port` to connect to.
    address: String,
    host: HeaderValue,
    /// The path every request of the run goes to.
    path: Uri,
    /// The address each client's connections leave from: the system's
    /// choice for one client, 127.3.x.y each for many.
    sources: Vec<Option<IpAddr>>,
    /// Each client's kept connections.
    idle: Mutex<Vec<Vec<SendRequest<Empty<Bytes>>>>>,
    budget: Semaphore,
}

/// What came back: the status, the serving node (`x-served-by`) and the body.
pub struct Answer {
    pub status: StatusCode,
    pub node: Option<String>,
    pub body: Bytes,
}

/// Why no answer came back.
#[derive(Debug, thiserror::Error)]
pub enum ShotError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("no answer within {ANSWER_TIMEOUT:?}")]
    Timeout,
    #[error("transport: {0}")]
    Transport(#[from] hyper::Error),
}

impl ShotError {
    /// The outcome label of the load report.
    pub fn outcome(&self) -> &'static str {
        match self {
            ShotError::Connect(_) => "CONNECT_ERROR",
            ShotError::Timeout => "TIMEOUT",
            ShotError::Transport(_) => "TRANSPORT_ERROR",
        }
    }
}

impl Lanes {
    /// Lanes to `path` under `target` (`http://host[:port]`; no TLS: the
    /// generator talks to nginx or a node on the local network).
    pub fn new(target: &str, path: &str, concurrency: usize) -> anyhow::Result<Lanes> {
        let uri: Uri = target
            .parse()
            .with_context(|| format!("--target {target} is not a URL"))?;
        if uri.scheme_str() != Some("http") {
            bail!("--target {target}: only http:// targets are supported");
        }
        let authority = uri
            .authority()
            .with_context(|| format!("--target {target} has no host"))?;
        let base = uri.path().trim_end_matches('/');
        Ok(Lanes {
            address: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(80)
            ),
            host: HeaderValue::from_str(authority.as_str())?,
            path: format!("{base}{path}").parse().context("request path")?,
            sources: vec![None],
            idle: Mutex::new(vec![Vec::new()]),
            budget: Semaphore::new(concurrency.max(1)),
        })
    }

    /// The same lanes as `clients` clients, each sending from a loopback
    /// address of its own (127.3.0.1, 127.3.0.2, ...): per-address limits,
    /// nginx's and the nodes', see that many clients instead of one. Only
    /// for a target on this machine's loopback.
    pub fn spread_over(mut self, clients: usize) -> anyhow::Result<Lanes> {
        if clients <= 1 {
            return Ok(self);
        }
        let host = self.address.rsplit_once(':').map_or("", |(host, _)| host);
        let loopback =
            host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            bail!("clients of their own address need a target on 127.0.0.1, not {host}");
        }
        self.sources = (0..clients)
            .map(|client| loopback_address(3, client, "clients").map(Some))
            .collect::<anyhow::Result<_>>()?;
        self.idle = Mutex::new((0..clients).map(|_| Vec::new()).collect());
        Ok(self)
    }

    /// The concurrency budget: `n` requests may go out at once.
    pub async fn reserve(&self, n: u32) -> SemaphorePermit<'_> {
        self.budget
            .acquire_many(n)
            .await
            .expect("the semaphore is never closed")
    }

    /// One `POST` from `client` (taken modulo the clients there are) with
    /// `authorization: token`, `idempotency-key: key` and no body, on one
    /// of the client's idle connections or a new one. Call it under a
    /// `reserve` permit.
    pub async fn post(
        &self,
        client: usize,
        token: &HeaderValue,
        key: &HeaderValue,
    ) -> Result<Answer, ShotError> {
        let client = client % self.sources.len();
        tokio::time::timeout(ANSWER_TIMEOUT, self.exchange(client, token, key))
            .await
            .unwrap_or(Err(ShotError::Timeout))
    }

    async fn exchange(
        &self,
        client: usize,
        token: &HeaderValue,
        key: &HeaderValue,
    ) -> Result<Answer, ShotError> {
        let mut request = Request::new(Empty::new());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.path.clone();
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        headers.insert(AUTHORIZATION, token.clone());
        headers.insert("idempotency-key", key.clone());
        // A kept connection can turn out to be closed when it is used (the
        // server ended it after its last answer). A request it did not send
        // goes out again on a new connection: no server saw it, so even a
        // purchase is safe to resend. One that was sent is never resent.
        let mut kept = self.checkout(client);
        loop {
            let fresh = kept.is_none();
            let mut sender = match kept.take() {
                Some(sender) => sender,
                None => self.connect(client).await?,
            };
            match sender.try_send_request(request).await {
                Ok(response) => return self.answer(client, sender, response).await,
                Err(mut error) => match error.take_message() {
                    Some(unsent) if !fresh => request = unsent,
                    _ => return Err(ShotError::Transport(error.into_error())),
                },
            }
        }
    }

    /// Reads the answer, then keeps the connection for the next request
    /// unless the server said it closes it.
    async fn answer(
        &self,
        client: usize,
        sender: SendRequest<Empty<Bytes>>,
        response: hyper::Response<hyper::body::Incoming>,
    ) -> Result<Answer, ShotError> {
        let status = response.status();
        let closing = response
            .headers()
            .get(CONNECTION)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"close"));
        let node = response
            .headers()
            .get("x-served-by")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let body = response.into_body().collect().await?.to_bytes();
        if !closing && !sender.is_closed() {
            self.idle.lock().expect("lanes poisoned")[client].push(sender);
        }
        Ok(Answer { status, node, body })
    }

    /// Opens up to `connections` connections ahead of the requests, spread
    /// over the clients as their requests will be, and keeps them idle: the
    /// requests of a run then start on open connections, as a crowd waiting
    /// on a sale's page has them, and their latency is the exchange's, not
    /// the TCP handshake's. A connection that cannot be opened is left to
    /// the request that needs it, whose outcome says why.
    pub async fn open_ahead(&self, connections: usize) {
        let opened = join_all((0..connections).map(|i| async move {
            let client = i % self.sources.len();
            self.connect(client).await.map(|sender| (client, sender))
        }))
        .await;
        let mut idle = self.idle.lock().expect("lanes poisoned");
        for (client, sender) in opened.into_iter().flatten() {
            idle[client].push(sender);
        }
    }

    fn checkout(&self, client: usize) -> Option<SendRequest<Empty<Bytes>>> {
        let mut idle = self.idle.lock().expect("lanes poisoned");
        while let Some(sender) = idle[client].pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    async fn connect(&self, client: usize) -> Result<SendRequest<Empty<Bytes>>, ShotError> {
        let stream = match self.sources[client] {
            None => TcpStream::connect(&self.address).await,
            Some(source) => from_source(source, &self.address).await,
        }
        .map_err(ShotError::Connect)?;
        stream.set_nodelay(true).map_err(ShotError::Connect)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        // The connection task ends when its sender is dropped or the peer
        // closes; its error is the request's error, reported there.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}

/// A connection to `address` leaving from `source`.
async fn from_source(source: IpAddr, address: &str) -> std::io::Result<TcpStream> {
    let remote = (tokio::net::lookup_host(address).await?)
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| std::io::Error::other(format!("{address} has no IPv4 address")))?;
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(remote).await
}

/// The `i`th address of the loopback block 127.`block`.x.y
/// (127.`block`.0.1 first): to nginx, each a client of its own. `who`
/// names the addresses' holders when there are more than the block has.
pub(super) fn loopback_address(block: u8, i: usize, who: &str) -> anyhow::Result<IpAddr> {
    let offset = u32::try_from(i + 1)
        .ok()
        .filter(|offset| *offset < 1 << 16)
        .with_context(|| format!("at most 65,535 {who} (one 127.{block}.x.y address each)"))?;
    Ok(IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(127, block, 0, 0)) + offset,
    )))
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use futures::future::join_all;
    use hyper::header::HeaderValue;

    use super::Lanes;

    #[test]
    fn a_target_is_a_plain_http_base_url() {
        let lanes =
            Lanes::new("http://127.0.0.1:8080/api/", "/voucher-order/seckill/7", 4).unwrap();
        assert_eq!(lanes.address, "127.0.0.1:8080");
        assert_eq!(lanes.host, "127.0.0.1:8080");
        assert_eq!(lanes.path, "/api/voucher-order/seckill/7");
        assert_eq!(
            Lanes::new("http://localhost", "/x", 1).unwrap().address,
            "localhost:80"
        );
        for bad in [
            "https://127.0.0.1:8443",
            "127.0.0.1:8080",
            "not a url",
            "http:///x",
        ] {
            assert!(Lanes::new(bad, "/x", 1).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_refused_or_dropped_connection_is_an_outcome_not_a_failure() {
        let token = HeaderValue::from_static("token");
        let refused = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let lanes = Lanes::new(&format!("http://{refused}"), "/x", 1).unwrap();
        let error = lanes
            .post(0, &token, &token)
            .await
            .err()
            .expect("nothing listens");
        assert_eq!(error.outcome(), "CONNECT_ERROR");

        // A server that accepts, then closes without answering.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                drop(socket);
            }
        });
        let lanes = Lanes::new(&format!("http://{address}"), "/x", 1).unwrap();
        let error = lanes
            .post(0, &token, &token)
            .await
            .err()
            .expect("no answer");
        assert_eq!(error.outcome(), "TRANSPORT_ERROR");
    }

    /// An HTTP server that answers every request with `{}`; on the first
    /// connection it says `Connection: close` and closes after one answer,
    /// as nginx does after `keepalive_requests`.
    async fn closing_server() -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut first = true;
            while let Ok((mut socket, _)) = listener.accept().await {
                let close_after_one = std::mem::take(&mut first);
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
                            match socket.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buffer.clear();
                        let connection = if close_after_one {
                            "close"
                        } else {
                            "keep-alive"
                        };
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: {connection}\r\n\r\n{{}}"
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() || close_after_one {
                            return;
                        }
                    }
                });
            }
        });
        address
    }

    #[tokio::test]
    async fn a_connection_the_server_closes_is_not_used_again() {
        let address = closing_server().await;
        let lanes = Lanes::new(&format!("http://{address}"), "/x", 1).unwrap();
        let token = HeaderValue::from_static("token");
        for attempt in 0..3 {
            let answer = lanes.post(0, &token, &token).await;
            assert!(answer.is_ok(), "request {attempt}: {:?}", answer.err());
        }
    }

    /// A server that answers every request with `{}` and reports the
    /// address of each connection it accepts.
    async fn counting_server() -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<IpAddr>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (peers, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, peer)) = listener.accept().await {
                peers.send(peer.ip()).unwrap();
                tokio::spawn(async move {
                    let mut chunk = [0u8; 1024];
                    while let Ok(read) = socket.read(&mut chunk).await {
                        if read == 0 {
                            return;
                        }
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (address, seen)
    }

    /// Connections opened ahead carry the requests: none is opened while
    /// they are sent, each client's from its own address.
    #[tokio::test]
    async fn requests_go_out_on_the_connections_opened_ahead() {
        let (address, mut seen) = counting_server().await;
        let lanes = Lanes::new(&format!("http://{address}"), "/x", 4)
            .unwrap()
            .spread_over(2)
            .unwrap();
        lanes.open_ahead(4).await;
        let idle: Vec<usize> = (lanes.idle.lock().unwrap().iter()).map(Vec::len).collect();
        assert_eq!(idle, [2, 2], "each client's connections, open and idle");

        let token = HeaderValue::from_static("token");
        let _permits = lanes.reserve(4).await;
        let answers = join_all((0..4).map(|client| lanes.post(client, &token, &token))).await;
        for answer in answers {
            assert_eq!(answer.unwrap().status, 200);
        }
        // Every connection that carried a request was accepted before its
        // answer: all of them are in the channel now.
        let mut accepted = Vec::new();
        while let Ok(ip) = seen.try_recv() {
            accepted.push(ip.to_string());
        }
        accepted.sort();
        assert_eq!(
            accepted,
            ["127.3.0.1", "127.3.0.1", "127.3.0.2", "127.3.0.2"]
        );
    }

    /// Many clients: each connection leaves from its client's own loopback
    /// address, and a client's connection is kept for that client alone.
    #[tokio::test]
    async fn each_client_sends_from_an_address_of_its_own() {
        let (address, mut seen) = counting_server().await;
        let token = HeaderValue::from_static("token");
        let lanes = Lanes::new(&format!("http://{address}"), "/x", 4)
            .unwrap()
            .spread_over(3)
            .unwrap();
        for client in [0, 1, 2, 3, 4, 5] {
            let answer = lanes.post(client, &token, &token).await.unwrap();
            assert_eq!(answer.status, 200);
        }
        let mut addresses = Vec::new();
        while let Ok(ip) = seen.try_recv() {
            addresses.push(ip.to_string());
        }
        assert_eq!(addresses, ["127.3.0.1", "127.3.0.2", "127.3.0.3"]);
        let remote = Lanes::new("http://192.0.2.1:80", "/x", 1).unwrap();
        assert!(remote.spread_over(2).is_err(), "a target off this machine");
    }
}
