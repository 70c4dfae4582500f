//! Loading a sale into Redis from MySQL, as a whole.
//!
//! MySQL stays the source a sale is loaded from, as a whole: while the
//! voucher's stock row is held (no writer commits, no other node loads),
//! a sale whose every shard is in Redis with this voucher's token and one
//! load's epoch is kept; otherwise every shard is written again
//! (`lua/seckill_load.lua`), its part of MySQL's stock and the buyers
//! routed to it, under a new epoch. So a sale already running in Redis is
//! never reset, a Redis (or a cluster master) restarted empty is filled
//! again from MySQL at the next node start or purchase, and a sale left by
//! an earlier voucher of the same id (a database reset or restored while
//! Redis kept its keys) is replaced, not sold from.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{Local, NaiveDateTime, TimeZone};
use redis::{AsyncCommands, Script};
use std::sync::LazyLock;

use super::admission::SALE_FENCE;
use super::fence::Suspicion;
use super::in_flight::on_their_way;
use super::{layout_of, Drift, SaleState};
use crate::error::Error;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::keys::Keys;
use crate::metrics;
use crate::redis_handle::RedisConnection;
use crate::shards::{Layout, Shard};
use crate::store::{NewOrder, SaleSnapshot};

static LOAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&[SALE_FENCE, include_str!("../../../lua/seckill_load.lua")].concat())
});
static CLOSE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/seckill_close.lua")));
static FOUND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&[SALE_FENCE, include_str!("../../../lua/sale_found.lua")].concat())
});
/// What Redis holds of a voucher's sale, as a load finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    /// Every shard, of this voucher's token and one load: nothing to write.
    Whole,
    /// Some shard, or all, is missing.
    Missing,
    /// Every shard is there, not all of one load: a load died half-way,
    /// or a shard was written again alone.
    Split,
    /// Every shard of one load, counts that drifted from MySQL's (the
    /// reconciler's finding, under the stock row).
    Drifted(Drift),
    /// A shard carries another token: an earlier voucher's sale.
    Stale,
    /// Every shard is there, and one cannot be trusted (`fence.rs`): Redis
    /// restarted or failed over, lost buyers, or lost admissions MySQL has.
    Suspect(Suspicion),
}

impl SaleState {
    /// Loads every seckill sale of MySQL not ended that Redis lacks (a node
    /// starting in `queue` or `stream` mode); returns how many it loaded.
    pub async fn load_missing(&self) -> Result<usize, Error> {
        let mut loaded = 0;
        for voucher_id in self.store.unended_sale_ids().await? {
            loaded += usize::from(self.load(voucher_id).await?);
        }
        Ok(loaded)
    }

    /// Loads one voucher's sale from MySQL unless Redis has this very sale
    /// (same sale token); `true` when this call loaded it, or replaced an
    /// earlier voucher's sale under the same id (logged and counted),
    /// `false` when it was there or MySQL has no such seckill voucher.
    ///
    /// A sale loaded before (Redis lost it) may have orders admitted before
    /// the loss still in writers' hands: it admits nobody for the backend
    /// timeout, the longest such a writer takes to reach the voucher's
    /// stock row and count its orders again (`lua/seckill_readmit.lua`), so
    /// that no unit they hold goes to a later buyer. A sale loaded for the
    /// first time admits at once.
    ///
    /// Gives up (503) after the backend timeout, the wait for another
    /// load of the same voucher included: a frozen MySQL must not hold the
    /// purchases waiting on it for ever.
    pub async fn load(&self, voucher_id: VoucherId) -> Result<bool, Error> {
        self.load_within_timeout(voucher_id, false).await
    }

    /// The reconciler's load (`reconcile.rs`): the sale is loaded again
    /// when Redis holds all of it and its counts drifted from MySQL's
    /// (compared while the stock row is held); `true` when it was.
    pub async fn heal(&self, voucher_id: VoucherId) -> Result<bool, Error> {
        self.load_within_timeout(voucher_id, true).await
    }

