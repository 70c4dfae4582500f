//! The API's contract: an OpenAPI 3.1 document generated from the handlers'
//! `#[utoipa::path]` annotations and the types they read and answer with,
//! served at `/openapi.json`, printed by `hmdp-server openapi` and kept in
//! `docs/openapi.json` (a test fails when the two differ).
//!
//! Every answer has hmdp's `Result` body ([`ApiResult`](super::response::ApiResult)):
//! a business "no" is a 200 with `success:false` and an [`ErrorCode`]; every
//! other failure is its status with the same body ([`Failure`]). The
//! response sets of [`crate::contract`] say which statuses a route can
//! answer, and why.

use std::sync::LazyLock;

use actix_web::{web, HttpResponse};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{blog, health, metrics, shop, shop_type, user, voucher, voucher_order};
use crate::contract::{ErrorCode, Failure};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hmdp-rs",
        description = "The Heima Dianping (黑马点评) flash-sale voucher backend: \
            hmdp's API, one order per user. Every body is hmdp's `Result`: \
            `{\"success\":true,\"data\":...}` or \
            `{\"success\":false,\"errorMsg\":\"...\",\"errorCode\":\"...\"}`; \
            a business \"no\" (sold out, already ordered, ...) is a 200 with \
            `success:false`.",
        license(name = "MIT"),
    ),
    paths(
        health::health,
        health::ready,
        metrics::metrics,
        contract,
        user::send_code,
        user::login,
        user::me,
        user::info,
        user::logout,
        shop::shop,
        shop::shops_of_type,
        shop_type::list,
        blog::hot,
        blog::of_me,
        voucher::add_voucher,
        voucher::add_seckill_voucher,
        voucher::list_vouchers,
        voucher_order::seckill_voucher,
        voucher_order::order,
        voucher_order::pay,
        voucher_order::cancel,
        voucher_order::mark_used,
    ),
    components(schemas(ErrorCode, Failure)),
    modifiers(&Credentials),
    tags(
        (name = "node", description = "The node itself: liveness, readiness, metrics, this contract."),
        (name = "user", description = "Login by phone code, the session, users' details."),
        (name = "shop", description = "Shops and their categories, read through the Redis cache."),
        (name = "blog", description = "hmdp's notes: always empty here (the blog chapter is not ported)."),
        (name = "voucher", description = "Vouchers and flash-sale (seckill) vouchers."),
        (name = "voucher-order", description = "The flash-sale purchase and the order's life after it."),
    )
)]
pub struct ApiDoc;

/// The contract as JSON, exactly as `/openapi.json` serves it.
pub fn contract_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the generated contract serializes")
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/openapi.json").route(web::get().to(contract)));
}

/// Generated once, on the first request for it.
static CONTRACT: LazyLock<String> = LazyLock::new(contract_json);

/// This contract.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "node",
    responses((status = 200, description = "This document.", body = Object)),
)]
async fn contract() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(CONTRACT.as_str())
}

/// The two credentials the routes' `security` names: `session`, the token
/// `/user/login` answers, in `authorization` as hmdp's front end sends it,
/// and `admin`, the admin token.
struct Credentials;

impl Modify for Credentials {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "authorization",
                "The session token `/user/login` answers; it lives 30 minutes \
                 from its last use.",
            ))),
        );
        components.add_security_scheme(
            "admin",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "x-admin-token",
                "The node's admin token (`--admin-token`, `HMDP_ADMIN_TOKEN`).",
            ))),
        );
    }
}
