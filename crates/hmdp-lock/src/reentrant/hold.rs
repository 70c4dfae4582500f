//! The hold behind a reentrant lock's guards (Redisson's `RedissonBaseLock`):
//! one shared hold per holder and key that re-entries join, the guard that
//! gives back exactly one hold, and the release that retries a lost reply
//! without taking a second hold away.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::lease::Lease;
use super::watchdog::Watching;
use crate::connection::Connection;
use crate::lock::{release_dropped, LockError, LockGuard, Release};
use crate::observer::LostReason;
use crate::owner;
use crate::owner::Holder;
use crate::scripts::GiveBack;

/// Sent at most this many times per release; the latch outlives them all
/// ([`RELEASE_LATCH`](crate::scripts::RELEASE_LATCH)).
const RELEASE_ATTEMPTS: u32 = 3;
/// ... and this many when Redis Cluster answers that it is moving the slot
/// (a failover takes a few seconds; the script has not run).
const RELEASE_ATTEMPTS_IN_FAILOVER: u32 = 10;

/// A take that landed, as [`guard`] needs it.
pub(super) struct Landed<'a> {
    pub key: &'a str,
    pub holder: Holder,
    /// How the holder is written into Redis ([`Holder::owner`]).
    pub owner: String,
    /// Whether the holder may come back for the key (a caller's own
    /// [`Holder`]): only then is the hold entered in the registry, where a
    /// re-entry finds it. A holder minted for one acquisition never does.
    pub reenterable: bool,
    pub lease: Duration,
    /// The holder's holds of the key now, this one included.
    pub count: u32,
    /// When the command that set the lease was sent.
    pub sent: Instant,
}

/// Whether `holder` has a live hold of `key` in this process.
pub(super) fn is_held(registry: &Registry, key: &str, holder: Holder) -> bool {
    holds_of(registry, key, holder) > 0
}

/// How many holds of `key` `holder`'s guards in this process have.
pub(super) fn holds_of(registry: &Registry, key: &str, holder: Holder) -> u32 {
    registry
        .lock()
        .expect("registry poisoned")
        .get(&(key.to_owned(), holder))
        .and_then(Weak::upgrade)
        .map_or(0, |hold| {
            u32::try_from(hold.guards.load(Ordering::SeqCst)).unwrap_or(u32::MAX)
        })
}

/// Gives back `extra` holds of `key` that a take counted more than once:
/// redis-rs's cluster connection sends a command again when its connection
/// drops before the reply, and a take sent twice counts two holds, of which
/// the caller's guard gives back one. Each goes back as a release of its
/// own, retried as any release is.
pub(super) async fn give_back_extra(
    redis: &Connection,
    key: &str,
    owner: &str,
    lease: Duration,
    extra: u32,
) -> Result<(), LockError> {
    for _ in 0..extra {
        let release_id = owner::unique_name(owner);
        let mut progress = ReleaseProgress {
            lease_running: true,
            ..ReleaseProgress::default()
        };
        release(redis, key, owner, lease, &release_id, &mut progress).await?;
    }
    Ok(())
}

/// The live holds of this process by (key, holder), so that a re-entry joins
/// the hold (and watchdog) its holder already has. Weak: a hold lives as long
/// as its guards.
pub(super) type Registry = Mutex<HashMap<(String, Holder), Weak<Hold>>>;

/// One holder's hold on one key, shared by all of its reentrant guards.
pub(super) struct Hold {
    pub(super) lease: Arc<Lease>,
    holder: Holder,
    /// Guards of this hold not yet giving their hold back.
    guards: AtomicUsize,
    /// The watchdog's renewals of this hold, stopped when dropped.
    renewal: Mutex<Option<Watching>>,
    /// The registry this hold is entered in, if any (see [`Landed`]).
    registry: Option<Arc<Registry>>,
}

