//! `tb_lock_fence`: the fencing check of a purchase made under `--fencing`.

use sqlx::MySqlConnection;

/// Records `token` as the newest lock token to write for `user_id`; `false`
/// when a newer (or the same) token already wrote, i.e. this holder's lock
/// has passed on. Run first in the transaction: the row lock it takes keeps
/// the user's other purchases out until this transaction ends.
pub async fn record_fence(
    conn: &mut MySqlConnection,
    user_id: u64,
    token: u64,
) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query("UPDATE tb_lock_fence SET token = ? WHERE user_id = ? AND token < ?")
        .bind(token)
        .bind(user_id)
        .bind(token)
        .execute(&mut *conn)
        .await?;
    if moved.rows_affected() == 1 {
        return Ok(true);
    }
    // No row yet, or a newer token: the insert tells which.
    let inserted = sqlx::query("INSERT IGNORE INTO tb_lock_fence (user_id, token) VALUES (?, ?)")
        .bind(user_id)
        .bind(token)
        .execute(conn)
        .await?;
    Ok(inserted.rows_affected() == 1)
}
