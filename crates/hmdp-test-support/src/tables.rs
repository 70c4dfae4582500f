//! The tables as the tests see them from outside the product: what a test
//! reads to judge a run (is this order written? whose is it?), and what a
//! fault test changes behind the product's back on purpose (an order row
//! deleted, the stock changed by hand, a give-back made old). Each query is
//! named for what it asks and written once; the product's own queries stay
//! in its `store`.

use sqlx::MySqlPool;

/// The product's tables in one database, as a test reads and breaks them.
#[derive(Clone, Copy)]
pub struct Tables<'a> {
    pool: &'a MySqlPool,
}

impl<'a> Tables<'a> {
    /// The tables of the database `pool` connects to.
    pub fn of(pool: &'a MySqlPool) -> Tables<'a> {
        Tables { pool }
    }

    // --- Orders, as a test reads them.

    /// How many orders MySQL holds under `order_id` (0 or 1).
    pub async fn orders_with_id(&self, order_id: i64) -> sqlx::Result<i64> {
        sqlx::query_scalar("SELECT COUNT(*) FROM tb_voucher_order WHERE id = ?")
            .bind(order_id)
            .fetch_one(self.pool)
            .await
    }

    /// The buyer and the voucher of order `order_id`, if MySQL has it.
    pub async fn order(&self, order_id: i64) -> sqlx::Result<Option<(u64, i64)>> {
        sqlx::query_as(
            "SELECT user_id, CAST(voucher_id AS SIGNED) FROM tb_voucher_order WHERE id = ?",
        )
        .bind(order_id)
        .fetch_optional(self.pool)
        .await
    }

    /// The buyer of order `order_id` if it is active (not closed).
    pub async fn active_buyer(&self, order_id: i64) -> sqlx::Result<Option<u64>> {
        sqlx::query_scalar("SELECT user_id FROM tb_voucher_order WHERE id = ? AND status <> 4")
            .bind(order_id)
            .fetch_optional(self.pool)
            .await
    }

    /// The status of order `order_id` (1 unpaid, 2 paid, 4 closed, ...).
    pub async fn order_status(&self, order_id: i64) -> sqlx::Result<u8> {
        sqlx::query_scalar("SELECT status FROM tb_voucher_order WHERE id = ?")
            .bind(order_id)
            .fetch_one(self.pool)
            .await
    }

    /// How many orders MySQL holds, of every voucher.
    pub async fn all_orders(&self) -> sqlx::Result<i64> {
        sqlx::query_scalar("SELECT COUNT(*) FROM tb_voucher_order")
            .fetch_one(self.pool)
            .await
    }

    /// How many orders of `voucher_id` MySQL holds, closed ones included.
    pub async fn orders_of_voucher(&self, voucher_id: i64) -> sqlx::Result<i64> {
        sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM tb_voucher_order WHERE voucher_id = ?",
        )
        .bind(voucher_id)
        .fetch_one(self.pool)
        .await
    }

    /// The ids of `voucher_id`'s orders, the oldest first.
    pub async fn order_ids_of_voucher(&self, voucher_id: i64) -> sqlx::Result<Vec<i64>> {
        sqlx::query_scalar("SELECT id FROM tb_voucher_order WHERE voucher_id = ? ORDER BY id")
            .bind(voucher_id)
            .fetch_all(self.pool)
            .await
    }

    /// The ids of `user_id`'s orders of every voucher, the oldest first.
    pub async fn order_ids_of_user(&self, user_id: u64) -> sqlx::Result<Vec<i64>> {
        sqlx::query_scalar("SELECT id FROM tb_voucher_order WHERE user_id = ? ORDER BY id")
            .bind(user_id)
            .fetch_all(self.pool)
            .await
    }

    /// The ids of `user_id`'s orders of `voucher_id`, the oldest first.
    pub async fn order_ids_of(&self, voucher_id: i64, user_id: u64) -> sqlx::Result<Vec<i64>> {
        sqlx::query_scalar(
            "SELECT id FROM tb_voucher_order WHERE voucher_id = ? AND user_id = ? ORDER BY id",
        )
        .bind(voucher_id)
        .bind(user_id)
        .fetch_all(self.pool)
        .await
    }

    /// The oldest order of `voucher_id`, with its buyer.
    pub async fn first_order(&self, voucher_id: i64) -> sqlx::Result<(i64, u64)> {
        sqlx::query_as(
            "SELECT id, user_id FROM tb_voucher_order WHERE voucher_id = ? ORDER BY id LIMIT 1",
        )
        .bind(voucher_id)
        .fetch_one(self.pool)
        .await
    }

