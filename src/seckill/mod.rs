//! The purchase use case, synchronous like hmdp's `seckillVoucher`:
//! voucher exists → sale window → stock → per-user lock → transaction
//! (count this user's orders, take stock, insert the order) → commit →
//! release. The lock is taken before the transaction begins and released
//! after it ends, never inside it; which lock runs is not this module's concern.

use std::sync::Arc;
use std::time::Duration;

use chrono::Local;

use crate::error::{Error, Rejection};
use crate::id_worker::IdWorker;
use crate::keys::Keys;
use crate::lock::{HeldLock, LockError, OrderLock};
use crate::store::{self, NewOrder, Store};

/// Places one-order-per-user flash-sale orders.
pub struct Seckill {
    store: Store,
    lock: Arc<dyn OrderLock>,
    ids: IdWorker,
    keys: Keys,
    /// Fault injection: sleep with the lock held and the transaction open,
    /// standing in for a GC pause or a slow SQL statement.
    chaos_hold: Duration,
}

impl Seckill {
    pub fn new(
        store: Store,
        lock: Arc<dyn OrderLock>,
        ids: IdWorker,
        keys: Keys,
        chaos_hold: Duration,
    ) -> Self {
        Seckill {
            store,
            lock,
            ids,
            keys,
            chaos_hold,
        }
    }

    /// Buys one unit of `voucher_id` for `user_id`; returns the new order id.
    #[tracing::instrument(name = "purchase", skip(self), fields(lock = %self.lock.mode()))]
    pub async fn purchase(&self, user_id: u64, voucher_id: i64) -> Result<i64, Error> {
        let voucher = self
            .store
            .seckill_voucher(voucher_id)
            .await?
            .ok_or(Rejection::VoucherNotFound)?;
        let now = Local::now().naive_local();
        if now < voucher.begin_time {
            return Err(Rejection::NotStarted.into());
        }
        if now > voucher.end_time {
            return Err(Rejection::Ended.into());
        }
        if voucher.stock < 1 {
            return Err(Rejection::SoldOut.into());
        }

        let held = self
            .lock
            .acquire(&self.keys.order_lock(user_id))
            .await?
            .ok_or(Rejection::DuplicateRequest)?;
        let outcome = self.create_order(user_id, voucher_id, held.as_ref()).await;
        release_logged(held).await;
        let order_id = outcome?;
        tracing::debug!(order_id, "order placed");
        Ok(order_id)
    }

    /// The transaction run under the per-user lock. Any early return drops the
    /// transaction, which rolls it back.
    async fn create_order(
        &self,
        user_id: u64,
        voucher_id: i64,
        held: &dyn HeldLock,
    ) -> Result<i64, Error> {
        let mut tx = self.store.pool().begin().await?;
        if let Some(token) = held.fencing_token() {
            if !store::record_fence(&mut tx, user_id, token).await? {
                return Err(LockError::Lost("a newer holder's fencing token already wrote").into());
            }
        }
        if store::count_user_orders(&mut tx, user_id, voucher_id).await? > 0 {
            return Err(Rejection::AlreadyOrdered.into());
        }
        if !self.chaos_hold.is_zero() {
            tokio::time::sleep(self.chaos_hold).await;
        }
        if !store::take_stock(&mut tx, voucher_id).await? {
            return Err(Rejection::SoldOut.into());
        }
        let id = self.ids.next_id("order").await?;
        store::insert_order(
            &mut tx,
            NewOrder {
                id,
                user_id,
                voucher_id,
            },
        )
        .await?;
        // A holder that learnt it lost the lock rolls back instead.
        held.ensure_held().await?;
        tx.commit().await?;
        Ok(id)
    }
}

/// Releases the lock; a release that was not clean means mutual exclusion may
/// have been lost while we held it, which is worth a warning, not a failure of
/// an order that already committed.
async fn release_logged(held: Box<dyn HeldLock>) {
    match held.release().await {
        Ok(release) if release.is_clean() => {}
        Ok(release) => tracing::warn!(?release, "lock release was not clean"),
        Err(error) => tracing::warn!(error = %error, "lock release failed"),
    }
}
