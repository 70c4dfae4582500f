//! Each node's closer, a background task: closes the orders whose due time
//! came (claimed in Redis, so two nodes never work on one at once; the
//! conditional close makes a second attempt harmless anyway), sweeps MySQL
//! for unpaid orders past their deadline that Redis lost the due time of,
//! sends the give-backs a killed node left owed, and reads the order
//! metrics.
//!
//! Stopping it at any `.await` loses nothing: a close either committed (its
//! give-back is owed in MySQL until sent) or did not (its order comes due
//! again when its claim's lease ends, or the sweep finds it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::AfterSale;
use crate::error::Error;
use crate::ids::OrderId;
use crate::metrics;
use crate::store::{CloseCause, Closing, OrderState};

/// How often due times are claimed.
const TICK: Duration = Duration::from_millis(250);
/// Orders claimed per round trip, and closed at once; at most this many
/// rounds a tick, so that a burst of deadlines (or orders MySQL keeps
/// finding not due) leaves the rest of the closer's work its turn.
const CLAIM_BATCH: usize = 100;
const ROUNDS_PER_TICK: usize = 10;
const CLOSING_AT_ONCE: usize = 8;
/// An order MySQL finds not due yet (the nodes' clocks run ahead of its
/// own) is looked at again this much later.
const NOT_DUE_RETRY: Duration = Duration::from_secs(1);
/// How long past its deadline an unpaid order is before the sweep closes
/// it: the due times in Redis close orders within a tick, so the sweep
/// only finds those Redis lost.
const SWEEP_GRACE: Duration = Duration::from_secs(5);
const SWEEP_BATCH: u32 = 500;
/// A give-back owed this long was left by a closer that died or lost Redis
/// (a live closer sends its own at once); sent again every so often.
const OWED_FOR: Duration = Duration::from_secs(2);
const RESEND_EVERY: Duration = Duration::from_secs(1);
const RESEND_BATCH: u32 = 500;
/// How often the order metrics (the give-backs owed among them) are read
/// from MySQL.
const METRICS_EVERY: Duration = Duration::from_secs(5);

/// A node's closer.
pub struct Closer {
    after_sale: Arc<AfterSale>,
    sweep_every: Duration,
}

/// A running closer, stopped when dropped or told.
pub struct RunningCloser(JoinHandle<()>);

impl RunningCloser {
    pub fn stop(self) {
        self.0.abort();
    }
}

impl Closer {
    pub fn new(after_sale: Arc<AfterSale>, sweep_every: Duration) -> Self {
        Closer {
            after_sale,
            sweep_every,
        }
    }

    pub fn spawn(self) -> RunningCloser {
        RunningCloser(tokio::spawn(self.run()))
    }

    async fn run(self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first sweep, resend and read happen at once: a node starting
        // after a Redis loss closes what is overdue without waiting.
        let long_ago = Instant::now() - self.sweep_every.max(METRICS_EVERY);
        let (mut swept, mut resent, mut read) = (long_ago, long_ago, long_ago);
        loop {
            tick.tick().await;
            self.close_due().await;
            if resent.elapsed() >= RESEND_EVERY {
                resent = Instant::now();
                self.resend_owed().await;
            }
            if swept.elapsed() >= self.sweep_every {
                swept = Instant::now();
                self.sweep().await;
            }
            if read.elapsed() >= METRICS_EVERY {
                read = Instant::now();
                self.read_metrics().await;
            }
        }
    }

    /// Closes the orders whose due time came, a batch at a time.
    async fn close_due(&self) {
        for _ in 0..ROUNDS_PER_TICK {
            let claimed = match self.after_sale.deadlines().claim(CLAIM_BATCH).await {
                Ok(claimed) => claimed,
                Err(error) => {
                    tracing::debug!(%error, "due times not claimed; the sweep covers them");
                    return;
                }
            };
            let full = claimed.len() == CLAIM_BATCH;
            self.close_all(claimed, CloseCause::Timeout).await;
            if !full {
                return;
            }
        }
    }

