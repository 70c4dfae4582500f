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
//! A mover that dies after step 1 or 2 leaves its record behind, which
//! every node's sweep delivers (`transit.rs`). A buyer who finds units in
//! transit waits for them, looking again every [`IN_TRANSIT_PAUSE`]. A
//! mover that finds the sale's shards of different loads (a load that died
//! half-way) moves nothing: the sale is loaded again as a whole.
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

use super::admission::SALE_FENCE;
use super::transit::Transfer;
use super::SaleState;
use crate::error::Error;
use crate::ids::VoucherId;
use crate::metrics;
use crate::shards::{Layout, Shard};

static LEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&[SALE_FENCE, include_str!("../../../lua/shard_lend.lua")].concat())
});

/// At most this many units move in one transfer: enough that a shard all
/// buyers hash to borrows a few times, not once a purchase.
const MOST_LENT: i64 = 64;

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
    /// A shard of the sale is gone from Redis, its shards are of
    /// different loads, or one cannot be trusted (`fence.rs`): the sale is
    /// to be loaded again as a whole.
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

impl SaleState {
    /// Fills shard `position` of `sale`, found empty by a buyer, from the
    /// sale's other shards; or finds that none holds a unit. Gives up (503)
    /// at `deadline` while units stay in transit (a mover died within the
    /// last [`STALE_AFTER`](super::STALE_AFTER)).
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
                    if let Some(refill) =
                        (self.moved(sale, sale.layout.shard(donor), home, epoch)).await?
                    {
                        return Ok(refill);
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
                if let Some(refill) =
                    (self.moved(sale, sale.layout.shard(donor), home, epoch)).await?
                {
                    return Ok(refill);
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
    /// settle; [`Refill::Moved`] once done. `None` when `from` had no unit
    /// left to lend, or is of another load; [`Refill::Missing`] when `from`
    /// cannot be trusted (`fence.rs`): the sale is to be loaded again.
    async fn moved(
        &self,
        sale: &SaleRef,
        from: Shard,
        to: Shard,
        epoch: Option<i64>,
    ) -> Result<Option<Refill>, Error> {
        let transfer_id = format!("{:032x}", rand::random::<u128>());
        let from_keys = self.keys.shard(from);
        let (units, epoch): (i64, String) = LEND
            .key(from_keys.voucher(sale.voucher_id))
            .key(from_keys.transit())
            .key(from_keys.buyers(sale.voucher_id))
            .arg(sale.voucher_id.get())
            .arg(sale.token)
            .arg(to.index())
            .arg(&transfer_id)
            .arg(MOST_LENT)
            .arg(epoch.map(|epoch| epoch.to_string()).unwrap_or_default())
            .arg(self.fences.floor(sale.voucher_id, from))
            .invoke_async(&mut self.redis.clone())
            .await?;
        match units {
            0 => return Ok(None),
            ..0 => return Ok(Some(Refill::Missing)),
            _ => {}
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
        Ok(Some(Refill::Moved))
    }
}
