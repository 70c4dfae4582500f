//! `/voucher-order/*`: the purchase and the caller's own orders, written or
//! (admitted in `queue` or `stream` mode) still pending.

use actix_web::{web, HttpResponse};

use super::response::ok_data;
use super::AppState;
use crate::auth::CurrentUser;
use crate::error::{Error, Rejection};
use crate::ids::{OrderId, VoucherId};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/voucher-order/seckill/{voucherId}",
        web::post().to(seckill_voucher),
    )
    .route("/voucher-order/{orderId}", web::get().to(order));
}

async fn seckill_voucher(
    state: web::Data<AppState>,
    current: CurrentUser,
    voucher_id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let voucher_id: VoucherId = voucher_id.parse()?;
    let order_id = state
        .seckill
        .purchase(current.user.id, voucher_id, current.since)
        .await?;
    Ok(ok_data(order_id))
}

async fn order(
    state: web::Data<AppState>,
    current: CurrentUser,
    order_id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let order_id: OrderId = order_id.parse()?;
    let order = state
        .seckill
        .order_status(order_id, current.user.id)
        .await?
        .ok_or(Rejection::OrderNotFound)?;
    Ok(ok_data(order))
}