    async fn load_within_timeout(&self, voucher_id: VoucherId, heal: bool) -> Result<bool, Error> {
        let deadline = self.store.backend_timeout();
        tokio::time::timeout(deadline, self.load_now(voucher_id, heal))
            .await
            .map_err(|_| {
                Error::over_budget(&format!("loading voucher {voucher_id}'s sale"), deadline)
            })?
    }

    async fn load_now(&self, voucher_id: VoucherId, heal: bool) -> Result<bool, Error> {
        let voucher_loads = self
            .loading
            .lock()
            .expect("sale loads poisoned")
            .entry(voucher_id)
            .or_default()
            .clone();
        let _one_at_a_time = voucher_loads.lock().await;
        // Checked first so that a sale already in Redis costs no read of
        // its buyers, and checked again under the stock row, for other nodes.
        let Some(row) = self.store.seckill_voucher(voucher_id).await? else {
            return Ok(false);
        };
        let layout = layout_of(row.shards)?;
        if !heal && self.found(voucher_id, layout, row.sale_token).await? == Found::Whole {
            return Ok(false);
        }
        let Some((tx, sale)) = self.store.lock_sale(voucher_id).await? else {
            return Ok(false);
        };
        let layout = layout_of(sale.shards)?;
        // What MySQL has written, read under the stock row: no writer
        // raises it until this load ends.
        self.fences.learn(voucher_id, &sale.fence);
        let mut found = self.found(voucher_id, layout, sale.token).await?;
        if found == Found::Whole {
            let drift = match heal {
                true => self.drift_now(voucher_id, layout, &sale).await?,
                false => None,
            };
            match drift {
                Some(drift) => found = Found::Drifted(drift),
                None => {
                    tx.commit().await?;
                    return Ok(false);
                }
            }
        }
        // Stored while the stock row is held: see `Store::lock_sale`.
        let (opens_in, on_their_way) = if sale.loaded_before && found != Found::Stale {
            let opens_in = self.store.backend_timeout();
            // The old sale admits nobody while its orders on their way are
            // read, so that none comes after the read and goes uncounted;
            // for twice the time the load may take, should it die.
            self.close(voucher_id, layout, opens_in * 2).await?;
            (opens_in, self.on_their_way(voucher_id, &sale).await?)
        } else {
            (Duration::ZERO, Vec::new())
        };
        // Stored and committed in a task of its own: a load given up on at
        // its deadline must not end the transaction, and free the stock row
        // for a close whose give-back would then miss this sale, while its
        // write to Redis is still on its way.
        let (redis, keys) = (self.redis.clone(), self.keys.clone());
        let stored = tokio::spawn(async move {
            put(
                redis,
                &keys,
                voucher_id,
                layout,
                &sale,
                &on_their_way,
                opens_in,
            )
            .await?;
            tx.commit().await?;
            Ok::<_, Error>((on_their_way.len(), sale))
        });
        let (on_their_way, sale) = stored.await.map_err(|failed| {
            Error::Internal(anyhow::Error::new(failed).context("the sale's load task failed"))
        })??;
        if sale.loaded_before && found != Found::Stale {
            // Loaded before: Redis forgot some of it. A heal, logged and
            // counted by what was found.
            let (label, drift) = match &found {
                Found::Split => ("split", String::new()),
                Found::Drifted(Drift(drift)) => ("drift", drift.clone()),
                Found::Suspect(suspicion) => (suspicion.label(), String::new()),
                _ => ("missing", String::new()),
            };
            metrics::SALES_RELOADED.with_label_values(&[label]).inc();
            tracing::warn!(%voucher_id, found = label, drift, initial = sale.initial(),
                stock = sale.stock, buyers = sale.buyers.len(), shards = layout.count(),
                on_their_way, "Redis forgot part of a seckill sale: loaded it again from MySQL");
        } else if found == Found::Stale {
            metrics::STALE_SALES_REPLACED.inc();
            tracing::warn!(%voucher_id, initial = sale.initial(), stock = sale.stock,
                "Redis held an earlier voucher's sale under this id (the database was reset \
                 or restored): replaced with this voucher's");
        } else {
            tracing::info!(%voucher_id, initial = sale.initial(), stock = sale.stock,
                buyers = sale.buyers.len(), shards = layout.count(),
                "seckill sale loaded into Redis from MySQL");
        }
        Ok(true)
    }

