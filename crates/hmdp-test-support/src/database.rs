//! A database of one's own on a shared MySQL server: created under a unique
//! name, dropped with the value (Ctrl-C and failed tests included). The
//! caller applies its migrations; this crate knows no schema.

use std::time::Duration;

use anyhow::Context;
use sqlx::{Connection, MySqlConnection};

use crate::finish_from_drop;
use crate::redis_keys::unique_id;

/// A uniquely named, empty database, dropped when the value is.
pub struct TestDatabase {
    /// The database's URL: the server's, with the database in the path.
    pub url: String,
    name: String,
}

impl TestDatabase {
    /// Creates `hmdp_{label}_{random}` on the server of `server_url`; a
    /// database named in that URL is left alone, its options are kept.
    pub async fn create(server_url: &str, label: &str) -> anyhow::Result<TestDatabase> {
        let name = format!("hmdp_{label}_{}", unique_id());
        let mut url = url::Url::parse(server_url).context("invalid MySQL URL")?;
        url.set_path("");
        let mut server = MySqlConnection::connect(url.as_str())
            .await
            .context("cannot reach MySQL (scripts/services.sh starts it)")?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&mut server)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        url.set_path(&format!("/{name}"));
        Ok(TestDatabase {
            url: url.to_string(),
            name,
        })
    }

    async fn drop_database(url: &str, name: &str) -> anyhow::Result<()> {
        let connect = MySqlConnection::connect(url);
        let mut connection = tokio::time::timeout(Duration::from_secs(5), connect)
            .await
            .context("MySQL did not answer within 5 s")??;
        // A transaction someone leaked on the database (a failed test's)
        // holds a metadata lock that DROP would wait on for a year, MySQL's
        // default: wait 10 s, then leave the database and say so.
        let drop_sql =
            format!("SET SESSION lock_wait_timeout = 10; DROP DATABASE IF EXISTS `{name}`");
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop_sql))
            .execute(&mut connection)
            .await?;
        Ok(())
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        let removal =
            finish_from_drop(async move { TestDatabase::drop_database(&url, &name).await });
        if let Ok(Err(error)) = removal {
            tracing::warn!(
                error = format!("{error:#}"),
                database = self.name,
                "could not drop the database"
            );
        }
    }
}
