//! `tb_voucher_order`: the purchase transaction's three statements, their
//! batched forms for the order stream's consumer (one statement per step
//! for a whole batch). The order's life after the sale is `order_life.rs`.

use chrono::NaiveDateTime;
use serde::Serialize;
use sqlx::{FromRow, MySql, MySqlConnection, QueryBuilder};

use super::order_life::active_order;
use crate::ids::{OrderId, UserId, VoucherId};

/// An order to insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
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

/// Takes `units` of stock at once if at least that many are left; `false`
/// (and nothing taken) otherwise: a transaction's orders of one voucher in
/// one statement. The guard (hmdp's optimistic lock, `stock > 0` for one
/// unit) is what prevents oversell, whatever the per-user lock does.
pub async fn take_stock_units(
    conn: &mut MySqlConnection,
    voucher_id: VoucherId,
    units: u32,
) -> Result<bool, sqlx::Error> {
    let result = sqlx::query(
        "UPDATE tb_seckill_voucher SET stock = stock - ? WHERE voucher_id = ? AND stock >= ?",
    )
    .bind(units)
    .bind(voucher_id)
    .bind(units)
    .execute(conn)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// The voucher's stock left, its row held until the transaction ends: read
/// when [`take_stock_units`] found fewer units than orders, so that exactly
/// as many orders as units left are written.
pub async fn stock_left(
    conn: &mut MySqlConnection,
    voucher_id: VoucherId,
) -> Result<u32, sqlx::Error> {
    let left: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(stock AS SIGNED) FROM tb_seckill_voucher WHERE voucher_id = ? FOR UPDATE",
    )
    .bind(voucher_id)
    .fetch_optional(conn)
    .await?;
    Ok(left.map_or(0, |left| u32::try_from(left).unwrap_or(0)))
}

/// Deletes orders `ids` that this transaction inserted and will not write
/// after all (no unit left for them).
pub async fn delete_orders(conn: &mut MySqlConnection, ids: &[OrderId]) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut query = QueryBuilder::<MySql>::new("DELETE FROM tb_voucher_order WHERE id IN (");
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    query.push(")");
    query.build().execute(conn).await.map(drop)
}

/// The orders among `ids` that exist already, as they were written: a
/// consumer compares them with what it was asked to write, which tells a
/// redelivered order from an order id reused for another order.
pub async fn orders_by_id(
    conn: &mut MySqlConnection,
    ids: &[OrderId],
) -> Result<Vec<NewOrder>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT id, user_id, CAST(voucher_id AS SIGNED) AS voucher_id \
         FROM tb_voucher_order WHERE id IN (",
    );
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    query.push(")");
    query.build_query_as().fetch_all(conn).await
}

/// The users among `users` who already hold an active order of `voucher_id`
/// (unpaid, paid or used: a closed order gave the buyer's turn back): the
/// per-user count of the purchase, for a whole batch in one statement.
pub async fn users_with_orders(
    conn: &mut MySqlConnection,
    voucher_id: VoucherId,
    users: &[UserId],
) -> Result<Vec<UserId>, sqlx::Error> {
    if users.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT DISTINCT user_id FROM tb_voucher_order WHERE voucher_id = ",
    );
    query
        .push_bind(voucher_id)
        .push(concat!(" AND ", active_order!(), " AND user_id IN ("));
    let mut list = query.separated(", ");
    for user in users {
        list.push_bind(*user);
    }
    query.push(")");
    query.build_query_scalar().fetch_all(conn).await
}

/// Inserts `orders` in one multi-row `INSERT`: a batch costs one round trip,
/// not one per order.
pub async fn insert_orders(
    conn: &mut MySqlConnection,
    orders: &[NewOrder],
) -> Result<(), sqlx::Error> {
    if orders.is_empty() {
        return Ok(());
    }
    QueryBuilder::<MySql>::new("INSERT INTO tb_voucher_order (id, user_id, voucher_id) ")
        .push_values(orders, |mut row, order| {
            row.push_bind(order.id)
                .push_bind(order.user_id)
                .push_bind(order.voucher_id);
        })
        .build()
        .execute(conn)
        .await
        .map(drop)
}
