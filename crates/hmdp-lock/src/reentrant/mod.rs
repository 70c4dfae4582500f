//! `reentrant`: a Redisson `RLock`-grade lock, the default mode.
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
//!   runs out, marks the hold lost, and [`LockGuard::ensure_held`] then stops
//!   the work under it from committing.
//! - Release is idempotent per guard: a retry after a lost reply gets the
//!   first attempt's answer, from a latch when holds remain, from the lease
//!   when the first attempt took the last one (`lua/reentrant_unlock.lua`).
//!   A release abandoned midway is resumed by the guard's `Drop` as a retry
//!   of the same release, never sent again as a new one.
//!
//! Split along Redisson's seams: this module is `RedissonLock` (the take
//! script and the wait loop), [`hold`] is `RedissonBaseLock` (identity, the
//! hold and its guards, the release latch), [`watchdog`] the lease renewal,
//! and `release_events` is `LockPubSub`.

mod hold;
mod lease;
mod watchdog;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::connection::Connection;
use async_trait::async_trait;
use tokio::time::Instant;

use crate::connection::RedisSource;
use crate::keys::sibling;
use crate::lock::{DistributedLock, LockError, LockGuard};
use crate::mode::LockMode;
use crate::observer::{Observer, Unobserved};
use crate::owner::Holder;
use crate::release_events::ReleaseEvents;
use crate::scripts::{Take, Taken};
use hold::{is_transient, Registry, Undo};
use watchdog::Watchdogs;

/// While releases are not being delivered (subscription down), waiters poll.
const POLL: Duration = Duration::from_millis(50);

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
    redis: Connection,
    events: ReleaseEvents,
    options: ReentrantOptions,
    holds: Arc<Registry>,
    watchdogs: Arc<Watchdogs>,
}

/// One take, and when the command that set its lease (if taken) was sent.
struct Attempt {
    taken: Taken,
    sent: Instant,
}

impl ReentrantLock {
    /// `releases` is where the release subscription connects (lazily, on
    /// the first wait): a `redis::Client` of the server, or
    /// [`RedisSource::Cluster`]; `redis` carries the lock commands.
    pub fn new(
        releases: impl Into<RedisSource>,
        redis: impl Into<Connection>,
        options: ReentrantOptions,
    ) -> Self {
        Self::observed(releases, redis, options, Unobserved::shared())
    }

    /// Like [`ReentrantLock::new`], reporting renewals and lost holds to
    /// `observer`.
    pub fn observed(
        releases: impl Into<RedisSource>,
        redis: impl Into<Connection>,
        options: ReentrantOptions,
        observer: Arc<dyn Observer>,
    ) -> Self {
        let redis: Connection = redis.into();
        ReentrantLock {
            inner: Arc::new(Inner {
                redis: redis.clone(),
                events: ReleaseEvents::new(releases.into().matching(&redis)),
                options,
                holds: Arc::new(Mutex::new(HashMap::new())),
                watchdogs: Arc::new(Watchdogs::new(redis.clone(), observer)),
            }),
        }
    }

    /// Holds whose lease a watchdog is renewing right now.
    pub fn renewing(&self) -> usize {
        self.inner.watchdogs.renewing()
    }

    /// Holds of this lock that a watchdog declared lost so far.
    pub fn holds_lost(&self) -> u64 {
        self.inner.watchdogs.lost()
    }

    async fn try_lock(
        &self,
        key: &str,
        holder: Holder,
        owner: &str,
        reenterable: bool,
    ) -> Result<Attempt, LockError> {
        let lease = self.inner.options.lease();
        // A caller that gives up while the script is in flight (its future
        // dropped: a timeout, a client gone) may have taken the key with no
        // guard left to give it back; undo that. Not for a re-entry: its
        // extra hold would be undone from the outer guard's count.
        let reentry = reenterable && hold::is_held(&self.inner.holds, key, holder);
        let mut undo = Undo {
            armed: !reentry,
            redis: &self.inner.redis,
            key,
            owner,
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
        let taken = reply?;
        if let Taken::Yes { count } = taken {
            // More holds than this holder's guards plus this one: the take
            // ran more than once (a re-sent command), and the holds it
            // counted too many would outlive every guard.
            let expected = if reentry {
                hold::holds_of(&self.inner.holds, key, holder) + 1
            } else {
                1
            };
            if count > expected {
                tracing::debug!(%key, count, expected, "a take counted twice; giving back the extra");
                hold::give_back_extra(&self.inner.redis, key, owner, lease, count - expected)
                    .await?;
                return Ok(Attempt {
                    taken: Taken::Yes { count: expected },
                    sent,
                });
            }
        }
        Ok(Attempt { taken, sent })
    }

    fn guard(
        &self,
        key: &str,
        holder: Holder,
        owner: String,
        reenterable: bool,
        count: u32,
        sent: Instant,
    ) -> Box<dyn LockGuard> {
        let inner = &self.inner;
        let landed = hold::Landed {
            key,
            holder,
            owner,
            reenterable,
            lease: inner.options.lease(),
            count,
            sent,
        };
        hold::guard(&inner.holds, &inner.redis, landed, |hold| {
            // An explicit lease runs out by itself: no watchdog.
            inner.options.lease.is_none().then(|| {
                let stop_at = inner.options.max_hold.map(|max| sent + max);
                watchdog::watch(&inner.watchdogs, hold, stop_at)
            })
        })
    }
}

#[async_trait]
impl DistributedLock for ReentrantLock {
    fn mode(&self) -> LockMode {
        LockMode::Reentrant
    }

    fn wait(&self) -> Duration {
        self.inner.options.wait
    }

    async fn acquire_as_within(
        &self,
        holder: Holder,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        self.take(holder, key, true, wait).await
    }

    /// A holder of its own that the caller never sees, so never re-enters:
    /// its hold stays out of the registry.
    async fn acquire_within(
        &self,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        self.take(Holder::new(), key, false, wait).await
    }
}

impl ReentrantLock {
    /// Takes `key` as `holder`, waiting up to `wait`; `reenterable`: see
    /// [`hold::Landed`].
    async fn take(
        &self,
        holder: Holder,
        key: &str,
        reenterable: bool,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        let owner = holder.owner();
        let guard = |owner, count, sent| self.guard(key, holder, owner, reenterable, count, sent);
        let deadline = Instant::now() + wait;
        let busy_for = match self.try_lock(key, holder, &owner, reenterable).await? {
            Attempt {
                taken: Taken::Yes { count },
                sent,
            } => return Ok(Some(guard(owner, count, sent))),
            Attempt { .. } if wait.is_zero() => return Ok(None),
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
            match self.try_lock(key, holder, &owner, reenterable).await? {
                Attempt {
                    taken: Taken::Yes { count },
                    sent,
                } => return Ok(Some(guard(owner, count, sent))),
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
