//! Shared commits: the synchronous purchases of one voucher that become
//! ready while a transaction of that voucher is in flight on this node wait
//! for it, and the next transaction writes them together, each under its
//! own buyer's lock (held from before that transaction until after its
//! commit), each answered only after the commit that holds its order, or
//! with its own refusal. A purchase of an idle voucher is written at once,
//! alone: nothing waits for company.
//!
//! One transaction per voucher is in flight on a node at a time: the stock
//! row admits one writer at a time anyway, and the purchases that queue
//! behind it are the next transaction's. Those found waiting when it has
//! committed wait a moment more (`--sync-batch-linger-ms`) for others to
//! join them: MySQL spends about as much on a transaction's round trips
//! and commit as on a few dozen orders, and a busy voucher's purchases keep
//! coming. Two nodes coalesce independently; their transactions meet on
//! the stock row.
//!
//! Coalescing never stands in for the lock: a buyer's purchase that comes
//! while another of theirs is in flight or waiting (possible only when the
//! lock let both through: `--lock none`, a lease that ran out) is written
//! at once in a transaction of its own, and races the other as it would
//! without shared commits.
//!
//! The transactions run in a task of their own, never in a purchase's
//! future: a client that hangs up cancels neither its purchase nor its
//! batch.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmdp_lock::{LockError, LockGuard, LostReason};
use tokio::sync::{oneshot, Notify};
use tracing::{Instrument, Span};

use super::writer::{Deferral, Locks, OrderWriter, Outcome};
use crate::error::{Error, Rejection};
use crate::ids::{OrderId, UserId, VoucherId};
use crate::metrics;
use crate::store::NewOrder;

/// What became of a purchase handed to [`SharedCommits::place`], with its
/// buyer's lock, still held, for the purchase to release.
pub(super) struct Placed {
    pub outcome: Result<Written, Error>,
    pub held: Box<dyn LockGuard>,
}

/// How a purchase's transaction ended for its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Committed under this id.
    Order(OrderId),
    /// The id, fresh from the id worker, belongs to an earlier order (the
    /// worker's counter in Redis started over): the purchase draws another
    /// and is placed again.
    IdTaken,
}

/// Should the task writing a voucher's transactions end before its queue
/// is empty (a panic, the runtime shutting down), the voucher is idle again,
/// so that its next purchase starts its transactions anew, and the
/// purchases still waiting are answered that their transaction ended (their
/// answers dropped). Disarmed once the queue emptied normally.
struct IdleAtTheEnd<'a> {
    commits: &'a SharedCommits,
    voucher_id: VoucherId,
    armed: bool,
}

impl Drop for IdleAtTheEnd<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(mut vouchers) = self.commits.busy.lock() {
            vouchers.remove(&self.voucher_id);
        }
    }
}

/// How a purchase joins its voucher's transactions.
enum Joined {
    /// The voucher was idle: its transactions start with this one's.
    First(Waiting),
    /// Its buyer has another purchase in flight or waiting: written alone.
    Alone(Waiting),
    /// Waiting for the voucher's next transaction.
    Queued,
}
use Joined::{Alone, First, Queued};

/// A purchase waiting for its voucher's next transaction.
struct Waiting {
    order: NewOrder,
    held: Box<dyn LockGuard>,
    /// The purchase's span, which its transaction's span continues.
    span: Span,
    /// When its answer is due: a purchase still waiting then is answered
    /// without a transaction.
    answer_by: Instant,
    answer: oneshot::Sender<Placed>,
    /// When it was handed over, for the time it waits.
    handed_over: Instant,
}

/// A voucher with a transaction in flight on this node.
#[derive(Default)]
struct Busy {
    /// The purchases waiting for its next transaction, in the order they
    /// came.
    waiting: VecDeque<Waiting>,
    /// The buyers of the transaction in flight and of those waiting.
    buyers: HashSet<UserId>,
    /// Told when the next transaction's purchases are as many as it takes,
    /// to end the wait for company early.
    full: Arc<Notify>,
}

/// Every voucher's purchases waiting on this node.
pub(super) struct SharedCommits {
    writer: Arc<OrderWriter>,
    /// Orders per transaction at most.
    most: usize,
    /// How long the purchases waiting after a commit wait for company.
    linger: Duration,
    /// The vouchers with a transaction in flight; an idle one has none.
    busy: Mutex<HashMap<VoucherId, Busy>>,
}

