//! A private database and Redis key prefix for one demo run or one test, so
//! runs sharing a MySQL and a Redis never see each other; both are removed
//! when the sandbox is dropped (Ctrl-C and failed tests included).

use std::time::Duration;

use anyhow::Context;
use redis::AsyncCommands;
use reqwest::Url;

use crate::config::redact_url;
use crate::store::{self, Store};

/// A migrated database of its own and a Redis prefix of its own.
pub struct Sandbox {
    /// The sandbox database's URL (same server and options as given).
    pub database_url: String,
    pub redis_url: String,
    /// Put before every Redis key the sandbox's nodes write.
    pub redis_prefix: String,
    database: String,
}

impl Sandbox {
    /// Creates `hmdp_{label}_{random}` on the server of `database_url` (the
    /// database named there is left alone), applies the migrations, and picks
    /// the prefix `{label}:{random}:`.
    pub async fn create(database_url: &str, redis_url: &str, label: &str) -> anyhow::Result<Self> {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let database = format!("hmdp_{label}_{id}");
        let mut url = Url::parse(database_url)
            .with_context(|| format!("invalid DATABASE_URL `{}`", redact_url(database_url)))?;
        url.set_path(&format!("/{database}"));
        let sandbox = Sandbox {
            database_url: url.to_string(),
            redis_url: redis_url.to_owned(),
            redis_prefix: format!("{label}:{id}:"),
            database,
        };
        store::create_database_if_missing(&sandbox.database_url).await?;
        sandbox.store(1)?.migrate().await?;
        Ok(sandbox)
    }

    /// A pool on the sandbox database.
    pub fn store(&self, max_connections: u32) -> anyhow::Result<Store> {
        Store::connect_lazy(&self.database_url, max_connections, Duration::from_secs(10))
    }

    async fn remove(database_url: &str, database: &str, redis_url: &str, prefix: &str) {
        if let Ok(store) = Store::connect_lazy(database_url, 1, Duration::from_secs(5)) {
            // A transaction someone leaked on the database (a failed test's)
            // holds a metadata lock that DROP would wait on for a year, MySQL's
            // default: wait 10 s, then leave the database and say so.
            let drop_sql =
                format!("SET SESSION lock_wait_timeout = 10; DROP DATABASE IF EXISTS `{database}`");
            if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(drop_sql))
                .execute(store.pool())
                .await
            {
                tracing::warn!(%error, database, "could not drop the sandbox database");
            }
        }
        let Ok(client) = redis::Client::open(redis_url) else {
            return;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return;
        };
        let mut keys: Vec<String> = Vec::new();
        // Keys that must share a Cluster slot with a lock key wrap it in a
        // hash tag (`{prefix...}:fence`, see `keys::sibling`).
        for pattern in [format!("{prefix}*"), format!("{{{prefix}*")] {
            if let Ok(mut iter) = conn.scan_match::<_, String>(&pattern).await {
                while let Some(Ok(key)) = iter.next_item().await {
                    keys.push(key);
                }
            }
        }
        for chunk in keys.chunks(1000) {
            let _: redis::RedisResult<()> = conn.del(chunk).await;
        }
    }
}

impl Drop for Sandbox {
    /// Runs the removal on its own thread and runtime: `Drop` cannot await,
    /// and it may run inside another runtime's task.
    fn drop(&mut self) {
        let (database_url, database, redis_url) = (
            self.database_url.clone(),
            self.database.clone(),
            self.redis_url.clone(),
        );
        let prefix = self.redis_prefix.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the cleanup");
            runtime.block_on(Sandbox::remove(
                &database_url,
                &database,
                &redis_url,
                &prefix,
            ));
        });
        let _ = cleanup.join();
    }
}
