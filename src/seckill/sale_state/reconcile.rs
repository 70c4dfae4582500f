//! The reconciler: Redis is a cache of the sale that may forget, MySQL is
//! the truth. Every node, every [`RECONCILE_EVERY`], compares the seckill
//! sales Redis is meant to hold (`Store::live_sales`, one statement: open
//! sales, and ended ones not yet settled) with MySQL, and loads again from
//! MySQL a sale whose counts drifted (an `appendfsync everysec` crash or a
//! failover to a replica that missed writes: Redis kept the sale and lost
//! its last admissions, or its last give-backs); a sale missing a shard, or
//! whose shards are of different loads, is loaded again as any purchase
//! would. Each heal is logged and counted (`hmdp_sales_reloaded_total`).
//! An ended sale whose orders are settled is let go (`reconcile/let_go.rs`):
//! its keys expire and no round reads it again, so an idle node's rounds
//! cost one statement each, however many sales have ended.
//!
//! A round costs what the sales Redis holds need: first their counts, each
//! shard read in one `MULTI` for all its sales (`reconcile/counts.rs`), then
//! MySQL's counts of them all in one statement; only a sale whose counts
//! differ, or cannot tell (orders of it pending, give-backs owed), has its
//! buyers and orders read and compared member by member. While orders are
//! on their way (writers working through a backlog) the comparison, which
//! reads every one of them, runs at most every [`RECONCILE_BUSY_EVERY`];
//! the missing-shard check still every round.
//!
//! What Redis should hold, by MySQL: its stock plus the units in transit
//! between shards equals MySQL's stock less the orders on their way
//! (pending in Redis, not written, not dead-lettered) and less the
//! give-backs owed (closed in MySQL, not yet back in Redis); its buyers are
//! the users with an active order in MySQL or one on its way (and, until
//! their give-back arrives, those of closed orders). Every operation on a
//! sale keeps these sums: an admission takes a unit and adds an order on
//! its way in one script, a commit needs the stock row, a give-back adds a
//! unit and marks its order in one script, a move lends and receives in
//! step. So the comparison is made while the voucher's stock row is held
//! (no commit, no close meanwhile), each shard read in one `MULTI`, and a
//! move between two shards' reads (their `moves` counts change) makes the
//! round skip the sale rather than heal what is no drift. Redis is read
//! before MySQL, counts and members alike, so that a commit or a close
//! between the two reads balances (the order leaves the orders on their
//! way as it enters MySQL's; the unit enters MySQL's stock as the
//! give-back it owes Redis).

mod agreement;
mod counts;
mod let_go;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, Value};

use super::in_flight::{on_their_way, pending_entry};

use super::{layout_of, Drift, SaleState};
use crate::error::Error;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::shards::{Layout, Shard};
use crate::store::{LiveSale, NewOrder, SaleSnapshot};
use agreement::Agreement;

/// How often every node compares the sales with MySQL.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// How often, at most, while orders are on their way.
pub const RECONCILE_BUSY_EVERY: Duration = Duration::from_secs(30);

/// The fields of a sale's shard hash a comparison reads.
const SHARD_FIELDS: [&str; 4] = ["stock", "lent", "received", "moves"];

/// One shard of a sale, read in one `MULTI`.
#[derive(Default)]
struct ShardView {
    stock: i64,
    /// Units lent less units received: what this shard's moves leave in
    /// transit, summed over the shards.
    lent_less_received: i64,
    moves: i64,
    buyers: HashSet<UserId>,
    /// The voucher's orders in the shard's pending hash.
    pending: Vec<NewOrder>,
    given_back: HashSet<OrderId>,
}

