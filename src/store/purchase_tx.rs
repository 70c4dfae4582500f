//! The purchase's transaction: begun with a plain `BEGIN`, ended by a
//! `COMMIT` that travels in one packet with the stock update and the order
//! insert, so the voucher's one stock row — which every purchase of the
//! voucher queues for — is locked only while MySQL runs those statements,
//! never across a round trip to the node.

use futures::TryStreamExt;
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlConnection};

use super::order::NewOrder;
use super::Store;

/// How [`PurchaseTx::place`] ended. Every outcome ends the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Stock taken and the order inserted, committed.
    Ordered,
    /// No stock left: nothing written.
    SoldOut,
    /// The order id exists already (the Redis id counter started over):
    /// rolled back, nothing written; try again with another id.
    IdTaken,
}

/// A purchase's open transaction on a pooled connection. sqlx's
/// `Transaction` cannot send its `COMMIT` together with other statements, so
/// this guard stands in for it: dropped while still open (an error on the
/// way, a cancelled request), it closes the connection instead of handing it
/// back to the pool mid-transaction, and MySQL rolls the transaction back.
pub struct PurchaseTx {
    conn: PoolConnection<MySql>,
    open: bool,
}

impl PurchaseTx {
    pub async fn begin(store: &Store) -> Result<Self, sqlx::Error> {
        let conn = store.pool().acquire().await?;
        // Open before `BEGIN` is sent: if this future is dropped while the
        // statement is in flight, the transaction may have begun.
        let mut tx = PurchaseTx { conn, open: true };
        sqlx::raw_sql("BEGIN").execute(tx.conn()).await?;
        Ok(tx)
    }

    /// The connection, for the statements before [`PurchaseTx::place`].
    pub fn conn(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }

    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("ROLLBACK").execute(self.conn()).await?;
        self.close();
        Ok(())
    }

    /// Takes one unit of stock if any is left (the `stock > 0` condition,
    /// hmdp's optimistic lock, is what prevents oversell) and only then
    /// inserts the order, and commits: in one packet. The values are
    /// integers, formatted in, as a multi-statement query takes no
    /// parameters.
    pub async fn place(mut self, order: NewOrder) -> Result<Placement, sqlx::Error> {
        let NewOrder {
            id,
            user_id,
            voucher_id,
        } = order;
        let statements = format!(
            "UPDATE tb_seckill_voucher SET stock = stock - 1 \
                 WHERE voucher_id = {voucher_id} AND stock > 0; \
             SET @hmdp_took_stock = ROW_COUNT(); \
             INSERT INTO tb_voucher_order (id, user_id, voucher_id) \
                 SELECT {id}, {user_id}, {voucher_id} FROM DUAL WHERE @hmdp_took_stock = 1; \
             COMMIT"
        );
        let results: Result<Vec<_>, _> = sqlx::raw_sql(sqlx::AssertSqlSafe(statements))
            .execute_many(self.conn())
            .try_collect()
            .await;
        match results {
            Ok(results) => {
                // MySQL ran all four, the `COMMIT` included.
                self.close();
                let inserted = results.get(2).map(|insert| insert.rows_affected());
                Ok(if inserted == Some(1) {
                    Placement::Ordered
                } else {
                    Placement::SoldOut
                })
            }
            // The insert failed, so the `COMMIT` after it never ran.
            Err(sqlx::Error::Database(error)) if error.is_unique_violation() => {
                self.rollback().await?;
                Ok(Placement::IdTaken)
            }
            Err(error) => Err(error),
        }
    }

    /// The transaction has ended: the connection may go back to the pool.
    fn close(&mut self) {
        self.open = false;
    }
}

impl Drop for PurchaseTx {
    fn drop(&mut self) {
        // Runs before the connection field is dropped, which then closes it.
        if self.open {
            self.conn.close_on_drop();
        }
    }
}
