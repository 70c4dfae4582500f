//! Prometheus metrics of this process, served at `/metrics`.
//!
//! Metrics are process-wide statics: the purchase and the HTTP middleware
//! record into them without threading a handle through every call, and one
//! process is one node. The lock crate knows no metrics: it reports its
//! events to [`LockMetrics`], which counts them here.

use std::sync::LazyLock;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use hmdp_lock::{LockEvent, LostReason};
use prometheus::{
    register_gauge_vec_with_registry, register_gauge_with_registry,
    register_histogram_vec_with_registry, register_histogram_with_registry,
    register_int_counter_vec_with_registry, register_int_counter_with_registry,
    register_int_gauge_vec_with_registry, register_int_gauge_with_registry, Encoder, Gauge,
    GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};

static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

/// Latency buckets from 0.5 ms to 5 s: purchases sit in the low milliseconds,
/// lock waits and faults reach seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

macro_rules! metric {
    ($name:ident: $ty:ty = $register:ident($($arg:expr),*)) => {
        pub static $name: LazyLock<$ty> =
            LazyLock::new(|| $register!($($arg,)* REGISTRY.clone()).expect("metric registers once"));
    };
}

metric!(HTTP_REQUESTS: IntCounterVec = register_int_counter_vec_with_registry(
    "http_requests_total", "HTTP requests by route, method and status",
    &["route", "method", "status"]));
metric!(HTTP_DURATION: HistogramVec = register_histogram_vec_with_registry(
    "http_request_duration_seconds", "HTTP request latency by route",
    &["route"], LATENCY_BUCKETS.to_vec()));
metric!(PURCHASES: IntCounterVec = register_int_counter_vec_with_registry(
    "purchases_total", "Purchases by outcome (ok or the errorCode)", &["outcome"]));
metric!(SALE_NEWS_HEARD: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_sale_news_heard_total",
    "News of a sale heard from the nodes (this one included) over Redis pub/sub: \
     sold-out, or returned (a unit back on sale)",
    &["news"]));
metric!(PURCHASES_SHED: IntCounter = register_int_counter_with_registry(
    "hmdp_purchases_shed_total",
    "Purchases answered 503 OVERLOADED at once: the node had as many in flight as it \
     finishes within its latency target (--shed-latency-ms)"));
metric!(PURCHASE_BOUND: IntGauge = register_int_gauge_with_registry(
    "hmdp_purchases_admitted_at_once",
    "How many purchases the node admits at once now (load shedding's adaptive bound)"));
metric!(RATE_LIMITED: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_rate_limited_total",
    "Requests refused with 429 by a limit, by rule (docs/limits.md)", &["rule"]));
metric!(RATE_LIMIT_FALLBACKS: IntCounter = register_int_counter_with_registry(
    "hmdp_rate_limit_fallbacks_total",
    "Limit checks Redis could not answer, counted by this node alone instead"));
metric!(STALE_SALES_REPLACED: IntCounter = register_int_counter_with_registry(
    "hmdp_stale_sales_replaced_total",
    "Redis sales of an earlier voucher under a reused id (a database reset or restored) replaced"));
metric!(SALES_RELOADED: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_sales_reloaded_total",
    "Sales Redis forgot, loaded again from MySQL, by what the load found: missing (a shard \
     or the whole sale gone), split (shards of different loads), drift (counts the reconciler \
     found to differ from MySQL's), server_changed (a Redis restart or failover since the \
     load), buyers_lost (the buyer set lost members), behind_mysql (MySQL wrote admissions \
     Redis lost)",
    &["found"]));
metric!(REDIS_SERVER_CHANGES: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_redis_server_changes_total",
    "Changes of the Redis server holding a shard of the sales that the per-second probe \
     noticed, by how: restarted or replaced (a new run id), promoted (a new replication id), \
     went back (its replication offset fell)",
    &["how"]));
metric!(ADMISSIONS: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_admissions_total",
    "Purchases the Redis admission script admitted or refused (queue and stream modes), \
     by outcome (admitted or the errorCode); SOLD_OUT also counts the purchases a node \
     refused from memory of a sale it saw sell out",
    &["outcome"]));
metric!(SHARD_ADMISSIONS: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_shard_admissions_total",
    "Admission scripts this node ran, by the sale shard's hash tag (seckill for a one-shard \
     sale): how a sharded sale spreads its admissions",
    &["shard"]));
metric!(STOCK_MOVES: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_stock_moves_total",
    "Steps of moving stock between a sale's shards, by step: lent, received, received_before \
     (a transfer sent twice), no_sale, sale_reloaded (the load counted it), settled_stale \
     (delivered for a mover that stopped)",
    &["step"]));