impl SaleState {
    /// Every node's reconciler, for as long as it runs: every
    /// [`RECONCILE_EVERY`], each sale Redis is meant to hold compared
    /// with MySQL, healed when it drifted, let go once ended and settled.
    pub async fn reconcile_forever(&self) {
        let mut compared_at: Option<Instant> = None;
        loop {
            tokio::time::sleep(RECONCILE_EVERY).await;
            // With no sale for Redis to hold, this one statement is the
            // round: nothing else is read.
            let sales = match self.store.live_sales().await {
                Ok(sales) if sales.is_empty() => continue,
                Ok(sales) => sales,
                Err(error) => {
                    tracing::debug!(?error, "sales not reconciled this round");
                    continue;
                }
            };
            // The comparison reads every order on its way: while the
            // writers work through a backlog, it runs at most every
            // RECONCILE_BUSY_EVERY, the missing-shard check every round.
            let busy = matches!(self.orders_on_their_way().await, Ok((p, s)) if p + s > 0);
            let compare =
                !busy || compared_at.is_none_or(|at| at.elapsed() >= RECONCILE_BUSY_EVERY);
            if compare {
                compared_at = Some(Instant::now());
            }
            if let Err(error) = self.reconcile(&sales, compare).await {
                tracing::debug!(?error, "sales not reconciled this round");
            }
        }
    }

    /// One comparing round, now (what a test drives instead of waiting for
    /// the reconciler's timer). Once it returns, no sale it compared is
    /// left drifted: a drift another node is healing meanwhile is compared
    /// again under the stock row, after that node's heal.
    pub async fn reconcile_once(&self) -> Result<(), Error> {
        let sales = self.store.live_sales().await?;
        self.reconcile(&sales, true).await
    }

    /// One round over `sales`: each one missing a shard (or of shards of
    /// different loads, or of another token) loaded again, as a purchase
    /// would; then, when `compare`, the others' counts compared with
    /// MySQL's, the members of those that differ or cannot tell compared,
    /// a sale that drifted loaded again, and an ended, settled one let go.
    async fn reconcile(&self, sales: &[LiveSale], compare: bool) -> Result<(), Error> {
        if sales.is_empty() {
            return Ok(());
        }
        let mut counted = self.counts(sales, compare).await?;
        let mut whole = Vec::new();
        for sale in sales {
            let shards = counted.remove(&sale.voucher_id).unwrap_or_default();
            if counts::whole(&shards, sale.token) {
                whole.push((*sale, shards));
                continue;
            }
            if let Err(error) = self.load(sale.voucher_id).await {
                tracing::debug!(voucher_id = %sale.voucher_id, ?error, "sale not reconciled");
            }
        }
        if !compare || whole.is_empty() {
            return Ok(());
        }
        let ids: Vec<VoucherId> = whole.iter().map(|(sale, _)| sale.voucher_id).collect();
        let mysql = self.store.sale_counts(&ids).await?;
        let mut members = Vec::new();
        let mut settled = Vec::new();
        for (sale, shards) in whole {
            let Some(counts) = mysql.get(&sale.voucher_id) else {
                continue;
            };
            if counts.shards != sale.shards {
                continue;
            }
            match Agreement::of(&shards, counts) {
                Agreement::Agrees if counts.settled() => settled.push(sale),
                Agreement::Agrees => {}
                Agreement::Differs | Agreement::Untold => members.push(sale),
            }
        }
        settled.extend(self.compare_members(&members, &mysql).await?);
        for sale in settled {
            if let Err(error) = self.let_go(&sale).await {
                tracing::debug!(voucher_id = %sale.voucher_id, ?error, "ended sale not let go this round");
            }
        }
        Ok(())
    }

