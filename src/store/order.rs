//! `tb_voucher_order`: the purchase transaction's three statements and the
//! owner-scoped order query.

use chrono::NaiveDateTime;
use serde::Serialize;
use sqlx::{FromRow, MySqlConnection};

use super::Store;
use crate::ids::{OrderId, UserId, VoucherId};

/// An order to insert.
#[derive(Debug, Clone, Copy)]
pub struct NewOrder {
    pub id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
}

/// An order as `GET /voucher-order/{id}` shows it (hmdp's `VoucherOrder`).
#[derive(Debug, Clone, Serialize, FromRow)]
#[serde(rename_all = "camelCase")]
pub struct VoucherOrder {
    pub id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
    pub pay_type: u8,
    pub status: u8,
    pub create_time: NaiveDateTime,
    pub pay_time: Option<NaiveDateTime>,
    pub use_time: Option<NaiveDateTime>,
    pub refund_time: Option<NaiveDateTime>,
    pub update_time: NaiveDateTime,
}

/// How many orders this user already has of this voucher.
pub async fn count_user_orders(
    conn: &mut MySqlConnection,
    user_id: UserId,
    voucher_id: VoucherId,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT COUNT(*) FROM tb_voucher_order WHERE user_id = ? AND voucher_id = ?")
        .bind(user_id)
        .bind(voucher_id)
        .fetch_one(conn)
        .await
}

/// Takes one unit of stock if any is left; `false` when sold out. The
/// `stock > 0` condition (hmdp's optimistic lock) is what prevents oversell,
/// whatever the per-user lock does.
pub async fn take_stock(
    conn: &mut MySqlConnection,
    voucher_id: VoucherId,
) -> Result<bool, sqlx::Error> {
    let result = sqlx::query(
        "UPDATE tb_seckill_voucher SET stock = stock - 1 WHERE voucher_id = ? AND stock > 0",
    )
    .bind(voucher_id)
    .execute(conn)
    .await?;
    Ok(result.rows_affected() == 1)
}

pub async fn insert_order(conn: &mut MySqlConnection, order: NewOrder) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO tb_voucher_order (id, user_id, voucher_id) VALUES (?, ?, ?)")
        .bind(order.id)
        .bind(order.user_id)
        .bind(order.voucher_id)
        .execute(conn)
        .await
        .map(drop)
}

impl Store {
    /// The order if it exists and belongs to `user_id`.
    pub async fn order_of_user(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<VoucherOrder>, sqlx::Error> {
        sqlx::query_as(
            "SELECT id, user_id, CAST(voucher_id AS SIGNED) AS voucher_id, pay_type, status, \
                    CAST(create_time AS DATETIME) AS create_time, \
                    CAST(pay_time AS DATETIME) AS pay_time, \
                    CAST(use_time AS DATETIME) AS use_time, \
                    CAST(refund_time AS DATETIME) AS refund_time, \
                    CAST(update_time AS DATETIME) AS update_time \
             FROM tb_voucher_order WHERE id = ? AND user_id = ?",
        )
        .bind(order_id)
        .bind(user_id)
        .fetch_optional(&self.pool)
        .await
    }
}
