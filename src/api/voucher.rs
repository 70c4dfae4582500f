//! `/voucher*`: admin-guarded voucher creation and the shop's voucher list.

use actix_web::{web, HttpResponse};
use chrono::{NaiveDate, NaiveDateTime};
use serde::Deserialize;
use utoipa::ToSchema;

use super::guards::Admin;
use super::response::{ok_data, ApiResult};
use super::AppState;
use crate::contract::{AdminOnly, Backend, BadBody, BadInput, NoRoute};
use crate::error::Error;
use crate::ids::{ShopId, VoucherId};
use crate::shards::Layout;
use crate::store::{NewSeckillVoucher, NewVoucher, Voucher};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/voucher").route(web::post().to(add_voucher)))
        .service(web::resource("/voucher/seckill").route(web::post().to(add_seckill_voucher)))
        .service(web::resource("/voucher/list/{shopId}").route(web::get().to(list_vouchers)));
}

/// hmdp's `Voucher` as the admin posts it.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct VoucherBody {
    #[schema(schema_with = crate::contract::unsigned_64)]
    shop_id: u64,
    /// Not blank (a character `trim` keeps); at most 255 characters.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    title: String,
    #[schema(max_length = 255)]
    sub_title: Option<String>,
    #[schema(max_length = 1024)]
    rules: Option<String>,
    /// The price, in fen (分).
    #[schema(schema_with = crate::contract::unsigned_64)]
    pay_value: u64,
    /// The value, in fen; not negative.
    #[schema(minimum = 0)]
    actual_value: i64,
    /// 0 ordinary, 1 flash sale: by default what the route creates.
    #[serde(rename = "type")]
    #[schema(maximum = 1)]
    voucher_type: Option<u8>,
    /// 1 on sale (the default), 2 off the shelf, 3 expired.
    #[schema(minimum = 1, maximum = 3)]
    status: Option<u8>,
}

/// A flash-sale voucher as the admin posts it: hmdp's `Voucher` with its
/// `SeckillVoucher` fields.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct SeckillVoucherBody {
    #[serde(flatten)]
    voucher: VoucherBody,
    /// The units on sale; not negative.
    #[schema(minimum = 0)]
    stock: i32,
    /// When the sale opens (1971 to 2038).
    #[schema(schema_with = crate::contract::local_time)]
    begin_time: NaiveDateTime,
    /// When it ends: after `beginTime`, before 2038.
    #[schema(schema_with = crate::contract::local_time)]
    end_time: NaiveDateTime,
    /// How many shards the sale is split into in Redis (not in hmdp): the
    /// node's `--seckill-shards` when absent.
    // 64 is `shards::MAX_SHARDS`: utoipa takes a literal here.
    #[schema(minimum = 1, maximum = 64)]
    shards: Option<i64>,
}

fn bad(message: &str) -> Error {
    Error::BadRequest(message.to_owned())
}

fn check_len(value: Option<&str>, max_chars: usize, field: &str) -> Result<(), Error> {
    match value {
        Some(text) if text.chars().count() > max_chars => Err(Error::BadRequest(format!(
            "{field} 超过 {max_chars} 个字符"
        ))),
        _ => Ok(()),
    }
}

/// `TIMESTAMP` columns hold 1970..2038; refuse what MySQL would mangle.
fn check_timestamp(at: NaiveDateTime, field: &str) -> Result<(), Error> {
    let min = NaiveDate::from_ymd_opt(1971, 1, 1).and_then(|d| d.and_hms_opt(0, 0, 0));
    let max = NaiveDate::from_ymd_opt(2038, 1, 1).and_then(|d| d.and_hms_opt(0, 0, 0));
    if Some(at) < min || Some(at) >= max {
        return Err(Error::BadRequest(format!("{field} 超出范围 (1971..2038)")));
    }
    Ok(())
}

