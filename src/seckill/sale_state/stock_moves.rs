//! Stock moved between a sale's shards: a buyer whose shard has run out
//! while other shards still hold units is served from them.
//!
//! A move is three calls, each to one shard, each of which can be the last
//! one its mover makes:
//!
//! 1. **lend** (`lua/shard_lend.lua`, on the lending shard): half its stock
//!    (at most [`MOST_LENT`]) leaves it and is recorded in its transit hash
//!    under a random transfer id, in the same call;
//! 2. **receive** (`lua/shard_receive.lua`, on the receiving shard): the
//!    units join its stock, the transfer id its received set, in one call —
//!    a transfer is received once, however often it is sent;
//! 3. **settle** (`lua/shard_settle.lua`, on the lending shard): the record
//!    leaves the transit hash.
//!
//! A mover that dies after step 1 or 2 leaves its record behind. Every node
//! looks at the transit hashes every [`SWEEP_EVERY`]: a record older than
//! [`STALE_AFTER`] is received and settled by whichever node finds it, which
//! changes nothing if the mover was only slow. A buyer who finds units in
//! transit waits for them, looking again every [`IN_TRANSIT_PAUSE`]. A unit
//! is thus stranded at most `STALE_AFTER + SWEEP_EVERY` (3 s) after its
//! mover died, unless its delivery fails: the age of the oldest record a
//! node's sweep finds is its `hmdp_stock_transit_oldest_seconds`. A
//! receiving shard of another load (a new epoch) refuses the units: they go
//! back to the lender, unless the lender too was loaded again (that load
//! counted its units from MySQL). A mover that finds the sale's shards of
//! different loads (a load that died half-way) moves nothing: the sale is
//! loaded again as a whole.
//!
//! A writer counting again an order Redis lost (`lua/seckill_readmit.lua`)
//! borrows the same way when the order's shard has no unit left.
//!
//! The sale answers SOLD_OUT only when no shard holds or moves a unit: two
//! reads of every shard, one after the other, find each one's stock at 0,
//! nothing in transit, and no move between them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Script;
use std::sync::LazyLock;
use tokio::time::Instant;

use super::SaleState;
use crate::error::Error;
use crate::ids::VoucherId;
use crate::metrics;
use crate::shards::{Layout, Shard};

static LEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/shard_lend.lua")));
static RECEIVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/shard_receive.lua")));
static SETTLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/shard_settle.lua")));

/// At most this many units move in one transfer: enough that a shard all
/// buyers hash to borrows a few times, not once a purchase.
const MOST_LENT: i64 = 64;

/// A transfer recorded this long ago is taken for its mover's: dead. A
/// live mover's three calls take milliseconds.
pub const STALE_AFTER: Duration = Duration::from_secs(2);

/// How often every node looks for stale transfers.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How long a buyer waits before looking again while units are in transit.
const IN_TRANSIT_PAUSE: Duration = Duration::from_millis(10);

/// One shard's counts, as one read finds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Look {
    pub(super) stock: i64,
    pub(super) moves: i64,
    pub(super) in_transit: i64,
    /// The load that wrote the shard (`None` for a sale stored before
    /// epochs existed): shards of one sale that disagree are a sale Redis
    /// partly forgot.
    pub(super) epoch: Option<i64>,
}

/// What a node saw of a sale's shards at one moment.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) at: Instant,
    pub(super) looks: Vec<Look>,
    /// Proved sold out then.
    pub(super) sold_out: bool,
}

/// A sale as a mover needs it.
#[derive(Debug, Clone, Copy)]
pub struct SaleRef {
    pub voucher_id: VoucherId,
    /// The voucher's sale token: a shard of another token lends nothing.
    pub token: u64,
    pub layout: Layout,
}

/// What [`SaleState::refill`] did for a shard found empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refill {
    /// Units came to the shard (moved here, or given back): ask it again.
    Moved,
    /// A shard of the sale is gone from Redis, or its shards are of
    /// different loads: the sale is to be loaded again as a whole.
    Missing,
    /// No shard holds or moves a unit.
    SoldOut,
}

