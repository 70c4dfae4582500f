//! The request guards: who is asking. A handler that names [`CurrentUser`]
//! runs only for a request with a live session, one that names [`Admin`]
//! only for one carrying the admin token; [`ClientIp`] says from where.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use actix_web::{web, FromRequest, HttpRequest};

use super::AppState;
use crate::auth::CurrentUser;
use crate::error::Error;

impl FromRequest for CurrentUser {
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Error>>>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let token = req
            .headers()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|token| !token.is_empty() && token.len() <= 64)
            .map(str::to_owned);
        let since = std::time::Instant::now();
        Box::pin(async move {
            let state = state.ok_or_else(|| Error::Internal(anyhow::anyhow!("no app state")))?;
            let token = token.ok_or(Error::Unauthorized)?;
            let user = state
                .sessions
                .touch(&token)
                .await?
                .ok_or(Error::Unauthorized)?;
            Ok(CurrentUser { user, token, since })
        })
    }
}

/// Proof that the request carried the admin token.
pub struct Admin;

impl FromRequest for Admin {
    type Error = Error;
    type Future = std::future::Ready<Result<Self, Error>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let expected = req
            .app_data::<web::Data<AppState>>()
            .map(|state| &state.admin_token);
        let given = req
            .headers()
            .get("x-admin-token")
            .map(|value| value.as_bytes());
        let allowed = match (expected, given) {
            (Some(expected), Some(given)) => expected.matches(given),
            _ => false,
        };
        std::future::ready(if allowed {
            Ok(Admin)
        } else {
            Err(Error::Forbidden)
        })
    }
}

/// The client's address: `X-Real-IP`, which nginx sets from the
/// connection it accepted (overwriting whatever the client sent), or the
/// peer's own address for a request that came straight to the node. The
/// nodes trust the header: they are reached through nginx, never exposed
/// directly (docs/limits.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub Option<IpAddr>);

impl FromRequest for ClientIp {
    type Error = Error;
    type Future = std::future::Ready<Result<Self, Error>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let forwarded = (req.headers().get("x-real-ip"))
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse().ok());
        let peer = req.peer_addr().map(|peer| peer.ip());
        std::future::ready(Ok(ClientIp(forwarded.or(peer))))
    }
}

impl fmt::Display for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(ip) => ip.fmt(f),
            None => f.write_str("unknown"),
        }
    }
}
