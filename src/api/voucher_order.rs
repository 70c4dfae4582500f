//! `/voucher-order/*`: the purchase (with an optional `Idempotency-Key`),
//! the caller's own orders, written or (admitted in `queue` or `stream`
//! mode) still pending, and the order's life after the sale: pay, cancel,
//! and (admin) use.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::guards::{Admin, ClientIp};
use super::response::ok_data;
use super::AppState;
use crate::after_sale::PAY_TYPES;
use crate::auth::CurrentUser;
use crate::error::{Error, Rejection};
use crate::idempotency::IdempotencyKey;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::limits::Rule;
use crate::seckill::OrderStatus;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/voucher-order/seckill/{voucherId}",
        web::post().to(seckill_voucher),
    )
    .route("/voucher-order/{orderId}", web::get().to(order))
    .route("/voucher-order/{orderId}/pay", web::post().to(pay))
    .route("/voucher-order/{orderId}/cancel", web::post().to(cancel))
    .route("/voucher-order/{orderId}/use", web::post().to(mark_used));
}

/// The header a replayed answer carries.
const REPLAYED: &str = "idempotent-replayed";

async fn seckill_voucher(
    state: web::Data<AppState>,
    client: ClientIp,
    current: CurrentUser,
    voucher_id: web::Path<String>,
    request: HttpRequest,
) -> Result<HttpResponse, Error> {
    let voucher_id: VoucherId = voucher_id.parse()?;
    let user = current.user.id;
    let key = request
        .headers()
        .get("idempotency-key")
        .map(|value| IdempotencyKey::parse(value.as_bytes()))
        .transpose()?;
    // A sale known sold out is answered before the limits cost a trip to
    // Redis: the cheapest answer there is, whoever asks how often.
    let seckill = &state.seckill;
    if let Some(answer) = seckill
        .answered_from_memory(user, voucher_id, key.as_ref())
        .await
    {
        return purchase_answer(answer?);
    }
    (state.limits)
        .take(&[(Rule::PurchaseByUser, &user), (Rule::PurchaseByIp, &client)])
        .await?;
    let _in_flight = state.overload.admit()?;
    let answer = seckill
        .purchase_once(user, voucher_id, current.since, key)
        .await?;
    purchase_answer(answer)
}

/// A purchase's order id, marked when it is the answer an earlier request
/// with the same Idempotency-Key got.
fn purchase_answer((order_id, again): (OrderId, bool)) -> Result<HttpResponse, Error> {
    let mut response = ok_data(order_id);
    if again {
        response.headers_mut().insert(
            actix_web::http::header::HeaderName::from_static(REPLAYED),
            actix_web::http::header::HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}

async fn order(
    state: web::Data<AppState>,
    current: CurrentUser,
    order_id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let order_id: OrderId = order_id.parse()?;
    match state
        .seckill
        .order_status(order_id, current.user.id)
        .await?
    {
        Some(OrderStatus::Written(order)) => Ok(ok_data(state.after_sale.view(order))),
        Some(OrderStatus::Pending(pending)) => Ok(ok_data(pending)),
        None => Err(Rejection::OrderNotFound.into()),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PayBody {
    /// hmdp's `pay_type`: 1 balance, 2 Alipay, 3 WeChat.
    pay_type: u8,
}

async fn pay(
    state: web::Data<AppState>,
    client: ClientIp,
    current: CurrentUser,
    order_id: web::Path<String>,
    body: web::Json<PayBody>,
) -> Result<HttpResponse, Error> {
    let order_id: OrderId = order_id.parse()?;
    limit_order_action(&state, client, &current).await?;
    if !PAY_TYPES.contains(&body.pay_type) {
        return Err(Error::BadRequest(format!(
            "payType 必须是 1（余额）、2（支付宝）或 3（微信），收到 {}",
            body.pay_type
        )));
    }
    let paid = state
        .after_sale
        .pay(order_id, current.user.id, body.pay_type)
        .await;
    Ok(ok_data(
        pending_told(&state, order_id, current.user.id, paid).await?,
    ))
}

async fn cancel(
    state: web::Data<AppState>,
    client: ClientIp,
    current: CurrentUser,
    order_id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let order_id: OrderId = order_id.parse()?;
    limit_order_action(&state, client, &current).await?;
    let cancelled = state.after_sale.cancel(order_id, current.user.id).await;
    Ok(ok_data(
        pending_told(&state, order_id, current.user.id, cancelled).await?,
    ))
}

/// Counts a pay or cancel against the client's and the user's limits.
async fn limit_order_action(
    state: &AppState,
    client: ClientIp,
    current: &CurrentUser,
) -> Result<(), Error> {
    (state.limits)
        .take(&[
            (Rule::OrderByUser, &current.user.id),
            (Rule::OrderByIp, &client),
        ])
        .await?;
    Ok(())
}

async fn mark_used(
    state: web::Data<AppState>,
    _admin: Admin,
    order_id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let order_id: OrderId = order_id.parse()?;
    Ok(ok_data(state.after_sale.mark_used(order_id).await?))
}

/// An order MySQL does not have may be the buyer's, admitted and not yet
/// written (`queue`, `stream`): the buyer hears to ask again shortly, not
/// that it does not exist.
async fn pending_told<T>(
    state: &AppState,
    order_id: OrderId,
    buyer: UserId,
    answer: Result<T, Error>,
) -> Result<T, Error> {
    match answer {
        Err(Error::Rejected(Rejection::OrderNotFound)) => {
            let pending = state
                .seckill
                .sale_state()
                .pending_order(order_id, buyer)
                .await?;
            Err(if pending.is_some() {
                Rejection::OrderPending
            } else {
                Rejection::OrderNotFound
            }
            .into())
        }
        answer => answer,
    }
}