    /// The members of `sales` compared with MySQL, and each sale that
    /// drifted healed; answers those found settled (no drift, no order of
    /// theirs pending, and MySQL's `counts` say so), for the round to let go.
    ///
    /// Compared first without the stock row, which every writer of the
    /// voucher needs (Redis read before MySQL); only a drift found so is
    /// compared again under the stock row.
    async fn compare_members(
        &self,
        sales: &[LiveSale],
        counts: &HashMap<VoucherId, crate::store::SaleCounts>,
    ) -> Result<Vec<LiveSale>, Error> {
        if sales.is_empty() {
            return Ok(Vec::new());
        }
        let layouts = (sales.iter())
            .map(|sale| Ok((sale.voucher_id, layout_of(sale.shards)?)))
            .collect::<Result<Vec<_>, Error>>()?;
        let mut views = self.views(&layouts).await?;
        let dead = self.dead_order_ids().await?;
        let mut settled = Vec::new();
        for sale in sales {
            let voucher_id = sale.voucher_id;
            let Some(views) = views.remove(&voucher_id) else {
                continue;
            };
            let Some(snapshot) = self.store.peek_sale(voucher_id).await? else {
                continue;
            };
            if snapshot.shards != sale.shards {
                continue;
            }
            if drift(&views, &snapshot, &dead).is_none() {
                let none_pending = views.iter().all(|view| view.pending.is_empty());
                if none_pending && counts.get(&voucher_id).is_some_and(|c| c.settled()) {
                    settled.push(*sale);
                }
                continue;
            }
            if let Err(error) = self.heal(voucher_id).await {
                tracing::debug!(%voucher_id, ?error, "drifted sale not healed this round");
            }
        }
        Ok(settled)
    }

    /// Under the stock row: the drift of the sale's Redis side from MySQL
    /// (`sale`, read while the row is held), `None` when there is none or
    /// a move ran between the shards' reads.
    pub(super) async fn drift_now(
        &self,
        voucher_id: VoucherId,
        layout: Layout,
        sale: &SaleSnapshot,
    ) -> Result<Option<Drift>, Error> {
        let mut views = self.views(&[(voucher_id, layout)]).await?;
        match views.remove(&voucher_id) {
            Some(views) => Ok(drift(&views, sale, &self.dead_order_ids().await?)),
            None => Ok(None),
        }
    }

    /// The shards of each of `sales`, by voucher, in the order of its
    /// layout: each shard read in one `MULTI` for all the sales on it, then
    /// every sale's moves read again. A sale is left out when a move ran
    /// between the reads, or a shard of it is gone.
    async fn views(
        &self,
        sales: &[(VoucherId, Layout)],
    ) -> Result<HashMap<VoucherId, Vec<ShardView>>, Error> {
        let mut on_shard: BTreeMap<Shard, Vec<VoucherId>> = BTreeMap::new();
        for (voucher_id, layout) in sales {
            for shard in layout.shards() {
                on_shard.entry(shard).or_default().push(*voucher_id);
            }
        }
        let reads: Vec<Vec<Value>> = self
            .on_shards(on_shard.keys().copied(), |mut redis, keys| {
                let vouchers = &on_shard[&keys.shard()];
                async move {
                    let mut pipe = redis::pipe();
                    pipe.atomic().hgetall(keys.pending());
                    for voucher_id in vouchers {
                        pipe.cmd("HMGET")
                            .arg(keys.voucher(*voucher_id))
                            .arg(&SHARD_FIELDS)
                            .smembers(keys.given_back(*voucher_id))
                            .smembers(keys.buyers(*voucher_id));
                    }
                    pipe.query_async(&mut redis).await
                }
            })
            .await?;
        let mut views: HashMap<(VoucherId, Shard), ShardView> = HashMap::new();
        let mut gone: HashSet<VoucherId> = HashSet::new();
        for ((shard, vouchers), read) in on_shard.iter().zip(reads) {
            let mut read = read.into_iter();
            let mut next = || read.next().unwrap_or(Value::Nil);
            let mut pending: HashMap<VoucherId, Vec<NewOrder>> = HashMap::new();
            for (id, entry) in parse::<Vec<(i64, String)>>(next())? {
                let order = pending_entry(OrderId::new(id), &entry)?;
                pending.entry(order.voucher_id).or_default().push(order);
            }
            for voucher_id in vouchers {
                let fields = parse::<Vec<Option<i64>>>(next())?;
                let given_back = parse::<Vec<i64>>(next())?;
                let buyers = parse::<Vec<u64>>(next())?;
                let [Some(stock), lent, received, moves] = fields[..] else {
                    gone.insert(*voucher_id);
                    continue;
                };
                let view = ShardView {
                    stock,
                    lent_less_received: lent.unwrap_or(0) - received.unwrap_or(0),
                    moves: moves.unwrap_or(0),
                    buyers: buyers.into_iter().map(UserId::new).collect(),
                    pending: pending.remove(voucher_id).unwrap_or_default(),
                    given_back: given_back.into_iter().map(OrderId::new).collect(),
                };
                views.insert((*voucher_id, *shard), view);
            }
        }
        let moves: Vec<Vec<Option<i64>>> = self
            .on_shards(on_shard.keys().copied(), |mut redis, keys| {
                let vouchers = &on_shard[&keys.shard()];
                async move {
                    let mut pipe = redis::pipe();
                    for voucher_id in vouchers {
                        pipe.hget(keys.voucher(*voucher_id), "moves");
                    }
                    pipe.query_async(&mut redis).await
                }
            })
            .await?;
        for ((shard, vouchers), moves) in on_shard.iter().zip(moves) {
            for (voucher_id, now) in vouchers.iter().zip(moves) {
                let moved = (views.get(&(*voucher_id, *shard)))
                    .is_some_and(|view| view.moves != now.unwrap_or(0));
                if moved {
                    gone.insert(*voucher_id);
                }
            }
        }
        let mut by_sale = HashMap::new();
        for (voucher_id, layout) in sales {
            if gone.contains(voucher_id) {
                continue;
            }
            let shards = (layout.shards())
                .map(|shard| views.remove(&(*voucher_id, shard)).unwrap_or_default())
                .collect();
            by_sale.insert(*voucher_id, shards);
        }
        Ok(by_sale)
    }
}

