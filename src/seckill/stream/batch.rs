//! Settling a batch of delivered entries: the dead letters first, then the
//! per-user locks of every remaining order (taken at once: on the shared
//! Redis connection their commands leave together), ONE transaction for
//! the lot, the acknowledgement, and the locks' release.
//!
//! Every step is safe to repeat, which is what makes a redelivery harmless:
//! an order id already in `tb_voucher_order` is not written again, so an
//! entry whose commit succeeded but whose `XACK` never happened (the node
//! died in between, or the reply was lost) is found written the next time
//! and only acknowledged.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::future::join_all;
use hmdp_lock::{HeldLock, LockError};

use super::entry::Entry;
use super::group::OrderStream;
use crate::error::{Error, Rejection};
use crate::ids::{OrderId, UserId, VoucherId};
use crate::metrics;
use crate::seckill::{Readmit, Seckill};
use crate::store::{self, NewOrder, Tx};

/// What became of one order of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Inserted, stock taken, committed.
    Written,
    /// Already in MySQL as this very order: a redelivery.
    AlreadyWritten,
    /// The user already holds another order of the voucher: refused, as
    /// the synchronous purchase refuses `ALREADY_ORDERED`.
    DuplicateUser,
    /// The order id belongs to another order (the id counter in Redis
    /// started over): it can never be written under this id.
    IdTaken,
    /// Admitted before Redis lost the sale, and its unit (or its buyer's
    /// turn) went to a buyer admitted after the reload, who keeps it: the
    /// order cannot be written without selling a unit twice.
    Resold,
    /// Not written this time (lock busy, no stock left in MySQL, a stale
    /// fencing token); left pending, to be claimed and tried again. Only
    /// [`NO_STOCK_IN_MYSQL`] ever ends in the dead letters.
    Deferred(&'static str),
}

impl Outcome {
    /// The `outcome` label of `hmdp_stream_orders_total`.
    fn label(self) -> &'static str {
        match self {
            Outcome::Written => "written",
            Outcome::AlreadyWritten => "already_written",
            Outcome::DuplicateUser => "duplicate_user",
            Outcome::IdTaken => "id_taken",
            Outcome::Resold => "resold",
            Outcome::Deferred(_) => "deferred",
        }
    }

    /// Left pending for a reason not the order's own: another holder has
    /// the user's lock, the lock could not be asked, or it passed on.
    fn waits_on_others(self) -> bool {
        matches!(self, Outcome::Deferred(why) if why != NO_STOCK_IN_MYSQL)
    }

    /// Settled in MySQL for good: the entry is acknowledged and its order
    /// leaves the pending hash.
    fn settled(self) -> bool {
        matches!(
            self,
            Outcome::Written | Outcome::AlreadyWritten | Outcome::DuplicateUser
        )
    }
}

const LOCK_BUSY: &str = "the user's lock is busy";
const LOCK_UNAVAILABLE: &str = "the user's lock is unavailable";
/// The one deferral that is the order's own: Redis admitted a unit MySQL
/// does not have (Redis and MySQL disagree), which no retry changes.
pub(super) const NO_STOCK_IN_MYSQL: &str = "no stock left in MySQL";

/// Every `outcome` label, for the metrics' zero series.
pub(super) const OUTCOMES: &[&str] = &[
    "written",
    "already_written",
    "duplicate_user",
    "id_taken",
    "resold",
    "deferred",
];

/// Why an entry went to the dead letters: the `reason` label of
/// `hmdp_stream_dead_letters_total`.
pub(super) const DEAD_LETTER_REASONS: &[&str] =
    &["malformed", "max_deliveries", "id_taken", "resold"];

