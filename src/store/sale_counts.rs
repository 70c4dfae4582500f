//! What MySQL counts of each sale the reconciler compares: enough to tell
//! a sale whose Redis side agrees from one whose members must be read, for
//! the whole round in one statement.

use std::collections::HashMap;

use sqlx::AssertSqlSafe;

use super::order_life::active_order;
use super::Store;
use crate::ids::VoucherId;

/// One seckill sale's counts as MySQL has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleCounts {
    pub voucher_id: VoucherId,
    /// Stock left in `tb_seckill_voucher`.
    pub stock: i64,
    pub shards: u16,
    /// Users holding an active order of the voucher.
    pub buyers: i64,
    /// Closed orders: each owes Redis a give-back until its shard's
    /// given-back set lists it.
    pub closed: i64,
    /// Unpaid orders: each may still close, and owe a give-back.
    pub unpaid: i64,
    /// Whether a give-back is still recorded as owed to Redis
    /// (`tb_order_giveback`).
    pub owed: bool,
    /// Whether the sale's window has ended by MySQL's clock.
    pub ended: bool,
}

impl SaleCounts {
    /// Whether MySQL has nothing more for the sale's Redis side: ended, no
    /// order left that may close, no give-back owed. Redis's own clock and
    /// pending orders decide the rest (`reconcile/let_go.rs`).
    pub fn settled(&self) -> bool {
        self.ended && self.unpaid == 0 && !self.owed
    }
}

impl Store {
    /// The counts of each of `vouchers` that MySQL has (a voucher deleted
    /// meanwhile is left out), in one statement: the voucher's orders
    /// counted in one pass over its index.
    pub async fn sale_counts(
        &self,
        vouchers: &[VoucherId],
    ) -> Result<HashMap<VoucherId, SaleCounts>, sqlx::Error> {
        if vouchers.is_empty() {
            return Ok(HashMap::new());
        }
        // Placeholders only: every id is bound. Closed (4) and unpaid (1)
        // as `tb_voucher_order.status` numbers them.
        let list = vec!["?"; vouchers.len()].join(", ");
        let sql = format!(
            concat!(
                "SELECT CAST(v.voucher_id AS SIGNED) AS voucher_id, CAST(v.stock AS SIGNED) AS stock, \
                        v.shards, \
                        CAST(COALESCE(o.buyers, 0) AS SIGNED) AS buyers, \
                        CAST(COALESCE(o.closed, 0) AS SIGNED) AS closed, \
                        CAST(COALESCE(o.unpaid, 0) AS SIGNED) AS unpaid, \
                        CAST(EXISTS (SELECT 1 FROM tb_order_giveback g \
                                     WHERE g.voucher_id = v.voucher_id) AS SIGNED) AS owed, \
                        CAST(v.end_time <= NOW() AS SIGNED) AS ended \
                 FROM tb_seckill_voucher v LEFT JOIN ( \
                   SELECT voucher_id, \
                          COUNT(DISTINCT CASE WHEN ", active_order!(), " THEN user_id END) AS buyers, \
                          SUM(status = 4) AS closed, SUM(status = 1) AS unpaid \
                   FROM tb_voucher_order WHERE voucher_id IN ({list}) GROUP BY voucher_id \
                 ) o ON o.voucher_id = v.voucher_id \
                 WHERE v.voucher_id IN ({list})"
            ),
            list = list,
        );
        type Row = (VoucherId, i64, u16, i64, i64, i64, i64, i64);
        let mut query = sqlx::query_as::<_, Row>(AssertSqlSafe(sql));
        for _ in 0..2 {
            for voucher_id in vouchers {
                query = query.bind(*voucher_id);
            }
        }
        let counts = query.fetch_all(&self.pool).await?;
        Ok(counts
            .into_iter()
            .map(
                |(voucher_id, stock, shards, buyers, closed, unpaid, owed, ended)| {
                    let counts = SaleCounts {
                        voucher_id,
                        stock,
                        shards,
                        buyers,
                        closed,
                        unpaid,
                        owed: owed != 0,
                        ended: ended != 0,
                    };
                    (voucher_id, counts)
                },
            )
            .collect())
    }
}
