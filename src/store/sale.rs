//! What the asynchronous purchase loads into Redis from MySQL: which seckill
//! vouchers exist, and each one's sale as one consistent snapshot.

use chrono::NaiveDateTime;

use super::order_life::active_order;
use super::{SaleFence, Store, Tx};
use crate::ids::{OrderId, UserId, VoucherId};

/// One seckill voucher's sale as MySQL has it.
#[derive(Debug, Clone)]
pub struct SaleSnapshot {
    /// Stock left in `tb_seckill_voucher`.
    pub stock: i64,
    /// Active orders written for the voucher (closed orders gave their
    /// units back to `stock`).
    pub orders: i64,
    pub begin_time: NaiveDateTime,
    pub end_time: NaiveDateTime,
    /// Users holding an active order of the voucher.
    pub buyers: Vec<UserId>,
    /// Every order of the voucher written, whatever its status.
    pub order_ids: Vec<OrderId>,
    /// Every closed order of the voucher, with its buyer: their units are
    /// in `stock` already, so the sale loaded from this snapshot marks them
    /// as given back, and a give-back still on its way (owed, or sent by a
    /// node that read it before its row was deleted) changes nothing.
    pub closed: Vec<(OrderId, UserId)>,
    /// The voucher's sale token (`tb_seckill_voucher.sale_token`).
    pub token: u64,
    /// Whether the sale was loaded into Redis before: loading it again
    /// means Redis lost it.
    pub loaded_before: bool,
    /// How many shards the sale is split into in Redis.
    pub shards: u16,
    /// Each shard's highest admission number MySQL has written: the
    /// sequence a shard loaded again goes on from.
    pub fence: SaleFence,
}

impl SaleSnapshot {
    /// The stock the sale began with: each active order holds one unit.
    pub fn initial(&self) -> i64 {
        self.stock + self.orders
    }
}

impl Store {
    /// Every seckill voucher's id whose sale has not ended: what a node
    /// starting loads into Redis. An ended sale has nothing to admit; one
    /// with orders still on their way is loaded by the reconciler, which
    /// reads every sale Redis is meant to hold.
    pub async fn unended_sale_ids(&self) -> Result<Vec<VoucherId>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT CAST(voucher_id AS SIGNED) FROM tb_seckill_voucher \
             WHERE end_time > NOW() ORDER BY voucher_id",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// The shard counts the seckill vouchers' sales use, ascending.
    pub async fn sale_shard_counts(&self) -> Result<Vec<u16>, sqlx::Error> {
        sqlx::query_scalar("SELECT DISTINCT shards FROM tb_seckill_voucher ORDER BY shards")
            .fetch_all(&self.pool)
            .await
    }

    /// The voucher's sale, `None` when it is no seckill voucher, read in a
    /// transaction left open for the caller to end: it holds the voucher's
    /// stock row (`FOR UPDATE`), so no writer can commit an order of the
    /// voucher until it ends. The caller stores the sale in Redis before
    /// ending it; a writer whose commit was in flight is waited for and
    /// counted here, and a writer that commits afterwards finds the sale
    /// stored, and counts its orders in it (`lua/seckill_readmit.lua`).
    ///
    /// The sale is marked as loaded (committed with the caller's end).
    ///
    /// Orders and buyers are read after the row lock is taken, in one
    /// snapshot (InnoDB's repeatable read, set at the first plain read), so
    /// `initial` computed from them is the true initial stock.
    pub async fn lock_sale(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Option<(Tx, SaleSnapshot)>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let Some(sale) = snapshot(&mut tx, voucher_id, true).await? else {
            tx.rollback().await?;
            return Ok(None);
        };
        if !sale.loaded_before {
            sqlx::query("UPDATE tb_seckill_voucher SET sale_loaded = 1 WHERE voucher_id = ?")
                .bind(voucher_id)
                .execute(&mut *tx)
                .await?;
        }
        Ok(Some((tx, sale)))
    }

    /// The voucher's sale as [`Store::lock_sale`] reads it, in one snapshot,
    /// without holding its stock row: what a comparison with Redis starts
    /// from before it asks for the row (`None`: no such seckill voucher).
    pub async fn peek_sale(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Option<SaleSnapshot>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let sale = snapshot(&mut tx, voucher_id, false).await?;
        tx.rollback().await?;
        Ok(sale)
    }
}

/// The voucher's stock row as a snapshot reads it.
macro_rules! sale_row {
    () => {
        "SELECT stock, CAST(begin_time AS DATETIME), CAST(end_time AS DATETIME), sale_token, \
                sale_loaded, shards, sale_fence \
         FROM tb_seckill_voucher WHERE voucher_id = ?"
    };
}

/// The voucher's sale read in `tx`, its stock row held until `tx` ends
/// when `lock`. Orders and buyers are read after
/// the row, in one snapshot (InnoDB's repeatable read, set at the first
/// plain read), so `initial` computed from them is the true initial stock.
async fn snapshot(
    tx: &mut Tx,
    voucher_id: VoucherId,
    lock: bool,
) -> Result<Option<SaleSnapshot>, sqlx::Error> {
    let query = if lock {
        concat!(sale_row!(), " FOR UPDATE")
    } else {
        sale_row!()
    };
    type Row = (i32, NaiveDateTime, NaiveDateTime, u64, bool, u16, String);
    let sale: Option<Row> = sqlx::query_as(query)
        .bind(voucher_id)
        .fetch_optional(&mut **tx)
        .await?;
    let Some((stock, begin_time, end_time, token, loaded_before, shards, fence)) = sale else {
        return Ok(None);
    };
    let orders: i64 = sqlx::query_scalar(concat!(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM tb_voucher_order WHERE voucher_id = ? AND ",
        active_order!()
    ))
    .bind(voucher_id)
    .fetch_one(&mut **tx)
    .await?;
    let buyers = sqlx::query_scalar(concat!(
        "SELECT DISTINCT user_id FROM tb_voucher_order WHERE voucher_id = ? AND ",
        active_order!(),
        " ORDER BY user_id"
    ))
    .bind(voucher_id)
    .fetch_all(&mut **tx)
    .await?;
    // Closing an order updates the stock row, which a locking read holds:
    // a close committed before it is seen whole here (status 4, its unit in
    // `stock`), one after it waits for it.
    let closed = sqlx::query_as(
        "SELECT id, user_id FROM tb_voucher_order WHERE voucher_id = ? AND status = 4 \
         ORDER BY id",
    )
    .bind(voucher_id)
    .fetch_all(&mut **tx)
    .await?;
    let order_ids = sqlx::query_scalar("SELECT id FROM tb_voucher_order WHERE voucher_id = ?")
        .bind(voucher_id)
        .fetch_all(&mut **tx)
        .await?;
    Ok(Some(SaleSnapshot {
        stock: stock.into(),
        orders,
        begin_time,
        end_time,
        buyers,
        order_ids,
        closed,
        token,
        loaded_before,
        shards,
        fence: SaleFence::parse(&fence),
    }))
}
