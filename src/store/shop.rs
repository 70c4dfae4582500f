//! `tb_shop`, `tb_shop_type` and `tb_user_info`: what hmdp's front end shows
//! on the way to a flash sale (the home page's categories, a category's
//! shops, a shop's page, the user page).

use chrono::{NaiveDate, NaiveDateTime};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::ToSchema;

use super::Store;
use crate::ids::{ShopId, UserId};

/// hmdp's `Shop`, as `/shop/{id}` and `/shop/of/type` answer it and as the
/// shop cache keeps it in Redis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Shop {
    pub id: ShopId,
    pub name: String,
    pub type_id: u64,
    /// Image URLs joined by `,`: the pages split them themselves.
    pub images: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub area: Option<String>,
    pub address: String,
    /// Longitude.
    pub x: f64,
    /// Latitude.
    pub y: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg_price: Option<u64>,
    pub sold: u32,
    pub comments: u32,
    /// 1 to 5 stars times ten (47 is 4.7): the pages divide by ten.
    pub score: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_hours: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::contract::local_time)]
    pub create_time: Option<NaiveDateTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::contract::local_time)]
    pub update_time: Option<NaiveDateTime>,
}

/// hmdp's `ShopType`: a category of the home page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShopType {
    pub id: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A path under the front end's `/imgs` (`/types/ms.png`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icon: Option<String>,
    /// The home page lists categories by this, ascending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sort: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::contract::local_time)]
    pub create_time: Option<NaiveDateTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::contract::local_time)]
    pub update_time: Option<NaiveDateTime>,
}

/// hmdp's `UserInfo` as `/user/info/{id}` answers it: without its create and
/// update times, which hmdp blanks before answering.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    pub user_id: UserId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub city: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub introduce: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fans: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub followee: Option<u32>,
    /// `false` male, `true` female: hmdp maps the `tinyint(1)` to a Boolean.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gender: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub birthday: Option<NaiveDate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credits: Option<u32>,
    /// 0 to 9 (0: no membership). hmdp's entity says Boolean, which would
    /// turn every level above 0 into `true`; the number is what the column
    /// means, and no page reads it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<u8>,
}

/// `SELECT` of a [`Shop`]'s columns from `tb_shop` followed by `$rest`, one
/// static statement; times are read back as they were written (see
/// [`super::SeckillVoucher`]).
macro_rules! select_shops {
    ($rest:literal) => {
        concat!(
            "SELECT id, name, type_id, images, area, address, x, y, avg_price, sold, comments, ",
            "score, open_hours, CAST(create_time AS DATETIME) AS create_time, ",
            "CAST(update_time AS DATETIME) AS update_time FROM tb_shop ",
            $rest
        )
    };
}

impl Store {
    /// One shop, hmdp's `getById`.
    pub async fn shop(&self, id: ShopId) -> Result<Option<Shop>, sqlx::Error> {
        sqlx::query_as(select_shops!("WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
    }

    /// One page of a category's shops in id order (hmdp pages without an
    /// order, which InnoDB answers in primary key order).
    pub async fn shops_of_type(
        &self,
        type_id: u64,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<Shop>, sqlx::Error> {
        sqlx::query_as(select_shops!(
            "WHERE type_id = ? ORDER BY id LIMIT ? OFFSET ?"
        ))
        .bind(type_id)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await
    }

    /// Every category, by `sort` (hmdp's `orderByAsc("sort")`), then id.
    pub async fn shop_types(&self) -> Result<Vec<ShopType>, sqlx::Error> {
        sqlx::query_as(
            "SELECT id, name, icon, sort, CAST(create_time AS DATETIME) AS create_time, \
             CAST(update_time AS DATETIME) AS update_time FROM tb_shop_type ORDER BY sort, id",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// A user's details; `None` for a user who never filled them in.
    pub async fn user_info(&self, user_id: UserId) -> Result<Option<UserInfo>, sqlx::Error> {
        sqlx::query_as(
            "SELECT user_id, city, introduce, fans, followee, gender, birthday, credits, level \
             FROM tb_user_info WHERE user_id = ?",
        )
        .bind(user_id)
        .fetch_optional(&self.pool)
        .await
    }

    /// Writes a category under its id, creating or overwriting it.
    pub async fn save_shop_type(&self, shop_type: &ShopType) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO tb_shop_type (id, name, icon, sort) VALUES (?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE name = VALUES(name), icon = VALUES(icon), sort = VALUES(sort)",
        )
        .bind(shop_type.id)
        .bind(&shop_type.name)
        .bind(&shop_type.icon)
        .bind(shop_type.sort)
        .execute(&self.pool)
        .await
        .map(drop)
    }

    /// Writes a shop under its id, creating or overwriting it (its create
    /// and update times are MySQL's).
    pub async fn save_shop(&self, shop: &Shop) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO tb_shop (id, name, type_id, images, area, address, x, y, avg_price, \
             sold, comments, score, open_hours) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE name = VALUES(name), type_id = VALUES(type_id), \
             images = VALUES(images), area = VALUES(area), address = VALUES(address), \
             x = VALUES(x), y = VALUES(y), avg_price = VALUES(avg_price), sold = VALUES(sold), \
             comments = VALUES(comments), score = VALUES(score), open_hours = VALUES(open_hours)",
        )
        .bind(shop.id)
        .bind(&shop.name)
        .bind(shop.type_id)
        .bind(&shop.images)
        .bind(&shop.area)
        .bind(&shop.address)
        .bind(shop.x)
        .bind(shop.y)
        .bind(shop.avg_price)
        .bind(shop.sold)
        .bind(shop.comments)
        .bind(shop.score)
        .bind(&shop.open_hours)
        .execute(&self.pool)
        .await
        .map(drop)
    }
}
