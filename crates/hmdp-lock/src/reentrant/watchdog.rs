//! The watchdog (Redisson's `lockWatchdogTimeout` renewal): keeps a hold's
//! lease alive every third of it while the hold lives, up to a maximum hold,
//! and marks the hold lost when a renewal finds the key gone or cannot reach
//! Redis before the lease runs out.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::hold::Hold;
use crate::scripts;
use crate::{LockEvent, LostReason, Observer};

/// A failed renewal is retried this often until the lease runs out.
const RENEW_RETRY: Duration = Duration::from_millis(500);

/// What the watchdogs of one lock are doing, for tests and operators.
pub(super) struct Watchdogs {
    observer: Arc<dyn Observer>,
    /// Watchdog tasks alive right now.
    renewing: AtomicUsize,
    /// Holds a watchdog found taken or gone, or could not renew in time.
    lost: AtomicU64,
}

impl Watchdogs {
    pub(super) fn new(observer: Arc<dyn Observer>) -> Self {
        Watchdogs {
            observer,
            renewing: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
        }
    }

    /// Holds whose lease a watchdog is renewing right now.
    pub(super) fn renewing(&self) -> usize {
        self.renewing.load(Ordering::SeqCst)
    }

    /// Holds a watchdog declared lost so far.
    pub(super) fn lost(&self) -> u64 {
        self.lost.load(Ordering::SeqCst)
    }
}

/// Starts the watchdog of `hold`, renewing on `redis` until the task is
/// aborted, or `stop_at` (the maximum hold) passes.
pub(super) fn start(
    watchdogs: &Arc<Watchdogs>,
    hold: &Arc<Hold>,
    redis: ConnectionManager,
    stop_at: Option<Instant>,
) -> JoinHandle<()> {
    tokio::spawn(renew(
        Arc::downgrade(hold),
        redis,
        stop_at,
        Renewing::start(watchdogs),
    ))
}

/// Counts a live watchdog for as long as its task exists (aborted included).
struct Renewing(Arc<Watchdogs>);

impl Renewing {
    fn start(watchdogs: &Arc<Watchdogs>) -> Self {
        watchdogs.renewing.fetch_add(1, Ordering::SeqCst);
        Renewing(watchdogs.clone())
    }

    /// Marks `hold` lost, unless its release has begun: a renewal that
    /// crossed the release finds the key gone because it was given back.
    fn lost(&self, hold: &Hold, reason: LostReason) -> bool {
        if hold.releasing.load(Ordering::SeqCst) {
            return false;
        }
        hold.lost.store(true, Ordering::SeqCst);
        self.0.lost.fetch_add(1, Ordering::SeqCst);
        self.0.observer.observe(LockEvent::HoldLost(reason));
        true
    }
}

impl Drop for Renewing {
    fn drop(&mut self) {
        self.0.renewing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The watchdog of one hold: renews its lease every third of it until the
/// hold ends (the task is aborted), the maximum hold time passes, or the key
/// turns out to be lost.
async fn renew(
    hold: Weak<Hold>,
    redis: ConnectionManager,
    stop_at: Option<Instant>,
    renewing: Renewing,
) {
    let Some(lease) = hold.upgrade().map(|hold| hold.lease) else {
        return;
    };
    let every = lease / 3;
    let mut next = Instant::now() + every;
    loop {
        tokio::time::sleep_until(next).await;
        if stop_at.is_some_and(|stop| Instant::now() >= stop) {
            tracing::warn!("lock held past its maximum hold time; no longer renewing its lease");
            return;
        }
        let Some(hold) = hold.upgrade() else {
            return;
        };
        let sent = Instant::now();
        let renewed = tokio::time::timeout(
            every,
            scripts::renew(&mut redis.clone(), &hold.key, &hold.owner, lease),
        )
        .await;
        match renewed {
            Ok(Ok(true)) => {
                renewing.0.observer.observe(LockEvent::LeaseRenewed);
                *hold.valid_until.lock().expect("hold poisoned") = sent + lease;
                next = sent + every;
            }
            Ok(Ok(false)) => {
                if renewing.lost(&hold, LostReason::TakenOrGone) {
                    tracing::warn!(key = %hold.key, "lock lost: the watchdog found it taken or gone");
                }
                return;
            }
            Ok(Err(_)) | Err(_) => {
                let now = Instant::now();
                if now >= *hold.valid_until.lock().expect("hold poisoned") {
                    if renewing.lost(&hold, LostReason::RedisUnreachable) {
                        tracing::warn!(key = %hold.key, "lock lost: Redis unreachable until the lease ran out");
                    }
                    return;
                }
                next = now + RENEW_RETRY.min(every);
            }
        }
    }
}
