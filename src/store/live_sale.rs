//! The sales the reconciler compares with Redis: those Redis is meant to
//! hold (loaded, and not let go once ended and settled), read in one
//! statement a round, however many sales have ended.

use crate::ids::VoucherId;

use super::Store;

/// A seckill sale Redis is meant to hold, as MySQL has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct LiveSale {
    pub voucher_id: VoucherId,
    /// How many shards the sale is split into in Redis.
    pub shards: u16,
    /// The voucher's sale token: a shard carrying another is an earlier
    /// voucher's sale.
    pub token: u64,
}

impl Store {
    /// The seckill sales Redis is meant to hold (`queue` and `stream` load
    /// them; a `sync` sale never is; an ended, settled one was let go),
    /// by voucher.
    pub async fn live_sales(&self) -> Result<Vec<LiveSale>, sqlx::Error> {
        sqlx::query_as(
            "SELECT CAST(voucher_id AS SIGNED) AS voucher_id, shards, sale_token AS token \
             FROM tb_seckill_voucher WHERE sale_loaded ORDER BY voucher_id",
        )
        .fetch_all(&self.pool)
        .await
    }
}
