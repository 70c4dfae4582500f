//! hmdp's `Result` body: `{"success":true,"data":...,"total":N}` or
//! `{"success":false,"errorMsg":"...","errorCode":"..."}`, null fields left out.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{redis_error_kind, Error};
use crate::metrics;

/// hmdp's `Result`: `data` on a success; `errorMsg` and `errorCode` on a
/// business "no" (still HTTP 200) and on every failure.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiResult<T> {
    pub success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_msg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::contract::ErrorCode>)]
    pub error_code: Option<&'static str>,
}

impl ApiResult<()> {
    pub fn fail(message: String, code: &'static str) -> Self {
        ApiResult {
            success: false,
            error_msg: Some(message),
            data: None,
            total: None,
            error_code: Some(code),
        }
    }
}

/// `{"success":true}`.
pub fn ok() -> HttpResponse {
    HttpResponse::Ok().json(ApiResult::<()> {
        success: true,
        error_msg: None,
        data: None,
        total: None,
        error_code: None,
    })
}

/// `{"success":true,"data":...}`.
pub fn ok_data<T: Serialize>(data: T) -> HttpResponse {
    HttpResponse::Ok().json(ApiResult {
        success: true,
        error_msg: None,
        data: Some(data),
        total: None,
        error_code: None,
    })
}

/// Serializes a 64-bit id as a JSON string: JavaScript numbers lose precision
/// past 2^53, and order ids use all 63 bits.
pub mod id_string {
    use serde::Serializer;

    pub fn serialize<S: Serializer>(id: &i64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(id)
    }
}

/// An [`Error`] as hmdp answers it: the status, and the `Result` body with
/// the message and `errorCode`. Infrastructure errors are logged here, once
/// per request, with their whole cause chain, and a Redis error among the
/// causes counted in `redis_errors_total` by kind.
impl ResponseError for Error {
    fn status_code(&self) -> StatusCode {
        match self {
            Error::Rejected(_) => StatusCode::OK,
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::Unauthorized => StatusCode::UNAUTHORIZED,
            Error::Forbidden => StatusCode::FORBIDDEN,
            Error::NotFound => StatusCode::NOT_FOUND,
            Error::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Error::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Error::IdempotencyKeyInUse => StatusCode::CONFLICT,
            Error::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Error::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Error::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            Error::Unavailable(cause) | Error::Internal(cause) => {
                if let Some(redis) = cause.downcast_ref::<redis::RedisError>() {
                    metrics::REDIS_ERRORS
                        .with_label_values(&[redis_error_kind(redis)])
                        .inc();
                }
                if matches!(self, Error::Unavailable(_)) {
                    tracing::warn!(error = ?self, "backend unavailable");
                } else {
                    tracing::error!(error = ?self, "request failed");
                }
            }
            // Someone without the token tried an admin route: worth seeing.
            Error::Forbidden => {
                tracing::warn!("admin request refused: wrong or missing x-admin-token")
            }
            _ => {}
        }
        let mut response = HttpResponse::build(self.status_code());
        match self {
            Error::RateLimited(limited) => {
                response
                    .insert_header(("retry-after", limited.retry_after_secs()))
                    .insert_header(("ratelimit-policy", limited.policy_header()))
                    .insert_header(("ratelimit", limited.rate_limit_header()));
            }
            // A node sheds for as long as its purchases run late: a second
            // is about one of them.
            Error::Overloaded => {
                response.insert_header(("retry-after", 1));
            }
            _ => {}
        }
        response.json(ApiResult::<()>::fail(self.to_string(), self.error_code()))
    }
}
