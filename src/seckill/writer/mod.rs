//! The purchase transaction, one for every path: under the buyers' per-user
//! locks, ONE transaction records each lock's fencing token, leaves out
//! order ids already written (idempotency), users who hold an order of the
//! voucher already (one active order per user) and users whose lock was
//! found lost, inserts the orders, takes the stock — the stock row's lock
//! last, so that only the commit follows it; as many units as are left when
//! they do not cover every order — and commits. Each order's outcome is its
//! own: one order refused never fails the others.
//!
//! The synchronous purchases run it for the orders of a shared commit
//! ([`OrderWriter::write_purchases`], `shared_commits.rs`); `queue`'s
//! writer for each queued order, the stream's consumer for a batch of
//! entries and a dead letter's replay for its order
//! ([`OrderWriter::write_under_locks`]), where the orders were admitted in
//! Redis first and are also counted again in a sale Redis reloaded
//! meanwhile. Each order written gets its payment deadline (`after_sale`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use hmdp_lock::{DistributedLock, LockMode};
use tracing::{field, Instrument, Span};

use super::sale_state::SaleState;
use crate::after_sale::PayDeadlines;
use crate::error::Error;
use crate::ids::OrderId;
use crate::keys::Keys;
use crate::metrics;
use crate::store::{NewOrder, Store};

mod locks;
mod outcome;
mod statements;
pub use locks::Locks;
pub use outcome::{Blame, Deferral, Ended, Outcome};

/// Where the orders a writer writes come from. Orders admitted in Redis
/// first are counted again, before their commit, in a sale Redis lost and
/// reloaded meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderSource {
    /// The synchronous purchase: the order exists only in its transaction.
    Purchase,
    /// Admitted in Redis, queued in this process (`queue`).
    Queue,
    /// Admitted in Redis onto the order stream (`stream`, a dead letter).
    Stream,
}

impl OrderSource {
    /// The `source` label of the transactions' metrics.
    pub fn label(self) -> &'static str {
        match self {
            OrderSource::Purchase => "purchase",
            OrderSource::Queue => "queue",
            OrderSource::Stream => "stream",
        }
    }
}

/// Writes orders to MySQL under their users' locks: what the purchase, the
/// queue's writer, the stream's consumer and a dead letter's replay share.
#[derive(Clone)]
pub struct OrderWriter {
    store: Store,
    lock: Arc<dyn DistributedLock>,
    keys: Keys,
    sale_state: Arc<SaleState>,
    source: OrderSource,
    /// Where each order written gets its payment deadline.
    deadlines: PayDeadlines,
    /// Fault injection: sleep with the locks held and the transaction open,
    /// standing in for a GC pause or a slow SQL statement.
    chaos_hold: Duration,
}

/// How often a transaction chosen as a deadlock's victim is run again.
const DEADLOCK_RETRIES: u32 = 3;

impl OrderWriter {
    pub fn new(
        store: Store,
        lock: Arc<dyn DistributedLock>,
        sale_state: Arc<SaleState>,
        keys: Keys,
        source: OrderSource,
        deadlines: PayDeadlines,
        chaos_hold: Duration,
    ) -> Self {
        OrderWriter {
            store,
            lock,
            keys,
            sale_state,
            source,
            deadlines,
            chaos_hold,
        }
    }