impl SharedCommits {
    pub fn new(writer: Arc<OrderWriter>, most: usize, linger: Duration) -> Arc<SharedCommits> {
        Arc::new(SharedCommits {
            writer,
            most: most.max(1),
            linger,
            busy: Mutex::new(HashMap::new()),
        })
    }

    /// Writes `order` under its buyer's lock `held`, in the voucher's next
    /// transaction, given up before its `COMMIT` at `answer_by`. Answers
    /// after that transaction has ended, whatever this future's caller does
    /// meanwhile.
    pub async fn place(
        self: &Arc<Self>,
        order: NewOrder,
        held: Box<dyn LockGuard>,
        answer_by: Instant,
    ) -> Result<Placed, Error> {
        let (answer, answered) = oneshot::channel();
        let waiting = Waiting {
            order,
            held,
            span: Span::current(),
            answer_by,
            answer,
            handed_over: Instant::now(),
        };
        let user = order.user_id;
        let joined = {
            let mut vouchers = self.busy.lock().expect("shared commits poisoned");
            match vouchers.get_mut(&order.voucher_id) {
                Some(busy) => match busy.buyers.insert(user) {
                    true => {
                        busy.waiting.push_back(waiting);
                        if busy.waiting.len() >= self.most {
                            busy.full.notify_waiters();
                        }
                        Queued
                    }
                    false => Alone(waiting),
                },
                None => {
                    let busy = Busy {
                        buyers: HashSet::from([user]),
                        ..Busy::default()
                    };
                    vouchers.insert(order.voucher_id, busy);
                    First(waiting)
                }
            }
        };
        let commits = self.clone();
        match joined {
            First(waiting) => {
                tokio::spawn(async move { commits.write_while_waiting(waiting).await });
            }
            Alone(waiting) => {
                tokio::spawn(async move { commits.write(vec![waiting]).await });
            }
            Queued => {}
        }
        answered.await.map_err(|_| {
            Error::Internal(anyhow::anyhow!(
                "the purchase's transaction ended unanswered"
            ))
        })
    }

    /// The voucher's transactions, the first for `first` alone, each next
    /// one for the purchases that waited meanwhile (and those that joined
    /// them while they lingered), until none waits.
    async fn write_while_waiting(&self, first: Waiting) {
        let voucher_id = first.order.voucher_id;
        let mut idle_at_the_end = IdleAtTheEnd {
            commits: self,
            voucher_id,
            armed: true,
        };
        let mut batch = vec![first];
        loop {
            let buyers: Vec<UserId> = batch.iter().map(|waiting| waiting.order.user_id).collect();
            self.write(batch).await;
            self.linger_for_company(voucher_id).await;
            batch = self.next_batch(voucher_id, &buyers);
            if batch.is_empty() {
                // Idle already: a purchase may have started the voucher's
                // transactions anew since.
                idle_at_the_end.armed = false;
                return;
            }
        }
    }

    /// Gives the purchases of the voucher waiting for its next transaction
    /// up to `linger` for others to join them, until `most` wait. None
    /// waiting: no wait, the voucher goes idle at once.
    async fn linger_for_company(&self, voucher_id: VoucherId) {
        if self.linger.is_zero() {
            return;
        }
        let full = {
            let vouchers = self.busy.lock().expect("shared commits poisoned");
            match vouchers.get(&voucher_id) {
                Some(busy) if (1..self.most).contains(&busy.waiting.len()) => busy.full.clone(),
                _ => return,
            }
        };
        let filled = full.notified();
        tokio::pin!(filled);
        // Listening before the count is read again: a purchase that fills
        // the transaction after the read still ends the wait.
        filled.as_mut().enable();
        let already_full = {
            let vouchers = self.busy.lock().expect("shared commits poisoned");
            vouchers
                .get(&voucher_id)
                .is_none_or(|busy| busy.waiting.len() >= self.most)
        };
        if !already_full {
            let lingering = Instant::now();
            let _ = tokio::time::timeout(self.linger, filled).await;
            (metrics::SYNC_BATCH_WAITS.with_label_values(&["linger"]))
                .observe(lingering.elapsed().as_secs_f64());
        }
    }

    /// Up to `most` of the voucher's waiting purchases, in the order they
    /// came, once the transaction of `done` ended; none left: the voucher
    /// is idle again.
    fn next_batch(&self, voucher_id: VoucherId, done: &[UserId]) -> Vec<Waiting> {
        let mut vouchers = self.busy.lock().expect("shared commits poisoned");
        let Some(busy) = vouchers.get_mut(&voucher_id) else {
            return Vec::new();
        };
        for user in done {
            busy.buyers.remove(user);
        }
        if busy.waiting.is_empty() {
            vouchers.remove(&voucher_id);
            return Vec::new();
        }
        let most = busy.waiting.len().min(self.most);
        busy.waiting.drain(..most).collect()
    }