    async fn close_all(&self, orders: Vec<OrderId>, cause: CloseCause) {
        futures::stream::iter(orders)
            .for_each_concurrent(CLOSING_AT_ONCE, |order_id| async move {
                match self.after_sale.close(order_id, None, cause).await {
                    Ok(Closing::NotDue) => {
                        let retry = self
                            .after_sale
                            .deadlines()
                            .retry_in(order_id, NOT_DUE_RETRY);
                        if let Err(error) = retry.await {
                            tracing::debug!(%order_id, %error, "due time not moved");
                        }
                    }
                    Ok(_) => {}
                    Err(error) => log_failed(order_id, cause, &error),
                }
            })
            .await;
    }

    /// Closes unpaid orders past their deadline that no due time closed,
    /// a batch at a time until none is left (or [`ROUNDS_PER_TICK`]).
    async fn sweep(&self) {
        let store = self.after_sale.store();
        let timeout = self.after_sale.deadlines().pay_timeout();
        for _ in 0..ROUNDS_PER_TICK {
            let overdue = match store
                .overdue_unpaid(timeout, SWEEP_GRACE, SWEEP_BATCH)
                .await
            {
                Ok(overdue) => overdue,
                Err(error) => {
                    tracing::warn!(%error, "sweep of overdue orders failed");
                    return;
                }
            };
            if overdue.is_empty() {
                return;
            }
            let full = overdue.len() == SWEEP_BATCH as usize;
            tracing::info!(
                orders = overdue.len(),
                "sweep found unpaid orders past their deadline with no due time; closing them"
            );
            self.close_all(overdue, CloseCause::Sweep).await;
            if !full {
                return;
            }
        }
    }

    /// Sends the give-backs still owed after a closer died or lost Redis.
    async fn resend_owed(&self) {
        let store = self.after_sale.store();
        let owed = match store.givebacks_owed(OWED_FOR, RESEND_BATCH).await {
            Ok(owed) => owed,
            Err(error) => {
                tracing::debug!(%error, "owed give-backs not read");
                return;
            }
        };
        for giveback in owed {
            tracing::info!(order_id = %giveback.order_id, voucher_id = %giveback.voucher_id,
                "sending a give-back still owed to Redis");
            if let Err(error) = self.after_sale.give_back(giveback).await {
                tracing::warn!(order_id = %giveback.order_id, ?error, "give-back failed again");
                return;
            }
        }
    }

    async fn read_metrics(&self) {
        let store = self.after_sale.store();
        match store.orders_by_status().await {
            Ok(counts) => {
                for state in OrderState::ALL {
                    let count = counts
                        .iter()
                        .find(|(status, _)| *status == state as u8)
                        .map_or(0, |(_, count)| *count);
                    metrics::ORDERS_BY_STATUS
                        .with_label_values(&[state.label()])
                        .set(count);
                }
            }
            Err(error) => tracing::debug!(%error, "order counts not read"),
        }
        let timeout = self.after_sale.deadlines().pay_timeout();
        match store.oldest_overdue_seconds(timeout).await {
            Ok(seconds) => metrics::UNPAID_OVERDUE.set(seconds),
            Err(error) => tracing::debug!(%error, "oldest overdue order not read"),
        }
        // Those the resend works on: younger ones are their closers' own,
        // on their way to Redis.
        match store.count_givebacks_owed(OWED_FOR).await {
            Ok(owed) => metrics::GIVEBACKS_OWED.set(owed),
            Err(error) => tracing::debug!(%error, "owed give-backs not counted"),
        }
    }
}

fn log_failed(order_id: OrderId, cause: CloseCause, error: &Error) {
    tracing::warn!(%order_id, cause = cause.label(), ?error,
        "closing an overdue order failed; it comes due again");
}
