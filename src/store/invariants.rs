//! The invariants of docs/design.md, read from the database: the one check shared
//! by the tests, `loadtest --verify` and `demo`.

use serde::Serialize;

use super::order_life::active_order;
use super::Store;
use crate::ids::{OrderId, UserId, VoucherId};

/// What a voucher's sale left behind. An active order (unpaid, paid, used)
/// holds a unit; a closed one (cancelled, or unpaid past its deadline) gave
/// its unit back to the stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VoucherAudit {
    /// Active orders written for the voucher.
    pub active_orders: i64,
    /// Closed orders (status 4).
    pub closed_orders: i64,
    /// Closed orders that carry a payment time: a buyer paid for an order
    /// that was closed.
    pub paid_and_closed: i64,
    /// Stock left in `tb_seckill_voucher`.
    pub stock_left: i64,
    /// Users holding more than one active order of the voucher.
    pub duplicate_users: i64,
    /// Active orders beyond the first of each user (sum over duplicate
    /// users).
    pub extra_orders: i64,
}

impl VoucherAudit {
    /// Units sold beyond the initial stock: orders that had no stock behind them.
    pub fn oversold(&self, initial_stock: i64) -> i64 {
        (self.active_orders - initial_stock).max(0) + (-self.stock_left).max(0)
    }

    /// `active orders + stock == initial` and `stock >= 0`.
    pub fn stock_balances(&self, initial_stock: i64) -> bool {
        self.active_orders + self.stock_left == initial_stock && self.stock_left >= 0
    }

    /// Every order written, closed ones included.
    pub fn orders(&self) -> i64 {
        self.active_orders + self.closed_orders
    }

    /// The units this audit accounts for, sold or left. Read before a run, it
    /// is the initial stock that the audit after the run must balance against.
    pub fn supply(&self) -> i64 {
        self.active_orders + self.stock_left
    }

    /// The invariants of docs/design.md that this audit breaks, in words; empty
    /// when all hold. `one_order_per_user` is false for the setups expected
    /// to let duplicates through (no lock, a local lock on two nodes).
    pub fn violations(&self, initial_stock: i64, one_order_per_user: bool) -> Vec<String> {
        let mut broken = Vec::new();
        if self.active_orders + self.stock_left != initial_stock {
            broken.push(format!(
                "active orders + stock = {} + {} != initial stock {initial_stock}",
                self.active_orders, self.stock_left
            ));
        }
        if self.stock_left < 0 {
            broken.push(format!("stock is negative: {}", self.stock_left));
        }
        if self.oversold(initial_stock) > 0 {
            broken.push(format!("{} units oversold", self.oversold(initial_stock)));
        }
        if one_order_per_user && self.duplicate_users > 0 {
            broken.push(format!(
                "{} users hold more than one active order ({} extra orders)",
                self.duplicate_users, self.extra_orders
            ));
        }
        if self.paid_and_closed > 0 {
            broken.push(format!(
                "{} orders were paid and closed (their buyers paid for nothing)",
                self.paid_and_closed
            ));
        }
        broken
    }
}

impl Store {
    /// Reads the audit of one voucher, in one snapshot: a close committing
    /// meanwhile (its order closed, its unit back in stock) is seen whole or
    /// not at all.
    pub async fn audit_voucher(&self, voucher_id: VoucherId) -> Result<VoucherAudit, sqlx::Error> {
        let mut tx = self.begin().await?;
        let stock_left: i32 =
            sqlx::query_scalar("SELECT stock FROM tb_seckill_voucher WHERE voucher_id = ?")
                .bind(voucher_id)
                .fetch_one(&mut *tx)
                .await?;
        let (active_orders, duplicate_users, extra_orders): (i64, i64, i64) =
            sqlx::query_as(concat!(
                "SELECT CAST(COALESCE(SUM(n), 0) AS SIGNED), \
                        CAST(COALESCE(SUM(n > 1), 0) AS SIGNED), \
                        CAST(COALESCE(SUM(n - 1), 0) AS SIGNED) \
                 FROM (SELECT COUNT(*) AS n FROM tb_voucher_order WHERE voucher_id = ? AND ",
                active_order!(),
                " GROUP BY user_id) AS per_user"
            ))
            .bind(voucher_id)
            .fetch_one(&mut *tx)
            .await?;
        let (closed_orders, paid_and_closed): (i64, i64) = sqlx::query_as(
            "SELECT CAST(COUNT(*) AS SIGNED), CAST(COALESCE(SUM(pay_time IS NOT NULL), 0) AS SIGNED) \
             FROM tb_voucher_order WHERE voucher_id = ? AND status = 4",
        )
        .bind(voucher_id)
        .fetch_one(&mut *tx)
        .await?;
        tx.rollback().await?;
        Ok(VoucherAudit {
            active_orders,
            closed_orders,
            paid_and_closed,
            stock_left: stock_left.into(),
            duplicate_users,
            extra_orders,
        })
    }

    /// Every user holding an active order of the voucher, with how many, by
    /// user id: the reconciliation compares them with the buyers Redis
    /// admitted.
    pub async fn orders_per_user(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Vec<(UserId, i64)>, sqlx::Error> {
        sqlx::query_as(concat!(
            "SELECT user_id, COUNT(*) FROM tb_voucher_order WHERE voucher_id = ? AND ",
            active_order!(),
            " GROUP BY user_id ORDER BY user_id"
        ))
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await
    }

    /// The ids of every order of the voucher, closed ones included: what a
    /// run's success answers are checked against.
    pub async fn order_ids_of(&self, voucher_id: VoucherId) -> Result<Vec<OrderId>, sqlx::Error> {
        sqlx::query_scalar("SELECT id FROM tb_voucher_order WHERE voucher_id = ?")
            .bind(voucher_id)
            .fetch_all(&self.pool)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::VoucherAudit;

    fn audit(active_orders: i64, stock_left: i64, duplicate_users: i64) -> VoucherAudit {
        VoucherAudit {
            active_orders,
            closed_orders: 0,
            paid_and_closed: 0,
            stock_left,
            duplicate_users,
            extra_orders: duplicate_users,
        }
    }

    #[test]
    fn a_clean_sale_breaks_nothing() {
        assert!(audit(100, 0, 0).violations(100, true).is_empty());
        assert_eq!(audit(40, 60, 0).supply(), 100);
    }

    #[test]
    fn duplicates_count_only_where_one_order_per_user_is_expected() {
        assert_eq!(audit(100, 0, 7).violations(100, true).len(), 1);
        assert!(audit(100, 0, 7).violations(100, false).is_empty());
    }

    #[test]
    fn closed_orders_count_as_stock_and_a_paid_one_is_reported() {
        let mut closed = audit(60, 40, 0);
        closed.closed_orders = 30;
        assert!(closed.violations(100, true).is_empty());
        closed.paid_and_closed = 1;
        assert_eq!(closed.violations(100, true).len(), 1);
    }

    #[test]
    fn oversell_and_lost_stock_are_reported() {
        let broken = audit(101, -1, 0).violations(100, false);
        assert_eq!(broken.len(), 2, "{broken:?}");
        assert_eq!(audit(90, 0, 0).violations(100, true).len(), 1);
    }
}
