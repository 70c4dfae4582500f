//! `/blog/*`: the notes (探店笔记) the home page and the user page list.
//! This backend has no blogs — hmdp's blog chapter is not part of it — so
//! both lists are always empty; answering them lets those pages load
//! without an error message.

use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::page_number;
use super::response::ok_data;
use crate::auth::CurrentUser;
use crate::error::Error;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/blog/hot", web::get().to(hot))
        .route("/blog/of/me", web::get().to(of_me));
}

/// hmdp's `current`, checked as every page number is, though every page is
/// empty.
#[derive(Deserialize)]
struct PageQuery {
    current: Option<u32>,
}

fn no_blogs(query: &PageQuery) -> Result<HttpResponse, Error> {
    page_number(query.current)?;
    Ok(ok_data(Vec::<serde_json::Value>::new()))
}

/// The home page's hot notes.
async fn hot(query: web::Query<PageQuery>) -> Result<HttpResponse, Error> {
    no_blogs(&query)
}

/// The caller's own notes; hmdp asks for a login here.
async fn of_me(_: CurrentUser, query: web::Query<PageQuery>) -> Result<HttpResponse, Error> {
    no_blogs(&query)
}
