//! The HTTP API of docs/design.md, one file per resource, plus the extractor
//! settings that turn malformed or slow input into hmdp-shaped 400/408/413
//! answers.

pub mod blog;
pub mod body_deadline;
pub mod front_end;
pub mod guards;
pub mod health;
pub mod metrics;
pub mod response;
pub mod shop;
pub mod shop_type;
mod state;
pub mod user;
pub mod voucher;
pub mod voucher_order;

use actix_web::error::{JsonPayloadError, PayloadError};
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

/// hmdp's `current`: the page number of a list, from 1 (the default).
fn page_number(current: Option<u32>) -> Result<u32, Error> {
    match current.unwrap_or(1) {
        0 => Err(Error::BadRequest("current 必须从 1 开始".into())),
        page => Ok(page),
    }
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
