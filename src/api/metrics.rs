//! `/metrics`: this node's Prometheus metrics.

use actix_web::{web, HttpResponse};

use super::AppState;
use crate::metrics::{render, DB_POOL};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/metrics").route(web::get().to(metrics)));
}

/// This node's Prometheus metrics, in the text exposition format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "node",
    responses((status = 200, description = "The metrics.", body = String, content_type = "text/plain")),
)]
pub(super) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    // Pool gauges are read at scrape time: they are a state, not events.
    let (in_use, idle) = state.store.connections();
    DB_POOL.with_label_values(&["idle"]).set(idle as i64);
    DB_POOL
        .with_label_values(&["in_use"])
        .set(i64::from(in_use));
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(render())
}
