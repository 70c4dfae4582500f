//! A MySQL transaction that no cancellation can leave open on a pooled
//! connection.
//!
//! sqlx counts a MySQL transaction as open only once `BEGIN` has answered:
//! a future dropped while `BEGIN` is in flight (a client that hung up, a
//! timeout) hands its connection back to the pool inside a transaction
//! nobody will end. Whatever that connection runs next stays invisible to
//! everyone else, and the next `BEGIN` on it silently commits the lot.
//! [`Tx`] trusts nothing it did not see end: unless a `COMMIT` or a
//! `ROLLBACK` answered, its connection is closed instead of pooled, and MySQL
//! rolls back what a closed connection left open.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlConnection, MySqlPool};

use super::order::{Found, Lookup};

/// An open transaction on a connection of the pool.
pub struct Tx {
    conn: PoolConnection<MySql>,
    /// Set once `COMMIT` or `ROLLBACK` answered: only then is the
    /// connection known to be outside any transaction.
    ended: bool,
}

impl Tx {
    /// Takes a connection from `pool` and begins a transaction on it
    /// (through [`Store::begin`](super::Store::begin)).
    pub(super) async fn begin(pool: &MySqlPool) -> Result<Tx, sqlx::Error> {
        Tx::begin_on(pool.acquire().await?).await
    }

    /// Begins a transaction on `conn`, a connection of the pool
    /// ([`Store::connection`](super::Store::connection)).
    pub async fn begin_on(conn: PoolConnection<MySql>) -> Result<Tx, sqlx::Error> {
        let mut tx = Tx { conn, ended: false };
        sqlx::raw_sql("BEGIN").execute(&mut *tx.conn).await?;
        Ok(tx)
    }

    /// Begins a transaction on `conn` in the round trip of its first
    /// statements, `lookup`'s, and returns what they found.
    pub async fn begin_looking_up(
        conn: PoolConnection<MySql>,
        lookup: &Lookup,
    ) -> Result<(Tx, Found), sqlx::Error> {
        // Open from here on: a cancellation while `BEGIN` is in flight
        // closes the connection.
        let mut tx = Tx { conn, ended: false };
        let found = lookup.run(&mut tx.conn, Some("BEGIN")).await?;
        Ok((tx, found))
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.end("COMMIT").await
    }

    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.end("ROLLBACK").await
    }

    async fn end(mut self, statement: &'static str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(statement).execute(&mut *self.conn).await?;
        self.ended = true;
        Ok(())
    }
}

impl Deref for Tx {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        &self.conn
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if !self.ended {
            // Dropped before its end was seen (an error, a cancellation, a
            // `COMMIT` whose answer never came): the server rolls back what
            // this connection left open once it is closed.
            self.conn.close_on_drop();
        }
    }
}
