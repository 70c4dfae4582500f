//! A client that sends its request body slower than the body deadline gets
//! 408 and its connection closed, instead of holding it open for as long as
//! it keeps trickling.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{socket_address, spawn_app};

/// Far beyond the 1 s deadline: only a connection that is never closed
/// reaches it, however loaded the machine.
const BOUND: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_body_trickled_byte_by_byte_gets_408_and_the_connection_closed() {
    let app = spawn_app(|s| s.body_timeout_ms = 1000).await;
    let stream = TcpStream::connect(socket_address(&app)).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    writer
        .write_all(
            b"POST /user/login HTTP/1.1\r\nHost: hmdp\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n",
        )
        .await
        .unwrap();
    // One byte a second, never reaching the 100 announced.
    let trickle = tokio::spawn(async move {
        for _ in 0..99 {
            if writer.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });

    let mut answer = Vec::new();
    let closed = tokio::time::timeout(BOUND, async {
        let mut chunk = [0u8; 1024];
        // A reset after the answer counts as closed too.
        while let Ok(read @ 1..) = reader.read(&mut chunk).await {
            answer.extend_from_slice(&chunk[..read]);
        }
    })
    .await;
    trickle.abort();

    let answer = String::from_utf8_lossy(&answer);
    assert!(
        closed.is_ok(),
        "the connection was still open after {BOUND:?}; received so far: {answer:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "not a 408: {answer:?}");
    assert!(
        answer
            .ends_with(r#"{"success":false,"errorMsg":"请求超时","errorCode":"REQUEST_TIMEOUT"}"#),
        "not hmdp's body: {answer:?}"
    );
}
