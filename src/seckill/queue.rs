//! `queue` mode, the course's V5: admitted orders wait in a bounded queue
//! inside this process, and one background task writes them to MySQL, each
//! under its user's lock with the purchase's own transaction.
//!
//! Kept to show why V6 exists: the queue lives only in this process's
//! memory. A node that dies with orders queued loses them: their buyers
//! were told "success", Redis counts them as sold and pending, and no order
//! row will ever exist.

use std::sync::Weak;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::Instrument;

use super::Seckill;
use crate::error::{Error, Rejection};
use crate::ids::OrderId;
use crate::store::NewOrder;

/// Orders the queue holds before a purchase waits for room. Bounded so that
/// a writer slower than the admissions makes purchases wait (backpressure)
/// instead of growing memory, and large enough to absorb a sale's burst.
const CAPACITY: usize = 1 << 16;

/// Tries per order before the writer gives up on it: a MySQL that is down
/// for a moment, or the user's lock busy (the user buying through a `sync`
/// node), passes within them.
const WRITE_ATTEMPTS: u32 = 5;
const FIRST_RETRY_AFTER: Duration = Duration::from_millis(100);

/// The sending side of the queue; the writer ends when it is dropped.
pub(super) struct OrderQueue {
    orders: mpsc::Sender<NewOrder>,
}

impl OrderQueue {
    /// Starts the writer of `seckill`'s admitted orders. It holds the
    /// purchase weakly: the purchase owns the queue, and the writer stops
    /// once the purchase (and with it the queue's sender) is gone.
    pub(super) fn start(seckill: Weak<Seckill>) -> OrderQueue {
        let (orders, queued) = mpsc::channel(CAPACITY);
        tokio::spawn(write_all(seckill, queued).instrument(tracing::info_span!("order_writer")));
        OrderQueue { orders }
    }

    /// Queues an admitted order, waiting for room when the queue is full.
    pub(super) async fn push(&self, order: NewOrder) -> Result<(), Error> {
        self.orders.send(order).await.map_err(|_| {
            Error::Internal(anyhow::anyhow!(
                "the order writer has stopped; order {} admitted but not queued",
                order.id
            ))
        })
    }
}

async fn write_all(seckill: Weak<Seckill>, mut queued: mpsc::Receiver<NewOrder>) {
    while let Some(order) = queued.recv().await {
        let Some(seckill) = seckill.upgrade() else {
            break;
        };
        seckill.write_queued(order).await;
    }
}

impl Seckill {
    /// Writes one admitted order, retrying what may pass, then takes it off
    /// the pending orders. An order MySQL refuses (the user already holds
    /// one, the stock row is empty) only happens when Redis and MySQL
    /// disagree, after Redis lost data: the buyer was told "success" anyway.
    async fn write_queued(&self, order: NewOrder) {
        let mut retry_after = FIRST_RETRY_AFTER;
        for attempt in 1..=WRITE_ATTEMPTS {
            match self.write_under_lock(order).await {
                Ok(written) => {
                    if written != order.id {
                        tracing::warn!(admitted = %order.id, %written,
                            "order written under another id (id counter reset)");
                    }
                    break;
                }
                Err(Error::Rejected(Rejection::DuplicateRequest)) | Err(Error::Unavailable(_))
                    if attempt < WRITE_ATTEMPTS =>
                {
                    tokio::time::sleep(retry_after).await;
                    retry_after *= 2;
                }
                Err(Error::Rejected(refused)) => {
                    tracing::warn!(order_id = %order.id, user_id = %order.user_id,
                        voucher_id = %order.voucher_id, refused = refused.code(),
                        "admitted order refused by MySQL: Redis and MySQL disagree");
                    break;
                }
                Err(error) => {
                    // Left pending: the order is admitted and unwritten.
                    tracing::error!(order_id = %order.id, user_id = %order.user_id,
                        voucher_id = %order.voucher_id, ?error, "admitted order not written");
                    return;
                }
            }
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
