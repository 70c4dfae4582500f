//! The purchase transaction's statements, each run once for all of its
//! orders: fences, idempotency, one active order per user, the lock
//! checks, the insert, the stock — and, for admitted orders, their count
//! in a sale Redis reloaded. The caller ([`OrderWriter::transaction`])
//! begins and ends the transaction.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use futures::future::join_all;
use hmdp_lock::LockError;

use super::{Deferral, Ended, Locks, OrderSource, OrderWriter, Outcome};
use crate::error::Error;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::metrics;
use crate::seckill::sale_state::Readmit;
use crate::store::{self, NewOrder, Tx};

impl OrderWriter {
    /// The statements of the purchase transaction, each run once for all of
    /// `orders`; the caller ends the transaction.
    pub(super) async fn statements(
        &self,
        tx: &mut Tx,
        orders: &[NewOrder],
        locks: &Locks,
    ) -> Result<Ended, Error> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; orders.len()];

        // Fencing first: a newer holder's token means this user's lock
        // passed on while we held it, and the fence row orders this user's
        // transactions by token.
        let mut stale = HashSet::new();
        for (user, held) in &locks.held {
            if let Some(token) = held.fencing_token() {
                if orders.iter().any(|order| order.user_id == *user)
                    && !store::record_fence(tx, *user, token).await?
                {
                    metrics::FENCING_REJECTIONS.inc();
                    stale.insert(*user);
                }
            }
        }
        for (order, outcome) in orders.iter().zip(outcomes.iter_mut()) {
            if stale.contains(&order.user_id) {
                *outcome = Some(Outcome::Deferred(Deferral::FencedOut));
            }
        }

        // Idempotency: an admitted order id already written is this order
        // again (a redelivery, a replay), or (another user, another voucher)
        // an id the counter handed out twice. A purchase's id is fresh: its
        // insert finds out, without a statement of its own.
        if self.source != OrderSource::Purchase {
            let ids: Vec<_> = orders.iter().map(|order| order.id).collect();
            let existing = store::orders_by_id(tx, &ids).await?;
            for (order, outcome) in orders.iter().zip(outcomes.iter_mut()) {
                if let Some(row) = existing.iter().find(|row| row.id == order.id) {
                    *outcome = Some(if row == order {
                        Outcome::AlreadyWritten
                    } else {
                        Outcome::IdTaken
                    });
                }
            }
        }

        // One active order per user: the users who hold an active order of
        // the voucher already, and a user's second order within the
        // transaction.
        let mut by_voucher: BTreeMap<VoucherId, Vec<UserId>> = BTreeMap::new();
        for (order, _) in undecided(orders, &outcomes) {
            by_voucher
                .entry(order.voucher_id)
                .or_default()
                .push(order.user_id);
        }
        let mut ordered = HashSet::new();
        for (voucher, users) in &by_voucher {
            for user in store::users_with_orders(tx, *voucher, users).await? {
                ordered.insert((user, *voucher));
            }
        }
        for (order, outcome) in orders.iter().zip(outcomes.iter_mut()) {
            if outcome.is_none() && !ordered.insert((order.user_id, order.voucher_id)) {
                *outcome = Some(Outcome::DuplicateUser);
            }
        }

        if !self.chaos_hold.is_zero() {
            tokio::time::sleep(self.chaos_hold).await;
        }

        // A holder that learnt it lost a user's lock leaves that user's
        // orders out; one that cannot ask (Redis unreachable) writes none.
        // Asked before the stock rows are locked (with fencing, a Redis
        // round trip); the fences recorded first keep a newer holder from
        // committing beside this transaction.
        let users: BTreeSet<UserId> = (undecided(orders, &outcomes))
            .map(|(order, _)| order.user_id)
            .collect();
        let checks = join_all(users.iter().filter_map(|user| {
            let held = locks.held.get(user)?;
            Some(async move { (*user, held.ensure_held().await) })
        }))
        .await;
        let mut lost = HashSet::new();
        for (user, check) in checks {
            match check {
                Ok(()) => {}
                Err(LockError::Lost(reason)) => {
                    tracing::warn!(%user, ?reason, "the user's lock was lost while held");
                    lost.insert(user);
                }
                Err(error) => return Err(error.into()),
            }
        }
        for (order, outcome) in orders.iter().zip(outcomes.iter_mut()) {
            if outcome.is_none() && lost.contains(&order.user_id) {
                *outcome = Some(Outcome::Deferred(Deferral::LockLost));
            }
        }
        let new: Vec<NewOrder> = undecided(orders, &outcomes)
            .map(|(order, _)| *order)
            .collect();
        // The stock last, in the insert's round trip: the `UPDATE` locks each
        // voucher's stock row until the commit, and every purchase of the
        // voucher queues for that lock. Only the admitted orders' count in a
        // reloaded sale follows it ([`OrderWriter::counted_again`]: it must
        // see every reload that the row lock orders before this transaction).
        let short = match store::insert_orders_taking_stock(tx, &new).await {
            Err(sqlx::Error::Database(error))
                if error.is_unique_violation() && self.source == OrderSource::Purchase =>
            {
                return Ok(Ended::IdTaken);
            }
            short => short?,
        };
        let mut unstocked = HashSet::new();
        for (voucher, units) in short {
            // Fewer units left than orders (the last units of a sale; MySQL
            // and Redis disagreeing): the first orders take what is left,
            // in one more statement under the row just read, and the others
            // are taken out again before the commit.
            let left = store::stock_left(tx, voucher).await?;
            let of_voucher = new.iter().filter(|order| order.voucher_id == voucher);
            let out: Vec<OrderId> = of_voucher
                .skip(left as usize)
                .map(|order| order.id)
                .collect();
            store::delete_orders(tx, &out).await?;
            let kept = units - out.len() as u32;
            if kept > 0 && !store::take_stock_units(tx, voucher, kept).await? {
                return Err(Error::Internal(anyhow::anyhow!(
                    "voucher {voucher}'s stock changed under its row lock"
                )));
            }
            unstocked.extend(out);
        }
        for (order, outcome) in orders.iter().zip(outcomes.iter_mut()) {
            if unstocked.contains(&order.id) {
                *outcome = Some(Outcome::Deferred(Deferral::NoStockInMysql));
            }
        }
        let new: Vec<NewOrder> = new
            .into_iter()
            .filter(|order| !unstocked.contains(&order.id))
            .collect();
        if self.source != OrderSource::Purchase {
            let resold = self.counted_again(&new).await?;
            if !resold.is_empty() {
                return Ok(Ended::Resold(resold));
            }
        }

        Ok(Ended::Committed(
            outcomes
                .into_iter()
                .map(|outcome| outcome.unwrap_or(Outcome::Written))
                .collect(),
        ))
    }

    /// Of `new`, inserted with their stock taken and the stock rows held:
    /// the orders whose units went to later buyers after Redis lost them.
    /// The rest are counted again in Redis if it lost them, before the
    /// commit: a reload of the sale either waited for this transaction (it
    /// holds the stock row) and counts them from MySQL, or stored the sale
    /// before this transaction took the row, and they are counted in it here.
    async fn counted_again(&self, new: &[NewOrder]) -> Result<Vec<OrderId>, Error> {
        let mut resold = Vec::new();
        for order in self.sale_state.not_pending(new).await? {
            let readmit = self
                .sale_state
                .readmit(order, self.source == OrderSource::Stream)
                .await?;
            if readmit != Readmit::Pending {
                tracing::warn!(order_id = %order.id, user_id = %order.user_id, ?readmit,
                    "order admitted before Redis lost it, counted again before its commit");
            }
            if !readmit.may_commit() {
                resold.push(order.id);
            }
        }
        Ok(resold)
    }
}

/// The orders no check has decided on yet.
fn undecided<'a>(
    orders: &'a [NewOrder],
    outcomes: &'a [Option<Outcome>],
) -> impl Iterator<Item = (&'a NewOrder, &'a Option<Outcome>)> {
    orders
        .iter()
        .zip(outcomes)
        .filter(|(_, outcome)| outcome.is_none())
}