metric!(STOCK_TRANSIT_OLDEST: Gauge = register_gauge_with_registry(
    "hmdp_stock_transit_oldest_seconds",
    "Age of the oldest units lent between a sharded sale's shards and not yet settled (0: none), \
     as this node's last sweep that read every shard's transit hash found them (every second; \
     queue and stream nodes). The sweep delivers units older than 2 s: past 3 s, it cannot"));
metric!(LOCK_ACQUIRE: HistogramVec = register_histogram_vec_with_registry(
    "lock_acquire_duration_seconds", "Time to acquire (or give up on) the per-user lock",
    &["mode"], LATENCY_BUCKETS.to_vec()));
metric!(LOCK_BUSY: IntCounterVec = register_int_counter_vec_with_registry(
    "lock_busy_total", "Acquisitions refused because another holder had the key", &["mode"]));
metric!(LOCK_UNCLEAN_RELEASES: IntCounterVec = register_int_counter_vec_with_registry(
    "lock_unclean_releases_total", "Releases that found the lock expired or held by another",
    &["mode", "release"]));
metric!(WATCHDOG_RENEWALS: IntCounter = register_int_counter_with_registry(
    "lock_watchdog_renewals_total", "Lease renewals made by reentrant lock watchdogs"));
metric!(LOCK_LOST: IntCounterVec = register_int_counter_vec_with_registry(
    "lock_lost_total", "Holds found lost while held, by how they were lost", &["reason"]));
metric!(FENCING_REJECTIONS: IntCounter = register_int_counter_with_registry(
    "fencing_rejections_total", "Stale holders turned away by a newer fencing token"));
metric!(REDIS_ERRORS: IntCounterVec = register_int_counter_vec_with_registry(
    "redis_errors_total",
    "Requests answered with a Redis error, by kind: connection (refused, dropped, timed out), \
     moved, ask, tryagain, clusterdown (a Redis Cluster's redirections and failover answers \
     the client could not settle by itself), loading, readonly, masterdown, other",
    &["kind"]));
metric!(CACHE_READS: IntCounterVec = register_int_counter_vec_with_registry(
    "cache_reads_total",
    "Reads of the Redis cache of shops and shop categories, by cache (shop, shop_type) and \
     outcome (hit, missing: the cached marker of an unknown id, rebuild: read from MySQL, \
     timeout: another reader's rebuild outlasted the wait)",
    &["cache", "outcome"]));
metric!(VOUCHER_READS: IntCounter = register_int_counter_with_registry(
    "hmdp_voucher_reads_total",
    "Reads of a seckill voucher from MySQL by the purchases' pre-checks: the first of each \
     voucher on this node (one for all the purchases waiting for it), then one every 5 s"));
metric!(DB_POOL: IntGaugeVec = register_int_gauge_vec_with_registry(
    "db_pool_connections", "MySQL pool connections by state", &["state"]));

metric!(STREAM_LENGTH: IntGaugeVec = register_int_gauge_vec_with_registry(
    "hmdp_stream_length",
    "Entries in a shard's order stream: admitted orders not yet written and acknowledged",
    &["shard"]));
metric!(STREAM_PENDING: IntGaugeVec = register_int_gauge_vec_with_registry(
    "hmdp_stream_pending",
    "A shard's order stream entries delivered to a consumer and not yet acknowledged",
    &["shard"]));
metric!(STREAM_OLDEST_PENDING: GaugeVec = register_gauge_vec_with_registry(
    "hmdp_stream_oldest_pending_seconds",
    "Age of the oldest delivered, unacknowledged entry of a shard's order stream (the \
     consumers' lag)",
    &["shard"]));
metric!(STREAM_CLAIMED: IntCounter = register_int_counter_with_registry(
    "hmdp_stream_claimed_total",
    "Entries this node's consumer claimed after they sat unacknowledged too long"));
metric!(STREAM_ROUND_FAILURES: IntCounter = register_int_counter_with_registry(
    "hmdp_stream_round_failures_total",
    "Consumer rounds that failed (MySQL or Redis failing, a lock lost): their entries stay pending"));
metric!(STREAM_DEAD_LETTERS: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_stream_dead_letters_total",
    "Orders this node moved to the dead-letter stream, by reason (queue: a queue writer's order \
     MySQL can never take)",
    &["reason"]));
metric!(STREAM_BATCH_ORDERS: Histogram = register_histogram_with_registry(
    "hmdp_stream_batch_orders", "Orders written per committed consumer transaction",
    vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]));
