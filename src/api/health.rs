//! `/health` (the process answers) and `/ready` (MySQL and Redis answer too,
//! and a Redis Cluster serves every slot).

use actix_web::{web, HttpResponse};
use redis::AsyncCommands;

use super::response::ok_data;
use super::AppState;
use crate::error::Error;
use crate::metrics;
use crate::redis_handle::RedisConnection;

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
    if let RedisConnection::Cluster(_) = state.redis {
        // A node that answers may still belong to a cluster with a slot
        // range nobody serves (a master down, its replica not yet promoted):
        // the keys there fail, so the node is not ready.
        let info: String = tokio::time::timeout(
            timeout,
            redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut state.redis.clone()),
        )
        .await
        .map_err(|_| unavailable("Redis Cluster"))?
        .map_err(|e| Error::Unavailable(e.into()))?;
        if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
            return Err(Error::Unavailable(anyhow::anyhow!(
                "the Redis Cluster reports a slot range unserved (cluster_state not ok)"
            )));
        }
    }
    let mut ready = serde_json::json!({ "status": "READY", "node": state.node_id });
    if state.seckill.streams_orders() {
        // The writers' lag, as this node's consumer last read it: a MySQL
        // that stalls the writes leaves the node ready to admit, with its
        // orders pending and their age growing here.
        let (length, pending, oldest) = metrics::stream_totals();
        ready["orderStream"] = serde_json::json!({
            "length": length,
            "pending": pending,
            "oldestPendingSeconds": oldest,
            "failedRounds": metrics::STREAM_ROUND_FAILURES.get(),
        });
    }
    Ok(ok_data(ready))
}
