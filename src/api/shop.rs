//! `/shop/*`: a shop's page and a category's list of shops, hmdp's
//! `ShopController`. A shop is read through the Redis cache; the lists come
//! from MySQL, as in hmdp.

use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::page_number;
use super::response::ok_data;
use super::AppState;
use crate::error::{Error, Rejection};
use crate::ids::{positive_id, ShopId};

/// Shops per page of `/shop/of/type`: hmdp's `SystemConstants.DEFAULT_PAGE_SIZE`.
pub const SHOPS_PER_PAGE: u64 = 5;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/shop/of/type", web::get().to(shops_of_type))
        .route("/shop/{id}", web::get().to(shop));
}

async fn shop(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, Error> {
    let id: ShopId = id.parse()?;
    let shop = state.shops.shop(id).await?.ok_or(Rejection::ShopNotFound)?;
    Ok(ok_data(shop))
}

/// The list page also sends `x`, `y` (the user's position, for hmdp's
/// distance sort in its GEO chapter, not ported here) and `sortBy`, which
/// hmdp's own handler ignores too: unknown parameters are not read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeQuery {
    type_id: String,
    current: Option<u32>,
}

async fn shops_of_type(
    state: web::Data<AppState>,
    query: web::Query<TypeQuery>,
) -> Result<HttpResponse, Error> {
    let type_id = positive_id(&query.type_id)?.unsigned_abs();
    let offset = u64::from(page_number(query.current)? - 1) * SHOPS_PER_PAGE;
    let shops = state
        .store
        .shops_of_type(type_id, offset, SHOPS_PER_PAGE)
        .await?;
    Ok(ok_data(shops))
}
