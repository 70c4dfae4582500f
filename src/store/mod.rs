//! All SQL lives here: the pool, migrations, and one file per table group.

mod fence;
mod invariants;
mod let_go;
mod live_sale;
mod order;
mod order_id_block;
mod order_life;
mod sale;
mod sale_counts;
mod sale_fence;
mod shop;
mod tx;
mod user;
mod voucher;

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::migrate::MigrateDatabase;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{Connection, MySql, MySqlPool};

use crate::config::redact_url;

pub use fence::record_fence;
pub use invariants::VoucherAudit;
pub use live_sale::LiveSale;
pub use order::{
    delete_orders, insert_orders_taking_stock, look_up, stock_left, take_stock_units, Found,
    Lookup, NewOrder, VoucherOrder,
};
pub use order_life::{CloseCause, Closing, Giveback, OrderState, Paid, Using};
pub use sale::SaleSnapshot;
pub use sale_counts::SaleCounts;
pub use sale_fence::SaleFence;
pub use shop::{Shop, ShopType, UserInfo};
pub use tx::Tx;
pub use user::User;
pub use voucher::{NewSeckillVoucher, NewVoucher, SeckillVoucher, Voucher};

/// A pooled connection idle at least this long is pinged before use.
const PING_IF_IDLE_FOR: Duration = Duration::from_millis(200);

/// hmdp's schema, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Access to hmdp's tables.
#[derive(Clone)]
pub struct Store {
    pool: MySqlPool,
}

impl Store {
    /// A pool that connects on first use, so a node starts (and answers
    /// `/health`) before its database is reachable.
    pub fn connect_lazy(
        database_url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> anyhow::Result<Self> {
        Self::build(database_url, max_connections, acquire_timeout, None)
    }

    /// A node's pool: as [`Store::connect_lazy`], and a statement waits for a
    /// lock no longer than `backend_timeout` (rounded up to whole seconds,
    /// MySQL's unit): a row lock instead of MySQL's 50 s, a table's metadata
    /// lock instead of a day or a year. A purchase queued behind a stock row
    /// that a frozen node or an open admin transaction holds, or behind a
    /// `LOCK TABLES` or an `ALTER TABLE`, answers 503 instead of hanging with
    /// its user's lock held.
    pub fn for_requests(
        database_url: &str,
        max_connections: u32,
        backend_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let lock_wait_secs = backend_timeout.as_millis().div_ceil(1000).max(1) as u64;
        Self::build(
            database_url,
            max_connections,
            backend_timeout,
            Some(lock_wait_secs),
        )
    }

    fn build(
        database_url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
        lock_wait_secs: Option<u64>,
    ) -> anyhow::Result<Self> {
        let options = MySqlConnectOptions::from_str(database_url)
            .with_context(|| format!("invalid DATABASE_URL `{}`", redact_url(database_url)))?
            // Keep the server's own time zone: hmdp's datetimes are local
            // wall-clock times, both those the API writes (`beginTime`) and
            // those MySQL fills in (`createTime`). Only naive datetimes are
            // read and written, so no UTC conversion is ever assumed.
            .timezone(None);
        let mut pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(acquire_timeout)
            // sqlx pings every connection it hands out: one more round trip
            // on every purchase, where a connection was in use a moment ago.
            // Only a connection idle for a while (MySQL may have dropped it)
            // is pinged, and a dead one is replaced before use.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            });
        if let Some(secs) = lock_wait_secs {
            pool = pool.after_connect(move |conn, _| {
                Box::pin(async move {
                    sqlx::query("SET SESSION innodb_lock_wait_timeout = ?, lock_wait_timeout = ?")
                        .bind(secs)
                        .bind(secs)
                        .execute(conn)
                        .await
                        .map(drop)
                })
            });
        }
        let pool = pool.connect_lazy_with(options);
        Ok(Store { pool })
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The pool's connections: `(in use, idle)`, read at scrape time.
    pub fn connections(&self) -> (u32, usize) {
        let idle = self.pool.num_idle();
        (self.pool.size().saturating_sub(idle as u32), idle)
    }

    /// Closes every connection of the pool, waiting for those in use.
    pub async fn disconnect(&self) {
        self.pool.close().await;
    }

    /// The longest wait for a connection (the pool's acquire timeout), and,
    /// once it has one, for the statements of a purchase before its
    /// `COMMIT`.
    pub fn backend_timeout(&self) -> Duration {
        self.pool.options().get_acquire_timeout()
    }

    /// Begins a transaction that a cancellation cannot leave open on a
    /// pooled connection ([`Tx`]); with [`Tx::begin_on`], the only way this
    /// crate begins one.
    pub async fn begin(&self) -> Result<Tx, sqlx::Error> {
        Tx::begin(&self.pool).await
    }

    /// A connection of the pool, waited for no longer than the backend
    /// timeout, for [`Tx::begin_on`].
    pub async fn connection(&self) -> Result<sqlx::pool::PoolConnection<MySql>, sqlx::Error> {
        self.pool.acquire().await
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        MIGRATOR
            .run(&self.pool)
            .await
            .context("failed to apply migrations")
    }

    /// `SELECT 1`: the readiness probe.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map(drop)
    }
}

/// Creates the database named in `database_url` when it does not exist.
pub async fn create_database_if_missing(database_url: &str) -> anyhow::Result<()> {
    let exists = MySql::database_exists(database_url)
        .await
        .context("cannot reach MySQL to check the database")?;
    if !exists {
        MySql::create_database(database_url)
            .await
            .context("failed to create the database")?;
        tracing::info!("created database");
    }
    Ok(())
}
