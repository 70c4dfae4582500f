//! `--lock reentrant`: a Redisson `RLock`-grade lock, the default mode.
//!
//! - A hash per key maps owner → hold count (`lua/reentrant_lock.lua`), so
//!   the same [`Holder`] re-enters instead of blocking itself; every
//!   acquisition returns its own guard that gives back exactly one hold, when
//!   released or when dropped.
//! - Waiting: a waiter subscribes to the key's release channel before it
//!   retries, then sleeps until a release message or the holder's remaining
//!   lease, whichever comes first, and always stops at its deadline. One
//!   subscription connection serves all waiters ([`ReleaseEvents`]).
//! - Watchdog: without an explicit lease the key gets a 30 s lease renewed
//!   every 10 s while the hold lives, up to a maximum hold time. A renewal
//!   that finds the key gone, or that cannot reach Redis before the lease
//!   runs out, marks the hold lost, and [`HeldLock::ensure_held`] then stops
//!   the work under it from committing.
//! - Release is idempotent per guard: a retry after a lost reply gets the
//!   first attempt's answer, from a latch when holds remain, from the lease
//!   when the first attempt took the last one (`lua/reentrant_unlock.lua`).
//!   A release abandoned midway is resumed by the guard's `Drop` as a retry
//!   of the same release, never sent again as a new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::owner;
use crate::release_events::ReleaseEvents;
use crate::scripts::{self, GiveBack, Take, Taken};
use crate::sibling;
use crate::{release_dropped, HeldLock, Holder, LockError, OrderLock, Release};
use crate::{LockEvent, LockMode, LostReason, Observer, Unobserved};

/// Sent at most this many times per release; the latch outlives them all
/// ([`scripts::RELEASE_LATCH`]).
const RELEASE_ATTEMPTS: u32 = 3;
/// While releases are not being delivered (subscription down), waiters poll.
const POLL: Duration = Duration::from_millis(50);
/// A failed renewal is retried this often until the lease runs out.
const RENEW_RETRY: Duration = Duration::from_millis(500);

/// How a [`ReentrantLock`] leases and waits.
#[derive(Debug, Clone)]
pub struct ReentrantOptions {
    /// An explicit lease: no watchdog, the key simply expires after it.
    pub lease: Option<Duration>,
    /// The watchdog's lease, renewed every third of it.
    pub watchdog_lease: Duration,
    /// The watchdog stops renewing after a hold has lasted this long.
    pub max_hold: Option<Duration>,
    /// How long an acquisition waits for a busy key; zero fails at once.
    pub wait: Duration,
}

impl ReentrantOptions {
    fn lease(&self) -> Duration {
        self.lease.unwrap_or(self.watchdog_lease)
    }
}

/// The reentrant lock of one process.
pub struct ReentrantLock {
    inner: Arc<Inner>,
}

struct Inner {
    redis: ConnectionManager,
    events: ReleaseEvents,
    options: ReentrantOptions,
    holds: Arc<Registry>,
    watchdogs: Arc<Watchdogs>,
}

/// What the watchdogs of one lock are doing, for tests and operators.
struct Watchdogs {
    observer: Arc<dyn Observer>,
    /// Watchdog tasks alive right now.
    renewing: AtomicUsize,
    /// Holds a watchdog found taken or gone, or could not renew in time.
    lost: AtomicU64,
}

/// The live holds of this process by (key, holder), so that a re-entry joins
/// the hold (and watchdog) its holder already has. Weak: a hold lives as long
/// as its guards.
type Registry = Mutex<HashMap<(String, Holder), Weak<Hold>>>;

/// One holder's hold on one key, shared by all of its reentrant guards.
struct Hold {
    key: String,
    holder: Holder,
    owner: String,
    lease: Duration,
    /// Guards of this hold not yet giving their hold back.
    guards: AtomicUsize,
    /// Set when the last guard starts giving back the last hold: a renewal
    /// that finds the key gone from now on saw the release, not a loss.
    releasing: AtomicBool,
    /// Set when a renewal found the key taken or gone.
    lost: AtomicBool,
    /// Until when Redis keeps the key for us, by our clock: counted from
    /// when the command that set the lease was sent, so never too late.
    valid_until: Mutex<Instant>,
    renewal: Mutex<Option<JoinHandle<()>>>,
    registry: Arc<Registry>,
}