impl Hold {
    /// One guard starts giving its hold back; the last one stops the
    /// watchdog first, so that no renewal reports the key it deletes as lost.
    fn guard_leaves(&self) {
        if self.guards.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.lease.releasing.store(true, Ordering::SeqCst);
            let renewal = self.renewal.lock().expect("hold poisoned").take();
            drop(renewal);
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let renewal = self.renewal.lock().expect("hold poisoned").take();
        drop(renewal);
        let Some(registry) = &self.registry else {
            return;
        };
        let mut holds = registry.lock().expect("registry poisoned");
        // The watchdog's watch went with the renewal: the lease is usually
        // this hold's alone now, and its key moves out instead of a copy.
        let key = match Arc::get_mut(&mut self.lease) {
            Some(lease) => std::mem::take(&mut lease.key),
            None => self.lease.key.clone(),
        };
        let entry = (key, self.holder);
        if holds
            .get(&entry)
            .is_some_and(|hold| hold.strong_count() == 0)
        {
            holds.remove(&entry);
        }
    }
}

/// The guard of a take that left `holder` with `count` holds of `key`,
/// its lease set by a command sent at `sent`: a re-entry joins the
/// holder's live hold, a first take starts one, and `watchdog` with it.
pub(super) fn guard(
    registry: &Arc<Registry>,
    redis: &Connection,
    landed: Landed<'_>,
    watchdog: impl FnOnce(&Arc<Lease>) -> Option<Watching>,
) -> Box<dyn LockGuard> {
    let Landed {
        key,
        holder,
        owner,
        reenterable,
        lease,
        count,
        sent,
    } = landed;
    let mut holds = reenterable.then(|| registry.lock().expect("registry poisoned"));
    let entry = (key.to_owned(), holder);
    let existing = holds
        .as_ref()
        .and_then(|holds| holds.get(&entry).and_then(Weak::upgrade));
    let hold = match existing {
        Some(hold) if count > 1 => {
            // The re-entry reset the lease.
            hold.lease.renewed(sent);
            hold.guards.fetch_add(1, Ordering::SeqCst);
            hold
        }
        _ => {
            let hold = Arc::new(Hold {
                lease: Arc::new(Lease::new(key.to_owned(), owner, lease, sent)),
                holder,
                guards: AtomicUsize::new(1),
                renewal: Mutex::new(None),
                registry: reenterable.then(|| registry.clone()),
            });
            *hold.renewal.lock().expect("hold poisoned") = watchdog(&hold.lease);
            if let Some(holds) = &mut holds {
                holds.insert(entry, Arc::downgrade(&hold));
            }
            hold
        }
    };
    drop(holds);
    Box::new(ReentrantHold {
        redis: redis.clone(),
        release_id: owner::unique_name(&hold.lease.owner),
        hold,
        progress: ReleaseProgress::default(),
        released: false,
    })
}

/// One acquisition's guard: gives back exactly one hold, on `release` or,
/// failing that, when dropped (a panic or a cancelled task included).
struct ReentrantHold {
    redis: Connection,
    hold: Arc<Hold>,
    /// Names this release for the idempotency latch.
    release_id: String,
    progress: ReleaseProgress,
    released: bool,
}

/// How far one guard's release got: a release abandoned midway (its future
/// dropped after an attempt was sent) is resumed from here by `Drop`, as a
/// retry that finds the first attempt's answer. Sent again as a first
/// attempt, it would skip the latch and take a second hold away.
#[derive(Default)]
struct ReleaseProgress {
    /// Attempts sent so far.
    sent: u32,
    /// Whether one of them may have run: its reply was lost, or it was
    /// abandoned in flight. (A cluster's redirection says it did not.)
    may_have_run: bool,
    /// Whether the key was surely still ours when the first one was sent.
    lease_running: bool,
}

/// Gives back one guard's hold of `hold`, or resumes doing so.
async fn give_back(
    redis: &Connection,
    hold: &Hold,
    release_id: &str,
    progress: &mut ReleaseProgress,
) -> Result<Release, LockError> {
    if progress.sent == 0 {
        progress.lease_running = hold.lease.running();
        hold.guard_leaves();
    }
    release(
        redis,
        &hold.lease.key,
        &hold.lease.owner,
        hold.lease.length,
        release_id,
        progress,
    )
    .await
}

