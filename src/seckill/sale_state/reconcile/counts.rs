//! A round's first look at Redis: each sale's counts, every shard read in
//! one `MULTI` for all the sales on it, no member read. What MySQL counts
//! of the same sales (`Store::sale_counts`) is read after it, and the two
//! are compared (`agreement.rs`) before any buyer or order is read.

use std::collections::{BTreeMap, HashMap};

use redis::Value;

use super::super::in_flight::pending_entry;
use super::super::SaleState;
use super::parse;
use crate::error::Error;
use crate::ids::{OrderId, VoucherId};
use crate::shards::Shard;
use crate::store::LiveSale;

/// The fields of a shard's hash the first look reads.
const FIELDS: [&str; 5] = ["stock", "lent", "received", "token", "epoch"];

/// One shard of a sale, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ShardCount {
    /// `None`: the shard is missing.
    pub stock: Option<i64>,
    /// Units lent less units received: what this shard's moves leave in
    /// transit, summed over the shards.
    pub lent_less_received: i64,
    pub token: Option<u64>,
    pub epoch: Option<String>,
    /// The size of its buyer set and of its given-back set.
    pub buyers: i64,
    pub given_back: i64,
    /// The voucher's orders in the shard's pending hash.
    pub pending: i64,
}

impl SaleState {
    /// Each of `sales`' shards counted, by voucher, in the order of its
    /// layout. `members`: the sets' sizes and the pending orders are read
    /// too (a comparing round); without, only what tells a shard missing
    /// or of another load.
    pub(super) async fn counts(
        &self,
        sales: &[LiveSale],
        members: bool,
    ) -> Result<HashMap<VoucherId, Vec<ShardCount>>, Error> {
        let mut on_shard: BTreeMap<Shard, Vec<VoucherId>> = BTreeMap::new();
        for sale in sales {
            for shard in super::super::layout_of(sale.shards)?.shards() {
                on_shard.entry(shard).or_default().push(sale.voucher_id);
            }
        }
        let reads: Vec<Vec<Value>> = self
            .on_shards(on_shard.keys().copied(), |mut redis, keys| {
                let vouchers = &on_shard[&keys.shard()];
                async move {
                    let mut pipe = redis::pipe();
                    pipe.atomic();
                    if members {
                        // Shared by every sale of the shard, and empty
                        // when nothing is on its way: read once.
                        pipe.hgetall(keys.pending());
                    }
                    for voucher_id in vouchers {
                        pipe.cmd("HMGET")
                            .arg(keys.voucher(*voucher_id))
                            .arg(&FIELDS);
                        if members {
                            pipe.scard(keys.buyers(*voucher_id))
                                .scard(keys.given_back(*voucher_id));
                        }
                    }
                    pipe.query_async(&mut redis).await
                }
            })
            .await?;
        let mut counted: HashMap<(VoucherId, Shard), ShardCount> = HashMap::new();
        for ((shard, vouchers), read) in on_shard.iter().zip(reads) {
            let mut read = read.into_iter();
            let mut next = || read.next().unwrap_or(Value::Nil);
            let mut pending: HashMap<VoucherId, i64> = HashMap::new();
            if members {
                for (id, entry) in parse::<Vec<(i64, String)>>(next())? {
                    let order = pending_entry(OrderId::new(id), &entry)?;
                    *pending.entry(order.voucher_id).or_default() += 1;
                }
            }
            for voucher_id in vouchers {
                type Fields = (
                    Option<i64>,
                    Option<i64>,
                    Option<i64>,
                    Option<u64>,
                    Option<String>,
                );
                let (stock, lent, received, token, epoch) = parse::<Fields>(next())?;
                let (buyers, given_back) = match members {
                    true => (parse(next())?, parse(next())?),
                    false => (0, 0),
                };
                let count = ShardCount {
                    stock,
                    lent_less_received: lent.unwrap_or(0) - received.unwrap_or(0),
                    token,
                    epoch,
                    buyers,
                    given_back,
                    pending: pending.get(voucher_id).copied().unwrap_or(0),
                };
                counted.insert((*voucher_id, *shard), count);
            }
        }
        let mut by_sale = HashMap::new();
        for sale in sales {
            let shards = (super::super::layout_of(sale.shards)?.shards())
                .map(|shard| {
                    counted
                        .remove(&(sale.voucher_id, shard))
                        .unwrap_or_default()
                })
                .collect();
            by_sale.insert(sale.voucher_id, shards);
        }
        Ok(by_sale)
    }
}

/// Whether Redis holds every shard of the sale, of its `token` and of one
/// load: a sale that is not whole is loaded as a purchase would load it.
pub(super) fn whole(shards: &[ShardCount], token: u64) -> bool {
    // A sale stored before tokens existed has none: it is token 0's.
    let ours = |shard: &ShardCount| shard.stock.is_some() && shard.token.unwrap_or(0) == token;
    shards.iter().all(ours) && shards.iter().all(|shard| shard.epoch == shards[0].epoch)
}
