//! `/health` (the process answers) and `/ready` (MySQL and Redis answer too,
//! and a Redis Cluster serves every slot).

use actix_web::{web, HttpResponse};
use redis::AsyncCommands;
use serde::Serialize;
use utoipa::ToSchema;

use super::response::{ok_data, ApiResult};
use super::AppState;
use crate::contract::Backend;
use crate::error::Error;
use crate::metrics;
use crate::redis_handle::RedisConnection;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/health").route(web::get().to(health)))
        .service(web::resource("/ready").route(web::get().to(ready)));
}

/// What `/health` and `/ready` answer.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct NodeStatus {
    /// `UP` (`/health`) or `READY` (`/ready`).
    status: &'static str,
    /// The node's id (`--node-id`, else `host:port`).
    node: String,
    /// `--seckill stream` only (`/ready`): the order stream as this node's
    /// consumer last read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    order_stream: Option<OrderStream>,
}

/// The writers' lag behind the order stream.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct OrderStream {
    /// Entries in the stream.
    length: i64,
    /// Entries delivered to a consumer and not yet acknowledged.
    pending: i64,
    /// Age of the oldest of them.
    oldest_pending_seconds: f64,
    /// Consumer rounds that failed since the node started.
    failed_rounds: u64,
}

/// The process answers (liveness).
#[utoipa::path(
    get,
    path = "/health",
    tag = "node",
    responses((status = 200, description = "`UP`.", body = ApiResult<NodeStatus>)),
)]
pub(super) async fn health(state: web::Data<AppState>) -> HttpResponse {
    ok_data(NodeStatus {
        status: "UP",
        node: state.node_id.clone(),
        order_stream: None,
    })
}

/// MySQL and Redis answer too, and a Redis Cluster serves every slot
/// (readiness).
#[utoipa::path(
    get,
    path = "/ready",
    tag = "node",
    responses(
        (status = 200, description = "`READY`.", body = ApiResult<NodeStatus>),
        Backend,
    ),
)]
pub(super) async fn ready(state: web::Data<AppState>) -> Result<HttpResponse, Error> {
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
    // The writers' lag, as this node's consumer last read it: a MySQL that
    // stalls the writes leaves the node ready to admit, with its orders
    // pending and their age growing here.
    let order_stream = state.seckill.streams_orders().then(|| {
        let (length, pending, oldest_pending_seconds) = metrics::stream_totals();
        OrderStream {
            length,
            pending,
            oldest_pending_seconds,
            failed_rounds: metrics::STREAM_ROUND_FAILURES.get(),
        }
    });
    Ok(ok_data(NodeStatus {
        status: "READY",
        node: state.node_id.clone(),
        order_stream,
    }))
}