/// Settles `entries`: dead-letters the malformed ones, writes the others in
/// one transaction and acknowledges what it settled; an entry delivered
/// more than `max_deliveries` times gets a last attempt of its own first.
/// Returns the entries left pending for a reason not their own (a lock
/// busy or lost), to be claimed again later. `Err` when the transaction or
/// the acknowledgement failed: the entries concerned stay pending.
pub(super) async fn settle(
    seckill: &Seckill,
    stream: &OrderStream,
    entries: Vec<Entry>,
    max_deliveries: usize,
) -> anyhow::Result<Vec<Entry>> {
    let mut orders = Vec::with_capacity(entries.len());
    let mut last_chances = Vec::new();
    for entry in entries {
        match entry.order() {
            Ok(order) if entry.deliveries > max_deliveries => last_chances.push((entry, order)),
            Ok(order) => orders.push((entry, order)),
            Err(why) => dead_letter(stream, &entry, "malformed", &why).await?,
        }
    }
    let mut waiting = Vec::new();
    if !orders.is_empty() {
        let outcomes = settle_orders(seckill, stream, &orders).await?;
        for ((entry, _), outcome) in orders.into_iter().zip(outcomes) {
            if outcome.waits_on_others() {
                waiting.push(entry);
            }
        }
    }
    for (entry, order) in last_chances {
        last_chance(seckill, stream, entry, order, max_deliveries).await?;
    }
    Ok(waiting)
}

/// One more attempt, alone, at an entry delivered more than
/// `max_deliveries` times: a batch that keeps failing may fail for one
/// order's sake, and alone that order cannot hold up the others. The dead
/// letters take it only when the failure is its own ([`Blame::Order`]);
/// any other failure keeps it pending, for as long as it lasts.
async fn last_chance(
    seckill: &Seckill,
    stream: &OrderStream,
    entry: Entry,
    order: NewOrder,
    max_deliveries: usize,
) -> anyhow::Result<()> {
    let deliveries = entry.deliveries;
    let alone = [(entry, order)];
    let why = match settle_orders(seckill, stream, &alone).await {
        Ok(outcomes) => match outcomes[0] {
            Outcome::Deferred(NO_STOCK_IN_MYSQL) => NO_STOCK_IN_MYSQL.to_owned(),
            // Settled, dead-lettered for its id, or waiting on others.
            _ => return Ok(()),
        },
        Err(failed) => match Blame::of(&failed) {
            Blame::Order(why) => why,
            Blame::Surroundings => return Err(failed),
        },
    };
    let reason = format!(
        "delivered {deliveries} times without being written (limit {max_deliveries}): {why}"
    );
    dead_letter(stream, &alone[0].0, "max_deliveries", &reason).await
}

/// Whose failure a failed write is. Only a failure of the order itself
/// repeats whatever the surroundings do, so only such a failure may ever
/// give up on an order its buyer was told they have; every other failure
/// passes once MySQL, Redis or the lock's holder lets it.
#[derive(Debug, PartialEq, Eq)]
pub enum Blame {
    /// The order's own values are refused (a column's type or range, a
    /// constraint): the same statement fails the same way every time.
    Order(String),
    /// Anything else: a lock wait timeout (1205), a deadlock (1213), a
    /// read-only server (1290), a locked table, a full disk, a connection
    /// lost or refused, a statement given up on, a user's lock lost.
    Surroundings,
}

/// MySQL errors about the values of the row written: column cannot be null
/// (1048), out of range (1264), incorrect value (1366), data too long
/// (1406), foreign key (1452), check constraint (3819, MariaDB's 4025).
const ORDER_VALUE_ERRORS: [u16; 7] = [1048, 1264, 1366, 1406, 1452, 3819, 4025];

impl Blame {
    pub fn of(failure: &anyhow::Error) -> Blame {
        let refused = failure
            .chain()
            .filter_map(|cause| match cause.downcast_ref::<sqlx::Error>() {
                Some(sqlx::Error::Database(db)) => {
                    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                }
                _ => None,
            })
            .find(|mysql| ORDER_VALUE_ERRORS.contains(&mysql.number()));
        match refused {
            Some(mysql) => Blame::Order(format!("MySQL refused the order: {mysql}")),
            None => Blame::Surroundings,
        }
    }
}

