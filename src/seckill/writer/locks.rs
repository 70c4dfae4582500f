//! The buyers' per-user locks around a transaction: taken (timed, a busy
//! one hmdp's failed `tryLock()`), held while their orders are written,
//! released after the commit; [`Locks`], those of one transaction.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use futures::future::join_all;
use hmdp_lock::LockGuard;

use super::{Deferral, OrderWriter, Outcome};
use crate::error::{Error, Rejection};
use crate::ids::UserId;
use crate::metrics;
use crate::store::NewOrder;

/// The per-user locks of a transaction's users: held, or why not.
pub struct Locks {
    /// By user id: a transaction records the users' fencing tokens in this
    /// order, so two transactions lock `tb_lock_fence` rows in one order and
    /// never wait on each other in a circle.
    pub(super) held: BTreeMap<UserId, Box<dyn LockGuard>>,
    pub(super) refused: HashMap<UserId, Outcome>,
}

impl Locks {
    /// `user`'s lock, `held`.
    pub fn one(user: UserId, held: Box<dyn LockGuard>) -> Locks {
        Locks {
            held: BTreeMap::from([(user, held)]),
            refused: HashMap::new(),
        }
    }

    /// The users' locks `held`.
    pub fn held_by(held: BTreeMap<UserId, Box<dyn LockGuard>>) -> Locks {
        Locks {
            held,
            refused: HashMap::new(),
        }
    }

    /// The locks held, to be released.
    pub fn into_held(self) -> impl Iterator<Item = Box<dyn LockGuard>> {
        self.held.into_values()
    }

    /// The locks held, by user.
    pub fn into_held_by_user(self) -> BTreeMap<UserId, Box<dyn LockGuard>> {
        self.held
    }
}

impl OrderWriter {
    /// Takes the user's lock, timing it; a busy lock is hmdp's failed
    /// `tryLock()`.
    #[tracing::instrument(name = "lock_acquire", skip_all, fields(%user_id))]
    pub async fn acquire(&self, user_id: UserId) -> Result<Box<dyn LockGuard>, Error> {
        let mode = self.lock_mode();
        let started = Instant::now();
        let held = self.lock.acquire(&self.keys.order_lock(user_id)).await;
        metrics::LOCK_ACQUIRE
            .with_label_values(&[mode.as_str()])
            .observe(started.elapsed().as_secs_f64());
        match held? {
            Some(held) => Ok(held),
            None => {
                metrics::LOCK_BUSY.with_label_values(&[mode.as_str()]).inc();
                Err(Rejection::DuplicateRequest.into())
            }
        }
    }

    /// Releases `user_id`'s lock; a release that was not clean means mutual
    /// exclusion may have been lost while it was held, which is worth a
    /// warning, not a failure of orders that already committed.
    #[tracing::instrument(name = "lock_release", skip_all, fields(%user_id))]
    pub async fn release(&self, user_id: UserId, held: Box<dyn LockGuard>) {
        match held.release().await {
            Ok(release) if release.is_clean() => {}
            Ok(release) => {
                tracing::warn!(?release, "lock release was not clean");
                let mode = self.lock_mode();
                let release = format!("{release:?}");
                metrics::LOCK_UNCLEAN_RELEASES
                    .with_label_values(&[mode.as_str(), release.as_str()])
                    .inc();
            }
            Err(error) => tracing::warn!(error = %error, "lock release failed"),
        }
    }

    /// Takes every user's lock at once. A lock busy (another node's
    /// purchase or consumer holds that user) or unreachable defers that
    /// user's orders.
    pub(super) async fn lock_users(&self, orders: &[NewOrder]) -> Locks {
        let users: HashSet<UserId> = orders.iter().map(|order| order.user_id).collect();
        let taken = join_all(
            users
                .into_iter()
                .map(|user| async move { (user, self.acquire(user).await) }),
        )
        .await;
        let mut locks = Locks {
            held: BTreeMap::new(),
            refused: HashMap::new(),
        };
        for (user, taken) in taken {
            match taken {
                Ok(held) => {
                    locks.held.insert(user, held);
                }
                Err(Error::Rejected(Rejection::DuplicateRequest)) => {
                    locks
                        .refused
                        .insert(user, Outcome::Deferred(Deferral::LockBusy));
                }
                Err(error) => {
                    tracing::warn!(error = ?error, %user, "cannot take the user's lock");
                    locks
                        .refused
                        .insert(user, Outcome::Deferred(Deferral::LockUnavailable));
                }
            }
        }
        locks
    }
}
