//! `/voucher*`: admin-guarded voucher creation and the shop's voucher list.

use actix_web::{web, HttpResponse};
use chrono::{NaiveDate, NaiveDateTime};
use serde::Deserialize;

use super::guards::Admin;
use super::response::ok_data;
use super::AppState;
use crate::error::Error;
use crate::ids::ShopId;
use crate::shards::Layout;
use crate::store::{NewSeckillVoucher, NewVoucher};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/voucher", web::post().to(add_voucher))
        .route("/voucher/seckill", web::post().to(add_seckill_voucher))
        .route("/voucher/list/{shopId}", web::get().to(list_vouchers));
}

/// hmdp's `Voucher` as the admin posts it; seckill fields only for `/voucher/seckill`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VoucherBody {
    shop_id: u64,
    title: String,
    sub_title: Option<String>,
    rules: Option<String>,
    pay_value: u64,
    actual_value: i64,
    #[serde(rename = "type")]
    voucher_type: Option<u8>,
    status: Option<u8>,
    stock: Option<i32>,
    begin_time: Option<NaiveDateTime>,
    end_time: Option<NaiveDateTime>,
    /// How many shards the sale is split into in Redis (not in hmdp): the
    /// node's `--seckill-shards` when absent.
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
    fn voucher(&self, default_type: u8) -> Result<NewVoucher, Error> {
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

    /// The seckill part; its sale split into `default_shards` unless the
    /// body says (`shards`).
    fn seckill(&self, default_shards: u16) -> Result<NewSeckillVoucher, Error> {
        let stock = self.stock.ok_or_else(|| bad("stock 不能为空"))?;
        if stock < 0 {
            return Err(bad("stock 不能为负"));
        }
        let begin_time = self.begin_time.ok_or_else(|| bad("beginTime 不能为空"))?;
        let end_time = self.end_time.ok_or_else(|| bad("endTime 不能为空"))?;
        check_timestamp(begin_time, "beginTime")?;
        check_timestamp(end_time, "endTime")?;
        if end_time <= begin_time {
            return Err(bad("endTime 必须晚于 beginTime"));
        }
        let shards = self.shards.unwrap_or(default_shards.into());
        let shards = Layout::new(shards).map_err(|error| bad(&error.to_string()))?;
        Ok(NewSeckillVoucher {
            stock,
            begin_time,
            end_time,
            shards: shards.count(),
        })
    }
}

async fn add_voucher(
    _: Admin,
    state: web::Data<AppState>,
    body: web::Json<VoucherBody>,
) -> Result<HttpResponse, Error> {
    let id = state.store.insert_voucher(&body.voucher(0)?).await?;
    Ok(ok_data(id.to_string()))
}

async fn add_seckill_voucher(
    _: Admin,
    state: web::Data<AppState>,
    body: web::Json<VoucherBody>,
) -> Result<HttpResponse, Error> {
    let voucher = body.voucher(1)?;
    let seckill = body.seckill(state.seckill.default_shards())?;
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
    Ok(ok_data(id.to_string()))
}

async fn list_vouchers(
    state: web::Data<AppState>,
    shop_id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let shop_id: ShopId = shop_id.parse()?;
    Ok(ok_data(state.store.vouchers_of_shop(shop_id).await?))
}
