//! The order's life after the sale: the buyer pays or cancels, an admin
//! marks a paid order used, and an order left unpaid past its deadline is
//! closed by whichever node gets to it first.
//!
//! A close (cancel, timeout or sweep) is one MySQL transaction: the
//! conditional update that closes the order (`… AND status = 1`, so that a
//! payment racing it and a second closer both lose to it, or it to them),
//! the unit back in MySQL's stock, and the give-back owed to Redis recorded
//! in `tb_order_giveback`. The give-back then reaches the Redis sale (one
//! unit more, the buyer's turn back) through `lua/giveback.lua`, keyed by the
//! order id: exactly once, however often it is sent. A node killed between
//! the two leaves the row, which any node's closer sends again.
//!
//! - `deadlines.rs` — the due times of unpaid orders in Redis
//! - `closer.rs` — each node's closer, in the background or one round on
//!   demand: due times, the MySQL sweep, owed give-backs, the metrics

mod closer;
mod deadlines;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use chrono::NaiveDateTime;
use redis::Script;
use serde::Serialize;

pub use closer::{Closer, Round};
pub use deadlines::PayDeadlines;

use crate::error::{Error, Rejection};
use crate::ids::{OrderId, UserId, VoucherId};
use crate::keys::Keys;
use crate::metrics;
use crate::redis_handle::RedisConnection;
use crate::shards::Shard;
use crate::store::{CloseCause, Closing, Giveback, OrderState, Paid, Store, Using, VoucherOrder};

static GIVE_BACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/giveback.lua")));

/// `--pay-timeout-secs`' default: hmdp's 15 minutes.
pub const DEFAULT_PAY_TIMEOUT: Duration = Duration::from_secs(900);

/// hmdp's `pay_type`: 1 balance, 2 Alipay, 3 WeChat.
pub const PAY_TYPES: std::ops::RangeInclusive<u8> = 1..=3;

/// Called with a voucher whose unit came back: the node forgets that it saw
/// the voucher sell out.
pub type OnReturned = Arc<dyn Fn(VoucherId) + Send + Sync>;

/// An order as `GET /voucher-order/{id}` and the after-sale endpoints show
/// it: the row, and for an unpaid order the moment it closes unpaid.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderView {
    #[serde(flatten)]
    pub order: VoucherOrder,
    /// An unpaid order: when it closes unpaid.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::contract::local_time)]
    pub pay_deadline: Option<NaiveDateTime>,
}

/// Pays, cancels, uses and closes orders, and gives closed orders' units
/// back.
pub struct AfterSale {
    store: Store,
    redis: RedisConnection,
    keys: Keys,
    deadlines: PayDeadlines,
    on_returned: OnReturned,
    /// Fault injection: a sleep between a close's commit and its give-back.
    chaos_giveback_delay: Duration,
}

impl AfterSale {
    pub fn new(
        store: Store,
        redis: RedisConnection,
        keys: Keys,
        deadlines: PayDeadlines,
        on_returned: OnReturned,
        chaos_giveback_delay: Duration,
    ) -> Self {
        for cause in CloseCause::ALL {
            metrics::ORDERS_CLOSED.with_label_values(&[cause.label()]);
        }
        for outcome in GivenBack::LABELS {
            metrics::GIVEBACKS.with_label_values(&[outcome]);
        }
        AfterSale {
            store,
            redis,
            keys,
            deadlines,
            on_returned,
            chaos_giveback_delay,
        }
    }

