//! The purchase use case, synchronous like hmdp's `seckillVoucher`:
//! voucher exists → sale window → stock → per-user lock → transaction
//! (count this user's orders, insert the order, take stock) → commit →
//! release. The lock is taken before the transaction begins and released
//! after it ends, never inside it; which lock runs is not this module's concern.
//!
//! A purchase, once started, runs to its end in a task of its own: the
//! request only awaits it. A client that hangs up makes actix drop the
//! request's future; were the purchase that future, the drop would release
//! the lock while its `COMMIT` is still running in MySQL, and the same
//! user's next request would not see the order yet and place a second one.
//!
//! In `queue` and `stream` mode ([`SeckillMode`]) the purchase is admitted in
//! Redis instead and answered at once; MySQL gets the order afterwards:
//!
//! - `sync_purchase.rs` — the synchronous purchase: window, lock, order written, release
//! - `admitted_purchase.rs` — the purchase of `queue` and `stream`: admitted in Redis, handed off
//! - `shared_commits.rs` — the synchronous purchases of a voucher written together, one transaction at a time
//! - `writer/` — the purchase transaction, under the users' locks, that every path writes with,
//!   and its vocabulary (`outcome.rs`)
//! - `sale_state/` — the sale's Redis side: loads, admission, stock moves between shards,
//!   readmissions, orders in flight and the reconciler
//! - `queue.rs` — `queue` mode's in-process queue and its writer
//! - `stream/` — `stream` mode's consumer: the order stream written to MySQL in batches
//! - `order_fields.rs` — an admitted order's fields, as the admission script writes them
//! - `catalog.rs` — each node's memory of the vouchers' sales

mod admitted_purchase;
mod catalog;
mod order_fields;
mod queue;
mod sale_news;
mod sale_state;
mod shared_commits;
pub mod stream;
mod sync_purchase;
mod writer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmdp_lock::DistributedLock;
use serde::Serialize;
use tracing::Instrument;

use crate::after_sale::PayDeadlines;
use crate::config::SeckillMode;
use crate::error::{Error, Rejection};
use crate::id_worker::IdWorker;
use crate::idempotency::{Idempotency, IdempotencyKey};
use crate::ids::{OrderId, UserId, VoucherId};
use crate::keys::Keys;
use crate::limits::Counting;
use crate::metrics;
use crate::redis_handle::RedisConnection;
use crate::shards::Shard;
use crate::store::{Store, VoucherOrder};
use catalog::{Catalog, SaleInfo};
use queue::OrderQueue;
use sale_news::{News, SaleNews};
pub use sale_state::{
    Admission, DeadLetter, InTransit, PendingOrder, RedisSale, RedisShard, SaleRef, SaleState,
    Suspicion, ID_BLOCK, RECONCILE_EVERY, STALE_AFTER, SWEEP_EVERY,
};
use shared_commits::SharedCommits;
pub use shared_commits::Written;
pub use writer::{Deferral, Locks, OrderSource, OrderWriter, Outcome};

/// Where an admitted order goes on its way to MySQL.
enum Handoff {
    /// Into this process's queue, written by its background task.
    Queue(OrderQueue),
    /// Appended to the order stream by the admission script itself.
    Stream,
}

/// An order as `GET /voucher-order/{id}` shows it: written, or admitted and
/// still on its way (with `"pending": true`).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OrderStatus {
    Written(VoucherOrder),
    Pending(PendingOrder),
}

/// A purchase's outcome (its order, and whether this request was answered
/// with the order an earlier one with its Idempotency-Key got), logged and
/// counted in `purchases_total`.
fn counted(outcome: Result<(OrderId, bool), Error>) -> Result<(OrderId, bool), Error> {
    let label = match &outcome {
        Ok((order_id, _)) => {
            tracing::debug!(%order_id, "order placed");
            "ok"
        }
        // Refused before it began: `hmdp_rate_limited_total` counts it.
        Err(Error::RateLimited(_)) => return outcome,
        Err(error) => {
            tracing::debug!(outcome = error.error_code(), "purchase refused");
            error.error_code()
        }
    };
    metrics::PURCHASES.with_label_values(&[label]).inc();
    outcome
}

