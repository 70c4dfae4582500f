//! `queue` mode, the course's V5: admitted orders wait in a bounded queue
//! inside this process, and one background task writes them to MySQL, each
//! under its user's lock with the purchase's own transaction.
//!
//! Kept to show why V6 exists: the queue lives only in this process's
//! memory. A node killed with orders queued loses them: their buyers were
//! told "success", Redis counts them as sold and pending, and no order row
//! will ever exist. That is the only way it loses one: a MySQL outage delays
//! the queue for as long as it lasts, an order whose user's lock is busy is
//! parked while the orders behind it are written, an order MySQL can never
//! take goes to the dead letters with its reason, and a stop request
//! (SIGTERM, every deploy) drains the queue before the process exits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::writer::Blame;
use super::writer::{OrderWriter, Outcome};
use crate::error::Error;
use crate::metrics;
use crate::store::NewOrder;

/// Orders the queue holds before a purchase waits for room. Bounded so that
/// a writer slower than the admissions makes purchases wait (backpressure)
/// instead of growing memory, and large enough to absorb a sale's burst.
const CAPACITY: usize = 1 << 16;

/// The wait before writing an order again after a failure that is not its
/// own (the user's lock busy, MySQL down, locked or read-only), doubled for
/// each failure in a row up to [`MAX_RETRY_AFTER`]: for as long as it takes.
const FIRST_RETRY_AFTER: Duration = Duration::from_millis(100);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The sending side of the queue and its writer.
pub(super) struct OrderQueue {
    orders: mpsc::Sender<NewOrder>,
    /// Told once the node stops: the writer takes no more orders, writes
    /// those queued, and ends.
    drain: Arc<Notify>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl OrderQueue {
    /// Starts the task that writes the queued orders with `writer`; it
    /// ends once the queue is dropped (or drained).
    pub(super) fn start(writer: Arc<OrderWriter>) -> OrderQueue {
        let (orders, queued) = mpsc::channel(CAPACITY);
        let drain = Arc::new(Notify::new());
        let writer = tokio::spawn(
            write_all(writer, queued, drain.clone())
                .instrument(tracing::info_span!("order_writer")),
        );
        OrderQueue {
            orders,
            drain,
            writer: Mutex::new(Some(writer)),
        }
    }

    /// Queues an admitted order, waiting for room when the queue is full.
    pub(super) async fn push(&self, order: NewOrder) -> Result<(), Error> {
        self.orders.send(order).await.map_err(|_| {
            Error::Unavailable(anyhow::anyhow!(
                "the order writer has stopped; order {} admitted but not queued",
                order.id
            ))
        })
    }

    /// Orders queued and not yet taken by the writer.
    fn queued(&self) -> usize {
        self.orders.max_capacity() - self.orders.capacity()
    }

    /// Stops taking orders and waits up to `within` for the writer to write
    /// those queued; returns how many it left unwritten (they stay pending
    /// in Redis, their buyers told success: what a killed node loses).
    pub(super) async fn drain(&self, within: Duration) -> usize {
        let Some(writer) = self.writer.lock().expect("queue poisoned").take() else {
            return 0;
        };
        let queued = self.queued();
        tracing::info!(queued, ?within, "stopping: writing the queued orders");
        self.drain.notify_one();
        match tokio::time::timeout(within, writer).await {
            Ok(_) => {
                tracing::info!(written = queued, "order queue drained");
                0
            }
            Err(_) => {
                // The writer is left to the process's exit: an order in its
                // hands ends as a killed node's would (a transaction never
                // seen to commit is rolled back with its connection).
                let left = self.queued();
                tracing::error!(
                    left,
                    ?within,
                    "order queue not drained in time: orders left unwritten, pending in Redis"
                );
                left
            }
        }
    }
}

/// An order whose user's lock another holder has: set aside so that the
/// orders behind it are written meanwhile, and tried again at `due`.
struct Parked {
    order: NewOrder,
    due: Instant,
    /// The wait before the next try after this one, doubled each time.
    backoff: Duration,
}

async fn write_all(
    writer: Arc<OrderWriter>,
    mut queued: mpsc::Receiver<NewOrder>,
    drain: Arc<Notify>,
) {
    let mut draining = false;
    let mut closed = false;
    let mut parked: Vec<Parked> = Vec::new();
    loop {
        let due = parked.iter().map(|parked| parked.due).min();
        if closed && due.is_none() {
            break;
        }
        let next = tokio::select! {
            // Cancel-safe: `recv` loses nothing when another branch wins.
            order = queued.recv(), if !closed => match order {
                Some(order) => Some((order, FIRST_RETRY_AFTER)),
                None => {
                    closed = true;
                    None
                }
            },
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)),
                if due.is_some() =>
            {
                let at = (parked.iter())
                    .position(|parked| Some(parked.due) == due)
                    .expect("the due order is parked");
                let parked = parked.swap_remove(at);
                Some((parked.order, parked.backoff))
            }
            () = drain.notified(), if !draining => {
                // No more orders in; those queued (and parked) are still
                // written.
                draining = true;
                queued.close();
                None
            }
        };
        let Some((order, backoff)) = next else {
            continue;
        };
        if write_one(&writer, order).await == Written::WaitsOnOthers {
            tracing::debug!(order_id = %order.id, ?backoff,
                "the user's lock is held elsewhere; order parked, the queue goes on");
            parked.push(Parked {
                order,
                due: Instant::now() + backoff,
                backoff: (backoff * 2).min(MAX_RETRY_AFTER),
            });
        }
    }
}

