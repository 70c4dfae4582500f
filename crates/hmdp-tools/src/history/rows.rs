//! A sale's orders as `hmdp check` reads them from MySQL: whose each is,
//! its status, and when it last changed (a closed order: when its unit went
//! back to the stock).

use std::collections::BTreeMap;

use anyhow::Context;
use sqlx::MySqlPool;

use hmdp::store::OrderState;

/// One order row of a sale.
#[derive(Debug, Clone, Copy)]
pub struct OrderRow {
    pub user: i64,
    pub status: u8,
    /// `update_time`, Unix epoch milliseconds (to the second: a
    /// `TIMESTAMP`).
    pub updated_ms: i64,
}

impl OrderRow {
    /// Every order of `voucher`, by id.
    pub async fn of_voucher(
        pool: &MySqlPool,
        voucher: i64,
    ) -> anyhow::Result<BTreeMap<i64, OrderRow>> {
        let rows: Vec<(i64, i64, u8, i64)> = sqlx::query_as(
            "SELECT id, CAST(user_id AS SIGNED), status, \
                    CAST(UNIX_TIMESTAMP(update_time) * 1000 AS SIGNED) \
             FROM tb_voucher_order WHERE voucher_id = ?",
        )
        .bind(voucher)
        .fetch_all(pool)
        .await
        .with_context(|| format!("reading voucher {voucher}'s orders"))?;
        Ok(rows
            .into_iter()
            .map(|(id, user, status, updated_ms)| {
                let row = OrderRow {
                    user,
                    status,
                    updated_ms,
                };
                (id, row)
            })
            .collect())
    }

    /// The voucher and buyer MySQL files order `id` under, whatever its
    /// voucher: a success answered with another sale's order.
    pub async fn voucher_and_user_of(
        pool: &MySqlPool,
        id: i64,
    ) -> anyhow::Result<Option<(i64, i64)>> {
        sqlx::query_as(
            "SELECT CAST(voucher_id AS SIGNED), CAST(user_id AS SIGNED) \
             FROM tb_voucher_order WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(pool)
        .await
        .with_context(|| format!("reading order {id}"))
    }

    pub fn state(&self) -> Option<OrderState> {
        OrderState::from_status(self.status)
    }

    /// Not closed: the order holds a unit (as the stock balance counts).
    pub fn active(&self) -> bool {
        self.status != OrderState::Closed as u8
    }
}