/// Places flash-sale orders, one active order per user.
pub struct Seckill {
    store: Store,
    catalog: Catalog,
    ids: IdWorker,
    /// Sales, buyers and pending orders in Redis (`queue` and `stream`; in
    /// `sync` mode only read, for the status of pending orders).
    sale_state: Arc<SaleState>,
    /// The purchase transaction, under the users' locks: the synchronous
    /// purchase's, and the writers' of admitted orders.
    writer: Arc<OrderWriter>,
    /// `None` in `sync` mode: purchases are not admitted in Redis.
    handoff: Option<Handoff>,
    /// Where the synchronous purchases of a voucher are written together;
    /// `None`: each in a transaction of its own (`--sync-batch-max 1`).
    commits: Option<Arc<SharedCommits>>,
    /// The orders of synchronous purchases sent with an Idempotency-Key
    /// (the admission script keeps those of `queue` and `stream`).
    idempotency: Idempotency,
    /// How many shards the sales of vouchers created here are split into,
    /// unless the request says (`--seckill-shards`).
    default_shards: u16,
    /// What this node tells the others of its sales, and hears from them.
    news: SaleNews,
}

impl Seckill {
    /// The synchronous purchase; [`Seckill::start`] puts it in a node's mode.
    pub fn new(
        store: Store,
        lock: Arc<dyn DistributedLock>,
        redis: RedisConnection,
        keys: Keys,
        deadlines: PayDeadlines,
        chaos_hold: Duration,
    ) -> Self {
        let sale_state = Arc::new(SaleState::new(redis.clone(), keys.clone(), store.clone()));
        let writer = OrderWriter::new(
            store.clone(),
            lock,
            sale_state.clone(),
            keys.clone(),
            OrderSource::Purchase,
            deadlines,
            chaos_hold,
        );
        Seckill {
            catalog: Catalog::new(store.clone()),
            news: SaleNews::new(redis.clone(), &keys),
            idempotency: Idempotency::new(redis.clone(), keys.clone()),
            ids: IdWorker::new(redis, keys),
            store,
            sale_state,
            writer: Arc::new(writer),
            handoff: None,
            commits: None,
            default_shards: 1,
        }
    }

    /// Writes up to `most` synchronous purchases of a voucher that wait
    /// for its transaction in flight in the next one, those waiting after a
    /// commit given up to `linger` for more to join them; 1 writes each in
    /// a transaction of its own (`--sync-batch-max`,
    /// `--sync-batch-linger-ms`).
    pub fn with_shared_commits(self, most: usize, linger: Duration) -> Self {
        let commits = (most > 1).then(|| SharedCommits::new(self.writer.clone(), most, linger));
        Seckill { commits, ..self }
    }

    /// Fault injection: every move of stock between shards pauses this
    /// long between its lend and its receive (`--chaos-move-pause-ms`).
    pub fn with_move_pause(self, pause: Duration) -> Self {
        self.sale_state.pause_moves(pause);
        self
    }

    /// Splits the sales of vouchers created through this node into
    /// `shards` shards, unless the request says (`--seckill-shards`).
    pub fn with_default_shards(self, shards: u16) -> Self {
        Seckill {
            default_shards: shards,
            ..self
        }
    }

    /// Purchases in `mode`. For `queue` and `stream`, first loads every
    /// seckill voucher Redis lacks; should MySQL or Redis be unreachable
    /// now, the node starts all the same and each voucher is loaded by its
    /// first purchase instead. `queue` also starts the writer of its queue.
    pub async fn start(self, mode: SeckillMode) -> Arc<Seckill> {
        if mode == SeckillMode::Sync {
            return Arc::new(self);
        }
        match self.sale_state.load_missing().await {
            Ok(loaded) => tracing::info!(loaded, %mode, "seckill sales loaded into Redis"),
            Err(error) => tracing::warn!(?error, %mode,
                "seckill sales not loaded at start; each loads on its first purchase"),
        }
        for label in Admission::labels() {
            metrics::ADMISSIONS.with_label_values(&[label]);
        }
        // Units a mover left in transit between shards are delivered by
        // every node, for as long as it runs.
        let sale_state = self.sale_state.clone();
        tokio::spawn(async move { sale_state.sweep_transfers().await });
        // Sales Redis forgot part of are loaded again from MySQL, by every
        // node, for as long as it runs.
        let sale_state = self.sale_state.clone();
        tokio::spawn(async move { sale_state.reconcile_forever().await });
        // A Redis restart or failover is noticed within a second.
        let sale_state = self.sale_state.clone();
        tokio::spawn(async move { sale_state.probe_servers_forever().await });
        let (source, handoff): (_, fn(Arc<OrderWriter>) -> Handoff) = match mode {
            SeckillMode::Queue => (OrderSource::Queue, |writer| {
                Handoff::Queue(OrderQueue::start(writer))
            }),
            _ => (OrderSource::Stream, |_| Handoff::Stream),
        };
        let writer = Arc::new(self.writer.for_orders_from(source));
        Arc::new(Seckill {
            handoff: Some(handoff(writer.clone())),
            writer,
            ..self
        })
    }

