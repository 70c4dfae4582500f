//! The invariants of DESIGN.md, read from the database: the one check shared
//! by the tests, `loadtest --verify` and `demo`.

use serde::Serialize;

use super::Store;

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
}

impl Store {
    /// Reads the audit of one voucher.
    pub async fn audit_voucher(&self, voucher_id: i64) -> Result<VoucherAudit, sqlx::Error> {
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
}