impl Hold {
    /// Whether the key is surely still ours: no renewal found it gone and
    /// the lease has not run out by our (conservative) clock.
    fn lease_running(&self) -> bool {
        !self.lost.load(Ordering::SeqCst)
            && Instant::now() < *self.valid_until.lock().expect("hold poisoned")
    }

    /// One guard starts giving its hold back; the last one stops the
    /// watchdog first, so that no renewal reports the key it deletes as lost.
    fn guard_leaves(&self) {
        if self.guards.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.releasing.store(true, Ordering::SeqCst);
            if let Some(renewal) = self.renewal.lock().expect("hold poisoned").take() {
                renewal.abort();
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.lock().expect("hold poisoned").take() {
            renewal.abort();
        }
        let mut holds = self.registry.lock().expect("registry poisoned");
        let entry = (std::mem::take(&mut self.key), self.holder);
        if holds
            .get(&entry)
            .is_some_and(|hold| hold.strong_count() == 0)
        {
            holds.remove(&entry);
        }
    }
}

/// One take, and when the command that set its lease (if taken) was sent.
struct Attempt {
    taken: Taken,
    sent: Instant,
}

impl ReentrantLock {
    /// `client` opens the release subscription (lazily, on the first wait);
    /// `redis` carries the lock commands.
    pub fn new(client: redis::Client, redis: ConnectionManager, options: ReentrantOptions) -> Self {
        Self::observed(client, redis, options, Unobserved::shared())
    }

    /// Like [`ReentrantLock::new`], reporting renewals and lost holds to
    /// `observer`.
    pub fn observed(
        client: redis::Client,
        redis: ConnectionManager,
        options: ReentrantOptions,
        observer: Arc<dyn Observer>,
    ) -> Self {
        ReentrantLock {
            inner: Arc::new(Inner {
                redis,
                events: ReleaseEvents::new(client),
                options,
                holds: Arc::new(Mutex::new(HashMap::new())),
                watchdogs: Arc::new(Watchdogs {
                    observer,
                    renewing: AtomicUsize::new(0),
                    lost: AtomicU64::new(0),
                }),
            }),
        }
    }

    /// Holds whose lease a watchdog is renewing right now.
    pub fn renewing(&self) -> usize {
        self.inner.watchdogs.renewing.load(Ordering::SeqCst)
    }

    /// Holds of this lock that a watchdog declared lost so far.
    pub fn holds_lost(&self) -> u64 {
        self.inner.watchdogs.lost.load(Ordering::SeqCst)
    }

    async fn try_lock(&self, key: &str, holder: Holder, owner: &str) -> Result<Attempt, LockError> {
        let lease = self.inner.options.lease();
        // A caller that gives up while the script is in flight (its future
        // dropped: a timeout, a client gone) may have taken the key with no
        // guard left to give it back; undo that. Not for a re-entry: its
        // extra hold would be undone from the outer guard's count.
        let reentry = self
            .inner
            .holds
            .lock()
            .expect("registry poisoned")
            .get(&(key.to_owned(), holder))
            .is_some_and(|hold| hold.strong_count() > 0);
        let mut undo = Undo {
            armed: !reentry,
            redis: self.inner.redis.clone(),
            key: key.to_owned(),
            owner: owner.to_owned(),
            lease,
        };
        let sent = Instant::now();
        let reply = Take {
            key,
            owner,
            lease,
            marker: None,
        }
        .run(&mut self.inner.redis.clone())
        .await;
        // A lost reply leaves it open whether the script ran: undo it too.
        undo.armed &= matches!(&reply, Err(error) if is_transient(error));
        drop(undo);
        Ok(Attempt {
            taken: reply?,
            sent,
        })
    }

