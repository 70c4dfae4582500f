//! The watchdog (Redisson's `lockWatchdogTimeout` renewal): keeps a hold's
//! lease alive every third of it while the hold lives, up to a maximum hold,
//! and marks the hold lost when a renewal finds the key gone or cannot reach
//! Redis before the lease runs out.
//!
//! One renewal task serves every hold of a lock (as Redisson's renewal
//! scheduler does), not a task per hold: most holds end within milliseconds,
//! long before their first renewal, and for them a hold's watch is an entry
//! put into a map and taken out again. A task of their own, with its timer,
//! cost more client work than the acquisition's command. The task runs
//! while there is something to renew and ends when nothing is left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;

use super::lease::Lease;
use crate::connection::Connection;
use crate::observer::{LockEvent, LostReason, Observer};
use crate::scripts;

/// A failed renewal is retried this often until the lease runs out.
const RENEW_RETRY: Duration = Duration::from_millis(500);

/// The watchdog of one lock: the holds it renews and what it has seen.
pub(super) struct Watchdogs {
    redis: Connection,
    observer: Arc<dyn Observer>,
    watched: Mutex<Watched>,
    /// Holds found taken or gone, or not renewed in time.
    lost: AtomicU64,
}

/// The holds being renewed, under one lock.
#[derive(Default)]
struct Watched {
    /// By watch number.
    watches: HashMap<u64, Watch>,
    next_number: u64,
    /// Whether the renewal task is alive; it ends once `watches` is empty.
    renewing_task: bool,
}

/// One hold's renewal schedule.
struct Watch {
    lease: Weak<Lease>,
    /// When its lease is next renewed.
    due: Instant,
    /// The maximum hold: no renewal after it.
    stop_at: Option<Instant>,
}

impl Watchdogs {
    pub(super) fn new(redis: Connection, observer: Arc<dyn Observer>) -> Self {
        Watchdogs {
            redis,
            observer,
            watched: Mutex::new(Watched::default()),
            lost: AtomicU64::new(0),
        }
    }

    /// Holds whose lease is being renewed right now.
    pub(super) fn renewing(&self) -> usize {
        self.watched().watches.len()
    }

    /// Holds declared lost so far.
    pub(super) fn lost(&self) -> u64 {
        self.lost.load(Ordering::SeqCst)
    }

    fn watched(&self) -> MutexGuard<'_, Watched> {
        self.watched.lock().expect("watchdog poisoned")
    }

    /// Marks `hold` lost, unless its release has begun: a renewal that
    /// crossed the release finds the key gone because it was given back.
    fn declare_lost(&self, lease: &Lease, reason: LostReason) -> bool {
        if lease.releasing.load(Ordering::SeqCst) {
            return false;
        }
        lease.lost.store(true, Ordering::SeqCst);
        self.lost.fetch_add(1, Ordering::SeqCst);
        self.observer.observe(LockEvent::HoldLost(reason));
        true
    }
}

/// A hold's place in its lock's watchdog: dropping it stops the renewals.
pub(super) struct Watching {
    watchdogs: Arc<Watchdogs>,
    number: u64,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.watchdogs.watched().watches.remove(&self.number);
    }
}

/// Starts renewing `lease`, a third of it from now, until the
/// returned [`Watching`] is dropped or `stop_at` (the maximum hold) passes.
pub(super) fn watch(
    watchdogs: &Arc<Watchdogs>,
    lease: &Arc<Lease>,
    stop_at: Option<Instant>,
) -> Watching {
    let mut watched = watchdogs.watched();
    let number = watched.next_number;
    watched.next_number += 1;
    watched.watches.insert(
        number,
        Watch {
            lease: Arc::downgrade(lease),
            due: Instant::now() + lease.length / 3,
            stop_at,
        },
    );
    // A new watch is never due before the others: every due time is at most
    // a third of a lease ahead. So a running task, asleep until the earliest
    // one, need not be woken.
    if !watched.renewing_task {
        watched.renewing_task = true;
        tokio::spawn(renew_while_watched(Arc::downgrade(watchdogs)));
    }
    Watching {
        watchdogs: watchdogs.clone(),
        number,
    }
}

/// A watch due now, taken out of the map's lock to be renewed.
struct Due {
    number: u64,
    lease: Arc<Lease>,
}

/// The renewal task: sleeps until the earliest watch is due, renews every
/// watch due then (concurrently), and ends when nothing is watched or the
/// lock is gone.
async fn renew_while_watched(watchdogs: Weak<Watchdogs>) {
    loop {
        let Some(next) = ({
            let Some(watchdogs) = watchdogs.upgrade() else {
                return;
            };
            let mut watched = watchdogs.watched();
            let next = watched.watches.values().map(|watch| watch.due).min();
            if next.is_none() {
                watched.renewing_task = false;
            }
            next
        }) else {
            return;
        };
        tokio::time::sleep_until(next).await;
        let Some(watchdogs) = watchdogs.upgrade() else {
            return;
        };
        let due = take_due(&watchdogs);
        join_all(due.into_iter().map(|due| renew(&watchdogs, due))).await;
    }
}

/// The watches due now; those past their maximum hold or whose hold is gone
/// leave the map.
fn take_due(watchdogs: &Watchdogs) -> Vec<Due> {
    let now = Instant::now();
    let mut due = Vec::new();
    watchdogs.watched().watches.retain(|&number, watch| {
        if watch.due > now {
            return true;
        }
        if watch.stop_at.is_some_and(|stop| now >= stop) {
            tracing::warn!("lock held past its maximum hold time; no longer renewing its lease");
            return false;
        }
        match watch.lease.upgrade() {
            Some(lease) => {
                due.push(Due { number, lease });
                true
            }
            None => false,
        }
    });
    due
}

/// Renews one due hold and schedules its next renewal, or ends its watch.
async fn renew(watchdogs: &Watchdogs, Due { number, lease }: Due) {
    let every = lease.length / 3;
    let sent = Instant::now();
    let renewed = tokio::time::timeout(
        every,
        scripts::renew(
            &mut watchdogs.redis.clone(),
            &lease.key,
            &lease.owner,
            lease.length,
        ),
    )
    .await;
    let mut watched = watchdogs.watched();
    // Released meanwhile: whatever the renewal found, the watch is over.
    let Some(watch) = watched.watches.get_mut(&number) else {
        return;
    };
    match renewed {
        Ok(Ok(true)) => {
            watchdogs.observer.observe(LockEvent::LeaseRenewed);
            lease.renewed(sent);
            watch.due = sent + every;
        }
        Ok(Ok(false)) => {
            watched.watches.remove(&number);
            if watchdogs.declare_lost(&lease, LostReason::TakenOrGone) {
                tracing::warn!(key = %lease.key, "lock lost: the watchdog found it taken or gone");
            }
        }
        Ok(Err(_)) | Err(_) => {
            let now = Instant::now();
            if now >= lease.valid_until() {
                watched.watches.remove(&number);
                if watchdogs.declare_lost(&lease, LostReason::RedisUnreachable) {
                    tracing::warn!(key = %lease.key, "lock lost: Redis unreachable until the lease ran out");
                }
            } else {
                watch.due = now + RENEW_RETRY.min(every);
            }
        }
    }
}