    /// The writer of admitted orders (`stream` mode's consumer writes with
    /// it).
    pub fn writer(&self) -> Arc<OrderWriter> {
        self.writer.clone()
    }

    /// A stopping node's last step in `queue` mode: no more orders into the
    /// queue, those queued written within `within`; how many were left
    /// unwritten. Nothing to do in the other modes.
    pub async fn drain_queue(&self, within: Duration) -> usize {
        match &self.handoff {
            Some(Handoff::Queue(queue)) => queue.drain(within).await,
            _ => 0,
        }
    }

    /// How many shards the sales of vouchers created through this node are
    /// split into, unless the request says.
    pub fn default_shards(&self) -> u16 {
        self.default_shards
    }

    /// Whether admitted orders go to the order stream (`stream` mode),
    /// whose consumer runs on this node.
    pub fn streams_orders(&self) -> bool {
        matches!(self.handoff, Some(Handoff::Stream))
    }

    /// Sales, buyers and pending orders in Redis.
    pub fn sale_state(&self) -> &SaleState {
        &self.sale_state
    }

    /// Called once `POST /voucher/seckill` committed the voucher: `queue`
    /// and `stream` put its sale in Redis now, replacing any sale an earlier
    /// voucher of the same id left there. Should that fail, the voucher
    /// still exists, and its first purchase loads it from MySQL.
    pub async fn voucher_created(&self, voucher_id: VoucherId) {
        if self.handoff.is_none() {
            return;
        }
        if let Err(error) = self.sale_state.load(voucher_id).await {
            tracing::warn!(%voucher_id, ?error,
                "seckill sale not stored in Redis; its first purchase loads it");
        }
    }

    /// A unit of the voucher came back on sale (an order closed unpaid):
    /// this node forgets that it saw the voucher sell out, and tells the
    /// others to.
    pub fn stock_returned(&self, voucher_id: VoucherId) {
        self.forget_sold_out(voucher_id);
        self.news.tell(News::Returned(voucher_id));
    }

    fn forget_sold_out(&self, voucher_id: VoucherId) {
        self.catalog.stock_returned(voucher_id);
        self.sale_state.stock_returned(voucher_id);
    }

    /// The voucher `sale` of `voucher_id` sold out, as this node just saw:
    /// the other nodes hear it at once, rather than each from its own next
    /// purchases.
    fn sold_out(&self, voucher_id: VoucherId, sale: &SaleInfo) {
        if sale.mark_sold_out() {
            self.news.tell(News::SoldOut(voucher_id));
        }
    }

    /// Hears the other nodes' news of the sales (and its own), from the
    /// Redis at `redis_url`, for as long as this node runs.
    pub fn listen_for_news(self: &Arc<Self>, redis_url: &str) {
        let urls = hmdp_lock::connection::cluster_nodes(redis_url)
            .unwrap_or_else(|| vec![redis_url.to_owned()]);
        self.news.listen(urls, Arc::downgrade(self));
    }

    /// News of a sale from a node.
    fn heard(&self, news: News) {
        match news {
            News::SoldOut(voucher_id) => self.catalog.sold_out_elsewhere(voucher_id),
            News::Returned(voucher_id) => self.forget_sold_out(voucher_id),
        }
    }