    fn guard(&self, key: &str, holder: Holder, count: u32, sent: Instant) -> Box<dyn HeldLock> {
        let inner = &self.inner;
        let lease = inner.options.lease();
        let mut holds = inner.holds.lock().expect("registry poisoned");
        let entry = (key.to_owned(), holder);
        let existing = holds.get(&entry).and_then(Weak::upgrade);
        let hold = match existing {
            Some(hold) if count > 1 => {
                // The re-entry reset the lease.
                *hold.valid_until.lock().expect("hold poisoned") = sent + lease;
                hold.guards.fetch_add(1, Ordering::SeqCst);
                hold
            }
            _ => {
                let hold = Arc::new(Hold {
                    key: key.to_owned(),
                    holder,
                    owner: holder.owner(),
                    lease,
                    guards: AtomicUsize::new(1),
                    releasing: AtomicBool::new(false),
                    lost: AtomicBool::new(false),
                    valid_until: Mutex::new(sent + lease),
                    renewal: Mutex::new(None),
                    registry: inner.holds.clone(),
                });
                if inner.options.lease.is_none() {
                    let renewal = tokio::spawn(renew(
                        Arc::downgrade(&hold),
                        inner.redis.clone(),
                        inner.options.max_hold.map(|max| sent + max),
                        Renewing::start(&inner.watchdogs),
                    ));
                    *hold.renewal.lock().expect("hold poisoned") = Some(renewal);
                }
                holds.insert(entry, Arc::downgrade(&hold));
                hold
            }
        };
        drop(holds);
        Box::new(ReentrantHold {
            inner: inner.clone(),
            release_id: owner::unique_name(&hold.owner),
            hold,
            progress: ReleaseProgress::default(),
            released: false,
        })
    }
}

#[async_trait]
impl OrderLock for ReentrantLock {
    fn mode(&self) -> LockMode {
        LockMode::Reentrant
    }

    async fn acquire_as(
        &self,
        holder: Holder,
        key: &str,
    ) -> Result<Option<Box<dyn HeldLock>>, LockError> {
        let owner = holder.owner();
        let deadline = Instant::now() + self.inner.options.wait;
        let busy_for = match self.try_lock(key, holder, &owner).await? {
            Attempt {
                taken: Taken::Yes { count },
                sent,
            } => return Ok(Some(self.guard(key, holder, count, sent))),
            Attempt { .. } if self.inner.options.wait.is_zero() => return Ok(None),
            Attempt {
                taken: Taken::Busy { expires_in },
                ..
            } => expires_in,
        };
        // Subscribe first, then retry: a release that lands in between is
        // either seen by the retry or delivered to the listener. The wait for
        // Redis to confirm the subscription lasts one poll at most: while it
        // is unconfirmed (slow to come, or the subscription connection cannot
        // be opened) releases may go unseen, and the loop below polls instead,
        // and retries as soon as the confirmation arrives.
        let patience = busy_for
            .map_or(deadline, |busy| deadline.min(Instant::now() + busy))
            .min(Instant::now() + POLL);
        let listener = self
            .inner
            .events
            .listen(&sibling(key, "released"), patience)
            .await;
        loop {
            let notified = listener.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Read before the retry, not after: only a subscription confirmed
            // before the retry ran is sure to deliver every release the retry
            // did not see. One confirmed while the retry's answer was on its
            // way may have come after a release.
            let live = listener.is_live();
            match self.try_lock(key, holder, &owner).await? {
                Attempt {
                    taken: Taken::Yes { count },
                    sent,
                } => return Ok(Some(self.guard(key, holder, count, sent))),
                Attempt {
                    taken:
                        Taken::Busy {
                            expires_in: busy_for,
                        },
                    ..
                } => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    let mut nap = busy_for.unwrap_or(deadline - now).min(deadline - now);
                    if !live {
                        nap = nap.min(POLL);
                    }
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep(nap) => {}
                        _ = listener.live(), if !live => {}
                    }
                }
            }
        }
    }
}

/// One acquisition's guard: gives back exactly one hold, on `release` or,
/// failing that, when dropped (a panic or a cancelled task included).
struct ReentrantHold {
    inner: Arc<Inner>,
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
    /// Whether the key was surely still ours when the first one was sent.
    lease_running: bool,
}

/// Gives back one guard's hold of `hold`, or resumes doing so.
async fn give_back(
    redis: &ConnectionManager,
    hold: &Hold,
    release_id: &str,
    progress: &mut ReleaseProgress,
) -> Result<Release, LockError> {
    if progress.sent == 0 {
        progress.lease_running = hold.lease_running();
        hold.guard_leaves();
    }
    release(
        redis,
        &hold.key,
        &hold.owner,
        hold.lease,
        release_id,
        progress,
    )
    .await
}

#[async_trait]
impl HeldLock for ReentrantHold {
    fn owner_in_key(&self) -> Option<&str> {
        Some(&self.hold.owner)
    }