/// One reply of a pipeline read as `T`.
fn parse<T: FromRedisValue>(value: Value) -> Result<T, Error> {
    Ok(T::from_redis_value(value).map_err(redis::RedisError::from)?)
}

/// The drift of a sale's Redis side (`views`) from MySQL (`sale`, read
/// after them; `dead`: the orders in the dead letters), `None` when there
/// is none.
fn drift(views: &[ShardView], sale: &SaleSnapshot, dead: &HashSet<OrderId>) -> Option<Drift> {
    let written: HashSet<OrderId> = sale.order_ids.iter().copied().collect();
    let pending = views.iter().flat_map(|view| &view.pending).copied();
    let on_their_way = on_their_way(pending, &written, dead, &sale.buyers);
    let given_back: HashSet<OrderId> = views
        .iter()
        .flat_map(|view| view.given_back.iter().copied())
        .collect();
    let owed: Vec<&(OrderId, UserId)> = (sale.closed.iter())
        .filter(|(order, _)| !given_back.contains(order))
        .collect();
    let held: i64 = views
        .iter()
        .map(|view| view.stock + view.lent_less_received)
        .sum();
    let expected = sale.stock - on_their_way.len() as i64 - owed.len() as i64;
    let mut drifts = Vec::new();
    // More orders on their way than MySQL has units: a load leaves
    // Redis at 0 (those orders end in the dead letters), no drift then.
    if held != expected.max(0) {
        drifts.push(format!(
            "Redis holds {held} unit(s) (stock and in transit), MySQL says {} \
             (stock {} - {} on their way - {} give-back(s) owed)",
            expected.max(0),
            sale.stock,
            on_their_way.len(),
            owed.len()
        ));
    }
    let buyers: HashSet<UserId> = views
        .iter()
        .flat_map(|view| &view.buyers)
        .copied()
        .collect();
    let mut due: BTreeSet<UserId> = sale.buyers.iter().copied().collect();
    due.extend(on_their_way.iter().map(|order| order.user_id));
    let missing = due.iter().filter(|user| !buyers.contains(user)).count();
    let returning: HashSet<UserId> = owed.iter().map(|(_, user)| *user).collect();
    let extra = (buyers.iter())
        .filter(|user| !due.contains(user) && !returning.contains(user))
        .count();
    if missing + extra > 0 {
        drifts.push(format!(
            "{missing} buyer(s) with an order missing from Redis, {extra} buyer(s) there \
             with none"
        ));
    }
    (!drifts.is_empty()).then(|| Drift(drifts.join("; ")))
}