impl VoucherBody {
    fn new_voucher(&self, default_type: u8) -> Result<NewVoucher, Error> {
        if self.title.trim().is_empty() {
            return Err(bad("title 不能为空"));
        }
        check_len(Some(&self.title), 255, "title")?;
        check_len(self.sub_title.as_deref(), 255, "subTitle")?;
        check_len(self.rules.as_deref(), 1024, "rules")?;
        if self.actual_value < 0 {
            return Err(bad("actualValue 不能为负"));
        }
        let status = self.status.unwrap_or(1);
        if !(1..=3).contains(&status) {
            return Err(bad("status 只能是 1, 2 或 3"));
        }
        let voucher_type = self.voucher_type.unwrap_or(default_type);
        if voucher_type > 1 {
            return Err(bad("type 只能是 0 或 1"));
        }
        Ok(NewVoucher {
            shop_id: self.shop_id,
            title: self.title.clone(),
            sub_title: self.sub_title.clone(),
            rules: self.rules.clone(),
            pay_value: self.pay_value,
            actual_value: self.actual_value,
            voucher_type,
            status,
        })
    }
}

impl SeckillVoucherBody {
    /// The seckill part; its sale split into `default_shards` unless the
    /// body says (`shards`).
    fn new_seckill(&self, default_shards: u16) -> Result<NewSeckillVoucher, Error> {
        if self.stock < 0 {
            return Err(bad("stock 不能为负"));
        }
        check_timestamp(self.begin_time, "beginTime")?;
        check_timestamp(self.end_time, "endTime")?;
        if self.end_time <= self.begin_time {
            return Err(bad("endTime 必须晚于 beginTime"));
        }
        let shards = self.shards.unwrap_or(default_shards.into());
        let shards = Layout::new(shards).map_err(|error| bad(&error.to_string()))?;
        Ok(NewSeckillVoucher {
            stock: self.stock,
            begin_time: self.begin_time,
            end_time: self.end_time,
            shards: shards.count(),
        })
    }
}

/// Creates an ordinary voucher.
#[utoipa::path(
    post,
    path = "/voucher",
    tag = "voucher",
    request_body = VoucherBody,
    security(("admin" = [])),
    responses(
        (status = 200, description = "The new voucher's id.", body = ApiResult<VoucherId>),
        BadBody,
        AdminOnly,
        Backend,
    ),
)]
pub(super) async fn add_voucher(
    _: Admin,
    state: web::Data<AppState>,
    body: web::Json<VoucherBody>,
) -> Result<HttpResponse, Error> {
    let id = state.store.insert_voucher(&body.new_voucher(0)?).await?;
    Ok(ok_data(id))
}

/// Creates a flash-sale voucher. Its sale is loaded into Redis when first
/// bought.
#[utoipa::path(
    post,
    path = "/voucher/seckill",
    tag = "voucher",
    request_body = SeckillVoucherBody,
    security(("admin" = [])),
    responses(
        (status = 200, description = "The new voucher's id.", body = ApiResult<VoucherId>),
        BadBody,
        AdminOnly,
        Backend,
    ),
)]
pub(super) async fn add_seckill_voucher(
    _: Admin,
    state: web::Data<AppState>,
    body: web::Json<SeckillVoucherBody>,
) -> Result<HttpResponse, Error> {
    let voucher = body.voucher.new_voucher(1)?;
    let seckill = body.new_seckill(state.seckill.default_shards())?;
    let id = state
        .store
        .insert_seckill_voucher(&voucher, &seckill)
        .await?;
    tracing::info!(
        voucher_id = %id,
        stock = seckill.stock,
        shards = seckill.shards,
        "seckill voucher created"
    );
    state.seckill.voucher_created(id).await;
    Ok(ok_data(id))
}

/// A shop's vouchers, flash-sale fields merged.
#[utoipa::path(
    get,
    path = "/voucher/list/{shopId}",
    tag = "voucher",
    params(("shopId" = String, Path, description = "The shop's id.", pattern = "^[1-9][0-9]{0,18}$")),
    responses(
        (status = 200, description = "The vouchers.", body = ApiResult<Vec<Voucher>>),
        BadInput,
        NoRoute,
        Backend,
    ),
)]
pub(super) async fn list_vouchers(
    state: web::Data<AppState>,
    shop_id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let shop_id: ShopId = shop_id.parse()?;
    Ok(ok_data(state.store.vouchers_of_shop(shop_id).await?))
}
