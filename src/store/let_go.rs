//! An ended sale let go from Redis: the reconciler, once MySQL has nothing
//! more for the sale's Redis side, lets its keys expire and marks it as one
//! Redis is no longer meant to hold, while its stock row is held.

use super::{Store, Tx};
use crate::ids::VoucherId;

impl Store {
    /// Holds the voucher's stock row and answers, as MySQL stands while it
    /// is held, whether the sale may be let go: Redis is meant to hold it,
    /// it has ended, no unpaid order is left to close and no give-back is
    /// owed. `Some` then, the row held for the caller to let the sale's
    /// Redis side go before [`Store::let_go`] ends the transaction; `None`
    /// otherwise, rolled back.
    ///
    /// Held because every writer of the sale needs the row: no order is
    /// committed or closed, and no load writes the sale again, until the
    /// caller is done.
    pub async fn hold_settled_sale(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Option<Tx>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let held: Option<i64> = sqlx::query_scalar(
            "SELECT CAST(end_time <= NOW() AS SIGNED) FROM tb_seckill_voucher \
             WHERE voucher_id = ? AND sale_loaded FOR UPDATE",
        )
        .bind(voucher_id)
        .fetch_optional(&mut *tx)
        .await?;
        // Read after the row is held: a close committed before it is seen,
        // and none can commit after it until this transaction ends.
        let settled = held == Some(1)
            && sqlx::query_scalar::<_, i64>(
                // Unpaid (1): it may still close, and owe a give-back.
                "SELECT CAST(NOT EXISTS (SELECT 1 FROM tb_voucher_order \
                                         WHERE voucher_id = ? AND status = 1) \
                        AND NOT EXISTS (SELECT 1 FROM tb_order_giveback WHERE voucher_id = ?) \
                        AS SIGNED)",
            )
            .bind(voucher_id)
            .bind(voucher_id)
            .fetch_one(&mut *tx)
            .await?
                == 1;
        if !settled {
            tx.rollback().await?;
            return Ok(None);
        }
        Ok(Some(tx))
    }

    /// Ends what [`Store::hold_settled_sale`] began: the sale is one Redis
    /// is no longer meant to hold (the reconciler reads it no more; a load
    /// of it, should a purchase ask, is a first load).
    pub async fn let_go(&self, mut tx: Tx, voucher_id: VoucherId) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE tb_seckill_voucher SET sale_loaded = 0 WHERE voucher_id = ?")
            .bind(voucher_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
}