    /// The oldest unpaid order of `voucher_id`, with its buyer.
    pub async fn first_unpaid_order(&self, voucher_id: i64) -> sqlx::Result<(i64, u64)> {
        sqlx::query_as(
            "SELECT id, user_id FROM tb_voucher_order WHERE voucher_id = ? AND status = 1 \
             ORDER BY id LIMIT 1",
        )
        .bind(voucher_id)
        .fetch_one(self.pool)
        .await
    }

    // --- The sale and the lock's fence, as a test reads them.

    /// How many rows `hmdp seed` writes hold: shop types, shops, vouchers,
    /// seckill vouchers.
    pub async fn seeded_rows(&self) -> sqlx::Result<[i64; 4]> {
        let mut counts = [0; 4];
        for (count, statement) in counts.iter_mut().zip([
            "SELECT CAST(COUNT(*) AS SIGNED) FROM tb_shop_type",
            "SELECT CAST(COUNT(*) AS SIGNED) FROM tb_shop",
            "SELECT CAST(COUNT(*) AS SIGNED) FROM tb_voucher",
            "SELECT CAST(COUNT(*) AS SIGNED) FROM tb_seckill_voucher",
        ]) {
            *count = sqlx::query_scalar(statement).fetch_one(self.pool).await?;
        }
        Ok(counts)
    }

    /// MySQL's stock of `voucher_id`'s sale.
    pub async fn stock(&self, voucher_id: i64) -> sqlx::Result<i64> {
        sqlx::query_scalar("SELECT stock FROM tb_seckill_voucher WHERE voucher_id = ?")
            .bind(voucher_id)
            .fetch_one(self.pool)
            .await
    }

    /// `voucher_id`'s sale fence as MySQL holds it (`sale_fence`, JSON).
    pub async fn sale_fence(&self, voucher_id: i64) -> sqlx::Result<String> {
        sqlx::query_scalar("SELECT sale_fence FROM tb_seckill_voucher WHERE voucher_id = ?")
            .bind(voucher_id)
            .fetch_one(self.pool)
            .await
    }

    /// The next number MySQL's order-id counter leases (`tb_order_id_block`).
    pub async fn next_order_id_number(&self) -> sqlx::Result<u64> {
        sqlx::query_scalar("SELECT next_value FROM tb_order_id_block WHERE name = 'order'")
            .fetch_one(self.pool)
            .await
    }

    /// Sets the next number MySQL's order-id counter leases.
    pub async fn set_next_order_id_number(&self, next: u64) -> sqlx::Result<()> {
        sqlx::query("UPDATE tb_order_id_block SET next_value = ? WHERE name = 'order'")
            .bind(next)
            .execute(self.pool)
            .await?;
        Ok(())
    }

    /// The shard count `voucher_id`'s sale was created with.
    pub async fn shards(&self, voucher_id: i64) -> sqlx::Result<u16> {
        sqlx::query_scalar("SELECT shards FROM tb_seckill_voucher WHERE voucher_id = ?")
            .bind(voucher_id)
            .fetch_one(self.pool)
            .await
    }

    /// The newest fencing token a write recorded for `user_id`.
    pub async fn fence_token(&self, user_id: u64) -> sqlx::Result<u64> {
        sqlx::query_scalar("SELECT token FROM tb_lock_fence WHERE user_id = ?")
            .bind(user_id)
            .fetch_one(self.pool)
            .await
    }

    /// How many users have a fencing token recorded.
    pub async fn fenced_users(&self) -> sqlx::Result<i64> {
        sqlx::query_scalar("SELECT COUNT(*) FROM tb_lock_fence")
            .fetch_one(self.pool)
            .await
    }

    /// How many give-backs to Redis are owed, of every order.
    pub async fn givebacks_owed(&self) -> sqlx::Result<i64> {
        sqlx::query_scalar("SELECT COUNT(*) FROM tb_order_giveback")
            .fetch_one(self.pool)
            .await
    }

    /// How many give-backs to Redis are owed for order `order_id`.
    pub async fn givebacks_owed_for(&self, order_id: i64) -> sqlx::Result<i64> {
        sqlx::query_scalar("SELECT COUNT(*) FROM tb_order_giveback WHERE order_id = ?")
            .bind(order_id)
            .fetch_one(self.pool)
            .await
    }

