//! A sale's counts in Redis (`counts.rs`) against MySQL's: whether they
//! agree, differ, or cannot tell, before any member is read.

use super::counts::ShardCount;
use crate::store::SaleCounts;

/// What a sale's counts say of its Redis side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Agreement {
    /// Redis holds the units and the buyers MySQL says it should.
    Agrees,
    /// Redis holds other counts: the members are compared, and the sale
    /// healed if they drifted.
    Differs,
    /// Orders on their way or give-backs owed: which of them count is
    /// known only member by member.
    Untold,
}

impl Agreement {
    /// The agreement of `shards` (read first) with `mysql` (read after).
    ///
    /// With no order of the sale pending and every closed order given
    /// back, what Redis should hold is plain counts: MySQL's stock (in the
    /// shards' stock and in transit between them) and its active buyers.
    /// A buyer counted in two shards (an order readmitted in the shard
    /// that drew it) counts twice here, and is compared member by member.
    pub(super) fn of(shards: &[ShardCount], mysql: &SaleCounts) -> Agreement {
        let sum = |count: fn(&ShardCount) -> i64| shards.iter().map(count).sum::<i64>();
        if sum(|shard| shard.pending) > 0 || sum(|shard| shard.given_back) != mysql.closed {
            return Agreement::Untold;
        }
        let held = sum(|shard| shard.stock.unwrap_or(0) + shard.lent_less_received);
        if held == mysql.stock.max(0) && sum(|shard| shard.buyers) == mysql.buyers {
            Agreement::Agrees
        } else {
            Agreement::Differs
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::VoucherId;

    fn mysql(stock: i64, buyers: i64, closed: i64) -> SaleCounts {
        SaleCounts {
            voucher_id: VoucherId::new(1),
            stock,
            shards: 2,
            buyers,
            closed,
            unpaid: 0,
            owed: false,
            ended: false,
        }
    }

    fn shard(stock: i64, lent_less_received: i64, buyers: i64) -> ShardCount {
        ShardCount {
            stock: Some(stock),
            lent_less_received,
            buyers,
            ..ShardCount::default()
        }
    }

    #[test]
    fn units_in_transit_count_with_the_stock() {
        let shards = [shard(3, 2, 1), shard(4, -2, 2)];
        assert_eq!(Agreement::of(&shards, &mysql(7, 3, 0)), Agreement::Agrees);
    }

    #[test]
    fn a_lost_admission_differs_in_units_and_buyers() {
        let shards = [shard(4, 0, 1), shard(4, 0, 1)];
        assert_eq!(Agreement::of(&shards, &mysql(7, 3, 0)), Agreement::Differs);
    }

    #[test]
    fn a_pending_order_or_a_give_back_owed_is_told_by_members() {
        let mut pending = [shard(3, 0, 1), shard(4, 0, 2)];
        pending[1].pending = 1;
        assert_eq!(Agreement::of(&pending, &mysql(7, 3, 0)), Agreement::Untold);
        let given_back = [shard(3, 0, 1), shard(4, 0, 2)];
        assert_eq!(
            Agreement::of(&given_back, &mysql(7, 3, 1)),
            Agreement::Untold
        );
    }
}