/// Writes `orders` in one transaction under their users' locks,
/// acknowledges what it settled, and says what became of each.
async fn settle_orders(
    seckill: &Seckill,
    stream: &OrderStream,
    orders: &[(Entry, NewOrder)],
) -> anyhow::Result<Vec<Outcome>> {
    let new: Vec<NewOrder> = orders.iter().map(|(_, order)| *order).collect();
    let outcomes = write_under_locks(seckill, &new, async |outcomes: &[Outcome]| {
        acknowledge(stream, orders, outcomes).await
    })
    .await?;
    for ((entry, order), outcome) in orders.iter().zip(&outcomes) {
        report(entry, order, *outcome);
    }
    Ok(outcomes)
}

/// Writes `orders` in one transaction under their users' locks and runs
/// `after_commit` on what became of each (the order stream's `XACK`, a
/// replayed dead letter's removal) before the locks are released: the
/// locks are released whatever happens, and only after the commit (or the
/// failure) and that step.
pub(super) async fn write_under_locks(
    seckill: &Seckill,
    orders: &[NewOrder],
    after_commit: impl AsyncFnOnce(&[Outcome]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Outcome>> {
    let mut locks = lock_users(seckill, orders).await;
    let written = async {
        let mut outcomes: Vec<Option<Outcome>> = orders
            .iter()
            .map(|order| locks.refused.get(&order.user_id).copied())
            .collect();
        let locked: Vec<NewOrder> = orders
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| outcome.is_none())
            .map(|(order, _)| *order)
            .collect();
        let mut written = write(seckill, &locked, &locks).await?.into_iter();
        let outcomes: Vec<Outcome> = outcomes
            .iter_mut()
            .map(|outcome| {
                outcome
                    .or_else(|| written.next())
                    .expect("every order has an outcome")
            })
            .collect();
        after_commit(&outcomes).await?;
        Ok(outcomes)
    }
    .await;
    join_all(
        std::mem::take(&mut locks.held)
            .into_values()
            .map(|held| seckill.release_logged(held)),
    )
    .await;
    written
}

/// The per-user locks of a batch's users: held, or why not.
struct Locks {
    /// By user id: the batch records the users' fencing tokens in this
    /// order, so two batches lock `tb_lock_fence` rows in one order and
    /// never wait on each other in a circle.
    held: BTreeMap<UserId, Box<dyn HeldLock>>,
    refused: HashMap<UserId, Outcome>,
}

/// Takes every user's lock at once. A lock busy (another node's purchase or
/// consumer holds that user) or unreachable defers that user's orders.
async fn lock_users(seckill: &Seckill, orders: &[NewOrder]) -> Locks {
    let users: HashSet<UserId> = orders.iter().map(|order| order.user_id).collect();
    let taken = join_all(
        users
            .into_iter()
            .map(|user| async move { (user, seckill.acquire(user).await) }),
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
                locks.refused.insert(user, Outcome::Deferred(LOCK_BUSY));
            }
            Err(error) => {
                tracing::warn!(error = ?error, %user, "cannot take the user's lock");
                locks
                    .refused
                    .insert(user, Outcome::Deferred(LOCK_UNAVAILABLE));
            }
        }
    }
    locks
}

/// How a batch's transaction ended.
enum Ended {
    Committed(Vec<Outcome>),
    /// Rolled back: a voucher's stock did not cover its orders.
    NoStock,
    /// Rolled back: these orders' units went to buyers admitted after Redis
    /// lost the sale.
    Resold(Vec<OrderId>),
}