/// What became of one order handed to [`write_one`].
#[derive(Debug, PartialEq, Eq)]
enum Written {
    /// Written, found written, or dead-lettered with its reason.
    Settled,
    /// Its user's lock is held elsewhere: to be tried again later.
    WaitsOnOthers,
}

/// Writes one admitted order under its user's lock, waiting out a MySQL
/// or Redis that fails, and takes it off the pending orders once it is
/// settled. An order MySQL can never take (no unit left for it, its id
/// taken, its unit resold after Redis lost it, a value refused) goes to the
/// dead letters with its reason: the buyer was told "success", and
/// `hmdp dead-letters` shows it.
async fn write_one(writer: &OrderWriter, order: NewOrder) -> Written {
    let mut retry_after = FIRST_RETRY_AFTER;
    let (order_id, user_id, voucher_id) = (order.id, order.user_id, order.voucher_id);
    loop {
        let forget = async |outcomes: &[Outcome]| {
            if outcomes[0].settled() {
                writer.sale_state().forget_pending(&[order_id]).await?;
            }
            Ok(())
        };
        let why = match writer.write_under_locks(&[order], forget).await {
            Ok(outcomes) => match outcomes[0] {
                outcome if outcome.settled() => return Written::Settled,
                outcome if outcome.waits_on_others() => return Written::WaitsOnOthers,
                Outcome::Deferred(why) => why.to_string(),
                Outcome::IdTaken => format!("order id {order_id} belongs to another order"),
                Outcome::DuplicateUser => format!(
                    "user {user_id} holds another active order of voucher {voucher_id}: Redis \
                     forgot the buyer and admitted them again"
                ),
                Outcome::Resold => "admitted before Redis lost the sale; its unit or its \
                                    buyer's turn went to a buyer admitted after the reload"
                    .to_owned(),
                other => format!("{other:?}"),
            },
            Err(error) => match Blame::of(&error) {
                Blame::Order(why) => why,
                Blame::Surroundings => {
                    tracing::debug!(%order_id, ?retry_after, error = %error,
                        "order not written yet; retrying");
                    tokio::time::sleep(retry_after).await;
                    retry_after = (retry_after * 2).min(MAX_RETRY_AFTER);
                    continue;
                }
            },
        };
        // Its dead letter is the order's only trace besides its pending
        // entry: it is kept for as long as Redis does not answer.
        loop {
            match writer.sale_state().dead_letter_order(order, &why).await {
                Ok(()) => break,
                Err(error) => {
                    tracing::warn!(%order_id, error = %error, "dead letter not stored; retrying");
                    tokio::time::sleep(retry_after).await;
                    retry_after = (retry_after * 2).min(MAX_RETRY_AFTER);
                }
            }
        }
        metrics::STREAM_DEAD_LETTERS
            .with_label_values(&["queue"])
            .inc();
        tracing::error!(%order_id, %user_id, %voucher_id, reason = %why,
            "admitted order cannot be written: moved to the dead letters");
        return Written::Settled;
    }
}
