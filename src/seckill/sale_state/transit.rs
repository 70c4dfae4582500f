//! Units in transit between a sale's shards: the transfer records a lend
//! leaves in the lender's transit hash, their delivery (steps 2 and 3 of a
//! move, `stock_moves.rs`: receive, then settle), and the sweep that
//! delivers the units of a mover that died.
//!
//! Every node looks at the transit hashes every [`SWEEP_EVERY`]: a record
//! older than [`STALE_AFTER`] is received and settled by whichever node
//! finds it, which changes nothing if the mover was only slow. A unit is
//! thus stranded at most `STALE_AFTER + SWEEP_EVERY` (3 s) after its mover
//! died, unless its delivery fails: the age of the oldest record a node's
//! sweep finds is its `hmdp_stock_transit_oldest_seconds`. A receiving
//! shard of another load (a new epoch) refuses the units: they go back to
//! the lender, unless the lender too was loaded again (that load counted
//! its units from MySQL).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::SaleState;
use crate::error::Error;
use crate::ids::VoucherId;
use crate::metrics;
use crate::shards::{Layout, Shard};

static RECEIVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/shard_receive.lua")));
static SETTLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/shard_settle.lua")));

/// A transfer recorded this long ago is taken for its mover's: dead. A
/// live mover's three calls take milliseconds.
pub const STALE_AFTER: Duration = Duration::from_secs(2);

/// How often every node looks for stale transfers.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A transfer record of a transit hash, as `lua/shard_lend.lua` wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Transfer {
    pub(super) voucher_id: VoucherId,
    pub(super) to: Shard,
    pub(super) units: i64,
    pub(super) epoch: String,
    /// When it was lent, by the lender's clock (0 for a move in hand).
    pub(super) lent_ms: i64,
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

    /// Steps 2 and 3 of a move: receive, then settle; units the receiver
    /// refused go back to the lender's stock.
    pub(super) async fn deliver(
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
