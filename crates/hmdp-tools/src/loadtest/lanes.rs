//! The load generator's connections: at most `concurrency` keep-alive
//! HTTP/1.1 connections to one target, each carrying one request at a time.
//!
//! Built on hyper's connection API rather than a general client: the
//! generator shares the machine's cores with the nginx, nodes, Redis and
//! MySQL it measures, so CPU spent per request on parsing a URL or looking
//! up a shared pool is CPU taken from the system under test. Here the
//! request line is fixed once and a connection is a `Vec` pop.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
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
    idle: Mutex<Vec<SendRequest<Empty<Bytes>>>>,
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
            idle: Mutex::new(Vec::new()),
            budget: Semaphore::new(concurrency.max(1)),
        })
    }

    /// The concurrency budget: `n` requests may go out at once.
    pub async fn reserve(&self, n: u32) -> SemaphorePermit<'_> {
        self.budget
            .acquire_many(n)
            .await
            .expect("the semaphore is never closed")
    }

    /// One `POST` with `authorization: token`, `idempotency-key: key` and
    /// no body, on an idle connection or a new one. Call it under a
    /// `reserve` permit.
    pub async fn post(&self, token: &HeaderValue, key: &HeaderValue) -> Result<Answer, ShotError> {
        tokio::time::timeout(ANSWER_TIMEOUT, self.exchange(token, key))
            .await
            .unwrap_or(Err(ShotError::Timeout))
    }

    async fn exchange(&self, token: &HeaderValue, key: &HeaderValue) -> Result<Answer, ShotError> {
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
        let mut kept = self.checkout();
        loop {
            let fresh = kept.is_none();
            let mut sender = match kept.take() {
                Some(sender) => sender,
                None => self.connect().await?,
            };
            match sender.try_send_request(request).await {
                Ok(response) => return self.answer(sender, response).await,
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
            self.idle.lock().expect("lanes poisoned").push(sender);
        }
        Ok(Answer { status, node, body })
    }

    fn checkout(&self) -> Option<SendRequest<Empty<Bytes>>> {
        let mut idle = self.idle.lock().expect("lanes poisoned");
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<Empty<Bytes>>, ShotError> {
        let stream = TcpStream::connect(&self.address)
            .await
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

#[cfg(test)]
mod tests {
    use super::Lanes;
    use hyper::header::HeaderValue;

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
            .post(&token, &token)
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
        let error = lanes.post(&token, &token).await.err().expect("no answer");
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
            let answer = lanes.post(&token, &token).await;
            assert!(answer.is_ok(), "request {attempt}: {:?}", answer.err());
        }
    }
}