metric!(SYNC_BATCH_ORDERS: Histogram = register_histogram_with_registry(
    "hmdp_sync_batch_orders",
    "Synchronous purchases written per shared transaction (--sync-batch-max)",
    vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]));
metric!(SYNC_PURCHASE_STEPS: HistogramVec = register_histogram_vec_with_registry(
    "hmdp_sync_purchase_step_seconds",
    "Where a synchronous purchase's time goes, by step: lock (from its session check to its \
     lock taken, its order id drawn and its Idempotency-Key claimed), placed (waiting for and \
     writing the transaction that holds its order, to its answer), release (its lock released \
     and its key's answer kept)",
    &["step"], LATENCY_BUCKETS.to_vec()));
metric!(SYNC_BATCH_WAITS: HistogramVec = register_histogram_vec_with_registry(
    "hmdp_sync_batch_wait_seconds",
    "Shared commits' waits: queued (a purchase, from its hand-over to the start of the \
     transaction that writes it), linger (a transaction's purchases, for company after the \
     previous commit; --sync-batch-linger-ms)",
    &["wait"], LATENCY_BUCKETS.to_vec()));
metric!(ORDER_TRANSACTION_STEPS: HistogramVec = register_histogram_vec_with_registry(
    "hmdp_order_transaction_step_seconds",
    "The order transactions' steps, by where their orders come from (purchase, queue, stream): \
     open (a pooled connection, BEGIN, the fences, the lookup of orders and buyers), \
     statements (the checks, the INSERT and the stock UPDATE), commit (COMMIT)",
    &["source", "step"], LATENCY_BUCKETS.to_vec()));
metric!(STREAM_ORDERS: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_stream_orders_total",
    "Stream entries settled by this node's consumer, by outcome", &["outcome"]));

metric!(ORDERS_BY_STATUS: IntGaugeVec = register_int_gauge_vec_with_registry(
    "hmdp_orders", "Orders in MySQL by status (unpaid, paid, used, closed, refunding, refunded), \
     read by each node's closer every few seconds", &["status"]));
metric!(ORDERS_PAID: IntCounter = register_int_counter_with_registry(
    "hmdp_orders_paid_total", "Unpaid orders this node paid"));
metric!(ORDERS_CLOSED: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_orders_closed_total",
    "Unpaid orders this node closed, by cause (cancel, timeout: their due time in Redis came, \
     sweep: found past their deadline in MySQL)", &["cause"]));
metric!(GIVEBACKS: IntCounterVec = register_int_counter_vec_with_registry(
    "hmdp_givebacks_total",
    "Closed orders' units and buyers' turns this node sent back to the Redis sale, by outcome \
     (given: now; already: an earlier send or a reload had; no_sale: Redis holds no sale, \
     which its next load reads from MySQL)", &["outcome"]));
metric!(GIVEBACKS_OWED: IntGauge = register_int_gauge_with_registry(
    "hmdp_givebacks_owed",
    "Closed orders whose unit and buyer's turn have been owed to the Redis sale for over 2 s \
     (a closer gives its own back at once: these wait for Redis to take them), as this node's \
     closer last counted them in MySQL (every 5 s; every node counts the same orders)"));
metric!(UNPAID_OVERDUE: IntGauge = register_int_gauge_with_registry(
    "hmdp_unpaid_overdue_oldest_seconds",
    "How long past its payment deadline the oldest unpaid order is (0: none is)"));

/// Counts what the lock reports into the metrics above.
pub struct LockMetrics;

impl hmdp_lock::Observer for LockMetrics {
    fn observe(&self, event: LockEvent) {
        match event {
            LockEvent::LeaseRenewed => WATCHDOG_RENEWALS.inc(),
            LockEvent::HoldLost(reason) => LOCK_LOST.with_label_values(&[reason.as_str()]).inc(),
            LockEvent::FencingRejected => FENCING_REJECTIONS.inc(),
        }
    }
}

/// The `kind` labels of `redis_errors_total`.
pub const REDIS_ERROR_KINDS: [&str; 9] = [
    "connection",
    "moved",
    "ask",
    "tryagain",
    "clusterdown",
    "loading",
    "readonly",
    "masterdown",
    "other",
];

