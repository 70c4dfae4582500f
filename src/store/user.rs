//! `tb_user`: users are created on their first login by phone.

use serde::Serialize;
use sqlx::FromRow;

use super::Store;
use crate::ids::UserId;

/// The public face of a user, also what the session hash stores.
#[derive(Debug, Clone, Serialize, FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct User {
    pub id: UserId,
    pub nick_name: String,
    pub icon: String,
}

impl Store {
    /// The user with this phone, created with hmdp's `user_` + random nickname
    /// when new. Safe under concurrent first logins of one phone: the unique
    /// key on `phone` makes the second insert a no-op.
    pub async fn find_or_create_user(
        &self,
        phone: &str,
        new_nick_name: &str,
    ) -> Result<User, sqlx::Error> {
        sqlx::query("INSERT IGNORE INTO tb_user (phone, nick_name) VALUES (?, ?)")
            .bind(phone)
            .bind(new_nick_name)
            .execute(&self.pool)
            .await?;
        sqlx::query_as(
            "SELECT id, COALESCE(nick_name, '') AS nick_name, COALESCE(icon, '') AS icon \
             FROM tb_user WHERE phone = ?",
        )
        .bind(phone)
        .fetch_one(&self.pool)
        .await
    }
}
