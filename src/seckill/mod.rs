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
//! - `admission.rs` — `lua/seckill.lua` and its reply, the admitting purchase
//! - `sale_state.rs` — sales, buyers and pending orders in Redis, loaded from MySQL
//! - `queue.rs` — `queue` mode's in-process queue and its writer
//! - `stream/` — `stream` mode's consumer: the order stream written to MySQL in batches
//! - `in_flight.rs` — admitted orders not yet written, read back for the audit

mod admission;
mod catalog;
mod in_flight;
mod queue;
mod sale_state;
pub mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Local;
use hmdp_lock::Connection as RedisConnection;
use hmdp_lock::{HeldLock, LockError, OrderLock};
use serde::Serialize;
use tracing::Instrument;

use crate::config::SeckillMode;
use crate::error::{Error, Rejection};
use crate::id_worker::IdWorker;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::keys::Keys;
use crate::metrics;
use crate::store::{self, NewOrder, Store, Tx, VoucherOrder};
pub use admission::Admission;
use catalog::Catalog;
pub use in_flight::DeadLetter;
use queue::OrderQueue;
pub use sale_state::{PendingOrder, Readmit, RedisSale, SaleState};

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

/// How long the answer waits for the lock's release even when the
/// purchase's time is up: a healthy Redis answers within a millisecond.
const RELEASE_GRACE: Duration = Duration::from_millis(200);

/// A purchase step (or a read it needs) given up on at the end of its time.
fn over_budget(step: &str, budget: Duration) -> Error {
    Error::Unavailable(anyhow::anyhow!("{step} took longer than {budget:?}"))
}

/// A purchase's outcome, logged and counted in `purchases_total`.
fn counted(outcome: Result<OrderId, Error>) -> Result<OrderId, Error> {
    let label = match &outcome {
        Ok(order_id) => {
            tracing::debug!(%order_id, "order placed");
            "ok"
        }
        Err(error) => {
            tracing::debug!(outcome = error.error_code(), "purchase refused");
            error.error_code()
        }
    };
    metrics::PURCHASES.with_label_values(&[label]).inc();
    outcome
}

/// Places one-order-per-user flash-sale orders.
pub struct Seckill {
    store: Store,
    catalog: Catalog,
    lock: Arc<dyn OrderLock>,
    ids: IdWorker,
    keys: Keys,
    /// Fault injection: sleep with the lock held and the transaction open,
    /// standing in for a GC pause or a slow SQL statement.
    chaos_hold: Duration,
    /// Sales, buyers and pending orders in Redis (`queue` and `stream`; in
    /// `sync` mode only read, for the status of pending orders).
    sale_state: SaleState,
    /// `None` in `sync` mode: purchases are not admitted in Redis.
    handoff: Option<Handoff>,
}

