//! The HTTP API of docs/design.md, one file per resource, plus the extractor
//! settings that turn malformed or slow input into hmdp-shaped 400/408/413
//! answers.

pub mod blog;
pub mod body_deadline;
pub mod front_end;
pub mod guards;
pub mod health;
pub mod metrics;
pub mod openapi;
pub mod response;
pub mod shop;
pub mod shop_type;
mod state;
pub mod user;
pub mod voucher;
pub mod voucher_order;

use actix_web::dev::ServiceResponse;
use actix_web::error::{JsonPayloadError, PayloadError, ResponseError};
use actix_web::http::header::ALLOW;
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::web;

use crate::error::Error;

pub use state::AppState;

/// Largest JSON body accepted; hmdp's bodies are a few hundred bytes.
pub const MAX_JSON_BYTES: usize = 16 * 1024;

/// Registers every route and the extractor error handlers.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::JsonConfig::default()
            .limit(MAX_JSON_BYTES)
            .error_handler(|err, _| json_error(err).into()),
    )
    .app_data(
        web::PathConfig::default()
            .error_handler(|err, _| Error::BadRequest(format!("路径参数错误: {err}")).into()),
    )
    .app_data(
        web::QueryConfig::default()
            .error_handler(|err, _| Error::BadRequest(format!("查询参数错误: {err}")).into()),
    )
    .configure(health::routes)
    .configure(metrics::routes)
    .configure(openapi::routes)
    .configure(user::routes)
    .configure(shop::routes)
    .configure(shop_type::routes)
    .configure(blog::routes)
    .configure(voucher::routes)
    .configure(voucher_order::routes)
    .default_service(web::to(|| async {
        Err::<actix_web::HttpResponse, _>(Error::NotFound)
    }));
}

/// Middleware (`ErrorHandlers` for 405): actix's answer to a method a path
/// does not take, its `Allow` header kept, given hmdp's body.
pub fn method_not_allowed<B>(
    answer: ServiceResponse<B>,
) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let (request, response) = answer.into_parts();
    let mut failure = Error::MethodNotAllowed.error_response();
    if let Some(allow) = response.headers().get(ALLOW) {
        failure.headers_mut().insert(ALLOW, allow.clone());
    }
    Ok(ErrorHandlerResponse::Response(
        ServiceResponse::new(request, failure).map_into_right_body(),
    ))
}

/// hmdp's `current`: the page number of a list, from 1 (the default).
/// hmdp reads it as a Java `Integer`: 1 to 2^31 - 1.
fn page_number(current: Option<i32>) -> Result<u32, Error> {
    u32::try_from(current.unwrap_or(1))
        .ok()
        .filter(|page| *page > 0)
        .ok_or_else(|| Error::BadRequest("current 必须从 1 开始".into()))
}

fn json_error(err: JsonPayloadError) -> Error {
    match err {
        JsonPayloadError::Overflow { .. }
        | JsonPayloadError::OverflowKnownLength { .. }
        | JsonPayloadError::Payload(PayloadError::Overflow) => Error::PayloadTooLarge,
        JsonPayloadError::Payload(ref payload) if body_deadline::is_expired(payload) => {
            Error::RequestTimeout
        }
        other => Error::BadRequest(format!("请求体格式错误: {other}")),
    }
}
