//! The purchase transaction's statements, each run once for all of its
//! orders: fences, idempotency, one active order per user, the lock
//! checks, the insert, the stock — and, for admitted orders, their count
//! in a sale Redis reloaded. The transaction begins with the first of them
//! ([`OrderWriter::open`]); the caller ([`OrderWriter::transaction`]) ends
//! it.

use std::collections::{BTreeSet, HashSet};

use futures::future::join_all;
use hmdp_lock::LockError;
use sqlx::pool::PoolConnection;
use sqlx::MySql;

use super::{Deferral, Ended, Locks, OrderSource, OrderWriter, Outcome};
use crate::error::Error;
use crate::ids::{OrderId, UserId};
use crate::metrics;
use crate::seckill::sale_state::Readmit;
use crate::store::{self, Found, Lookup, NewOrder, SaleFence, Tx};

/// What the transaction's opening round trips found: the users whose lock
/// passed on to a newer holder, the orders written already, the users who
/// hold an active order.
pub(super) struct Opened {
    stale: HashSet<UserId>,
    found: Found,
}

impl OrderWriter {
    /// Begins the transaction on `conn` for `orders`: records each lock's
    /// fencing token, then looks up what was written already. Without a
    /// token to record, `BEGIN` rides in the lookup's round trip.
    pub(super) async fn open(
        &self,
        conn: PoolConnection<MySql>,
        orders: &[NewOrder],
        locks: &Locks,
    ) -> Result<(Tx, Opened), Error> {
        // An admitted order id already written is this order again (a
        // redelivery, a replay), or (another user, another voucher) an id
        // the counter handed out twice. A purchase's id is fresh: its insert
        // finds out, without a statement of its own. Every order's user is
        // looked up, those the fences or the ids decide on too: what is
        // found for them is never asked.
        let mut lookup = Lookup::default();
        if self.source != OrderSource::Purchase {
            lookup.ids = orders.iter().map(|order| order.id).collect();
        }
        for order in orders {
            let users = lookup.users.entry(order.voucher_id).or_default();
            users.push(order.user_id);
        }
        let tokens: Vec<(UserId, u64)> = (locks.held.iter())
            .filter(|(user, _)| orders.iter().any(|order| order.user_id == **user))
            .filter_map(|(user, held)| Some((*user, held.fencing_token()?)))
            .collect();
        if tokens.is_empty() {
            let (tx, found) = Tx::begin_looking_up(conn, &lookup).await?;
            let stale = HashSet::new();
            return Ok((tx, Opened { stale, found }));
        }
        // Fencing first: a newer holder's token means this user's lock
        // passed on while we held it, and the fence row orders this user's
        // transactions by token. The lookup follows, its snapshot taken
        // after the fences: an older holder's order committed meanwhile is
        // seen.
        let mut tx = Tx::begin_on(conn).await?;
        let mut stale = HashSet::new();
        for (user, token) in tokens {
            if !store::record_fence(&mut tx, user, token).await? {
                metrics::FENCING_REJECTIONS.inc();
                stale.insert(user);
            }
        }
        let found = store::look_up(&mut tx, &lookup).await?;
        Ok((tx, Opened { stale, found }))
    }

    /// The statements of the purchase transaction after its [`open`]ing,
    /// each run once for all of `orders`; the caller ends the transaction.
    ///
    /// [`open`]: OrderWriter::open
    pub(super) async fn statements(
        &self,
        tx: &mut Tx,
        orders: &[NewOrder],
        locks: &Locks,
        opened: Opened,
    ) -> Result<Ended, Error> {
        let Opened { stale, found } = opened;
        let mut outcomes: Vec<Option<Outcome>> = vec![None; orders.len()];
        for (order, outcome) in orders.iter().zip(outcomes.iter_mut()) {
            if stale.contains(&order.user_id) {
                *outcome = Some(Outcome::Deferred(Deferral::FencedOut));
            }
            // Written already, whoever holds the lock now.
            if let Some(row) = found.written.iter().find(|row| row.id == order.id) {
                *outcome = Some(if row.is_same_order(order) {
                    Outcome::AlreadyWritten
                } else {
                    Outcome::IdTaken
                });
            }
        }

        // One active order per user: the users who hold an active order of
        // the voucher already, and a user's second order within the
        // transaction.
        let mut ordered = found.holders;
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
            let kept_orders = (new.iter())
                .filter(|order| order.voucher_id == voucher && !out.contains(&order.id));
            let fence = SaleFence::of_orders(kept_orders);
            if kept > 0 && !store::take_stock_units(tx, voucher, kept, &fence).await? {
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