/// How long a node trusts what it saw of a sale's shards: long enough to
/// spare the storm in flight at the last unit a read of every shard each,
/// far shorter than the node's memory of a sold-out sale (5 s, `catalog.rs`).
const SEEN_FOR: Duration = Duration::from_millis(200);

/// The positions of the shards other than `position` that held stock, the
/// fullest first: the fewer moves, the better.
fn fullest(looks: &[Look], position: u16) -> impl Iterator<Item = u16> {
    let mut donors: Vec<u16> = (0..looks.len() as u16)
        .filter(|&donor| donor != position && looks[usize::from(donor)].stock > 0)
        .collect();
    donors.sort_by_key(|&donor| -looks[usize::from(donor)].stock);
    donors.into_iter()
}

/// A transfer record of a transit hash, as `lua/shard_lend.lua` wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Transfer {
    voucher_id: VoucherId,
    to: Shard,
    units: i64,
    epoch: String,
    lent_ms: i64,
}

impl Transfer {
    fn parse(record: &str) -> Option<Transfer> {
        let mut fields = record.split(':');
        let transfer = Transfer {
            voucher_id: VoucherId::new(fields.next()?.parse().ok()?),
            to: Shard::from_index(fields.next()?.parse().ok()?)?,
            units: fields.next()?.parse().ok()?,
            epoch: fields.next()?.to_owned(),
            lent_ms: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(transfer)
    }

    /// How long ago it was lent, at `now_ms` by the clock that stamped it.
    fn age_at(&self, now_ms: i64) -> Duration {
        Duration::from_millis((now_ms - self.lent_ms).max(0) as u64)
    }
}

/// A transfer record as a sweep read it.
struct Lent {
    id: String,
    transfer: Transfer,
    age: Duration,
}

/// A transfer of a sale's units between two of its shards, as its record
/// in the lender's transit hash shows it (`hmdp audit` reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InTransit {
    pub id: String,
    pub from: Shard,
    pub to: Shard,
    pub units: i64,
    /// The load of the sale the units were lent from.
    pub epoch: String,
    /// Since the lend, by the lender's clock.
    pub age: Duration,
    /// Whether the receiver counted it (its id in the received set): a
    /// record received and not yet settled holds no unit in transit.
    pub received: bool,
}

impl SaleState {
    /// `shard`'s transit hash, id and record, and the time now by the same
    /// server, in milliseconds: one pipeline, sent to the master of the
    /// hash, whose clock stamped the records (`lua/shard_lend.lua`) and so
    /// tells their age.
    async fn transit_records(&self, shard: Shard) -> Result<(Vec<(String, String)>, i64), Error> {
        let (records, (seconds, micros)): (Vec<(String, String)>, (i64, i64)) = redis::pipe()
            .hgetall(self.keys.shard(shard).transit())
            .cmd("TIME")
            .query_async(&mut self.redis.clone())
            .await?;
        Ok((records, seconds * 1000 + micros / 1000))
    }

    /// Every transfer record of `voucher_id`'s sale in its shards' transit
    /// hashes, with its age and whether it was received.
    pub async fn transfers_of(
        &self,
        voucher_id: VoucherId,
        layout: Layout,
    ) -> Result<Vec<InTransit>, Error> {
        let mut transfers = Vec::new();
        for from in layout.shards() {
            let (records, now_ms) = self.transit_records(from).await?;
            for (id, record) in records {
                let Some(transfer) = Transfer::parse(&record) else {
                    return Err(Error::Internal(anyhow::anyhow!(
                        "unreadable transfer record {id}: {record:?}"
                    )));
                };
                if transfer.voucher_id != voucher_id {
                    continue;
                }
                let received: bool = redis::cmd("SISMEMBER")
                    .arg(self.keys.shard(transfer.to).received(voucher_id))
                    .arg(&id)
                    .query_async(&mut self.redis.clone())
                    .await?;
                let age = transfer.age_at(now_ms);
                transfers.push(InTransit {
                    id,
                    from,
                    to: transfer.to,
                    units: transfer.units,
                    epoch: transfer.epoch,
                    age,
                    received,
                });
            }
        }
        Ok(transfers)
    }