    pub fn deadlines(&self) -> &PayDeadlines {
        &self.deadlines
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// `order` with its deadline when unpaid.
    pub fn view(&self, order: VoucherOrder) -> OrderView {
        let unpaid = order.status == OrderState::Unpaid as u8;
        let timeout = chrono::Duration::from_std(self.deadlines.pay_timeout())
            .unwrap_or(chrono::Duration::MAX);
        OrderView {
            pay_deadline: unpaid.then(|| order.create_time + timeout),
            order,
        }
    }

    /// The buyer pays their order: unpaid → paid. A paid (or used) order
    /// is answered as it is; a closed one, or one past its deadline (closed
    /// now), is refused.
    pub async fn pay(
        &self,
        order_id: OrderId,
        buyer: UserId,
        pay_type: u8,
    ) -> Result<OrderView, Error> {
        let timeout = self.deadlines.pay_timeout();
        match self.store.pay(order_id, buyer, pay_type, timeout).await? {
            Paid::Paid { order, now } => {
                if now {
                    metrics::ORDERS_PAID.inc();
                    self.no_deadline(order_id).await;
                }
                Ok(self.view(order))
            }
            Paid::Closed => Err(Rejection::OrderClosed.into()),
            // Past its deadline: closed now, unless a payment or a close
            // came first.
            Paid::Overdue => match self.close(order_id, None, CloseCause::Timeout).await? {
                Closing::Settled(order) if order.status != OrderState::Closed as u8 => {
                    Ok(self.view(order))
                }
                Closing::Closed(_) | Closing::Settled(_) => Err(Rejection::OrderClosed.into()),
                Closing::NotDue => Err(Error::Unavailable(anyhow::anyhow!(
                    "order {order_id} is past its deadline for the payment and not for the close \
                     (MySQL's clock stepped back); try again"
                ))),
                Closing::NotFound => Err(Rejection::OrderNotFound.into()),
            },
            Paid::NotFound => Err(Rejection::OrderNotFound.into()),
        }
    }

    /// The buyer cancels their unpaid order; cancelling a closed order
    /// again is answered with it as it is.
    pub async fn cancel(&self, order_id: OrderId, buyer: UserId) -> Result<OrderView, Error> {
        match self
            .close(order_id, Some(buyer), CloseCause::Cancel)
            .await?
        {
            Closing::Closed(_) => self
                .store
                .order_of_user(order_id, buyer)
                .await?
                .map(|order| self.view(order))
                .ok_or(Rejection::OrderNotFound.into()),
            Closing::Settled(order) if order.status == OrderState::Closed as u8 => {
                Ok(self.view(order))
            }
            Closing::Settled(_) => Err(Rejection::OrderPaid.into()),
            Closing::NotDue => Err(Error::Internal(anyhow::anyhow!(
                "a cancel found order {order_id} unpaid and did not close it"
            ))),
            Closing::NotFound => Err(Rejection::OrderNotFound.into()),
        }
    }

    /// An admin marks a paid order used (核销); a used order again is
    /// answered as it is.
    pub async fn mark_used(&self, order_id: OrderId) -> Result<OrderView, Error> {
        match self.store.mark_used(order_id).await? {
            Using::Used(order) => Ok(self.view(order)),
            Using::NotPaid(order) if order.status == OrderState::Unpaid as u8 => {
                Err(Rejection::OrderNotPaid.into())
            }
            Using::NotPaid(_) => Err(Rejection::OrderClosed.into()),
            Using::NotFound => Err(Rejection::OrderNotFound.into()),
        }
    }

    /// Closes an unpaid order — `buyer`'s only, when given; past its
    /// deadline only, unless cancelled — and gives its unit back. The unit
    /// is back in MySQL when this returns `Closed`; should Redis fail, the
    /// give-back stays owed and a closer sends it.
    pub async fn close(
        &self,
        order_id: OrderId,
        buyer: Option<UserId>,
        cause: CloseCause,
    ) -> Result<Closing, Error> {
        let overdue_after = (cause != CloseCause::Cancel).then(|| self.deadlines.pay_timeout());
        let closing = self.store.close(order_id, buyer, overdue_after).await?;
        if let Closing::Closed(giveback) = &closing {
            metrics::ORDERS_CLOSED
                .with_label_values(&[cause.label()])
                .inc();
            tracing::info!(%order_id, user_id = %giveback.user_id, voucher_id = %giveback.voucher_id,
                cause = cause.label(), "order closed unpaid; its unit goes back on sale");
            if !self.chaos_giveback_delay.is_zero() {
                tokio::time::sleep(self.chaos_giveback_delay).await;
            }
            if let Err(error) = self.give_back(*giveback).await {
                tracing::warn!(%order_id, ?error,
                    "give-back to Redis failed; it stays owed and a closer sends it again");
            }
        }
        if !matches!(closing, Closing::NotDue) {
            self.no_deadline(order_id).await;
        }
        Ok(closing)
    }

    /// Sends a closed order's give-back to its shard of the Redis sale (once per order,
    /// however often it is sent), then marks it no longer owed.
    pub async fn give_back(&self, giveback: Giveback) -> Result<(), Error> {
        // The shard that drew the order, whose buyer set holds its buyer.
        let keys = self.keys.shard(Shard::of_order(giveback.order_id));
        let answer: i64 = GIVE_BACK
            .key(keys.voucher(giveback.voucher_id))
            .key(keys.buyers(giveback.voucher_id))
            .key(keys.given_back(giveback.voucher_id))
            .arg(giveback.order_id.get())
            .arg(giveback.user_id.get())
            .invoke_async(&mut self.redis.clone())
            .await?;
        let given = GivenBack::from_answer(answer);
        metrics::GIVEBACKS.with_label_values(&[given.label()]).inc();
        self.store.giveback_done(giveback.order_id).await?;
        (self.on_returned)(giveback.voucher_id);
        Ok(())
    }

    /// Drops the order's due time; should Redis fail, the closer finds the
    /// order settled when it comes due.
    async fn no_deadline(&self, order_id: OrderId) {
        if let Err(error) = self.deadlines.settled(order_id).await {
            tracing::debug!(%order_id, %error, "due time not removed; it finds the order settled");
        }
    }
}

/// What `lua/giveback.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GivenBack {
    Given,
    Already,
    NoSale,
}

impl GivenBack {
    const LABELS: [&str; 3] = ["given", "already", "no_sale"];

    fn from_answer(answer: i64) -> GivenBack {
        match answer {
            1 => GivenBack::Given,
            0 => GivenBack::Already,
            _ => GivenBack::NoSale,
        }
    }

    fn label(self) -> &'static str {
        match self {
            GivenBack::Given => Self::LABELS[0],
            GivenBack::Already => Self::LABELS[1],
            GivenBack::NoSale => Self::LABELS[2],
        }
    }
}
