//! A sale read back from Redis as a whole, its shards summed: what the
//! audit and the load tests compare with MySQL.

use super::SaleState;
use crate::error::Error;
use crate::ids::{UserId, VoucherId};
use crate::shards::Shard;

/// A voucher's sale as Redis holds it, its shards summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSale {
    /// Stock when the sale was loaded, orders already written included.
    pub initial: i64,
    /// Stock left to admit.
    pub stock: i64,
    /// Units lent by one shard and not yet received by another: on their
    /// way between shards (`transit.rs`).
    pub in_transit: i64,
    /// The sale window, Unix epoch milliseconds.
    pub begin_ms: i64,
    pub end_ms: i64,
    /// Users admitted, ascending.
    pub buyers: Vec<UserId>,
    /// Each shard, by position.
    pub shards: Vec<RedisShard>,
}

/// One shard of a sale as Redis holds it: `stock + buyers = initial +
/// received - lent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisShard {
    pub shard: Shard,
    /// Its part of the stock when the sale was loaded, its orders included.
    pub initial: i64,
    pub stock: i64,
    /// Units it lent to other shards, and received from them, since.
    pub lent: i64,
    pub received: i64,
    /// Units of its transfer records not yet settled (received or not).
    pub recorded_in_transit: i64,
    /// The load that wrote it: every shard of a sale is of one load.
    pub epoch: Option<i64>,
    /// Users admitted in it.
    pub buyers: i64,
}

impl SaleState {
    /// The voucher's sale as Redis has it, `None` when MySQL has no such
    /// seckill voucher or Redis lacks a shard of its sale.
    pub async fn read(&self, voucher_id: VoucherId) -> Result<Option<RedisSale>, Error> {
        let Some(layout) = self.layout(voucher_id).await? else {
            return Ok(None);
        };
        let mut sale = RedisSale {
            initial: 0,
            stock: 0,
            in_transit: 0,
            begin_ms: 0,
            end_ms: 0,
            buyers: Vec::new(),
            shards: Vec::new(),
        };
        let shards: Vec<(Vec<Option<i64>>, Vec<u64>)> = self
            .on_shards(layout.shards(), |mut redis, keys| async move {
                redis::pipe()
                    .cmd("HMGET")
                    .arg(keys.voucher(voucher_id))
                    .arg(&[
                        "initial",
                        "stock",
                        "begin_ms",
                        "end_ms",
                        "lent",
                        "received",
                        "in_transit",
                        "epoch",
                    ])
                    .smembers(keys.buyers(voucher_id))
                    .query_async(&mut redis)
                    .await
            })
            .await?;
        for (shard, (fields, buyers)) in layout.shards().zip(shards) {
            let [Some(initial), Some(stock), Some(begin_ms), Some(end_ms), lent, received, recorded, epoch] =
                fields[..]
            else {
                return Ok(None);
            };
            let (lent, received) = (lent.unwrap_or(0), received.unwrap_or(0));
            sale.initial += initial;
            sale.stock += stock;
            sale.in_transit += lent - received;
            (sale.begin_ms, sale.end_ms) = (begin_ms, end_ms);
            sale.shards.push(RedisShard {
                shard,
                initial,
                stock,
                lent,
                received,
                recorded_in_transit: recorded.unwrap_or(0),
                epoch,
                buyers: buyers.len() as i64,
            });
            sale.buyers.extend(buyers.into_iter().map(UserId::new));
        }
        sale.buyers.sort_unstable();
        Ok(Some(sale))
    }
}
