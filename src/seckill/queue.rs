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

use std::sync::{Mutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::stream::Blame;
use super::Seckill;
use crate::error::{Error, Rejection};
use crate::ids::OrderId;
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
    drain: std::sync::Arc<Notify>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl OrderQueue {
    /// Starts the writer of `seckill`'s admitted orders. It holds the
    /// purchase weakly: the purchase owns the queue, and the writer stops
    /// once the purchase is gone.
    pub(super) fn start(seckill: Weak<Seckill>) -> OrderQueue {
        let (orders, queued) = mpsc::channel(CAPACITY);
        let drain = std::sync::Arc::new(Notify::new());
        let writer = tokio::spawn(
            write_all(seckill, queued, drain.clone())
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
    seckill: Weak<Seckill>,
    mut queued: mpsc::Receiver<NewOrder>,
    drain: std::sync::Arc<Notify>,
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
        let Some(seckill) = seckill.upgrade() else {
            break;
        };
        seckill.write_queued(order).await;
    }
}

impl Seckill {
    /// Writes one admitted order, waiting out what is not the order's own
    /// fault, then takes it off the pending orders. An order MySQL refuses
    /// (the user already holds one, the stock row is empty) only happens
    /// when Redis and MySQL disagree, after Redis lost data: the buyer was
    /// told "success" anyway.
    async fn write_queued(&self, order: NewOrder) {
        let mut retry_after = FIRST_RETRY_AFTER;
        loop {
            match self.write_under_lock(order).await {
                Ok(written) => {
                    if written != order.id {
                        tracing::warn!(admitted = %order.id, %written,
                            "order written under another id (id counter reset)");
                    }
                    break;
                }
                Err(Error::Rejected(Rejection::DuplicateRequest)) | Err(Error::Unavailable(_)) => {}
                Err(Error::Rejected(refused)) => {
                    tracing::warn!(order_id = %order.id, user_id = %order.user_id,
                        voucher_id = %order.voucher_id, refused = refused.code(),
                        "admitted order refused by MySQL: Redis and MySQL disagree");
                    break;
                }
                Err(Error::Internal(error)) => {
                    if let Blame::Order(why) = Blame::of(&error) {
                        // Left pending: the order is admitted and unwritten,
                        // and the audit counts it lost.
                        tracing::error!(order_id = %order.id, user_id = %order.user_id,
                            voucher_id = %order.voucher_id, why, "admitted order cannot be written");
                        return;
                    }
                }
                Err(error) => {
                    tracing::error!(order_id = %order.id, ?error, "admitted order not written");
                    return;
                }
            }
            tracing::debug!(order_id = %order.id, ?retry_after, "order not written yet; retrying");
            tokio::time::sleep(retry_after).await;
            retry_after = (retry_after * 2).min(MAX_RETRY_AFTER);
        }
        self.forget_written(order.id).await;
    }

    /// The course's V5 writer: the user's lock around the purchase's own
    /// transaction.
    async fn write_under_lock(&self, order: NewOrder) -> Result<OrderId, Error> {
        let held = self.acquire(order.user_id).await?;
        let outcome = self
            .order_transaction(order.id, order.user_id, order.voucher_id, held.as_ref())
            .await;
        self.release_logged(held).await;
        outcome
    }

    async fn forget_written(&self, order_id: OrderId) {
        if let Err(error) = self.sale_state.forget_pending(&[order_id]).await {
            // The order is in MySQL, which the status query reads first.
            tracing::warn!(%order_id, ?error, "written order left in the pending orders");
        }
    }
}