    /// The same writer, for orders from `source`.
    pub fn for_orders_from(&self, source: OrderSource) -> OrderWriter {
        OrderWriter {
            source,
            ..self.clone()
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn sale_state(&self) -> &SaleState {
        &self.sale_state
    }

    /// How long an acquisition waits for a busy lock.
    pub fn lock_wait(&self) -> Duration {
        self.lock.wait()
    }

    /// The lock's mode, for logs and metrics.
    pub fn lock_mode(&self) -> LockMode {
        self.lock.mode()
    }

    /// Writes `orders` in one transaction under their users' locks and runs
    /// `after_commit` on what became of each (the order stream's `XACK`, a
    /// replayed dead letter's removal, the queue's pending order) before the
    /// locks are released: the locks are released whatever happens, and
    /// only after the commit (or the failure) and that step.
    pub async fn write_under_locks(
        &self,
        orders: &[NewOrder],
        after_commit: impl AsyncFnOnce(&[Outcome]) -> Result<(), Error>,
    ) -> Result<Vec<Outcome>, Error> {
        let locks = self.lock_users(orders).await;
        let written = async {
            let mut outcomes: Vec<Option<Outcome>> = orders
                .iter()
                .map(|order| locks.refused.get(&order.user_id).copied())
                .collect();
            let locked: Vec<NewOrder> = orders
                .iter()
                .zip(&outcomes)
                .filter(|(_, outcome)| outcome.is_none())
                .map(|(order, _)| *order)
                .collect();
            let written = self.write_all(&locked, &locks, None).await;
            let mut written = written
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?
                .into_iter();
            let outcomes: Vec<Outcome> = outcomes
                .iter_mut()
                .map(|outcome| {
                    outcome
                        .or_else(|| written.next())
                        .expect("every order has an outcome")
                })
                .collect();
            after_commit(&outcomes).await?;
            Ok(outcomes)
        }
        .await;
        let held = locks.into_held_by_user();
        join_all(
            held.into_iter()
                .map(|(user, held)| self.release(user, held)),
        )
        .await;
        written
    }

    /// The synchronous purchases' `orders`, whose users' locks are held,
    /// written as [`OrderWriter::write_under_locks`] writes admitted ones;
    /// everything before each `COMMIT` given up at the backend timeout or
    /// `answer_by`, whichever comes first.
    pub async fn write_purchases(
        &self,
        orders: &[NewOrder],
        locks: &Locks,
        answer_by: Instant,
    ) -> Vec<Result<Outcome, Error>> {
        self.write_all(orders, locks, Some(answer_by)).await
    }

    /// Writes `orders`, whose users' locks are held, in one transaction; the
    /// outcome of each, in order. Orders whose units were sold again after a
    /// Redis loss are left out, and the rest written without them; so are
    /// those a voucher's last units do not cover (see `statements`). Should
    /// the transaction fail for one order's sake — a purchase's id taken
    /// already, a statement MySQL refused — it is rolled back and each
    /// order written alone, so that exactly the orders that can be written
    /// are, and only the others are refused: no oversell, nothing written
    /// twice. A failure that is no order's own (MySQL or Redis unreachable,
    /// a `COMMIT` whose end is unknown) is each order's answer.
    async fn write_all(
        &self,
        orders: &[NewOrder],
        locks: &Locks,
        answer_by: Option<Instant>,
    ) -> Vec<Result<Outcome, Error>> {
        let mut resold: HashSet<OrderId> = HashSet::new();
        let merged = |resold: &HashSet<OrderId>, written: Vec<Result<Outcome, Error>>| {
            let mut written = written.into_iter();
            (orders.iter())
                .map(|order| match resold.contains(&order.id) {
                    true => Ok(Outcome::Resold),
                    false => written.next().expect("an outcome per order written"),
                })
                .collect()
        };
        let rest = loop {
            let rest: Vec<NewOrder> = (orders.iter())
                .filter(|order| !resold.contains(&order.id))
                .copied()
                .collect();
            if rest.is_empty() {
                return merged(&resold, Vec::new());
            }
            match self.run(&rest, locks, answer_by).await {
                Ok(Ended::Committed(outcomes)) => {
                    return merged(&resold, outcomes.into_iter().map(Ok).collect())
                }
                // Each round leaves out at least one order: it ends.
                Ok(Ended::Resold(ids)) => resold.extend(ids),
                Ok(ended) if rest.len() == 1 => return merged(&resold, vec![Ok(alone(ended))]),
                Ok(Ended::IdTaken) => break rest,
                Err(Error::Internal(refused)) if rest.len() > 1 => {
                    tracing::warn!(orders = rest.len(), error = ?refused,
                        "a transaction of several orders failed; writing them one by one");
                    break rest;
                }
                Err(error) => {
                    let each = rest.iter().map(|_| Err(each_told(&error))).collect();
                    return merged(&resold, each);
                }
            }
        };
        let mut outcomes = Vec::with_capacity(rest.len());
        for order in &rest {
            let ended = self
                .run(std::slice::from_ref(order), locks, answer_by)
                .await;
            outcomes.push(ended.map(alone));
        }
        merged(&resold, outcomes)
    }

    /// [`OrderWriter::transaction`] over `orders`, its statements given up
    /// at the backend timeout or `answer_by`, whichever comes first (never
    /// without `answer_by`), and run again should MySQL choose it as a
    /// deadlock's victim (its orders' rows and the stock row against
    /// another transaction's): rolled back whole, it is safe to run again,
    /// a few times.
    async fn run(
        &self,
        orders: &[NewOrder],
        locks: &Locks,
        answer_by: Option<Instant>,
    ) -> Result<Ended, Error> {
        let mut deadlocks = 0;
        loop {
            let own = Instant::now() + self.store.backend_timeout();
            let deadline = answer_by.map(|answer_by| answer_by.min(own));
            match self.transaction(orders, locks, deadline).await {
                Err(error) if error.is_deadlock() && deadlocks < DEADLOCK_RETRIES => {
                    deadlocks += 1;
                    tracing::debug!(
                        orders = orders.len(),
                        deadlocks,
                        "deadlock victim; running again"
                    );
                }
                ended => return ended,
            }
        }
    }

    /// ONE transaction over `orders`, under `locks`. Its end is known
    /// before this returns, so that the locks are released only after it:
    /// committed, rolled back, or — after a failure that left it unknown —
    /// its connection closed, which is known never to commit.
    ///
    /// With a `deadline`, everything before `COMMIT` is given up then (the
    /// purchase's answer is due; see [`Seckill::purchase_sync`](crate::seckill::Seckill)),
    /// the transaction dropped uncommitted and its connection closed. The
    /// `COMMIT` itself is always waited for: given up while in flight, it
    /// might still land after the locks were released, next to a second
    /// purchase of the same user.
    #[tracing::instrument(name = "order_transaction", skip_all,
        fields(orders = orders.len(), order_id, user_id, voucher_id))]
    pub async fn transaction(
        &self,
        orders: &[NewOrder],
        locks: &Locks,
        deadline: Option<Instant>,
    ) -> Result<Ended, Error> {
        if let [order] = orders {
            let span = Span::current();
            span.record("order_id", field::display(order.id));
            span.record("user_id", field::display(order.user_id));
            span.record("voucher_id", field::display(order.voucher_id));
        }
        let step = |step: &str, since: Instant| {
            (metrics::ORDER_TRANSACTION_STEPS.with_label_values(&[self.source.label(), step]))
                .observe(since.elapsed().as_secs_f64());
        };
        let statements = async {
            let began = Instant::now();
            let conn = self.store.connection().await?;
            let (mut tx, opened) = self.open(conn, orders, locks).await?;
            step("open", began);
            let opened_at = Instant::now();
            let ended = self.statements(&mut tx, orders, locks, opened).await?;
            step("statements", opened_at);
            Ok::<_, Error>((tx, ended))
        };
        // On an error or the deadline, the transaction is dropped with its
        // end unseen, which closes its connection.
        let (tx, ended) = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), statements)
                .await
                .map_err(|_| {
                    Error::over_budget("the purchase's statements", self.store.backend_timeout())
                })??,
            None => statements.await?,
        };
        match &ended {
            Ended::Committed(outcomes) => {
                let committing = Instant::now();
                tx.commit()
                    .instrument(tracing::info_span!("commit"))
                    .await?;
                step("commit", committing);
                let written: Vec<&NewOrder> = orders
                    .iter()
                    .zip(outcomes)
                    .filter(|(_, outcome)| **outcome == Outcome::Written)
                    .map(|(order, _)| order)
                    .collect();
                // MySQL's fence rose with this commit: this node's next
                // admission from a shard that lost these orders is refused.
                self.sale_state.fences().written(written.iter().copied());
                self.deadlines
                    .schedule(written.iter().map(|order| order.id));
            }
            Ended::IdTaken | Ended::Resold(_) => tx.rollback().await?,
        }
        Ok(ended)
    }
}

/// What became of an order its transaction's end speaks for alone.
fn alone(ended: Ended) -> Outcome {
    match ended {
        Ended::Committed(outcomes) => outcomes[0],
        Ended::IdTaken => Outcome::IdTaken,
        Ended::Resold(_) => Outcome::Resold,
    }
}

/// A transaction's failure as each of its orders is told it: the same kind
/// of failure for each.
fn each_told(error: &Error) -> Error {
    match error {
        Error::Rejected(rejection) => Error::Rejected(*rejection),
        Error::Unavailable(cause) => Error::Unavailable(anyhow::anyhow!("{cause:#}")),
        other => Error::Internal(anyhow::anyhow!("{other:?}")),
    }
}
