//! `tb_lock_fence`: the fencing check of a purchase made under `--fencing`.

use sqlx::MySqlConnection;

use crate::ids::UserId;

/// Records `token` as the newest lock token to write for `user_id`; `false`
/// when a newer (or the same) token already wrote, i.e. this holder's lock
/// has passed on. Run first in the transaction: the row lock it takes keeps
/// the user's other purchases out until this transaction ends.
///
/// One statement, the insert first: an `UPDATE` of a row not there yet takes
/// a gap lock, and two overlapping holders that each took one and then
/// inserted would deadlock on each other's gap. A duplicate key instead
/// waits for the other insert's row lock, then updates. Which of the three
/// outcomes happened comes back in the reply: a stale token leaves the row
/// as it is and reports the newer token as the statement's insert id
/// (`LAST_INSERT_ID(expr)`, otherwise 0 for a table without auto-increment),
/// since the affected-row count alone cannot tell an insert from an
/// unchanged row.
pub async fn record_fence(
    conn: &mut MySqlConnection,
    user_id: UserId,
    token: u64,
) -> Result<bool, sqlx::Error> {
    let written = sqlx::query(
        "INSERT INTO tb_lock_fence (user_id, token) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE token = IF(token < ?, ?, LAST_INSERT_ID(token))",
    )
    .bind(user_id)
    .bind(token)
    .bind(token)
    .bind(token)
    .execute(conn)
    .await?;
    Ok(written.last_insert_id() == 0)
}