/// Writes `orders`, whose users' locks are held, in one transaction; the
/// outcome of each, in order. Orders whose units were sold again after a
/// Redis loss are left out, and the rest written without them. Should a
/// voucher's stock not cover its orders (MySQL and Redis disagree), the
/// batch is rolled back and each order is written alone, so the orders that
/// have stock are written and only those without wait: no oversell,
/// nothing written twice.
async fn write(
    seckill: &Seckill,
    orders: &[NewOrder],
    locks: &Locks,
) -> anyhow::Result<Vec<Outcome>> {
    if orders.is_empty() {
        // Every user's lock refused: nothing to write, no transaction.
        return Ok(Vec::new());
    }
    let mut resold: HashSet<OrderId> = HashSet::new();
    let outcome_of = |resold: &HashSet<OrderId>,
                      order: &NewOrder,
                      written: &mut dyn Iterator<Item = Outcome>| {
        if resold.contains(&order.id) {
            Outcome::Resold
        } else {
            written.next().expect("an outcome per order written")
        }
    };
    loop {
        let rest: Vec<NewOrder> = orders
            .iter()
            .filter(|order| !resold.contains(&order.id))
            .copied()
            .collect();
        match transaction(seckill, &rest, locks).await? {
            Ended::Committed(outcomes) => {
                let mut written = outcomes.into_iter();
                return Ok(orders
                    .iter()
                    .map(|order| outcome_of(&resold, order, &mut written))
                    .collect());
            }
            // Each round leaves out at least one order: it ends.
            Ended::Resold(ids) => resold.extend(ids),
            Ended::NoStock => break,
        }
    }
    tracing::warn!(
        orders = orders.len(),
        "the stock left in MySQL does not cover the batch; writing its orders one by one"
    );
    let mut outcomes = Vec::with_capacity(orders.len());
    for order in orders {
        if resold.contains(&order.id) {
            outcomes.push(Outcome::Resold);
            continue;
        }
        outcomes.push(
            match transaction(seckill, std::slice::from_ref(order), locks).await? {
                Ended::Committed(alone) => alone[0],
                Ended::NoStock => Outcome::Deferred(NO_STOCK_IN_MYSQL),
                Ended::Resold(_) => Outcome::Resold,
            },
        );
    }
    Ok(outcomes)
}

/// One transaction over `orders`. Its end is known before this returns,
/// so that the locks are released only after it (see
/// [`Seckill::order_transaction`]).
async fn transaction(
    seckill: &Seckill,
    orders: &[NewOrder],
    locks: &Locks,
) -> anyhow::Result<Ended> {
    let mut tx = seckill.store.begin().await?;
    // On an error, the transaction is dropped with its end unseen, which
    // closes its connection: MySQL rolls it back.
    let ended = statements(seckill, &mut tx, orders, locks).await?;
    match &ended {
        Ended::Committed(outcomes) => {
            tx.commit().await?;
            let written = outcomes.iter().filter(|o| **o == Outcome::Written).count();
            if written > 0 {
                metrics::STREAM_BATCH_ORDERS.observe(written as f64);
            }
            tracing::debug!(orders = orders.len(), written, "batch committed");
        }
        Ended::NoStock | Ended::Resold(_) => tx.rollback().await?,
    }
    Ok(ended)
}

/// Of `new`, inserted with their stock taken and the stock rows held: the
/// orders whose units went to later buyers after Redis lost them. The rest
/// are counted again in Redis if it lost them, before the commit: a reload
/// of the sale either waited for this transaction (it holds the stock row)
/// and counts them from MySQL, or stored the sale before this transaction
/// took the row, and they are counted in it here.
async fn counted_again(seckill: &Seckill, new: &[NewOrder]) -> anyhow::Result<Vec<OrderId>> {
    let mut resold = Vec::new();
    for order in seckill.sale_state.not_pending(new).await? {
        let readmit = seckill.sale_state.readmit(order, true).await?;
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

/// The statements of a batch: the purchase's (fence, count, insert, take
/// stock), each run once for the whole batch.
async fn statements(
    seckill: &Seckill,
    tx: &mut Tx,
    orders: &[NewOrder],
    locks: &Locks,
) -> anyhow::Result<Ended> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; orders.len()];

    // Fencing first, as in the purchase: a newer holder's token means this
    // user's lock passed on while we held it.
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
            *outcome = Some(Outcome::Deferred(
                "a newer lock holder's fencing token wrote",
            ));
        }
    }

    // Idempotency: an order id already written is this order again, or
    // (another user, another voucher) an id the counter handed out twice.
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

    // One order per user: the users who hold an order of the voucher
    // already, and a user's second order within the batch.
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

    if !seckill.chaos_hold.is_zero() {
        tokio::time::sleep(seckill.chaos_hold).await;
    }
    let new: Vec<NewOrder> = undecided(orders, &outcomes)
        .map(|(order, _)| *order)
        .collect();
    store::insert_orders(tx, &new).await?;

    // A holder that learnt it lost a lock rolls the whole batch back. Asked
    // before the stock rows are locked (with fencing, a Redis round trip);
    // the fences recorded first keep a newer holder from committing beside
    // this batch.
    let users: HashSet<UserId> = new.iter().map(|order| order.user_id).collect();
    let checks = join_all(
        users
            .iter()
            .filter_map(|user| locks.held.get(user))
            .map(|held| held.ensure_held()),
    )
    .await;
    checks
        .into_iter()
        .collect::<Result<Vec<()>, LockError>>()
        .map_err(|lost| {
            anyhow::Error::new(lost).context("a user's lock was lost; batch rolled back")
        })?;

    // The stock last: the `UPDATE` locks each voucher's stock row until the
    // commit. Only the reloaded sale's count follows it (`counted_again`: it
    // must see every reload that the row lock orders before this batch).
    let mut units: BTreeMap<VoucherId, u32> = BTreeMap::new();
    for order in &new {
        *units.entry(order.voucher_id).or_default() += 1;
    }
    for (voucher, units) in units {
        if !store::take_stock_units(tx, voucher, units).await? {
            return Ok(Ended::NoStock);
        }
    }
    let resold = counted_again(seckill, &new).await?;
    if !resold.is_empty() {
        return Ok(Ended::Resold(resold));
    }

    Ok(Ended::Committed(
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Outcome::Written))
            .collect(),
    ))
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