/// The order streams' gauges over every shard this node's consumer reads:
/// entries, pending entries (both summed) and the oldest pending entry's age.
pub fn stream_totals() -> (i64, i64, f64) {
    use prometheus::core::Collector;
    let total = |family: Vec<prometheus::proto::MetricFamily>| -> Vec<f64> {
        (family.iter())
            .flat_map(|family| family.get_metric())
            .map(|metric| metric.get_gauge().get_value())
            .collect()
    };
    let length = total(STREAM_LENGTH.collect()).iter().sum::<f64>() as i64;
    let pending = total(STREAM_PENDING.collect()).iter().sum::<f64>() as i64;
    let oldest = total(STREAM_OLDEST_PENDING.collect())
        .into_iter()
        .fold(0.0, f64::max);
    (length, pending, oldest)
}

/// Registers every metric, with the lock series of this node's mode at zero,
/// so a dashboard sees "no lock lost yet" from the start rather than no
/// series at all.
pub fn init(mode: &str) {
    LazyLock::force(&HTTP_REQUESTS);
    LazyLock::force(&HTTP_DURATION);
    LazyLock::force(&PURCHASES);
    LazyLock::force(&LOCK_UNCLEAN_RELEASES);
    LazyLock::force(&WATCHDOG_RENEWALS);
    LazyLock::force(&FENCING_REJECTIONS);
    LazyLock::force(&STALE_SALES_REPLACED);
    LazyLock::force(&RATE_LIMIT_FALLBACKS);
    LazyLock::force(&PURCHASES_SHED);
    LazyLock::force(&PURCHASE_BOUND);
    for news in ["sold-out", "returned"] {
        SALE_NEWS_HEARD.with_label_values(&[news]);
    }
    for found in [
        "missing",
        "split",
        "drift",
        "server_changed",
        "buyers_lost",
        "behind_mysql",
    ] {
        SALES_RELOADED.with_label_values(&[found]);
    }
    for how in ["restarted or replaced", "promoted", "went back"] {
        REDIS_SERVER_CHANGES.with_label_values(&[how]);
    }
    for step in [
        "lent",
        "received",
        "received_before",
        "no_sale",
        "sale_reloaded",
        "settled_stale",
    ] {
        STOCK_MOVES.with_label_values(&[step]);
    }
    for kind in REDIS_ERROR_KINDS {
        REDIS_ERRORS.with_label_values(&[kind]);
    }
    LazyLock::force(&DB_POOL);
    LazyLock::force(&CACHE_READS);
    LazyLock::force(&ORDERS_PAID);
    LazyLock::force(&UNPAID_OVERDUE);
    LazyLock::force(&GIVEBACKS_OWED);
    LazyLock::force(&STOCK_TRANSIT_OLDEST);
    LazyLock::force(&SYNC_BATCH_ORDERS);
    LOCK_ACQUIRE.with_label_values(&[mode]);
    LOCK_BUSY.with_label_values(&[mode]);
    for reason in LostReason::ALL {
        LOCK_LOST.with_label_values(&[reason.as_str()]);
    }
}

/// Registers the order stream consumer's metrics, every labelled series at
/// zero (see [`init`]).
pub fn init_stream(outcomes: &[&str], dead_letter_reasons: &[&str]) {
    LazyLock::force(&STREAM_LENGTH);
    LazyLock::force(&STREAM_PENDING);
    LazyLock::force(&STREAM_OLDEST_PENDING);
    LazyLock::force(&STREAM_CLAIMED);
    LazyLock::force(&STREAM_ROUND_FAILURES);
    LazyLock::force(&STREAM_BATCH_ORDERS);
    for outcome in outcomes {
        STREAM_ORDERS.with_label_values(&[*outcome]);
    }
    for reason in dead_letter_reasons {
        STREAM_DEAD_LETTERS.with_label_values(&[*reason]);
    }
}

/// Renders every metric in Prometheus' text format.
pub fn render() -> String {
    let mut buffer = Vec::new();
    TextEncoder::new()
        .encode(&REGISTRY.gather(), &mut buffer)
        .expect("text encoding cannot fail");
    String::from_utf8(buffer).expect("prometheus text is UTF-8")
}

/// Middleware recording each request's route, status and latency.
pub async fn record_http(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let route = request
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    // Clients may send any method token; only the standard ones become
    // labels, so made-up methods cannot grow the series without bound.
    let method = match request.method().as_str() {
        known @ ("GET" | "POST" | "PUT" | "DELETE" | "HEAD" | "OPTIONS" | "PATCH") => known,
        _ => "OTHER",
    }
    .to_owned();
    let response = next.call(request).await?;
    let status = response.status().as_u16().to_string();
    HTTP_REQUESTS
        .with_label_values(&[route.as_str(), method.as_str(), status.as_str()])
        .inc();
    HTTP_DURATION
        .with_label_values(&[route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    Ok(response)
}
