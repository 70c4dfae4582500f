//! Each node's closer, a background task (or one round on demand,
//! [`Closer::run_once`]): closes the orders whose due time came (claimed in
//! Redis, so two nodes never work on one at once; the conditional close
//! makes a second attempt harmless anyway), sweeps MySQL for unpaid orders
//! past their deadline that Redis lost the due time of, sends the
//! give-backs a killed node left owed, and reads the order metrics.
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

/// A node's closer: [`Closer::spawn`] runs it in the background, and
/// [`Closer::run_once`] does its work once, now (what a test drives
/// instead of waiting for its timers).
#[derive(Clone)]
pub struct Closer {
    after_sale: Arc<AfterSale>,
    sweep_every: Duration,
}

/// What a round of the closer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Orders closed at their due time.
    pub closed_due: usize,
    /// Orders the sweep of MySQL closed.
    pub swept: usize,
    /// Give-backs still owed sent to Redis.
    pub resent: usize,
}

/// Which of the closer's jobs besides the due times a round does.
#[derive(Debug, Clone, Copy)]
struct Jobs {
    resend: bool,
    sweep: bool,
    read_metrics: bool,
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

    /// Every job once, now: the orders due closed, the give-backs owed
    /// sent, the sweep, the metrics read.
    pub async fn run_once(&self) -> Round {
        let jobs = Jobs {
            resend: true,
            sweep: true,
            read_metrics: true,
        };
        self.round(jobs).await
    }

    /// A round every tick: the due times each time, the other jobs each
    /// at its own interval.
    async fn run(self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first sweep, resend and read happen at once: a node starting
        // after a Redis loss closes what is overdue without waiting.
        let long_ago = Instant::now() - self.sweep_every.max(METRICS_EVERY);
        let (mut resent, mut swept, mut read) = (long_ago, long_ago, long_ago);
        loop {
            tick.tick().await;
            let jobs = Jobs {
                resend: came(&mut resent, RESEND_EVERY),
                sweep: came(&mut swept, self.sweep_every),
                read_metrics: came(&mut read, METRICS_EVERY),
            };
            self.round(jobs).await;
        }
    }

    async fn round(&self, jobs: Jobs) -> Round {
        let mut round = Round {
            closed_due: self.close_due().await,
            ..Round::default()
        };
        if jobs.resend {
            round.resent = self.resend_owed().await;
        }
        if jobs.sweep {
            round.swept = self.sweep().await;
        }
        if jobs.read_metrics {
            self.read_metrics().await;
        }
        round
    }

    /// Closes the orders whose due time came, a batch at a time; how many
    /// it closed.
    async fn close_due(&self) -> usize {
        let mut closed = 0;
        for _ in 0..ROUNDS_PER_TICK {
            let claimed = match self.after_sale.deadlines().claim(CLAIM_BATCH).await {
                Ok(claimed) => claimed,
                Err(error) => {
                    tracing::debug!(%error, "due times not claimed; the sweep covers them");
                    break;
                }
            };
            let full = claimed.len() == CLAIM_BATCH;
            closed += self.close_all(claimed, CloseCause::Timeout).await;
            if !full {
                break;
            }
        }
        closed
    }

    /// Closes `orders`, a few at once; how many it closed (the others were
    /// settled already, not due, or failed).
    async fn close_all(&self, orders: Vec<OrderId>, cause: CloseCause) -> usize {
        futures::stream::iter(orders)
            .map(|order_id| async move {
                match self.after_sale.close(order_id, None, cause).await {
                    Ok(Closing::Closed(_)) => true,
                    Ok(Closing::NotDue) => {
                        let retry = self
                            .after_sale
                            .deadlines()
                            .retry_in(order_id, NOT_DUE_RETRY);
                        if let Err(error) = retry.await {
                            tracing::debug!(%order_id, %error, "due time not moved");
                        }
                        false
                    }
                    Ok(Closing::Settled(_) | Closing::NotFound) => false,
                    Err(error) => {
                        log_failed(order_id, cause, &error);
                        false
                    }
                }
            })
            .buffer_unordered(CLOSING_AT_ONCE)
            .filter(|closed| std::future::ready(*closed))
            .count()
            .await
    }

    /// Closes unpaid orders past their deadline that no due time closed,
    /// a batch at a time until none is left (or [`ROUNDS_PER_TICK`]); how
    /// many it closed.
    async fn sweep(&self) -> usize {
        let store = self.after_sale.store();
        let timeout = self.after_sale.deadlines().pay_timeout();
        let mut closed = 0;
        for _ in 0..ROUNDS_PER_TICK {
            let overdue = match store
                .overdue_unpaid(timeout, SWEEP_GRACE, SWEEP_BATCH)
                .await
            {
                Ok(overdue) => overdue,
                Err(error) => {
                    tracing::warn!(%error, "sweep of overdue orders failed");
                    break;
                }
            };
            if overdue.is_empty() {
                break;
            }
            let full = overdue.len() == SWEEP_BATCH as usize;
            tracing::info!(
                orders = overdue.len(),
                "sweep found unpaid orders past their deadline with no due time; closing them"
            );
            closed += self.close_all(overdue, CloseCause::Sweep).await;
            if !full {
                break;
            }
        }
        closed
    }

    /// Sends the give-backs still owed after a closer died or lost Redis;
    /// how many it sent.
    async fn resend_owed(&self) -> usize {
        let store = self.after_sale.store();
        let owed = match store.givebacks_owed(OWED_FOR, RESEND_BATCH).await {
            Ok(owed) => owed,
            Err(error) => {
                tracing::debug!(%error, "owed give-backs not read");
                return 0;
            }
        };
        let mut sent = 0;
        for giveback in owed {
            tracing::info!(order_id = %giveback.order_id, voucher_id = %giveback.voucher_id,
                "sending a give-back still owed to Redis");
            if let Err(error) = self.after_sale.give_back(giveback).await {
                tracing::warn!(order_id = %giveback.order_id, ?error, "give-back failed again");
                break;
            }
            sent += 1;
        }
        sent
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

/// Whether a job run every `every`, last at `last`, is due; if so, it
/// counts as run now.
fn came(last: &mut Instant, every: Duration) -> bool {
    let due = last.elapsed() >= every;
    if due {
        *last = Instant::now();
    }
    due
}

fn log_failed(order_id: OrderId, cause: CloseCause, error: &Error) {
    tracing::warn!(%order_id, cause = cause.label(), ?error,
        "closing an overdue order failed; it comes due again");
}