    /// Fills shard `position` of `sale`, found empty by a buyer, from the
    /// sale's other shards; or finds that none holds a unit. Gives up (503)
    /// at `deadline` while units stay in transit (a mover died within the
    /// last [`STALE_AFTER`]).
    pub(super) async fn refill(
        &self,
        sale: &SaleRef,
        position: u16,
        deadline: Instant,
    ) -> Result<Refill, Error> {
        if sale.layout.count() == 1 {
            return Ok(Refill::SoldOut);
        }
        let home = sale.layout.shard(position);
        // What this node saw a moment ago spares the reads of every shard:
        // a sale it proved sold out, or the shard that had the most stock.
        match self.seen(sale.voucher_id) {
            Some(Seen { sold_out: true, .. }) => return Ok(Refill::SoldOut),
            Some(Seen { looks, .. }) => {
                if let Some(donor) = fullest(&looks, position).next() {
                    let epoch = looks[usize::from(position)].epoch;
                    if self
                        .moved(sale, sale.layout.shard(donor), home, epoch)
                        .await?
                    {
                        return Ok(Refill::Moved);
                    }
                }
            }
            None => {}
        }
        while Instant::now() < deadline {
            let first = self.look(sale).await?;
            let Some(first) = first.into_iter().collect::<Option<Vec<Look>>>() else {
                return Ok(Refill::Missing);
            };
            // Shards of different loads: a load died half-way. Units moved
            // between them would be refused by the receiver; the sale is
            // loaded again from MySQL instead.
            if first.iter().any(|look| look.epoch != first[0].epoch) {
                tracing::warn!(voucher_id = %sale.voucher_id,
                    "the sale's shards are of different loads; loading it again");
                return Ok(Refill::Missing);
            }
            if first[usize::from(position)].stock > 0 {
                return Ok(Refill::Moved);
            }
            self.remember(sale.voucher_id, &first, false);
            for donor in fullest(&first, position) {
                let epoch = first[usize::from(position)].epoch;
                if self
                    .moved(sale, sale.layout.shard(donor), home, epoch)
                    .await?
                {
                    return Ok(Refill::Moved);
                }
            }
            // Units on their way land within a mover's round trips, or, its
            // mover dead, within the bound, delivered by the sweep.
            if first.iter().any(|look| look.in_transit > 0) {
                tokio::time::sleep(IN_TRANSIT_PAUSE).await;
                continue;
            }
            let second = self.look(sale).await?;
            let unchanged = second.iter().zip(&first).all(|(second, first)| {
                second.is_some_and(|second| {
                    second.stock == 0 && second.in_transit == 0 && second.moves == first.moves
                })
            });
            if unchanged {
                self.remember(sale.voucher_id, &first, true);
                return Ok(Refill::SoldOut);
            }
        }
        Err(Error::over_budget(
            "moving stock between the sale's shards",
            self.store.backend_timeout(),
        ))
    }

    /// What this node saw of the sale's shards, if it saw it within
    /// [`SEEN_FOR`].
    fn seen(&self, voucher_id: VoucherId) -> Option<Seen> {
        let seen = self.seen_shards.lock().expect("seen shards poisoned");
        (seen.get(&voucher_id))
            .filter(|seen| seen.at.elapsed() < SEEN_FOR)
            .cloned()
    }

    fn remember(&self, voucher_id: VoucherId, looks: &[Look], sold_out: bool) {
        let mut seen = self.seen_shards.lock().expect("seen shards poisoned");
        let at = Instant::now();
        seen.retain(|_, seen| seen.at.elapsed() < SEEN_FOR);
        let looks = looks.to_vec();
        seen.insert(
            voucher_id,
            Seen {
                at,
                looks,
                sold_out,
            },
        );
    }