    // --- Changes behind the product's back, on purpose.

    /// An order row written by hand, as no purchase wrote it.
    pub async fn insert_order(
        &self,
        order_id: i64,
        user_id: u64,
        voucher_id: i64,
    ) -> sqlx::Result<()> {
        sqlx::query("INSERT INTO tb_voucher_order (id, user_id, voucher_id) VALUES (?, ?, ?)")
            .bind(order_id)
            .bind(user_id)
            .bind(voucher_id)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// Order `order_id`'s row deleted.
    pub async fn delete_order(&self, order_id: i64) -> sqlx::Result<()> {
        sqlx::query("DELETE FROM tb_voucher_order WHERE id = ?")
            .bind(order_id)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// `user_id`'s orders of `voucher_id` deleted.
    pub async fn delete_orders_of(&self, voucher_id: i64, user_id: u64) -> sqlx::Result<()> {
        sqlx::query("DELETE FROM tb_voucher_order WHERE voucher_id = ? AND user_id = ?")
            .bind(voucher_id)
            .bind(user_id)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// Order `order_id` marked closed, nothing else changed.
    pub async fn mark_closed(&self, order_id: i64) -> sqlx::Result<()> {
        sqlx::query("UPDATE tb_voucher_order SET status = 4 WHERE id = ?")
            .bind(order_id)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// Order `order_id` made `seconds` older, if it is still unpaid.
    pub async fn age_unpaid_order(&self, order_id: i64, seconds: u64) -> sqlx::Result<u64> {
        sqlx::query(
            "UPDATE tb_voucher_order SET create_time = create_time - INTERVAL ? SECOND \
             WHERE id = ? AND status = 1",
        )
        .bind(seconds)
        .bind(order_id)
        .execute(self.pool)
        .await
        .map(|done| done.rows_affected())
    }

    /// Every give-back owed made `seconds` older.
    pub async fn age_givebacks(&self, seconds: u64) -> sqlx::Result<()> {
        sqlx::query("UPDATE tb_order_giveback SET create_time = create_time - INTERVAL ? SECOND")
            .bind(seconds)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// MySQL's stock of `voucher_id`'s sale changed by `by` units.
    pub async fn add_stock(&self, voucher_id: i64, by: i64) -> sqlx::Result<()> {
        sqlx::query("UPDATE tb_seckill_voucher SET stock = stock + ? WHERE voucher_id = ?")
            .bind(by)
            .bind(voucher_id)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// MySQL's stock of `voucher_id`'s sale set to `stock`.
    pub async fn set_stock(&self, voucher_id: i64, stock: i64) -> sqlx::Result<()> {
        sqlx::query("UPDATE tb_seckill_voucher SET stock = ? WHERE voucher_id = ?")
            .bind(stock)
            .bind(voucher_id)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// A fencing token recorded for `user_id`, as a newer holder's write
    /// would have.
    pub async fn insert_fence(&self, user_id: u64, token: u64) -> sqlx::Result<()> {
        sqlx::query("INSERT INTO tb_lock_fence (user_id, token) VALUES (?, ?)")
            .bind(user_id)
            .bind(token)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// Shop `shop_id` renamed in MySQL, behind any cache of it.
    pub async fn rename_shop(&self, shop_id: u64, name: &str) -> sqlx::Result<()> {
        sqlx::query("UPDATE tb_shop SET name = ? WHERE id = ?")
            .bind(name)
            .bind(shop_id)
            .execute(self.pool)
            .await
            .map(drop)
    }

    /// A profile for `user_id`, as hmdp's sample data has them: 杭州,
    /// 爱吃爱玩, 3 fans, born 2000-01-02, level 2.
    pub async fn insert_user_info(&self, user_id: u64) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO tb_user_info (user_id, city, introduce, fans, gender, birthday, level) \
             VALUES (?, '杭州', '爱吃爱玩', 3, 1, '2000-01-02', 2)",
        )
        .bind(user_id)
        .execute(self.pool)
        .await
        .map(drop)
    }

    /// Voucher `voucher_id` gone from MySQL with its orders, and its id
    /// handed out again to the next voucher created: as a database restored
    /// from a backup older than the voucher.
    pub async fn forget_voucher(&self, voucher_id: i64) -> sqlx::Result<()> {
        for statement in [
            "DELETE FROM tb_voucher_order WHERE voucher_id = ?",
            "DELETE FROM tb_seckill_voucher WHERE voucher_id = ?",
            "DELETE FROM tb_voucher WHERE id = ?",
        ] {
            sqlx::query(statement)
                .bind(voucher_id)
                .execute(self.pool)
                .await?;
        }
        let reset = format!("ALTER TABLE tb_voucher AUTO_INCREMENT = {voucher_id}");
        sqlx::query(sqlx::AssertSqlSafe(reset))
            .execute(self.pool)
            .await
            .map(drop)
    }

    // --- The server, as a test watches it.

    /// The server's count of status variable `name` (`Com_stmt_prepare`,
    /// ...), asked as text, itself no prepared statement.
    pub async fn global_status(&self, name: &str) -> sqlx::Result<u64> {
        use sqlx::Row;
        let sql = format!("SHOW GLOBAL STATUS LIKE '{name}'");
        let row = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .fetch_one(self.pool)
            .await?;
        let value: String = row.try_get(1)?;
        value
            .parse()
            .map_err(|error: std::num::ParseIntError| sqlx::Error::Decode(error.into()))
    }

    /// How many transactions are open on this database's connections.
    pub async fn open_transactions(&self) -> sqlx::Result<i64> {
        sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = DATABASE()",
        )
        .fetch_one(self.pool)
        .await
    }

    /// How many sessions on this database wait for a table's metadata lock
    /// (behind a `LOCK TABLES`, an `ALTER TABLE`).
    pub async fn waiting_for_a_table_lock(&self) -> sqlx::Result<i64> {
        sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.processlist \
             WHERE db = DATABASE() AND state = 'Waiting for table metadata lock'",
        )
        .fetch_one(self.pool)
        .await
    }

    /// Each transaction open on this database's connections, in a line:
    /// its state, age, rows, its session's command, and the statements it
    /// ran (from `performance_schema`'s history where the server keeps one).
    pub async fn describe_open_transactions(&self) -> sqlx::Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT CONCAT_WS(' | ', CONCAT('trx ', t.trx_id), t.trx_state, \
             CONCAT('since ', t.trx_started), CONCAT('rows modified ', t.trx_rows_modified), \
             CONCAT('rows locked ', t.trx_rows_locked), p.command, p.state, CONCAT(p.time, ' s'), \
             p.info, \
             CONCAT('last statements: ', (SELECT GROUP_CONCAT(CONCAT( \
                 COALESCE(h.SQL_TEXT, SUBSTRING_INDEX(h.EVENT_NAME, '/', -1)), \
                 IF(h.ROWS_AFFECTED > 0, CONCAT(' (', h.ROWS_AFFECTED, ' rows)'), ''), \
                 IF(h.MYSQL_ERRNO <> 0, CONCAT(' (error ', h.MYSQL_ERRNO, ')'), ''), \
                 ' ', ROUND((now.TIMER_START - h.TIMER_END) / 1e12, 3), ' s ago') \
                 ORDER BY h.EVENT_ID SEPARATOR ' ; ') \
               FROM performance_schema.events_statements_history h \
               JOIN performance_schema.threads th ON th.THREAD_ID = h.THREAD_ID \
               WHERE th.PROCESSLIST_ID = p.id))) \
             FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             LEFT JOIN performance_schema.events_statements_current now ON now.THREAD_ID = \
               (SELECT THREAD_ID FROM performance_schema.threads WHERE PROCESSLIST_ID = CONNECTION_ID()) \
             WHERE p.db = DATABASE()",
        )
        .fetch_all(self.pool)
        .await
    }

    /// Whether a connection of the pool is inside a transaction (with a
    /// pool of one, the connection the last statement left behind).
    pub async fn in_transaction(&self) -> sqlx::Result<bool> {
        let open: u64 = sqlx::query_scalar("SELECT @@in_transaction")
            .fetch_one(self.pool)
            .await?;
        Ok(open != 0)
    }

    /// Every session on this database but the one asking, killed
    /// (`KILL CONNECTION`), as a MySQL restart would; how many there were.
    pub async fn kill_other_connections(&self) -> sqlx::Result<usize> {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM information_schema.processlist \
             WHERE db = DATABASE() AND id <> CONNECTION_ID()",
        )
        .fetch_all(self.pool)
        .await?;
        for id in &ids {
            // A session may have ended on its own meanwhile.
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                .execute(self.pool)
                .await;
        }
        Ok(ids.len())
    }
}
