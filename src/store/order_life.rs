//! `tb_voucher_order` after the sale: pay, use, and the close (a cancel or
//! the unpaid-order timeout) that gives the unit back. Each change of status
//! is ONE conditional update (`… WHERE id = ? AND status = ?`): of a payment
//! and a close racing for one unpaid order, InnoDB's row lock lets exactly
//! one see it unpaid. Deadlines are MySQL's clock, for the payment and the
//! close alike, so that they agree on which side of it a moment is, and in
//! seconds since the epoch (`UNIX_TIMESTAMP`), so that a time zone's
//! daylight-saving hour neither shortens nor lengthens them.

use std::time::Duration;

use sqlx::MySqlConnection;

use super::{Store, VoucherOrder};
use crate::ids::{OrderId, UserId, VoucherId};

/// `tb_voucher_order.status`, as hmdp's schema numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderState {
    Unpaid = 1,
    Paid = 2,
    Used = 3,
    /// Cancelled by its buyer or closed unpaid at its deadline: the unit and
    /// the buyer's turn went back to the sale.
    Closed = 4,
    Refunding = 5,
    Refunded = 6,
}

impl OrderState {
    pub const ALL: [OrderState; 6] = [
        OrderState::Unpaid,
        OrderState::Paid,
        OrderState::Used,
        OrderState::Closed,
        OrderState::Refunding,
        OrderState::Refunded,
    ];

    pub fn from_status(status: u8) -> Option<OrderState> {
        OrderState::ALL
            .into_iter()
            .find(|state| *state as u8 == status)
    }

    /// The metrics' label.
    pub fn label(self) -> &'static str {
        match self {
            OrderState::Unpaid => "unpaid",
            OrderState::Paid => "paid",
            OrderState::Used => "used",
            OrderState::Closed => "closed",
            OrderState::Refunding => "refunding",
            OrderState::Refunded => "refunded",
        }
    }
}

/// The SQL condition of an active order: its unit is sold and its buyer may
/// not buy the voucher again. Only a closed order (4) gave both back;
/// refunds (5, 6) are hmdp's schema, not this API's, and keep the unit.
macro_rules! active_order {
    () => {
        "status <> 4"
    };
}
pub(crate) use active_order;

/// Why an order was closed: the `cause` label of `orders_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseCause {
    /// Its buyer cancelled it.
    Cancel,
    /// Its due time in Redis came.
    Timeout,
    /// The MySQL sweep found it past its deadline (Redis lost the due time).
    Sweep,
}

impl CloseCause {
    pub const ALL: [CloseCause; 3] = [CloseCause::Cancel, CloseCause::Timeout, CloseCause::Sweep];

    pub fn label(self) -> &'static str {
        match self {
            CloseCause::Cancel => "cancel",
            CloseCause::Timeout => "timeout",
            CloseCause::Sweep => "sweep",
        }
    }
}

/// A closed order whose unit and buyer's turn are owed to the Redis sale
/// (a row of `tb_order_giveback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Giveback {
    pub order_id: OrderId,
    pub voucher_id: VoucherId,
    pub user_id: UserId,
}

/// What a payment found.
#[derive(Debug)]
pub enum Paid {
    /// Paid now (`now`), or paid (or used) before: the order as it is.
    Paid { order: VoucherOrder, now: bool },
    /// Closed or cancelled: nothing changed.
    Closed,
    /// Unpaid and past its deadline: to be closed, not paid.
    Overdue,
    /// No such order of this user.
    NotFound,
}

/// What a close found.
#[derive(Debug)]
pub enum Closing {
    /// Closed now by this call, its unit back in MySQL's stock and owed to
    /// Redis.
    Closed(Giveback),
    /// Not unpaid (any more): paid, used or closed already.
    Settled(VoucherOrder),
    /// Unpaid and not past its deadline (a timeout's close only).
    NotDue,
    NotFound,
}

/// What marking an order used found.
#[derive(Debug)]
pub enum Using {
    Used(VoucherOrder),
    /// Unpaid, closed or refunded: the order as it is.
    NotPaid(VoucherOrder),
    NotFound,
}

async fn order_by_id(
    conn: &mut MySqlConnection,
    order_id: OrderId,
) -> Result<Option<VoucherOrder>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, user_id, CAST(voucher_id AS SIGNED) AS voucher_id, pay_type, status, \
                CAST(create_time AS DATETIME) AS create_time, \
                CAST(pay_time AS DATETIME) AS pay_time, CAST(use_time AS DATETIME) AS use_time, \
                CAST(refund_time AS DATETIME) AS refund_time, \
                CAST(update_time AS DATETIME) AS update_time \
         FROM tb_voucher_order WHERE id = ?",
    )
    .bind(order_id)
    .fetch_optional(conn)
    .await
}

fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs().max(1)
}

impl Store {
    /// The order a synchronous purchase of `user_id` placed for `voucher_id`
    /// with the Idempotency-Key of `digest`, if MySQL has one: the key's
    /// answer when Redis lost the one it kept.
    pub async fn order_placed_with_key(
        &self,
        user_id: UserId,
        voucher_id: VoucherId,
        digest: u64,
    ) -> Result<Option<OrderId>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT id FROM tb_voucher_order \
             WHERE user_id = ? AND voucher_id = ? AND idempotency_key_digest = ? LIMIT 1",
        )
        .bind(user_id)
        .bind(voucher_id)
        .bind(digest)
        .fetch_optional(&self.pool)
        .await
    }

    /// The order if it exists and belongs to `user_id`.
    pub async fn order_of_user(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<VoucherOrder>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        Ok(order_by_id(&mut conn, order_id)
            .await?
            .filter(|order| order.user_id == user_id))
    }

    /// Pays `user_id`'s unpaid order if its deadline (`create_time +
    /// pay_timeout`) has not passed; paying a paid order again finds it
    /// paid and changes nothing.
    pub async fn pay(
        &self,
        order_id: OrderId,
        user_id: UserId,
        pay_type: u8,
        pay_timeout: Duration,
    ) -> Result<Paid, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let paid = sqlx::query(
            "UPDATE tb_voucher_order SET status = 2, pay_type = ?, pay_time = NOW() \
             WHERE id = ? AND user_id = ? AND status = 1 \
               AND UNIX_TIMESTAMP(create_time) > UNIX_TIMESTAMP() - ?",
        )
        .bind(pay_type)
        .bind(order_id)
        .bind(user_id)
        .bind(whole_seconds(pay_timeout))
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1;
        let Some(order) = order_by_id(&mut conn, order_id)
            .await?
            .filter(|order| order.user_id == user_id)
        else {
            return Ok(Paid::NotFound);
        };
        Ok(match OrderState::from_status(order.status) {
            Some(OrderState::Paid | OrderState::Used) => Paid::Paid { order, now: paid },
            Some(OrderState::Unpaid) => Paid::Overdue,
            _ => Paid::Closed,
        })
    }

    /// Closes an unpaid order — `buyer`'s only, when given (a cancel), and
    /// only past its deadline for a timeout (`overdue_after`) — and, in the
    /// same transaction, puts its unit back in the voucher's stock and
    /// records the give-back owed to Redis.
    pub async fn close(
        &self,
        order_id: OrderId,
        buyer: Option<UserId>,
        overdue_after: Option<Duration>,
    ) -> Result<Closing, sqlx::Error> {
        let mut tx = self.begin().await?;
        let overdue_after = overdue_after.map(whole_seconds);
        let closed = sqlx::query(
            "UPDATE tb_voucher_order SET status = 4 WHERE id = ? AND status = 1 \
               AND (? IS NULL OR user_id = ?) \
               AND (? IS NULL OR UNIX_TIMESTAMP(create_time) <= UNIX_TIMESTAMP() - ?)",
        )
        .bind(order_id)
        .bind(buyer)
        .bind(buyer)
        .bind(overdue_after)
        .bind(overdue_after)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let order = order_by_id(&mut tx, order_id)
            .await?
            .filter(|order| buyer.is_none_or(|buyer| order.user_id == buyer));
        let Some(order) = order else {
            tx.rollback().await?;
            return Ok(Closing::NotFound);
        };
        if !closed {
            tx.rollback().await?;
            return Ok(if order.status == OrderState::Unpaid as u8 {
                Closing::NotDue
            } else {
                Closing::Settled(order)
            });
        }
        sqlx::query("UPDATE tb_seckill_voucher SET stock = stock + 1 WHERE voucher_id = ?")
            .bind(order.voucher_id)
            .execute(&mut *tx)
            .await?;
        let giveback = Giveback {
            order_id,
            voucher_id: order.voucher_id,
            user_id: order.user_id,
        };
        sqlx::query(
            "INSERT INTO tb_order_giveback (order_id, voucher_id, user_id) VALUES (?, ?, ?)",
        )
        .bind(giveback.order_id)
        .bind(giveback.voucher_id)
        .bind(giveback.user_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Closing::Closed(giveback))
    }

    /// Marks a paid order used (核销); a used order again finds it used.
    pub async fn mark_used(&self, order_id: OrderId) -> Result<Using, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query(
            "UPDATE tb_voucher_order SET status = 3, use_time = NOW() WHERE id = ? AND status = 2",
        )
        .bind(order_id)
        .execute(&mut *conn)
        .await?;
        let Some(order) = order_by_id(&mut conn, order_id).await? else {
            return Ok(Using::NotFound);
        };
        Ok(if order.status == OrderState::Used as u8 {
            Using::Used(order)
        } else {
            Using::NotPaid(order)
        })
    }

    /// Give-backs owed to Redis for at least `older_than` (the closer's own
    /// give-back normally follows its commit at once), oldest first.
    pub async fn givebacks_owed(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> Result<Vec<Giveback>, sqlx::Error> {
        sqlx::query_as(
            "SELECT order_id, CAST(voucher_id AS SIGNED) AS voucher_id, user_id \
             FROM tb_order_giveback WHERE create_time <= NOW() - INTERVAL ? SECOND \
             ORDER BY create_time LIMIT ?",
        )
        .bind(older_than.as_secs())
        .bind(limit)
        .fetch_all(&self.pool)
        .await
    }

    /// How many give-backs have been owed to Redis for at least
    /// `older_than`: all those [`Store::givebacks_owed`] lists, unlimited.
    pub async fn count_givebacks_owed(&self, older_than: Duration) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM tb_order_giveback \
             WHERE create_time <= NOW() - INTERVAL ? SECOND",
        )
        .bind(older_than.as_secs())
        .fetch_one(&self.pool)
        .await
    }

    /// The give-backs of `voucher_id` still owed to Redis, each with how
    /// many seconds it has been owed: what the audit reconciles.
    pub async fn givebacks_owed_of(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Vec<(Giveback, i64)>, sqlx::Error> {
        let rows: Vec<(OrderId, VoucherId, UserId, i64)> = sqlx::query_as(
            "SELECT order_id, CAST(voucher_id AS SIGNED), user_id, \
                    CAST(TIMESTAMPDIFF(SECOND, create_time, NOW()) AS SIGNED) \
             FROM tb_order_giveback WHERE voucher_id = ? ORDER BY order_id",
        )
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(order_id, voucher_id, user_id, age)| {
                let giveback = Giveback {
                    order_id,
                    voucher_id,
                    user_id,
                };
                (giveback, age)
            })
            .collect())
    }

    /// The give-back reached Redis (or a reload counted it): no longer owed.
    pub async fn giveback_done(&self, order_id: OrderId) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM tb_order_giveback WHERE order_id = ?")
            .bind(order_id)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// Unpaid orders past their deadline by at least `grace`, oldest first:
    /// what the sweep closes when Redis lost their due times.
    pub async fn overdue_unpaid(
        &self,
        pay_timeout: Duration,
        grace: Duration,
        limit: u32,
    ) -> Result<Vec<OrderId>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT id FROM tb_voucher_order \
             WHERE status = 1 AND create_time <= NOW() - INTERVAL ? SECOND \
             ORDER BY create_time LIMIT ?",
        )
        .bind(whole_seconds(pay_timeout) + grace.as_secs())
        .bind(limit)
        .fetch_all(&self.pool)
        .await
    }

    /// How far past its deadline the oldest unpaid order is, in seconds (0
    /// when none is).
    pub async fn oldest_overdue_seconds(&self, pay_timeout: Duration) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT CAST(COALESCE(CAST(UNIX_TIMESTAMP() AS SIGNED) \
                    - CAST(UNIX_TIMESTAMP(MIN(create_time)) AS SIGNED) - ?, 0) \
                    AS SIGNED) \
             FROM tb_voucher_order WHERE status = 1",
        )
        // Signed: a u64 would make the difference unsigned, which MariaDB
        // refuses to take below 0.
        .bind(whole_seconds(pay_timeout) as i64)
        .fetch_one(&self.pool)
        .await
        .map(|seconds: i64| seconds.max(0))
    }

    /// How many orders are in each status, over every voucher.
    pub async fn orders_by_status(&self) -> Result<Vec<(u8, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT status, CAST(COUNT(*) AS SIGNED) FROM tb_voucher_order GROUP BY status",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// How many of `voucher_id`'s orders are in each status.
    pub async fn orders_of_voucher_by_status(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Vec<(u8, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT status, CAST(COUNT(*) AS SIGNED) FROM tb_voucher_order \
             WHERE voucher_id = ? GROUP BY status",
        )
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await
    }

    /// Every order of `voucher_id` with its status, by id.
    pub async fn order_statuses_of(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Vec<(OrderId, u8)>, sqlx::Error> {
        sqlx::query_as("SELECT id, status FROM tb_voucher_order WHERE voucher_id = ?")
            .bind(voucher_id)
            .fetch_all(&self.pool)
            .await
    }
}
