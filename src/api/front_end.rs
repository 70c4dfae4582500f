//! hmdp's front end reads the body of a 200 only: any other status but 401
//! shows as 服务器异常, whatever the body says. So the requests nginx passes
//! on from it (under `/api`) carry `X-Refusal-Status: 200`, and a limit's
//! refusal is answered to them as hmdp answers every refusal: 200 with
//! `success:false`, the `RATE_LIMITED` body and the `Retry-After` and
//! `RateLimit` headers unchanged, so the page shows 操作太频繁. Every other
//! client gets the 429.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;

/// The request header that asks for refusals as 200s.
pub const REFUSAL_STATUS: &str = "x-refusal-status";

/// Middleware: a 429 answered with 200 to a request that asked for it.
pub async fn refusals_as_200(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let asked =
        (request.headers().get(REFUSAL_STATUS)).is_some_and(|value| value.as_bytes() == b"200");
    let mut response = next.call(request).await?;
    if asked && response.status() == StatusCode::TOO_MANY_REQUESTS {
        *response.response_mut().status_mut() = StatusCode::OK;
    }
    Ok(response)
}
