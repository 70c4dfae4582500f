//! An order Redis lost, counted again before its commit: a writer about to
//! commit admitted orders finds those no longer pending (Redis restarted
//! empty, or a load of the sale left them out) and counts each again in
//! its shard (`lua/seckill_readmit.lua`), borrowing a unit from the sale's
//! other shards where its own has none.

use std::collections::HashSet;
use std::sync::LazyLock;

use redis::Script;

use super::stock_moves::{Refill, SaleRef};
use super::{by_shard, layout_of, SaleState};
use crate::error::Error;
use crate::shards::Shard;
use crate::store::NewOrder;

static READMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/seckill_readmit.lua")));

/// What `lua/seckill_readmit.lua` did with an order about to be committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readmit {
    /// Redis had lost it: counted again in the reloaded sale.
    Counted,
    /// Redis never lost it.
    Pending,
    /// No sale in Redis: the reload, after the commit, counts it.
    NoSale,
    /// Its buyer was admitted again after the reload, with another order.
    UserAgain,
    /// No unit left: the reloaded sale sold it to a later buyer.
    NoUnit,
}

impl Readmit {
    /// Whether the order may be committed: its unit and buyer are its own
    /// in Redis, or will be once the sale is reloaded.
    pub fn may_commit(self) -> bool {
        matches!(self, Readmit::Counted | Readmit::Pending | Readmit::NoSale)
    }
}

impl SaleState {
    /// Of `orders`, those not in their shard's pending hash: Redis lost
    /// them (their writer read them before it restarted empty), or a load
    /// of their sale took them out (it did not count them).
    pub async fn not_pending(&self, orders: &[NewOrder]) -> Result<Vec<NewOrder>, Error> {
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        let ids = by_shard(orders.iter().map(|order| order.id));
        let found: Vec<Vec<Option<String>>> = self
            .on_shards(ids.keys().copied(), |mut redis, keys| {
                let ids = &ids[&keys.shard()];
                async move {
                    redis::cmd("HMGET")
                        .arg(keys.pending())
                        .arg(ids)
                        .query_async(&mut redis)
                        .await
                }
            })
            .await?;
        let found: HashSet<i64> = (ids.values().zip(found))
            .flat_map(|(ids, found)| ids.iter().zip(found))
            .filter_map(|(id, found)| found.map(|_| *id))
            .collect();
        Ok(orders
            .iter()
            .filter(|order| !found.contains(&order.id.get()))
            .copied()
            .collect())
    }

    /// Counts `order`, which Redis lost, again in its shard of the sale
    /// (see `lua/seckill_readmit.lua`); run while its writer holds the
    /// stock row. A shard with no unit left borrows from the sale's other
    /// shards first.
    pub async fn readmit(&self, order: NewOrder, append_to_stream: bool) -> Result<Readmit, Error> {
        let shard = Shard::of_order(order.id);
        let readmit = self.readmit_in(shard, order, append_to_stream).await?;
        if readmit != Readmit::NoUnit {
            return Ok(readmit);
        }
        let Some(row) = self.store.seckill_voucher(order.voucher_id).await? else {
            return Ok(readmit);
        };
        let sale = SaleRef {
            voucher_id: order.voucher_id,
            token: row.sale_token,
            layout: layout_of(row.shards)?,
        };
        let Some(position) = sale.layout.shards().position(|of| of == shard) else {
            return Ok(readmit);
        };
        let deadline = tokio::time::Instant::now() + self.store.backend_timeout();
        match self.refill(&sale, position as u16, deadline).await? {
            Refill::Moved => self.readmit_in(shard, order, append_to_stream).await,
            Refill::SoldOut => Ok(readmit),
            // The sale is to be loaded again, which waits for the stock row
            // this writer holds, and then counts its order from MySQL.
            Refill::Missing => Ok(Readmit::NoSale),
        }
    }

    /// One call of `lua/seckill_readmit.lua`, in `shard`.
    async fn readmit_in(
        &self,
        shard: Shard,
        order: NewOrder,
        append_to_stream: bool,
    ) -> Result<Readmit, Error> {
        let keys = self.keys.shard(shard);
        let code: i64 = READMIT
            .key(keys.voucher(order.voucher_id))
            .key(keys.buyers(order.voucher_id))
            .key(keys.pending())
            .key(keys.orders())
            .arg(order.id.get())
            .arg(order.user_id.get())
            .arg(order.voucher_id.get())
            .arg(u8::from(append_to_stream))
            .arg(order.sequence)
            .invoke_async(&mut self.redis.clone())
            .await?;
        match code {
            0 => Ok(Readmit::Counted),
            1 => Ok(Readmit::Pending),
            2 => Ok(Readmit::NoSale),
            3 => Ok(Readmit::UserAgain),
            4 => Ok(Readmit::NoUnit),
            other => Err(Error::Internal(anyhow::anyhow!(
                "lua/seckill_readmit.lua answered {other}"
            ))),
        }
    }
}
