//! A private database, migrated, and a Redis key prefix for one demo run or
//! one test, so runs sharing a MySQL and a Redis never see each other; both
//! are removed when the sandbox is dropped (Ctrl-C and failed tests included).

use std::time::Duration;

use hmdp::config::RedisSettings;
use hmdp::store::Store;
use hmdp_test_support::{RedisNamespace, TestDatabase};

/// A migrated database of its own and a Redis prefix of its own.
pub struct Sandbox {
    pub database: TestDatabase,
    pub redis: RedisNamespace,
}

impl Sandbox {
    /// Creates `hmdp_{label}_{random}` on the server of `database_url` (the
    /// database named there is left alone), applies the migrations, and picks
    /// the prefix `{redis.prefix}{label}:{random}:` on `redis.url`.
    pub async fn create(
        database_url: &str,
        redis: &RedisSettings,
        label: &str,
    ) -> anyhow::Result<Self> {
        let sandbox = Sandbox {
            database: TestDatabase::create(database_url, label).await?,
            redis: RedisNamespace::new(&redis.url, &format!("{}{label}", redis.prefix)),
        };
        sandbox.store(1)?.migrate().await?;
        Ok(sandbox)
    }

    /// A pool on the sandbox database.
    pub fn store(&self, max_connections: u32) -> anyhow::Result<Store> {
        Store::connect_lazy(&self.database.url, max_connections, Duration::from_secs(10))
    }
}
