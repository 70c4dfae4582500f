//! `queue` mode, the course's V5: admitted orders wait in a bounded queue
//! inside this process, and one background task writes them to MySQL, each
//! under its user's lock with the purchase's own transaction.
//!
//! Kept to show why V6 exists: the queue lives only in this process's
//! memory. A node killed with orders queued loses them: their buyers were
//! told "success", Redis counts them as sold and pending, and no order row
//! will ever exist. That is the only way it loses one: a busy lock or a
//! MySQL outage delays an order for as long as it lasts, and a stop request
//! (SIGTERM, every deploy) drains the queue before the process exits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::stream::Blame;
use super::writer::{OrderWriter, Outcome, NO_STOCK_IN_MYSQL};
use crate::error::Error;
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

async fn write_all(
    writer: Arc<OrderWriter>,
    mut queued: mpsc::Receiver<NewOrder>,
    drain: Arc<Notify>,
) {
    let mut draining = false;
    loop {
        let order = tokio::select! {
            // Cancel-safe: `recv` loses nothing when the other branch wins.
            order = queued.recv() => order,
            () = drain.notified(), if !draining => {
                // No more orders in; those queued are still received.
                draining = true;
                queued.close();
                continue;
            }
        };
        let Some(order) = order else { break };
        write_one(&writer, order).await;
    }
}

/// Writes one admitted order under its user's lock, waiting out what is
/// not the order's own fault, and takes it off the pending orders once it
/// is settled. An order MySQL refuses (the user already holds one, the
/// stock row is empty) only happens when Redis and MySQL disagree, after
/// Redis lost data: the buyer was told "success" anyway.
async fn write_one(writer: &OrderWriter, order: NewOrder) {
    let mut retry_after = FIRST_RETRY_AFTER;
    let (order_id, user_id, voucher_id) = (order.id, order.user_id, order.voucher_id);
    loop {
        let forget = async |outcomes: &[Outcome]| {
            if outcomes[0].settled() || outcomes[0] == Outcome::Deferred(NO_STOCK_IN_MYSQL) {
                writer.sale_state().forget_pending(&[order_id]).await?;
            }
            Ok(())
        };
        match writer.write_under_locks(&[order], forget).await {
            Ok(outcomes) => match outcomes[0] {
                Outcome::Written | Outcome::AlreadyWritten => return,
                outcome if outcome.waits_on_others() => {}
                refused => {
                    tracing::warn!(%order_id, %user_id, %voucher_id, ?refused,
                        "admitted order refused by MySQL: Redis and MySQL disagree");
                    return;
                }
            },
            Err(error) => {
                if let Blame::Order(why) = Blame::of(&error) {
                    // Left pending: the order is admitted and unwritten,
                    // and the audit counts it lost.
                    tracing::error!(%order_id, %user_id, %voucher_id, why,
                        "admitted order cannot be written");
                    return;
                }
            }
        }
        tracing::debug!(%order_id, ?retry_after, "order not written yet; retrying");
        tokio::time::sleep(retry_after).await;
        retry_after = (retry_after * 2).min(MAX_RETRY_AFTER);
    }
}
