//! `/shop-type/list`: the home page's categories, by `sort`, read through
//! the Redis cache (hmdp's `cache:type`).

use actix_web::{web, HttpResponse};

use super::response::ok_data;
use super::AppState;
use crate::error::Error;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/shop-type/list", web::get().to(list));
}

async fn list(state: web::Data<AppState>) -> Result<HttpResponse, Error> {
    Ok(ok_data(state.shops.shop_types().await?))
}