    async fn release(mut self: Box<Self>) -> Result<Release, LockError> {
        let this = &mut *self;
        let outcome = give_back(
            &this.inner.redis,
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
        if self.hold.lost.load(Ordering::SeqCst) {
            return Err(LockError::Lost(
                "a lease renewal found the lock taken or gone",
            ));
        }
        if Instant::now() >= *self.hold.valid_until.lock().expect("hold poisoned") {
            return Err(LockError::Lost(
                "the lease ran out before it could be renewed",
            ));
        }
        Ok(())
    }
}

impl Drop for ReentrantHold {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let redis = self.inner.redis.clone();
        let hold = self.hold.clone();
        let release_id = std::mem::take(&mut self.release_id);
        let mut progress = std::mem::take(&mut self.progress);
        release_dropped(hold.key.clone(), async move {
            give_back(&redis, &hold, &release_id, &mut progress).await
        });
    }
}

/// Gives back one hold, retrying (with the same release id) when the reply
/// is lost, so the answer is the first attempt's; `progress` counts the
/// attempts sent, this call's and any earlier call's for the same release.
async fn release(
    redis: &ConnectionManager,
    key: &str,
    owner: &str,
    lease: Duration,
    release_id: &str,
    progress: &mut ReleaseProgress,
) -> Result<Release, LockError> {
    loop {
        progress.sent += 1;
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
            Ok(given_back) => return Ok(given_back.release(attempt > 1 && progress.lease_running)),
            Err(LockError::Redis(error)) if attempt < RELEASE_ATTEMPTS && is_transient(&error) => {
                tracing::debug!(%error, attempt, "lock release reply lost; retrying");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Gives back the hold an abandoned acquisition may have taken, if dropped
/// while armed.
struct Undo {
    armed: bool,
    redis: ConnectionManager,
    key: String,
    owner: String,
    lease: Duration,
}

impl Drop for Undo {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (redis, lease) = (self.redis.clone(), self.lease);
        let (key, owner) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.owner),
        );
        runtime.spawn(async move {
            let release_id = owner::unique_name(&owner);
            // Whether the acquisition took the key at all is unknown.
            let mut progress = ReleaseProgress::default();
            let undone = release(&redis, &key, &owner, lease, &release_id, &mut progress).await;
            tracing::debug!(?undone, %key, "undid an abandoned acquisition");
        });
    }
}

fn is_transient(error: &redis::RedisError) -> bool {
    error.is_io_error() || error.is_timeout() || error.is_connection_dropped()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::GaveBack;

    async fn unlock(
        redis: &mut ConnectionManager,
        key: &str,
        owner: &str,
        id: &str,
        attempt: u32,
    ) -> GaveBack {
        GiveBack {
            key,
            owner,
            lease: Duration::from_secs(10),
            release_id: id,
            attempt,
            take_marker: None,
        }
        .run(redis)
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_retried_release_of_a_reentered_hold_does_not_take_a_second_hold() {
        let url =
            std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        let client = redis::Client::open(url).unwrap();
        let mut redis = ConnectionManager::new(client).await.unwrap();
        let key = format!("test:{}:lock:retried", uuid::Uuid::new_v4().simple());
        async fn take(redis: &mut ConnectionManager, key: &str, owner: &str) -> bool {
            let take = Take {
                key,
                owner,
                lease: Duration::from_secs(10),
                marker: None,
            };
            matches!(take.run(redis).await.unwrap(), Taken::Yes { .. })
        }

        assert!(take(&mut redis, &key, "a:1").await);
        assert!(take(&mut redis, &key, "a:1").await, "re-entered");
        assert_eq!(
            unlock(&mut redis, &key, "a:1", "r1", 1).await,
            GaveBack::Remaining(1)
        );
        // A's reply was lost, so A sends the same release again.
        assert_eq!(
            unlock(&mut redis, &key, "a:1", "r1", 2).await,
            GaveBack::Remaining(1),
            "the first answer, not a second hold taken away"
        );
        assert_eq!(
            unlock(&mut redis, &key, "a:1", "r2", 1).await,
            GaveBack::Remaining(0),
            "the last hold"
        );
        assert!(take(&mut redis, &key, "b:1").await, "the key is free");
        assert_eq!(
            unlock(&mut redis, &key, "a:1", "r2", 2).await,
            GaveBack::OtherOwner,
            "a retry of the last hold's release finds B's key"
        );

        let _: () = redis::cmd("DEL")
            .arg(&key)
            .arg(sibling(&key, "release:r1"))
            .arg(sibling(&key, "release:r2"))
            .query_async(&mut redis)
            .await
            .unwrap();
    }
}