    /// A unit of the voucher came back (an order closed on this node): what
    /// this node saw of its shards is forgotten.
    pub fn stock_returned(&self, voucher_id: VoucherId) {
        let mut seen = self.seen_shards.lock().expect("seen shards poisoned");
        seen.remove(&voucher_id);
    }

    /// Every shard's counts, read at once; `None` for a shard Redis lacks.
    async fn look(&self, sale: &SaleRef) -> Result<Vec<Option<Look>>, Error> {
        let voucher_id = sale.voucher_id;
        let shards: Vec<Vec<Option<i64>>> = self
            .on_shards(sale.layout.shards(), |mut redis, keys| async move {
                redis::cmd("HMGET")
                    .arg(keys.voucher(voucher_id))
                    .arg(&["stock", "moves", "in_transit", "epoch"])
                    .query_async(&mut redis)
                    .await
            })
            .await?;
        Ok((shards.into_iter())
            .map(|fields| match fields[..] {
                [Some(stock), moves, in_transit, epoch] => Some(Look {
                    stock,
                    moves: moves.unwrap_or(0),
                    in_transit: in_transit.unwrap_or(0),
                    epoch,
                }),
                _ => None,
            })
            .collect())
    }

    /// One move from `from` to `to`, whose load is `epoch`: lend, receive,
    /// settle. `false` when `from` had no unit left to lend, or is of
    /// another load.
    async fn moved(
        &self,
        sale: &SaleRef,
        from: Shard,
        to: Shard,
        epoch: Option<i64>,
    ) -> Result<bool, Error> {
        let transfer_id = format!("{:032x}", rand::random::<u128>());
        let from_keys = self.keys.shard(from);
        let (units, epoch): (i64, String) = LEND
            .key(from_keys.voucher(sale.voucher_id))
            .key(from_keys.transit())
            .arg(sale.voucher_id.get())
            .arg(sale.token)
            .arg(to.index())
            .arg(&transfer_id)
            .arg(MOST_LENT)
            .arg(epoch.map(|epoch| epoch.to_string()).unwrap_or_default())
            .invoke_async(&mut self.redis.clone())
            .await?;
        if units == 0 {
            return Ok(false);
        }
        metrics::STOCK_MOVES.with_label_values(&["lent"]).inc();
        let pause = self.move_pause_ms.load(Ordering::Relaxed);
        if pause > 0 {
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        let transfer = Transfer {
            voucher_id: sale.voucher_id,
            to,
            units,
            epoch,
            lent_ms: 0,
        };
        self.deliver(from, &transfer_id, &transfer).await?;
        Ok(true)
    }

    /// Steps 2 and 3 of a move: receive, then settle; units the receiver
    /// refused go back to the lender's stock.
    async fn deliver(
        &self,
        from: Shard,
        transfer_id: &str,
        transfer: &Transfer,
    ) -> Result<(), Error> {
        let to_keys = self.keys.shard(transfer.to);
        let received: i64 = RECEIVE
            .key(to_keys.voucher(transfer.voucher_id))
            .key(to_keys.received(transfer.voucher_id))
            .arg(transfer_id)
            .arg(transfer.units)
            .arg(&transfer.epoch)
            .invoke_async(&mut self.redis.clone())
            .await?;
        let (outcome, refused) = match received {
            1 => ("received", false),
            0 => ("received_before", false),
            2 => ("no_sale", true),
            _ => ("sale_reloaded", true),
        };
        metrics::STOCK_MOVES.with_label_values(&[outcome]).inc();
        if refused {
            tracing::warn!(%transfer_id, voucher_id = %transfer.voucher_id, units = transfer.units,
                from = from.tag(), to = transfer.to.tag(), outcome,
                "a shard refused units lent to it; they go back to the lender");
        }
        let from_keys = self.keys.shard(from);
        let _settled: i64 = SETTLE
            .key(from_keys.voucher(transfer.voucher_id))
            .key(from_keys.transit())
            .arg(transfer_id)
            .arg(u8::from(refused))
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(())
    }

    /// The transfer records of `shard`'s transit hash that read back, each
    /// with its age; one that does not is left as it is.
    async fn lent_by(&self, shard: Shard) -> Result<Vec<Lent>, Error> {
        let (records, now_ms) = self.transit_records(shard).await?;
        let lent = records.into_iter().filter_map(|(id, record)| {
            let Some(transfer) = Transfer::parse(&record) else {
                tracing::warn!(transfer_id = %id, %record,
                    "unreadable transfer record; left as it is");
                return None;
            };
            let age = transfer.age_at(now_ms);
            Some(Lent { id, transfer, age })
        });
        Ok(lent.collect())
    }

    /// Receives and settles every transfer of `lent`, `shard`'s, lent more
    /// than [`STALE_AFTER`] ago (its mover is taken for dead).
    async fn settle_stale(&self, shard: Shard, lent: Vec<Lent>) -> Result<(), Error> {
        for Lent { id, transfer, age } in lent {
            if age < STALE_AFTER {
                continue;
            }
            tracing::warn!(transfer_id = %id, voucher_id = %transfer.voucher_id,
                units = transfer.units, from = shard.tag(), to = transfer.to.tag(),
                "stock moved between shards by a mover that stopped; delivering it");
            self.deliver(shard, &id, &transfer).await?;
            metrics::STOCK_MOVES
                .with_label_values(&["settled_stale"])
                .inc();
        }
        Ok(())
    }

    /// Every node's sweep, for as long as it runs: every [`SWEEP_EVERY`],
    /// a [`sweep_transfers_once`](Self::sweep_transfers_once).
    pub async fn sweep_transfers(&self) {
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            self.sweep_transfers_once().await;
        }
    }

