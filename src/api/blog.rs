//! `/blog/*`: the notes (探店笔记) the home page and the user page list.
//! This backend has no blogs — hmdp's blog chapter is not part of it — so
//! both lists are always empty; answering them lets those pages load
//! without an error message.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::page_number;
use super::response::{ok_data, ApiResult};
use crate::auth::CurrentUser;
use crate::contract::{Backend, BadInput, SignedIn};
use crate::error::Error;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/blog/hot").route(web::get().to(hot)))
        .service(web::resource("/blog/of/me").route(web::get().to(of_me)));
}

/// hmdp's `current`, checked as every page number is, though every page is
/// empty.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct PageQuery {
    /// The page, from 1 (the default).
    #[param(minimum = 1)]
    current: Option<i32>,
}

/// A note of hmdp's blog chapter: there are none here, so no value of this
/// type exists.
#[derive(Serialize, ToSchema)]
pub(super) enum Blog {}

fn no_blogs(query: &PageQuery) -> Result<HttpResponse, Error> {
    page_number(query.current)?;
    Ok(ok_data(Vec::<Blog>::new()))
}

/// The home page's hot notes: none.
#[utoipa::path(
    get,
    path = "/blog/hot",
    tag = "blog",
    params(PageQuery),
    responses(
        (status = 200, description = "An empty list.", body = ApiResult<Vec<Blog>>),
        BadInput,
    ),
)]
pub(super) async fn hot(query: web::Query<PageQuery>) -> Result<HttpResponse, Error> {
    no_blogs(&query)
}

/// The caller's own notes: none; hmdp asks for a login here.
#[utoipa::path(
    get,
    path = "/blog/of/me",
    tag = "blog",
    params(PageQuery),
    security(("session" = [])),
    responses(
        (status = 200, description = "An empty list.", body = ApiResult<Vec<Blog>>),
        BadInput,
        SignedIn,
        Backend,
    ),
)]
pub(super) async fn of_me(
    _: CurrentUser,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, Error> {
    no_blogs(&query)
}
