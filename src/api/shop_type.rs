//! `/shop-type/list`: the home page's categories, by `sort`, read through
//! the Redis cache (hmdp's `cache:type`).

use actix_web::{web, HttpResponse};

use super::response::{ok_data, ApiResult};
use super::AppState;
use crate::contract::Backend;
use crate::error::Error;
use crate::store::ShopType;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/shop-type/list").route(web::get().to(list)));
}

/// The home page's categories, by `sort`.
#[utoipa::path(
    get,
    path = "/shop-type/list",
    tag = "shop",
    responses(
        (status = 200, description = "The categories.", body = ApiResult<Vec<ShopType>>),
        Backend,
    ),
)]
pub(super) async fn list(state: web::Data<AppState>) -> Result<HttpResponse, Error> {
    Ok(ok_data(state.shops.shop_types().await?))
}