    /// One transaction for `batch`, each purchase answered after it ends.
    async fn write(&self, batch: Vec<Waiting>) {
        let now = Instant::now();
        let (late, batch): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .partition(|waiting| waiting.answer_by <= now);
        for waiting in late {
            let outcome = Err(Error::Unavailable(anyhow::anyhow!(
                "the purchase's time was up while it waited for its voucher's transaction"
            )));
            let user = waiting.order.user_id;
            self.answer(waiting.answer, outcome, user, waiting.held)
                .await;
        }
        if batch.is_empty() {
            return;
        }
        let span = commit_span(&batch);
        let orders: Vec<NewOrder> = batch.iter().map(|waiting| waiting.order).collect();
        let answer_by =
            (batch.iter().map(|waiting| waiting.answer_by).min()).expect("a batch is never empty");
        let mut answers = Vec::with_capacity(batch.len());
        let mut held = BTreeMap::new();
        let queued = metrics::SYNC_BATCH_WAITS.with_label_values(&["queued"]);
        for waiting in batch {
            queued.observe(now.duration_since(waiting.handed_over).as_secs_f64());
            held.insert(waiting.order.user_id, waiting.held);
            answers.push(waiting.answer);
        }
        let locks = Locks::held_by(held);
        metrics::SYNC_BATCH_ORDERS.observe(orders.len() as f64);
        let written = self
            .writer
            .write_purchases(&orders, &locks, answer_by)
            .instrument(span)
            .await;
        let mut held = locks.into_held_by_user();
        let mut release = |user: UserId| held.remove(&user).expect("each buyer's lock is held");
        for ((order, answer), outcome) in orders.iter().zip(answers).zip(written) {
            let outcome = outcome.and_then(|outcome| answered(order, outcome));
            let user = order.user_id;
            self.answer(answer, outcome, user, release(user)).await;
        }
    }

    /// Answers a purchase; one whose purchase is gone (the node is
    /// stopping) has its buyer's (`user`'s) lock released here.
    async fn answer(
        &self,
        answer: oneshot::Sender<Placed>,
        outcome: Result<Written, Error>,
        user: UserId,
        held: Box<dyn LockGuard>,
    ) {
        if let Err(unheard) = answer.send(Placed { outcome, held }) {
            self.writer.release(user, unheard.held).await;
        }
    }
}

/// The span of `batch`'s transaction: in the trace of its first purchase,
/// following from the others' (as links, in an exported trace).
fn commit_span(batch: &[Waiting]) -> Span {
    let (first, others) = batch.split_first().expect("a batch is never empty");
    let span = tracing::info_span!(parent: &first.span, "shared_commit",
        orders = batch.len(), voucher_id = %first.order.voucher_id);
    for waiting in others {
        span.follows_from(&waiting.span);
    }
    span
}

/// A purchase's answer from what became of its order in a transaction.
pub(super) fn answered(order: &NewOrder, outcome: Outcome) -> Result<Written, Error> {
    match outcome {
        Outcome::Written => Ok(Written::Order(order.id)),
        Outcome::IdTaken => Ok(Written::IdTaken),
        Outcome::AlreadyWritten | Outcome::DuplicateUser => Err(Rejection::AlreadyOrdered.into()),
        Outcome::Deferred(Deferral::NoStockInMysql) => Err(Rejection::SoldOut.into()),
        Outcome::Deferred(Deferral::FencedOut) => {
            Err(LockError::Lost(LostReason::FencedOut).into())
        }
        Outcome::Deferred(why @ Deferral::LockLost) => Err(Error::Unavailable(
            anyhow::Error::new(why).context("the purchase rolled back"),
        )),
        // A purchase's own lock is held when its order is written.
        Outcome::Deferred(why @ (Deferral::LockBusy | Deferral::LockUnavailable)) => Err(
            Error::Internal(anyhow::Error::new(why).context("the purchase's order was deferred")),
        ),
        // Never a purchase's: its order is not counted again in a sale Redis
        // reloaded (only admitted orders are).
        Outcome::Resold => Err(Error::Internal(anyhow::anyhow!(
            "a purchase's order was answered as resold in a reloaded sale"
        ))),
    }
}
