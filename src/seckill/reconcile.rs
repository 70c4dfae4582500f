//! The reconciler: Redis is a cache of the sale that may forget, MySQL is
//! the truth. Every node, every [`RECONCILE_EVERY`], compares each seckill
//! sale Redis holds with MySQL, a sale at a time, and loads again from
//! MySQL a sale whose counts drifted (an `appendfsync everysec` crash or a
//! failover to a replica that missed writes: Redis kept the sale and lost
//! its last admissions, or its last give-backs); a sale missing a shard, or
//! whose shards are of different loads, is loaded again as any purchase
//! would. Each heal is logged and counted (`hmdp_sales_reloaded_total`).
//! While orders are on their way (writers working through a backlog) the
//! comparison, which reads every one of them, runs at most every
//! [`RECONCILE_BUSY_EVERY`]; the missing-shard check still every round.
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
//! round skip the sale rather than heal what is no drift.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use super::sale_state::{on_their_way, pending_entry, Drift, SaleState};
use crate::error::Error;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::shards::Layout;
use crate::store::{NewOrder, SaleSnapshot};

/// How often every node compares the sales with MySQL.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// How often, at most, while orders are on their way.
pub const RECONCILE_BUSY_EVERY: Duration = Duration::from_secs(30);

/// One shard of a sale, read in one `MULTI`.
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
    /// [`RECONCILE_EVERY`], each seckill voucher's sale compared with
    /// MySQL, and healed when it drifted.
    pub async fn reconcile_forever(&self) {
        let mut compared_at: Option<Instant> = None;
        loop {
            tokio::time::sleep(RECONCILE_EVERY).await;
            let vouchers = match self.store.seckill_voucher_ids().await {
                Ok(vouchers) => vouchers,
                Err(error) => {
                    tracing::debug!(%error, "seckill vouchers not read; reconciling none");
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
            for voucher_id in vouchers {
                let reconciled = match compare {
                    true => self.reconcile(voucher_id).await,
                    false => self.load_if_loaded(voucher_id).await,
                };
                if let Err(error) = reconciled {
                    tracing::debug!(%voucher_id, ?error, "sale not reconciled this round");
                }
            }
        }
    }

    /// A sale loaded before and missing a shard (or of shards of different
    /// loads) loaded again: the cheap half of [`SaleState::reconcile`].
    async fn load_if_loaded(&self, voucher_id: VoucherId) -> Result<bool, Error> {
        if !self.store.sale_loaded(voucher_id).await? {
            return Ok(false);
        }
        self.load(voucher_id).await
    }

    /// Compares `voucher_id`'s sale in Redis with MySQL; loads it again when
    /// Redis forgot any of it. `true` when it did.
    pub async fn reconcile(&self, voucher_id: VoucherId) -> Result<bool, Error> {
        if !self.store.sale_loaded(voucher_id).await? {
            // Never loaded: nothing in Redis to reconcile (a `sync` sale).
            return Ok(false);
        }
        // A shard missing or of another load: loaded as a purchase would.
        if self.load(voucher_id).await? {
            return Ok(true);
        }
        // Compared first without the stock row, which every writer of the
        // voucher needs: Redis read before MySQL, so that a commit or a
        // close between the two reads balances (the order leaves the orders
        // on their way as it enters MySQL's; the unit enters MySQL's stock
        // as the give-back it owes Redis). Only a drift found so is
        // compared again under the stock row.
        let Some(layout) = self.layout(voucher_id).await? else {
            return Ok(false);
        };
        let Some(views) = self.views(voucher_id, layout).await? else {
            return Ok(false);
        };
        let Some(sale) = self.store.peek_sale(voucher_id).await? else {
            return Ok(false);
        };
        if self.drift(voucher_id, &views, &sale).await?.is_none() {
            return Ok(false);
        }
        self.heal(voucher_id).await
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
        match self.views(voucher_id, layout).await? {
            Some(views) => self.drift(voucher_id, &views, sale).await,
            None => Ok(None),
        }
    }

    /// The drift of the sale's Redis side (`views`) from MySQL (`sale`,
    /// read after them), `None` when there is none.
    async fn drift(
        &self,
        voucher_id: VoucherId,
        views: &[ShardView],
        sale: &SaleSnapshot,
    ) -> Result<Option<Drift>, Error> {
        let written: HashSet<OrderId> = sale.order_ids.iter().copied().collect();
        let dead: HashSet<OrderId> = (self.dead_letters_of(voucher_id).await?)
            .into_iter()
            .filter_map(|letter| letter.order.ok().map(|order| order.id))
            .collect();
        let pending = views.iter().flat_map(|view| &view.pending).copied();
        let on_their_way = on_their_way(pending, &written, &dead, &sale.buyers);
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
        Ok((!drifts.is_empty()).then(|| Drift(drifts.join("; "))))
    }

    /// Each shard of the sale read in one `MULTI`, then every shard's moves
    /// read again: `None` when a move ran between the reads, or a shard is
    /// gone.
    async fn views(
        &self,
        voucher_id: VoucherId,
        layout: Layout,
    ) -> Result<Option<Vec<ShardView>>, Error> {
        type Read = (Vec<Option<i64>>, Vec<(i64, String)>, Vec<i64>, Vec<u64>);
        let reads: Vec<Read> = self
            .on_shards(layout.shards(), |mut redis, keys| async move {
                redis::pipe()
                    .atomic()
                    .cmd("HMGET")
                    .arg(keys.voucher(voucher_id))
                    .arg(&["stock", "lent", "received", "moves"])
                    .hgetall(keys.pending())
                    .smembers(keys.given_back(voucher_id))
                    .smembers(keys.buyers(voucher_id))
                    .query_async(&mut redis)
                    .await
            })
            .await?;
        let mut views = Vec::with_capacity(reads.len());
        for (fields, pending, given_back, buyers) in reads {
            let [Some(stock), lent, received, moves] = fields[..] else {
                return Ok(None);
            };
            let mut orders = Vec::new();
            for (id, entry) in pending {
                let order = pending_entry(OrderId::new(id), &entry)?;
                if order.voucher_id == voucher_id {
                    orders.push(order);
                }
            }
            views.push(ShardView {
                stock,
                lent_less_received: lent.unwrap_or(0) - received.unwrap_or(0),
                moves: moves.unwrap_or(0),
                buyers: buyers.into_iter().map(UserId::new).collect(),
                pending: orders,
                given_back: given_back.into_iter().map(OrderId::new).collect(),
            });
        }
        let moves: Vec<Option<i64>> = self
            .on_shards(layout.shards(), |mut redis, keys| async move {
                redis::cmd("HGET")
                    .arg(keys.voucher(voucher_id))
                    .arg("moves")
                    .query_async(&mut redis)
                    .await
            })
            .await?;
        let still = (views.iter().zip(&moves)).all(|(view, now)| now.unwrap_or(0) == view.moves);
        Ok(still.then_some(views))
    }
}