/// After the commit: acknowledges the settled entries (one `MULTI`) and
/// moves the orders whose id another order took to the dead letters.
async fn acknowledge(
    stream: &OrderStream,
    orders: &[(Entry, NewOrder)],
    outcomes: &[Outcome],
) -> anyhow::Result<()> {
    let mut entries = Vec::new();
    let mut settled = Vec::new();
    for ((entry, order), outcome) in orders.iter().zip(outcomes) {
        match outcome {
            outcome if outcome.settled() => {
                entries.push(entry);
                settled.push(*order);
            }
            Outcome::IdTaken => {
                let reason = format!("order id {} belongs to another order", order.id);
                dead_letter(stream, entry, "id_taken", &reason).await?;
            }
            Outcome::Resold => {
                let reason = "admitted before Redis lost the sale; its unit or its buyer's \
                              turn went to a buyer admitted after the reload";
                dead_letter(stream, entry, "resold", reason).await?;
            }
            _ => {}
        }
    }
    stream.acknowledge(&entries, &settled).await?;
    Ok(())
}

async fn dead_letter(
    stream: &OrderStream,
    entry: &Entry,
    label: &'static str,
    reason: &str,
) -> anyhow::Result<()> {
    stream.dead_letter(entry, reason).await?;
    metrics::STREAM_DEAD_LETTERS
        .with_label_values(&[label])
        .inc();
    tracing::error!(
        entry = %entry.id,
        deliveries = entry.deliveries,
        reason,
        "order stream entry moved to the dead letters"
    );
    Ok(())
}

/// Counts and logs what became of one order of a committed batch.
fn report(entry: &Entry, order: &NewOrder, outcome: Outcome) {
    metrics::STREAM_ORDERS
        .with_label_values(&[outcome.label()])
        .inc();
    let (order_id, user_id, voucher_id) = (order.id, order.user_id, order.voucher_id);
    match outcome {
        Outcome::Written | Outcome::IdTaken | Outcome::Resold => {}
        Outcome::AlreadyWritten => tracing::info!(
            %order_id, entry = %entry.id,
            "order already written (a redelivery): acknowledged, not written again"
        ),
        Outcome::DuplicateUser => tracing::warn!(
            %order_id, %user_id, %voucher_id,
            "the user already holds another order of this voucher: entry refused and acknowledged"
        ),
        Outcome::Deferred(reason) => tracing::warn!(
            %order_id, entry = %entry.id, deliveries = entry.deliveries, reason,
            "order not written; left pending to be claimed and tried again"
        ),
    }
}
