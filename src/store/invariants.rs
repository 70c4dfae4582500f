//! The invariants of docs/design.md, read from the database: the one check shared
//! by the tests, `loadtest --verify` and `demo`.

use serde::Serialize;

use super::Store;
use crate::ids::{OrderId, UserId, VoucherId};

/// What a voucher's sale left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VoucherAudit {
    /// Orders written for the voucher.
    pub orders: i64,
    /// Stock left in `tb_seckill_voucher`.
    pub stock_left: i64,
    /// Users holding more than one order of the voucher.
    pub duplicate_users: i64,
    /// Orders beyond the first of each user (sum over duplicate users).
    pub extra_orders: i64,
}

impl VoucherAudit {
    /// Units sold beyond the initial stock: orders that had no stock behind them.
    pub fn oversold(&self, initial_stock: i64) -> i64 {
        (self.orders - initial_stock).max(0) + (-self.stock_left).max(0)
    }

    /// `orders + stock == initial` and `stock >= 0`.
    pub fn stock_balances(&self, initial_stock: i64) -> bool {
        self.orders + self.stock_left == initial_stock && self.stock_left >= 0
    }

    /// The units this audit accounts for, sold or left. Read before a run, it
    /// is the initial stock that the audit after the run must balance against.
    pub fn supply(&self) -> i64 {
        self.orders + self.stock_left
    }

    /// The invariants of docs/design.md that this audit breaks, in words; empty
    /// when all hold. `one_order_per_user` is false for the setups expected
    /// to let duplicates through (no lock, a local lock on two nodes).
    pub fn violations(&self, initial_stock: i64, one_order_per_user: bool) -> Vec<String> {
        let mut broken = Vec::new();
        if self.orders + self.stock_left != initial_stock {
            broken.push(format!(
                "orders + stock = {} + {} != initial stock {initial_stock}",
                self.orders, self.stock_left
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
                "{} users hold more than one order ({} extra orders)",
                self.duplicate_users, self.extra_orders
            ));
        }
        broken
    }
}

impl Store {
    /// Reads the audit of one voucher.
    pub async fn audit_voucher(&self, voucher_id: VoucherId) -> Result<VoucherAudit, sqlx::Error> {
        let stock_left: i32 =
            sqlx::query_scalar("SELECT stock FROM tb_seckill_voucher WHERE voucher_id = ?")
                .bind(voucher_id)
                .fetch_one(&self.pool)
                .await?;
        let (orders, duplicate_users, extra_orders): (i64, i64, i64) = sqlx::query_as(
            "SELECT CAST(COALESCE(SUM(n), 0) AS SIGNED), \
                    CAST(COALESCE(SUM(n > 1), 0) AS SIGNED), \
                    CAST(COALESCE(SUM(n - 1), 0) AS SIGNED) \
             FROM (SELECT COUNT(*) AS n FROM tb_voucher_order WHERE voucher_id = ? \
                   GROUP BY user_id) AS per_user",
        )
        .bind(voucher_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(VoucherAudit {
            orders,
            stock_left: stock_left.into(),
            duplicate_users,
            extra_orders,
        })
    }

    /// Every user holding an order of the voucher, with how many, by user
    /// id: the reconciliation compares them with the buyers Redis admitted.
    pub async fn orders_per_user(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Vec<(UserId, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT user_id, COUNT(*) FROM tb_voucher_order WHERE voucher_id = ? \
             GROUP BY user_id ORDER BY user_id",
        )
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await
    }

    /// The ids of every order of the voucher: what a run's success answers
    /// are checked against.
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

    fn audit(orders: i64, stock_left: i64, duplicate_users: i64) -> VoucherAudit {
        VoucherAudit {
            orders,
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
    fn oversell_and_lost_stock_are_reported() {
        let broken = audit(101, -1, 0).violations(100, false);
        assert_eq!(broken.len(), 2, "{broken:?}");
        assert_eq!(audit(90, 0, 0).violations(100, true).len(), 1);
    }
}
