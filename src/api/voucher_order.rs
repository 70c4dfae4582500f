//! `/voucher-order/*`: the purchase (with an optional `Idempotency-Key`),
//! the caller's own orders, written or (admitted in `queue` or `stream`
//! mode) still pending, and the order's life after the sale: pay, cancel,
//! and (admin) use.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::guards::{Admin, ClientIp};
use super::response::{ok_data, ApiResult};
use super::AppState;
use crate::after_sale::{OrderView, PAY_TYPES};
use crate::auth::CurrentUser;
use crate::contract::{AdminOnly, Backend, BadBody, BadInput, Failure, Limited, NoRoute, SignedIn};
use crate::error::{Error, Rejection};
use crate::idempotency::IdempotencyKey;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::limits::{Counting, Rule};
use crate::seckill::{OrderStatus, PendingOrder};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/voucher-order/seckill/{voucherId}").route(web::post().to(seckill_voucher)),
    )
    .service(web::resource("/voucher-order/{orderId}").route(web::get().to(order)))
    .service(web::resource("/voucher-order/{orderId}/pay").route(web::post().to(pay)))
    .service(web::resource("/voucher-order/{orderId}/cancel").route(web::post().to(cancel)))
    .service(web::resource("/voucher-order/{orderId}/use").route(web::post().to(mark_used)));
}

/// The header a replayed answer carries.
const REPLAYED: &str = "idempotent-replayed";

/// The flash-sale purchase: one order per user and voucher. With an
/// `Idempotency-Key`, a request sent again (a retry after a timeout) gets
/// the answer the first one got, marked `idempotent-replayed: true`.
#[utoipa::path(
    post,
    path = "/voucher-order/seckill/{voucherId}",
    tag = "voucher-order",
    params(
        ("voucherId" = String, Path, description = "The flash-sale voucher's id.", pattern = "^[1-9][0-9]{0,18}$"),
        ("idempotency-key" = Option<String>, Header, nullable = false,
            description = "1 to 255 visible ASCII characters but `\"`, unique per purchase.",
            pattern = "^[!#-~]{1,255}$"),
    ),
    security(("session" = [])),
    responses(
        (status = 200,
            description = "The order's id, or a business no: `VOUCHER_NOT_FOUND`, \
                `NOT_STARTED`, `ENDED`, `SOLD_OUT`, `ALREADY_ORDERED`, `DUPLICATE_REQUEST`.",
            body = ApiResult<OrderId>,
            headers(("idempotent-replayed" = String,
                description = "`true` on the answer an earlier request with the key got."))),
        (status = 409, description = "`IDEMPOTENCY_KEY_IN_USE`: a request with the key is still being answered.",
            body = Failure),
        (status = 422, description = "`IDEMPOTENCY_KEY_REUSED`: the key was first sent with another request.",
            body = Failure),
        BadInput,
        NoRoute,
        SignedIn,
        Limited,
        Backend,
    ),
)]
pub(super) async fn seckill_voucher(
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
    // A subject this node remembers refused is answered here. What is left
    // to count is counted before the node sheds (a purchase over its limit
    // takes no place among those admitted), but for an admitted purchase's,
    // which its admission script counts in its own call, once admitted.
    let mut limits = Counting::from(
        (state.limits)
            .owe(&[(Rule::PurchaseByUser, &user), (Rule::PurchaseByIp, &client)])
            .await?,
    );
    if !seckill.admits_in_redis() {
        limits.pay_now().await?;
    }
    let _in_flight = state.overload.admit()?;
    let answer = seckill
        .purchase_once(user, voucher_id, current.since, key, limits)
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

/// An order as `GET /voucher-order/{orderId}` answers it.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum OrderAnswer {
    Written(OrderView),
    Pending(PendingOrder),
}

/// One of the caller's orders: written to MySQL, or admitted and still on
/// its way (`"pending": true`).
#[utoipa::path(
    get,
    path = "/voucher-order/{orderId}",
    tag = "voucher-order",
    params(("orderId" = String, Path, description = "The order's id.", pattern = "^[1-9][0-9]{0,18}$")),
    security(("session" = [])),
    responses(
        (status = 200, description = "The order, or `ORDER_NOT_FOUND`.", body = ApiResult<OrderAnswer>),
        BadInput,
        NoRoute,
        SignedIn,
        Backend,
    ),
)]
pub(super) async fn order(
    state: web::Data<AppState>,
    current: CurrentUser,
    order_id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let order_id: OrderId = order_id.parse()?;
    let answer = match state
        .seckill
        .order_status(order_id, current.user.id)
        .await?
    {
        Some(OrderStatus::Written(order)) => OrderAnswer::Written(state.after_sale.view(order)),
        Some(OrderStatus::Pending(pending)) => OrderAnswer::Pending(pending),
        None => return Err(Rejection::OrderNotFound.into()),
    };
    Ok(ok_data(answer))
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct PayBody {
    /// hmdp's `pay_type`: 1 balance, 2 Alipay, 3 WeChat.
    #[schema(minimum = 1, maximum = 3)]
    pay_type: u8,
}

/// Pays an unpaid order before its deadline.
#[utoipa::path(
    post,
    path = "/voucher-order/{orderId}/pay",
    tag = "voucher-order",
    params(("orderId" = String, Path, description = "The order's id.", pattern = "^[1-9][0-9]{0,18}$")),
    request_body = PayBody,
    security(("session" = [])),
    responses(
        (status = 200,
            description = "The paid order, or `ORDER_NOT_FOUND`, `ORDER_PENDING`, `ORDER_CLOSED`.",
            body = ApiResult<OrderView>),
        BadBody,
        NoRoute,
        SignedIn,
        Limited,
        Backend,
    ),
)]
pub(super) async fn pay(
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

/// Cancels an unpaid order; its unit goes back on sale.
#[utoipa::path(
    post,
    path = "/voucher-order/{orderId}/cancel",
    tag = "voucher-order",
    params(("orderId" = String, Path, description = "The order's id.", pattern = "^[1-9][0-9]{0,18}$")),
    security(("session" = [])),
    responses(
        (status = 200,
            description = "The closed order, or `ORDER_NOT_FOUND`, `ORDER_PENDING`, `ORDER_PAID`.",
            body = ApiResult<OrderView>),
        BadInput,
        NoRoute,
        SignedIn,
        Limited,
        Backend,
    ),
)]
pub(super) async fn cancel(
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

/// Marks a paid order used (the shop redeemed it).
#[utoipa::path(
    post,
    path = "/voucher-order/{orderId}/use",
    tag = "voucher-order",
    params(("orderId" = String, Path, description = "The order's id.", pattern = "^[1-9][0-9]{0,18}$")),
    security(("admin" = [])),
    responses(
        (status = 200,
            description = "The used order, or `ORDER_NOT_FOUND`, `ORDER_NOT_PAID`, `ORDER_CLOSED`.",
            body = ApiResult<OrderView>),
        BadInput,
        NoRoute,
        AdminOnly,
        Backend,
    ),
)]
pub(super) async fn mark_used(
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