impl crate::lock::sealed::InKey for ReentrantHold {
    fn owner_in_key(&self) -> Option<&str> {
        Some(&self.hold.lease.owner)
    }
}

#[async_trait]
impl LockGuard for ReentrantHold {
    async fn release(mut self: Box<Self>) -> Result<Release, LockError> {
        let this = &mut *self;
        let outcome = give_back(
            &this.redis,
            &this.hold,
            &this.release_id,
            &mut this.progress,
        )
        .await;
        // Only now: a release abandoned halfway (its future dropped) leaves
        // `released` unset, and `Drop` resumes it.
        self.released = true;
        outcome
    }

    async fn ensure_held(&self) -> Result<(), LockError> {
        if self.hold.lease.lost.load(Ordering::SeqCst) {
            return Err(LockError::Lost(LostReason::TakenOrGone));
        }
        if Instant::now() >= self.hold.lease.valid_until() {
            return Err(LockError::Lost(LostReason::LeaseExpired));
        }
        Ok(())
    }
}

impl Drop for ReentrantHold {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let redis = self.redis.clone();
        let hold = self.hold.clone();
        let release_id = std::mem::take(&mut self.release_id);
        let mut progress = std::mem::take(&mut self.progress);
        release_dropped(hold.lease.key.clone(), async move {
            give_back(&redis, &hold, &release_id, &mut progress).await
        });
    }
}

/// Gives back one hold, retrying (with the same release id) when the reply
/// is lost, so the answer is the first attempt's; `progress` counts the
/// attempts sent, this call's and any earlier call's for the same release.
async fn release(
    redis: &Connection,
    key: &str,
    owner: &str,
    lease: Duration,
    release_id: &str,
    progress: &mut ReleaseProgress,
) -> Result<Release, LockError> {
    loop {
        let earlier_may_have_run = progress.may_have_run;
        progress.sent += 1;
        progress.may_have_run = true;
        let attempt = progress.sent;
        let given_back = GiveBack {
            key,
            owner,
            lease,
            release_id,
            attempt,
            take_marker: None,
        }
        .run(&mut redis.clone())
        .await;
        match given_back {
            Ok(given_back) => {
                // Only an earlier attempt that may have run can explain a
                // key found gone or someone else's.
                let retried_in_lease = earlier_may_have_run && progress.lease_running;
                return Ok(given_back.release(retried_in_lease));
            }
            Err(LockError::Redis(error)) if attempt < RELEASE_ATTEMPTS && is_transient(&error) => {
                tracing::debug!(%error, attempt, "lock release reply lost; retrying");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
            // A cluster's redirection or "down" answer (a failover moving
            // the slot): the script did not run.
            Err(LockError::Redis(error))
                if attempt < RELEASE_ATTEMPTS_IN_FAILOVER && error.is_cluster_error() =>
            {
                progress.may_have_run = earlier_may_have_run;
                tracing::debug!(%error, attempt, "lock release redirected; retrying");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt.min(5)))).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Gives back the hold an abandoned acquisition may have taken, if dropped
/// while armed.
pub(super) struct Undo<'a> {
    pub(super) armed: bool,
    pub(super) redis: &'a Connection,
    pub(super) key: &'a str,
    pub(super) owner: &'a str,
    pub(super) lease: Duration,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (redis, lease) = (self.redis.clone(), self.lease);
        let (key, owner) = (self.key.to_owned(), self.owner.to_owned());
        runtime.spawn(async move {
            let release_id = owner::unique_name(&owner);
            // Whether the acquisition took the key at all is unknown.
            let mut progress = ReleaseProgress::default();
            let undone = release(&redis, &key, &owner, lease, &release_id, &mut progress).await;
            tracing::debug!(?undone, %key, "undid an abandoned acquisition");
        });
    }
}

pub(super) fn is_transient(error: &redis::RedisError) -> bool {
    error.is_io_error() || error.is_timeout() || error.is_connection_dropped()
}
