//! The request body's deadline: actix's `client_request_timeout` covers only
//! the headers, so without it a client sending one byte a second holds its
//! connection, and the handler reading the body, for as long as it likes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use bytes::Bytes;
use futures::Stream;
use tokio::time::{Instant, Sleep};

/// Middleware: reading the request's body fails with a timed-out
/// [`PayloadError`] (see [`is_expired`]) once `timeout` has passed since its
/// headers arrived.
pub async fn enforce(
    timeout: Duration,
    mut request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let payload = request.take_payload();
    if !matches!(payload, Payload::None) {
        let deadline = Deadline {
            payload,
            expiry: Instant::now() + timeout,
            timer: None,
        };
        request.set_payload(Payload::Stream {
            payload: Box::pin(deadline),
        });
    }
    next.call(request).await
}

/// Whether a body read failed because its deadline passed.
pub fn is_expired(error: &PayloadError) -> bool {
    matches!(error, PayloadError::Io(io) if io.kind() == io::ErrorKind::TimedOut)
}

/// A request payload that fails once its deadline has passed.
struct Deadline {
    payload: Payload,
    expiry: Instant,
    /// Armed on the first wait for data: a body that is there at once (most
    /// are) never costs a timer.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Stream for Deadline {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Poll::Ready(item) = Pin::new(&mut this.payload).poll_next(cx) {
            return Poll::Ready(item);
        }
        let expiry = this.expiry;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(expiry)));
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Some(Err(PayloadError::Io(io::ErrorKind::TimedOut.into()))))
    }
}
