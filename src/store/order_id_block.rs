//! The counter the order ids of `queue` and `stream` are leased from
//! (`tb_order_id_block`), a block at a time.

use super::Store;

impl Store {
    /// Leases `count` numbers of the order-id counter; returns the first.
    /// One statement, which moves the counter forward and reads it back
    /// (`LAST_INSERT_ID(expr)` answers in the statement's own reply), so
    /// two nodes never lease one number.
    pub async fn lease_order_ids(&self, count: u64) -> Result<u64, sqlx::Error> {
        let leased = sqlx::query(
            "UPDATE tb_order_id_block SET next_value = LAST_INSERT_ID(next_value + ?) \
             WHERE name = 'order'",
        )
        .bind(count)
        .execute(&self.pool)
        .await?;
        if leased.rows_affected() != 1 {
            return Err(sqlx::Error::RowNotFound);
        }
        Ok(leased.last_insert_id() - count)
    }
}
