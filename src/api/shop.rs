//! `/shop/*`: a shop's page and a category's list of shops, hmdp's
//! `ShopController`. A shop is read through the Redis cache; the lists come
//! from MySQL, as in hmdp.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use utoipa::IntoParams;

use super::page_number;
use super::response::{ok_data, ApiResult};
use super::AppState;
use crate::contract::{Backend, BadInput, NoRoute};
use crate::error::{Error, Rejection};
use crate::ids::{positive_id, ShopId};
use crate::store::Shop;

/// Shops per page of `/shop/of/type`: hmdp's `SystemConstants.DEFAULT_PAGE_SIZE`.
pub const SHOPS_PER_PAGE: u64 = 5;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/shop/of/type").route(web::get().to(shops_of_type)))
        .service(web::resource("/shop/{id}").route(web::get().to(shop)));
}

/// A shop's page, read through the Redis cache.
#[utoipa::path(
    get,
    path = "/shop/{id}",
    tag = "shop",
    params(("id" = String, Path, description = "The shop's id.", pattern = "^[1-9][0-9]{0,18}$")),
    responses(
        (status = 200, description = "The shop, or `SHOP_NOT_FOUND`.", body = ApiResult<Shop>),
        BadInput,
        NoRoute,
        Backend,
    ),
)]
pub(super) async fn shop(
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let id: ShopId = id.parse()?;
    let shop = state.shops.shop(id).await?.ok_or(Rejection::ShopNotFound)?;
    Ok(ok_data(shop))
}

/// The list page also sends `x`, `y` (the user's position, for hmdp's
/// distance sort in its GEO chapter, not ported here) and `sortBy`, which
/// hmdp's own handler ignores too: unknown parameters are not read.
#[derive(Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(super) struct TypeQuery {
    /// The category's id.
    #[param(pattern = "^[1-9][0-9]{0,18}$")]
    type_id: String,
    /// The page, from 1 (the default); five shops a page.
    #[param(minimum = 1)]
    current: Option<i32>,
}

/// A category's shops, five a page.
#[utoipa::path(
    get,
    path = "/shop/of/type",
    tag = "shop",
    params(TypeQuery),
    responses(
        (status = 200, description = "The page's shops.", body = ApiResult<Vec<Shop>>),
        BadInput,
        Backend,
    ),
)]
pub(super) async fn shops_of_type(
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
