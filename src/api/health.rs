//! `/health` (the process answers) and `/ready` (MySQL and Redis answer too).

use actix_web::{web, HttpResponse};
use redis::AsyncCommands;

use super::response::ok_data;
use crate::error::Error;
use crate::startup::AppState;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .route("/ready", web::get().to(ready));
}

async fn health(state: web::Data<AppState>) -> HttpResponse {
    ok_data(serde_json::json!({ "status": "UP", "node": state.node_id }))
}

async fn ready(state: web::Data<AppState>) -> Result<HttpResponse, Error> {
    let timeout = state.backend_timeout;
    let unavailable = |what: &str| Error::Unavailable(anyhow::anyhow!("{what} timed out"));
    tokio::time::timeout(timeout, state.store.ping())
        .await
        .map_err(|_| unavailable("MySQL"))?
        .map_err(|e| Error::Unavailable(e.into()))?;
    let _: String = tokio::time::timeout(timeout, state.redis.clone().ping())
        .await
        .map_err(|_| unavailable("Redis"))?
        .map_err(|e| Error::Unavailable(e.into()))?;
    Ok(ok_data(
        serde_json::json!({ "status": "READY", "node": state.node_id }),
    ))
}