    /// The caller's order: written in MySQL, else admitted and pending in
    /// Redis, else `None`.
    pub async fn order_status(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<OrderStatus>, Error> {
        if let Some(order) = self.store.order_of_user(order_id, user_id).await? {
            return Ok(Some(OrderStatus::Written(order)));
        }
        let pending = self.sale_state.pending_order(order_id, user_id).await?;
        Ok(pending.map(OrderStatus::Pending))
    }

    /// Whether a purchase is admitted by a script in Redis (`queue`,
    /// `stream`), which may count its limits in the same call.
    pub fn admits_in_redis(&self) -> bool {
        self.handoff.is_some()
    }

    /// Buys one unit of `voucher_id` for `user_id`; returns the new order id.
    /// The purchase runs to its end (commit or rollback, then release)
    /// even if the caller stops waiting for it.
    ///
    /// `requested_at` is when the request began, its session check
    /// included: the synchronous purchase answers within the backend
    /// timeout plus the lock's wait from then (its `COMMIT` aside, which is
    /// always waited for), even with Redis failing over, where each of its
    /// Redis calls could take the backend timeout on its own.
    pub async fn purchase(
        self: &Arc<Self>,
        user_id: UserId,
        voucher_id: VoucherId,
        requested_at: Instant,
    ) -> Result<OrderId, Error> {
        self.purchase_once(user_id, voucher_id, requested_at, None, Counting::Done)
            .await
            .map(|(order_id, _)| order_id)
    }

    /// The answer to a purchase this node gives from memory, before
    /// anything else costs a trip to Redis (the request limits included):
    /// a sale it saw sell out. After the last unit a storm is nearly all
    /// such requests, and there is nothing to see to its end. Unless the
    /// buyer sends a key that got an order: that buyer lost the answer to
    /// one of the last units, and is owed the order. `None`: the purchase
    /// goes on.
    pub async fn answered_from_memory(
        &self,
        user_id: UserId,
        voucher_id: VoucherId,
        key: Option<&IdempotencyKey>,
    ) -> Option<Result<(OrderId, bool), Error>> {
        if !self.catalog.sold_out_now(voucher_id) {
            return None;
        }
        if let Some(key) = key {
            match self.kept_answer(user_id, voucher_id, key, None).await {
                Ok(Some(order_id)) => return Some(counted(Ok((order_id, true)))),
                Ok(None) => {}
                Err(error) => return Some(counted(Err(error))),
            }
        }
        if self.handoff.is_some() {
            metrics::ADMISSIONS
                .with_label_values(&[Admission::Refused(Rejection::SoldOut).label()])
                .inc();
        }
        Some(counted(Err(Rejection::SoldOut.into())))
    }

    /// [`Seckill::purchase`], sent with the buyer's Idempotency-Key `key`:
    /// the same key of the same buyer is answered with the order it got the
    /// first time (`true`: answered again), however often it comes. A
    /// refusal is not kept: it changed nothing, and the key asks again.
    /// The request's `limits`, when their count is still owed, are counted
    /// before anything else is done, in the admission script's own call
    /// where it can be.
    pub async fn purchase_once(
        self: &Arc<Self>,
        user_id: UserId,
        voucher_id: VoucherId,
        requested_at: Instant,
        key: Option<IdempotencyKey>,
        mut limits: Counting,
    ) -> Result<(OrderId, bool), Error> {
        let span =
            tracing::info_span!("purchase", lock = %self.writer.lock_mode(), %user_id, %voucher_id);
        if let Some(answer) = self
            .answered_from_memory(user_id, voucher_id, key.as_ref())
            .await
        {
            return span.in_scope(|| answer);
        }
        let seckill = self.clone();
        let purchase = tokio::spawn(
            async move {
                let key = key.as_ref();
                counted(match &seckill.handoff {
                    None => match limits.pay_now().await {
                        Ok(()) => {
                            (seckill.purchase_sync(user_id, voucher_id, requested_at, key)).await
                        }
                        Err(limited) => Err(limited.into()),
                    },
                    Some(handoff) => {
                        (seckill.admit(handoff, user_id, voucher_id, key, limits)).await
                    }
                })
            }
            .instrument(span),
        );
        purchase.await.map_err(|failed| {
            Error::Internal(anyhow::Error::new(failed).context("the purchase task failed"))
        })?
    }

    /// The order an earlier request with `key` got (see
    /// [`Idempotency::kept`]), looked up where a refusal from this node's
    /// memory or the sale's window would otherwise answer, or where the
    /// admission script will not look: in the one-shard keys for the
    /// synchronous purchase; for an admitted one, in the buyer's shard of
    /// a sale of each shard count the sales use, but `checked` (the
    /// buyer's shard of this sale, which the admission script reads
    /// itself), so that a key first sent for a sale of another shard count
    /// is refused, not admitted again. No call at all when that leaves no
    /// shard: a node whose sales have one shard count.
    async fn kept_answer(
        &self,
        user_id: UserId,
        voucher_id: VoucherId,
        key: &IdempotencyKey,
        checked: Option<Shard>,
    ) -> Result<Option<OrderId>, Error> {
        let mut shards = vec![Shard::SINGLE];
        if self.handoff.is_some() {
            for layout in self.catalog.layouts_in_use().await? {
                shards.push(layout.shard_of(user_id));
            }
            shards.sort_unstable();
            shards.dedup();
        }
        shards.retain(|shard| Some(*shard) != checked);
        if shards.is_empty() {
            return Ok(None);
        }
        self.idempotency
            .kept(user_id, key, voucher_id, shards)
            .await
    }

    async fn next_order_id(&self) -> redis::RedisResult<OrderId> {
        self.ids.next_id("order").await.map(OrderId::new)
    }
}
