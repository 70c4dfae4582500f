//! `tb_voucher` and `tb_seckill_voucher`: what is on sale, how many, and when.

use chrono::NaiveDateTime;
use serde::Serialize;
use sqlx::FromRow;

use super::Store;
use crate::ids::{ShopId, VoucherId};

/// A voucher to create (`POST /voucher`).
#[derive(Debug, Clone)]
pub struct NewVoucher {
    pub shop_id: u64,
    pub title: String,
    pub sub_title: Option<String>,
    pub rules: Option<String>,
    pub pay_value: u64,
    pub actual_value: i64,
    pub voucher_type: u8,
    pub status: u8,
}

/// The flash-sale part of a seckill voucher (`POST /voucher/seckill`).
#[derive(Debug, Clone)]
pub struct NewSeckillVoucher {
    pub stock: i32,
    pub begin_time: NaiveDateTime,
    pub end_time: NaiveDateTime,
    /// How many shards its sale is split into in Redis (1 to
    /// `shards::MAX_SHARDS`).
    pub shards: u16,
}

impl NewVoucher {
    /// A flash-sale voucher of hmdp's first sample shop titled `title`,
    /// paying 100 for 200: what the labs, benchmarks and tests sell.
    pub fn flash_sale(title: impl Into<String>) -> NewVoucher {
        NewVoucher {
            shop_id: 1,
            title: title.into(),
            sub_title: None,
            rules: None,
            pay_value: 100,
            actual_value: 200,
            voucher_type: 1,
            status: 1,
        }
    }
}

impl NewSeckillVoucher {
    /// `stock` units on sale from an hour ago to an hour from now (local
    /// time, as the columns hold it), in one shard: a sale open the moment
    /// it is created, whatever the clocks' skew.
    pub fn open_now(stock: i32) -> NewSeckillVoucher {
        let now = chrono::Local::now().naive_local();
        NewSeckillVoucher {
            stock,
            begin_time: now - chrono::TimeDelta::hours(1),
            end_time: now + chrono::TimeDelta::hours(1),
            shards: 1,
        }
    }
}

/// A voucher as listed for a shop, seckill fields merged (hmdp's `Voucher`).
#[derive(Debug, Clone, Serialize, FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Voucher {
    pub id: VoucherId,
    pub shop_id: Option<u64>,
    pub title: String,
    pub sub_title: Option<String>,
    pub rules: Option<String>,
    pub pay_value: u64,
    pub actual_value: i64,
    #[serde(rename = "type")]
    pub voucher_type: u8,
    pub status: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stock: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::contract::local_time)]
    pub begin_time: Option<NaiveDateTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::contract::local_time)]
    pub end_time: Option<NaiveDateTime>,
}

/// What the purchase needs to know before taking the lock.
///
/// `TIMESTAMP` columns are read through `CAST(... AS DATETIME)`: the values are
/// wall-clock times in the session time zone, exactly as they were written.
#[derive(Debug, Clone, FromRow)]
pub struct SeckillVoucher {
    pub stock: i32,
    pub begin_time: NaiveDateTime,
    pub end_time: NaiveDateTime,
    /// Drawn at random when the voucher was created: what tells its Redis
    /// sale from an earlier voucher's under the same id.
    pub sale_token: u64,
    /// How many shards its sale is split into in Redis.
    pub shards: u16,
    /// Each shard's highest admission number MySQL has written
    /// (`store/sale_fence.rs`), as the column holds it.
    pub sale_fence: String,
}

/// A new seckill voucher's sale token: random, below 2^63 (a Lua number
/// compares it as text, so any value works; this one also fits `i64`).
fn new_sale_token() -> u64 {
    rand::random::<u64>() >> 1
}

impl Store {
    /// Inserts an ordinary voucher and returns its id.
    pub async fn insert_voucher(&self, voucher: &NewVoucher) -> Result<VoucherId, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        insert_voucher_row(&mut conn, voucher).await
    }

    /// Inserts a voucher and its seckill row in one transaction.
    pub async fn insert_seckill_voucher(
        &self,
        voucher: &NewVoucher,
        seckill: &NewSeckillVoucher,
    ) -> Result<VoucherId, sqlx::Error> {
        let mut tx = self.begin().await?;
        let id = insert_voucher_row(&mut tx, voucher).await?;
        sqlx::query(
            "INSERT INTO tb_seckill_voucher \
             (voucher_id, stock, begin_time, end_time, sale_token, shards) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(seckill.stock)
        .bind(seckill.begin_time)
        .bind(seckill.end_time)
        .bind(new_sale_token())
        .bind(seckill.shards)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Removes a voucher with its seckill row and its orders (a benchmark's
    /// own voucher, once measured).
    pub async fn delete_voucher(&self, voucher_id: VoucherId) -> Result<(), sqlx::Error> {
        let mut tx = self.begin().await?;
        for statement in [
            "DELETE FROM tb_voucher_order WHERE voucher_id = ?",
            "DELETE FROM tb_order_giveback WHERE voucher_id = ?",
            "DELETE FROM tb_seckill_voucher WHERE voucher_id = ?",
            "DELETE FROM tb_voucher WHERE id = ?",
        ] {
            sqlx::query(statement)
                .bind(voucher_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }

    /// Listed (`status = 1`) vouchers of a shop, hmdp's `queryVoucherOfShop`.
    pub async fn vouchers_of_shop(&self, shop_id: ShopId) -> Result<Vec<Voucher>, sqlx::Error> {
        sqlx::query_as(
            "SELECT CAST(v.id AS SIGNED) AS id, v.shop_id, v.title, v.sub_title, v.rules, \
                    v.pay_value, v.actual_value, v.type AS voucher_type, v.status, \
                    sv.stock, CAST(sv.begin_time AS DATETIME) AS begin_time, \
                    CAST(sv.end_time AS DATETIME) AS end_time \
             FROM tb_voucher v LEFT JOIN tb_seckill_voucher sv ON v.id = sv.voucher_id \
             WHERE v.shop_id = ? AND v.status = 1 ORDER BY v.id",
        )
        .bind(shop_id)
        .fetch_all(&self.pool)
        .await
    }

    /// The seckill row of a voucher, if it is a seckill voucher.
    pub async fn seckill_voucher(
        &self,
        voucher_id: VoucherId,
    ) -> Result<Option<SeckillVoucher>, sqlx::Error> {
        sqlx::query_as(
            "SELECT stock, CAST(begin_time AS DATETIME) AS begin_time, \
             CAST(end_time AS DATETIME) AS end_time, sale_token, shards, sale_fence \
             FROM tb_seckill_voucher WHERE voucher_id = ?",
        )
        .bind(voucher_id)
        .fetch_optional(&self.pool)
        .await
    }
}

async fn insert_voucher_row(
    conn: &mut sqlx::MySqlConnection,
    voucher: &NewVoucher,
) -> Result<VoucherId, sqlx::Error> {
    let result = sqlx::query(
        "INSERT INTO tb_voucher \
         (shop_id, title, sub_title, rules, pay_value, actual_value, type, status) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(voucher.shop_id)
    .bind(&voucher.title)
    .bind(&voucher.sub_title)
    .bind(&voucher.rules)
    .bind(voucher.pay_value)
    .bind(voucher.actual_value)
    .bind(voucher.voucher_type)
    .bind(voucher.status)
    .execute(conn)
    .await?;
    Ok(VoucherId::new(result.last_insert_id() as i64))
}