    /// Delivers the stale transfers of every shard in use, now, and sets
    /// the node's `hmdp_stock_transit_oldest_seconds` to the age of the
    /// oldest transfer found.
    pub async fn sweep_transfers_once(&self) {
        let shards = match self.shards_in_use().await {
            Ok(shards) => shards,
            Err(error) => {
                tracing::debug!(?error, "shards in use not read; sweeping none");
                return;
            }
        };
        // Only a sweep that read every shard knows that no transfer is older
        // than those it found: one that did not leaves the gauge as the last
        // one set it.
        let mut oldest = Some(Duration::ZERO);
        for shard in shards.into_iter().filter(|&shard| shard != Shard::SINGLE) {
            let lent = match self.lent_by(shard).await {
                Ok(lent) => lent,
                Err(error) => {
                    tracing::warn!(?error, shard = shard.tag(), "transit hash not read");
                    oldest = None;
                    continue;
                }
            };
            oldest =
                oldest.map(|oldest| lent.iter().map(|lent| lent.age).fold(oldest, Duration::max));
            if let Err(error) = self.settle_stale(shard, lent).await {
                tracing::warn!(?error, shard = shard.tag(), "stale transfers not delivered");
            }
        }
        if let Some(oldest) = oldest {
            metrics::STOCK_TRANSIT_OLDEST.set(oldest.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_record_reads_back_whole_or_not_at_all() {
        let to = Shard::from_index(11).unwrap();
        assert_eq!(
            Transfer::parse("42:11:3:987:1700000000000"),
            Some(Transfer {
                voucher_id: VoucherId::new(42),
                to,
                units: 3,
                epoch: "987".to_owned(),
                lent_ms: 1_700_000_000_000,
            })
        );
        for bad in [
            "",
            "42:11:3:987",
            "42:11:3:987:1:2",
            "x:11:3:987:1",
            "42:200:3:987:1",
        ] {
            assert_eq!(Transfer::parse(bad), None, "{bad}");
        }
    }
}