    /// The orders of the voucher Redis still holds as pending (in the
    /// shards it did not forget) that MySQL has not written, each of a
    /// buyer with no active order there: orders on their way, which a sale
    /// loaded again keeps counted (their units taken, their buyers in),
    /// so that their writers find them pending and no later buyer gets
    /// their units. Read while the stock row is held: no writer commits
    /// one of them meanwhile.
    async fn on_their_way(
        &self,
        voucher_id: VoucherId,
        sale: &SaleSnapshot,
    ) -> Result<Vec<NewOrder>, Error> {
        let pending = self.pending_orders_of(voucher_id).await?;
        if pending.is_empty() {
            return Ok(pending);
        }
        let written: HashSet<OrderId> = sale.order_ids.iter().copied().collect();
        let dead = self.dead_order_ids().await?;
        Ok(on_their_way(
            pending.into_iter(),
            &written,
            &dead,
            &sale.buyers,
        ))
    }

    /// Closes the sale in every shard Redis holds for `for_how_long`
    /// (`lua/seckill_close.lua`): admissions answer that it reopens shortly.
    async fn close(
        &self,
        voucher_id: VoucherId,
        layout: Layout,
        for_how_long: Duration,
    ) -> Result<(), Error> {
        let millis = for_how_long.as_millis() as u64;
        self.on_shards(layout.shards(), |mut redis, keys| async move {
            CLOSE
                .key(keys.voucher(voucher_id))
                .arg(millis)
                .invoke_async::<()>(&mut redis)
                .await
        })
        .await?;
        Ok(())
    }

    /// Whether Redis holds the voucher's sale, in every shard, with the
    /// voucher's `token` and one load's epoch, and every shard can be
    /// trusted (`lua/sale_found.lua`).
    async fn found(
        &self,
        voucher_id: VoucherId,
        layout: Layout,
        token: u64,
    ) -> Result<Found, Error> {
        type Shard = (Option<i64>, Option<u64>, Option<String>, i64);
        let shards: Vec<Shard> = self
            .on_shards(layout.shards(), |mut redis, keys| async move {
                let floor = self.fences.floor(voucher_id, keys.shard());
                FOUND
                    .key(keys.voucher(voucher_id))
                    .key(keys.buyers(voucher_id))
                    .arg(floor)
                    .invoke_async(&mut redis)
                    .await
            })
            .await?;
        // A sale stored before tokens existed has none: it is token 0's.
        if shards
            .iter()
            .any(|(stock, found, _, _)| stock.is_some() && found.unwrap_or(0) != token)
        {
            return Ok(Found::Stale);
        }
        if shards.iter().any(|(stock, _, _, _)| stock.is_none()) {
            return Ok(Found::Missing);
        }
        if let Some(suspicion) = (shards.iter()).find_map(|(.., code)| Suspicion::from_code(*code))
        {
            return Ok(Found::Suspect(suspicion));
        }
        let one_load = (shards.iter()).all(|(_, _, epoch, _)| epoch == &shards[0].2);
        Ok(if one_load { Found::Whole } else { Found::Split })
    }

    /// The voucher's layout as MySQL has it, `None` when it is no seckill
    /// voucher.
    pub async fn layout(&self, voucher_id: VoucherId) -> Result<Option<Layout>, Error> {
        match self.store.seckill_voucher(voucher_id).await? {
            Some(row) => Ok(Some(layout_of(row.shards)?)),
            None => Ok(None),
        }
    }

    /// Every shard the seckill vouchers' sales use (the one-shard sale's
    /// always among them): whose streams the consumers read, whose units
    /// in transit the movers watch.
    pub async fn shards_in_use(&self) -> Result<Vec<Shard>, Error> {
        let mut shards = vec![Shard::SINGLE];
        for count in self.store.sale_shard_counts().await? {
            shards.extend(layout_of(count)?.shards());
        }
        shards.sort_unstable();
        shards.dedup();
        Ok(shards)
    }

