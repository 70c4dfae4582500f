//! A sale's fence as MySQL keeps it (`tb_seckill_voucher.sale_fence`): for
//! each shard, the highest admission sequence number of an order written.
//! Raised in the `UPDATE` of the stock row that every write of orders runs
//! anyway (no row of its own to contend for), read with the sale.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::shards::Shard;
use crate::store::NewOrder;

/// Each shard's highest sequence number written, as a JSON object keyed by
/// `s<table index>` (`{"s0": 17}`); a shard not named has none written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaleFence(BTreeMap<Shard, u64>);

impl SaleFence {
    /// The column's value, read; a shard whose entry is not a number counts
    /// as none written (a fence only ever lowers what it cannot read).
    pub fn parse(column: &str) -> SaleFence {
        let entries: BTreeMap<String, serde_json::Value> =
            serde_json::from_str(column).unwrap_or_default();
        SaleFence(
            (entries.into_iter())
                .filter_map(|(name, value)| {
                    let shard = Shard::from_index(name.strip_prefix('s')?.parse().ok()?)?;
                    Some((shard, value.as_u64()?))
                })
                .collect(),
        )
    }

    /// The highest sequence numbers of `orders` (those of one voucher), by
    /// the shard that admitted each; orders no admission numbered raise
    /// nothing.
    pub fn of_orders<'a>(orders: impl IntoIterator<Item = &'a NewOrder>) -> SaleFence {
        let mut fence = SaleFence::default();
        for order in orders {
            fence.raise(Shard::of_order(order.id), order.sequence);
        }
        fence
    }

    /// `shard`'s fence: 0 when none of its orders was written.
    pub fn of(&self, shard: Shard) -> u64 {
        self.0.get(&shard).copied().unwrap_or(0)
    }

    /// Raises `shard`'s fence to `sequence` (never lowers it).
    pub fn raise(&mut self, shard: Shard, sequence: u64) {
        if sequence > 0 {
            let fence = self.0.entry(shard).or_default();
            *fence = (*fence).max(sequence);
        }
    }

    /// Each shard with a fence, and its number.
    pub fn shards(&self) -> impl Iterator<Item = (Shard, u64)> + '_ {
        self.0.iter().map(|(shard, fence)| (*shard, *fence))
    }

    /// The `SET` clause that raises the column to this fence, shard by
    /// shard (`""` when it raises nothing): integers only, written in.
    pub(super) fn raise_clause(&self) -> String {
        if self.0.is_empty() {
            return String::new();
        }
        let mut clause = String::from(", sale_fence = JSON_SET(sale_fence");
        for (shard, sequence) in &self.0 {
            let path = format!("'$.s{}'", shard.index());
            write!(
                clause,
                ", {path}, GREATEST(CAST(COALESCE(JSON_VALUE(sale_fence, {path}), 0) AS UNSIGNED), \
                 {sequence})"
            )
            .expect("writing to a String");
        }
        clause.push(')');
        clause
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{OrderId, UserId, VoucherId};

    #[test]
    fn a_fence_reads_back_each_shard_and_ignores_what_it_cannot_read() {
        let fence = SaleFence::parse(r#"{"s0": 17, "s3": 4, "x": 1, "s9": "a"}"#);
        assert_eq!(fence.of(Shard::SINGLE), 17);
        assert_eq!(fence.of(Shard::from_index(3).unwrap()), 4);
        assert_eq!(fence.of(Shard::from_index(9).unwrap()), 0);
        assert_eq!(SaleFence::parse("not json"), SaleFence::default());
    }

    #[test]
    fn orders_raise_their_own_shards_fence_to_their_highest_number() {
        let order = |low: u64, sequence| NewOrder {
            id: OrderId::new((7 << 32) | low as i64),
            user_id: UserId::new(1),
            voucher_id: VoucherId::new(10),
            sequence,
            idempotency: None,
        };
        let three = Shard::from_index(3).unwrap();
        let fence = SaleFence::of_orders(&[
            order(Shard::SINGLE.sequence_base() + 5, 8),
            order(Shard::SINGLE.sequence_base() + 6, 3),
            order(three.sequence_base() + 1, 2),
            order(5, 0),
        ]);
        assert_eq!(
            fence.shards().collect::<Vec<_>>(),
            [(Shard::SINGLE, 8), (three, 2)]
        );
        assert_eq!(
            fence.raise_clause(),
            ", sale_fence = JSON_SET(sale_fence, '$.s0', GREATEST(CAST(COALESCE(\
             JSON_VALUE(sale_fence, '$.s0'), 0) AS UNSIGNED), 8), '$.s3', GREATEST(CAST(\
             COALESCE(JSON_VALUE(sale_fence, '$.s3'), 0) AS UNSIGNED), 2))"
        );
        assert_eq!(SaleFence::default().raise_clause(), "");
    }
}
