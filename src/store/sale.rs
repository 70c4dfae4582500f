//! What the asynchronous purchase loads into Redis from MySQL: which seckill
//! vouchers exist, and each one's sale as one consistent snapshot.

use chrono::NaiveDateTime;

use super::Store;
use crate::ids::{UserId, VoucherId};

/// One seckill voucher's sale as MySQL has it.
#[derive(Debug, Clone)]
pub struct SaleSnapshot {
    /// Stock left in `tb_seckill_voucher`.
    pub stock: i64,
    /// Orders written for the voucher.
    pub orders: i64,
    pub begin_time: NaiveDateTime,
    pub end_time: NaiveDateTime,
    /// Users holding an order of the voucher.
    pub buyers: Vec<UserId>,
    /// The voucher's sale token (`tb_seckill_voucher.sale_token`).
    pub token: u64,
}

impl SaleSnapshot {
    /// The stock the sale began with: each order took one unit.
    pub fn initial(&self) -> i64 {
        self.stock + self.orders
    }
}

impl Store {
    /// Every seckill voucher's id.
    pub async fn seckill_voucher_ids(&self) -> Result<Vec<VoucherId>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT CAST(voucher_id AS SIGNED) FROM tb_seckill_voucher ORDER BY voucher_id",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// The voucher's sale, `None` when it is no seckill voucher. Stock,
    /// orders and buyers are read in one transaction, so they come from one
    /// snapshot (InnoDB's repeatable read) even while orders are written:
    /// `initial` computed from them is the true initial stock.
    pub async fn sale_snapshot(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Option<SaleSnapshot>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let sale: Option<(i32, i64, NaiveDateTime, NaiveDateTime, u64)> = sqlx::query_as(
            "SELECT stock, \
                    (SELECT CAST(COUNT(*) AS SIGNED) FROM tb_voucher_order WHERE voucher_id = ?), \
                    CAST(begin_time AS DATETIME), CAST(end_time AS DATETIME), sale_token \
             FROM tb_seckill_voucher WHERE voucher_id = ?",
        )
        .bind(voucher_id)
        .bind(voucher_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((stock, orders, begin_time, end_time, token)) = sale else {
            tx.rollback().await?;
            return Ok(None);
        };
        let buyers = sqlx::query_scalar(
            "SELECT DISTINCT user_id FROM tb_voucher_order WHERE voucher_id = ? ORDER BY user_id",
        )
        .bind(voucher_id)
        .fetch_all(&mut *tx)
        .await?;
        // Read only: the commit just ends the snapshot.
        tx.commit().await?;
        Ok(Some(SaleSnapshot {
            stock: stock.into(),
            orders,
            begin_time,
            end_time,
            buyers,
            token,
        }))
    }
}