impl Seckill {
    /// The synchronous purchase; [`Seckill::start`] puts it in a node's mode.
    pub fn new(
        store: Store,
        lock: Arc<dyn OrderLock>,
        redis: RedisConnection,
        keys: Keys,
        chaos_hold: Duration,
    ) -> Self {
        Seckill {
            catalog: Catalog::new(store.clone()),
            sale_state: SaleState::new(redis.clone(), keys.clone(), store.clone()),
            ids: IdWorker::new(redis, keys.clone()),
            store,
            lock,
            keys,
            chaos_hold,
            handoff: None,
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
        Arc::new_cyclic(|seckill| {
            let handoff = if mode == SeckillMode::Queue {
                Handoff::Queue(OrderQueue::start(seckill.clone()))
            } else {
                Handoff::Stream
            };
            Seckill {
                handoff: Some(handoff),
                ..self
            }
        })
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
        let span = tracing::info_span!("purchase", lock = %self.lock.mode(), %user_id, %voucher_id);
        // A sale this node saw sell out is refused at once, from memory,
        // without a task: after the last unit a storm is nearly all such
        // requests, and there is nothing to see to its end.
        if self.catalog.sold_out_now(voucher_id) {
            if self.handoff.is_some() {
                metrics::ADMISSIONS
                    .with_label_values(&[Admission::Refused(Rejection::SoldOut).label()])
                    .inc();
            }
            return span.in_scope(|| counted(Err(Rejection::SoldOut.into())));
        }
        let seckill = self.clone();
        let purchase = tokio::spawn(
            async move {
                seckill
                    .purchase_to_the_end(user_id, voucher_id, requested_at)
                    .await
            }
            .instrument(span),
        );
        purchase.await.map_err(|failed| {
            Error::Internal(anyhow::Error::new(failed).context("the purchase task failed"))
        })?
    }

    async fn purchase_to_the_end(
        self: &Arc<Self>,
        user_id: UserId,
        voucher_id: VoucherId,
        requested_at: Instant,
    ) -> Result<OrderId, Error> {
        counted(match &self.handoff {
            None => self.try_purchase(user_id, voucher_id, requested_at).await,
            Some(handoff) => self.try_admit(handoff, user_id, voucher_id).await,
        })
    }

    async fn try_purchase(
        self: &Arc<Self>,
        user_id: UserId,
        voucher_id: VoucherId,
        requested_at: Instant,
    ) -> Result<OrderId, Error> {
        let budget = self.store.backend_timeout() + self.lock.wait();
        let answer_by = requested_at + budget;
        let voucher = self
            .catalog
            .sale(voucher_id)
            .await?
            .ok_or(Rejection::VoucherNotFound)?;
        if let Some(refusal) = voucher.refusal_at(Local::now().naive_local()) {
            return Err(refusal.into());
        }

        // The order id is drawn alongside the lock: with a Redis lock, both
        // commands are queued on the shared connection before its writer
        // runs, so they leave in one write and come back in one read — the
        // id costs no round trip of its own, and none while the voucher's
        // stock row is locked. A purchase refused after this leaves a gap in the
        // counter, which ids allow.
        // Given up on at the end of the budget (an acquisition abandoned in
        // flight gives back whatever it took).
        let (held, id) = tokio::time::timeout_at(answer_by.into(), async {
            tokio::join!(self.acquire(user_id), self.next_order_id())
        })
        .await
        .map_err(|_| over_budget("taking the lock", budget))?;
        let held = held?;
        let outcome = match id {
            Ok(id) => {
                self.transaction_until(id, user_id, voucher_id, held.as_ref(), Some(answer_by))
                    .await
            }
            Err(error) => Err(error.into()),
        };
        self.release_awaited_until(held, answer_by).await;
        if matches!(outcome, Err(Error::Rejected(Rejection::SoldOut))) {
            voucher.mark_sold_out();
        }
        outcome
    }

    /// Inserts the order under `id`, drawn with the lock. The id
    /// worker's counter lives in Redis: if Redis restarted empty within the
    /// same second as earlier orders, the counter starts over and an id can
    /// repeat. The duplicate key fails only that statement, so we draw the
    /// next id and try again.
    async fn insert_order(
        &self,
        tx: &mut sqlx::MySqlConnection,
        mut id: OrderId,
        user_id: UserId,
        voucher_id: VoucherId,
    ) -> Result<OrderId, Error> {
        const ATTEMPTS: usize = 8;
        let mut attempt = 1;
        loop {
            let order = NewOrder {
                id,
                user_id,
                voucher_id,
            };
            match store::insert_order(tx, order).await {
                Err(sqlx::Error::Database(error))
                    if error.is_unique_violation() && attempt < ATTEMPTS =>
                {
                    tracing::warn!(
                        %id,
                        "order id reused after an id counter reset; drawing another"
                    );
                    attempt += 1;
                    id = self.next_order_id().await?;
                }
                other => return other.map(|()| id).map_err(Error::from),
            }
        }
    }

    async fn next_order_id(&self) -> redis::RedisResult<OrderId> {
        self.ids.next_id("order").await.map(OrderId::new)
    }

    /// Takes the user's lock, timing it; a busy lock is hmdp's failed `tryLock()`.
    async fn acquire(&self, user_id: UserId) -> Result<Box<dyn HeldLock>, Error> {
        let mode = self.lock.mode().to_string();
        let started = Instant::now();
        let held = self.lock.acquire(&self.keys.order_lock(user_id)).await;
        metrics::LOCK_ACQUIRE
            .with_label_values(&[mode.as_str()])
            .observe(started.elapsed().as_secs_f64());
        match held? {
            Some(held) => Ok(held),
            None => {
                metrics::LOCK_BUSY.with_label_values(&[mode.as_str()]).inc();
                Err(Rejection::DuplicateRequest.into())
            }
        }
    }

    /// Releases the lock, waiting for that until `answer_by` at most (but
    /// always [`RELEASE_GRACE`]). The answer normally follows the release,
    /// so that the same user's next purchase finds the lock free; but with
    /// Redis failing over, a purchase that already waited out a Redis call
    /// inside its transaction (the fencing check) could wait as long again
    /// for the release. After that the release carries on in a task of its
    /// own (the transaction has ended: the lock has done its work); a
    /// release that ends in time, nearly all of them, costs no task.
    async fn release_awaited_until(self: &Arc<Self>, held: Box<dyn HeldLock>, answer_by: Instant) {
        let seckill = self.clone();
        // Owned, so that it can move to a task half done: a release is not
        // dropped midway.
        let mut release = Box::pin(async move { seckill.release_logged(held).await });
        let until = answer_by.max(Instant::now() + RELEASE_GRACE);
        if tokio::time::timeout_at(until.into(), &mut release)
            .await
            .is_err()
        {
            tracing::debug!("lock release still under way; answering without it");
            tokio::spawn(release);
        }
    }

    /// Releases the lock; a release that was not clean means mutual exclusion
    /// may have been lost while we held it, which is worth a warning, not a
    /// failure of an order that already committed.
    async fn release_logged(&self, held: Box<dyn HeldLock>) {
        match held.release().await {
            Ok(release) if release.is_clean() => {}
            Ok(release) => {
                tracing::warn!(?release, "lock release was not clean");
                let mode = self.lock.mode().to_string();
                let release = format!("{release:?}");
                metrics::LOCK_UNCLEAN_RELEASES
                    .with_label_values(&[mode.as_str(), release.as_str()])
                    .inc();
            }
            Err(error) => tracing::warn!(error = %error, "lock release failed"),
        }
    }

    /// The transaction run under the per-user lock `held`, placing order
    /// `id` (also what `bench-db` measures, with no lock). It has ended
    /// before this returns, so that the lock is released only after it:
    /// committed, rolled back, or — after a failure that left it unknown —
    /// its connection closed, which is known never to commit.
    ///
    /// Once a connection is in hand (the pool's own wait is bounded by the
    /// backend timeout), everything before `COMMIT` has the backend timeout
    /// in all: a MySQL that stops answering mid-transaction (a frozen
    /// server, a network that drops packets without a reset) would
    /// otherwise keep the user's lock and the stock row for as long as it
    /// stays silent. Given up there, the transaction is dropped uncommitted
    /// and its connection closed. The `COMMIT` itself is waited for: given
    /// up while in flight, it might still land after the lock was released,
    /// next to a second purchase of the same user.
    pub async fn order_transaction(
        &self,
        id: OrderId,
        user_id: UserId,
        voucher_id: VoucherId,
        held: &dyn HeldLock,
    ) -> Result<OrderId, Error> {
        self.transaction_until(id, user_id, voucher_id, held, None)
            .await
    }

    /// [`Seckill::order_transaction`], its statements also given up at
    /// `answer_by`, the end of the purchase's budget, if that comes first.
    async fn transaction_until(
        &self,
        id: OrderId,
        user_id: UserId,
        voucher_id: VoucherId,
        held: &dyn HeldLock,
        answer_by: Option<Instant>,
    ) -> Result<OrderId, Error> {
        let conn = self.store.connection().await?;
        let timeout = self.store.backend_timeout();
        let own = Instant::now() + timeout;
        let deadline = answer_by.map_or(own, |answer_by| answer_by.min(own));
        let statements = async {
            let mut tx = Tx::begin_on(conn).await?;
            let decision = self
                .write_order(&mut tx, id, user_id, voucher_id, held)
                .await?;
            Ok::<_, Error>((tx, decision))
        };
        // On an error or the deadline, the transaction is dropped with its
        // end unseen, which closes its connection.
        let (tx, decision) = tokio::time::timeout_at(deadline.into(), statements)
            .await
            .map_err(|_| over_budget("the purchase's statements", timeout))??;
        match decision {
            Ok(id) => {
                tx.commit().await?;
                Ok(id)
            }
            Err(refused) => {
                tx.rollback().await?;
                Err(refused)
            }
        }
    }

    /// The statements of the purchase transaction, which the caller ends:
    /// `Ok(decision)` when they ran — the order to commit, or a refusal to
    /// roll back — and `Err` when one of them failed.
    async fn write_order(
        &self,
        tx: &mut Tx,
        id: OrderId,
        user_id: UserId,
        voucher_id: VoucherId,
        held: &dyn HeldLock,
    ) -> Result<Result<OrderId, Error>, Error> {
        if let Some(token) = held.fencing_token() {
            // First statement: a newer holder's token means ours is stale,
            // and the row lock orders this user's purchases by token.
            if !store::record_fence(tx, user_id, token).await? {
                metrics::FENCING_REJECTIONS.inc();
                let stale = LockError::Lost("a newer holder's fencing token already wrote");
                return Ok(Err(stale.into()));
            }
        }
        if store::count_user_orders(tx, user_id, voucher_id).await? > 0 {
            return Ok(Err(Rejection::AlreadyOrdered.into()));
        }
        if !self.chaos_hold.is_zero() {
            tokio::time::sleep(self.chaos_hold).await;
        }
        let id = self.insert_order(tx, id, user_id, voucher_id).await?;
        // A holder that learnt it lost the lock rolls back instead. Asked
        // before the stock is taken: with fencing it is a Redis round trip,
        // and the fence recorded above already keeps a newer holder's
        // purchase from committing beside this one.
        if let Err(lost) = held.ensure_held().await {
            return Ok(Err(lost.into()));
        }
        // The stock last: the `UPDATE` locks the voucher's one stock row
        // until the commit, and every purchase of the voucher queues for
        // that lock, so only the commit follows it. (Sold out: the insert
        // rolls back with the rest.)
        if !store::take_stock(tx, voucher_id).await? {
            return Ok(Err(Rejection::SoldOut.into()));
        }
        Ok(Ok(id))
    }
}