    /// Removes a voucher: its rows and orders from MySQL, then its sale and
    /// buyers from Redis (a node that loads meanwhile finds it gone in MySQL).
    pub async fn delete_voucher(&self, voucher_id: VoucherId) -> Result<(), Error> {
        let layout = self.layout(voucher_id).await?.unwrap_or(Layout::SINGLE);
        self.store.delete_voucher(voucher_id).await?;
        self.fences.forget(voucher_id);
        self.on_shards(layout.shards(), |mut redis, keys| async move {
            let keys = [
                keys.voucher(voucher_id),
                keys.buyers(voucher_id),
                keys.given_back(voucher_id),
                keys.received(voucher_id),
            ];
            redis.del::<_, ()>(&keys).await
        })
        .await?;
        Ok(())
    }
}

/// A sale time as Redis compares it: the wall-clock time MySQL holds, in
/// this node's time zone (the zone the synchronous purchase compares it in),
/// as Unix epoch milliseconds. A time that the zone skips (a daylight-saving
/// gap) is read as UTC rather than refused; zones without one (China's)
/// never get there.
fn epoch_ms(at: NaiveDateTime) -> i64 {
    Local.from_local_datetime(&at).earliest().map_or_else(
        || at.and_utc().timestamp_millis(),
        |at| at.timestamp_millis(),
    )
}

/// Writes every shard of `sale` into Redis under a new epoch
/// (`lua/seckill_load.lua`): Redis's stock is MySQL's less the orders
/// `on_their_way`, whose buyers join their shards' buyers.
async fn put(
    mut redis: RedisConnection,
    keys: &Keys,
    voucher_id: VoucherId,
    layout: Layout,
    sale: &SaleSnapshot,
    on_their_way: &[NewOrder],
    opens_in: Duration,
) -> Result<(), Error> {
    let epoch = rand::random::<u64>() >> 1;
    // More orders on their way than MySQL has units: Redis and MySQL
    // disagree, and the orders without a unit end in the dead letters
    // (`no stock left in MySQL`) when their writers get to them.
    let stock = layout.split((sale.stock - on_their_way.len() as i64).max(0));
    for (position, shard) in layout.shards().enumerate() {
        let written = (sale.buyers.iter().copied())
            .filter(|buyer| usize::from(layout.position_of(*buyer)) == position);
        // An order on its way counts in the shard that drew it, where its
        // pending entry and its writer's readmission are.
        let coming = (on_their_way.iter())
            .filter(|order| Shard::of_order(order.id) == shard)
            .map(|order| order.user_id);
        let buyers: Vec<UserId> = written.chain(coming).collect();
        // The shard's numbers go on above every admission MySQL has written
        // and every order on its way, so that the fence its writers raise
        // never passes what it holds.
        let sequence = (on_their_way.iter())
            .filter(|order| Shard::of_order(order.id) == shard)
            .map(|order| order.sequence)
            .fold(sale.fence.of(shard), u64::max);
        let keys = keys.shard(shard);
        let mut load = LOAD.prepare_invoke();
        load.key(keys.voucher(voucher_id))
            .key(keys.buyers(voucher_id))
            .key(keys.given_back(voucher_id))
            .key(keys.received(voucher_id))
            .arg(stock[position] + buyers.len() as i64)
            .arg(stock[position])
            .arg(epoch_ms(sale.begin_time))
            .arg(epoch_ms(sale.end_time))
            .arg(sale.token)
            .arg(opens_in.as_millis() as u64)
            .arg(epoch)
            .arg(sequence)
            .arg(buyers.len());
        for buyer in buyers {
            load.arg(buyer.get());
        }
        // A closed order counts as given back in the shard that drew it,
        // where its give-back goes (`after_sale`).
        for (order, _) in (sale.closed.iter()).filter(|(order, _)| Shard::of_order(*order) == shard)
        {
            load.arg(order.get());
        }
        load.invoke_async::<()>(&mut redis).await?;
    }
    Ok(())
}
