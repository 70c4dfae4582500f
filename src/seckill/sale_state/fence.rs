//! Redis fenced by MySQL: what tells a node that a sale's Redis side lost
//! writes it was told, before it admits anyone from it. Each shard of a
//! sale carries three marks (lua/sale_fence.lua checks them, in the
//! admission script and in every load): the replication id of the server
//! it was loaded on (a restart or a promoted replica has another), the
//! count of its buyer set (a set that lost members), and the number of its
//! last admission, which may not be below the highest number MySQL has
//! written (`tb_seckill_voucher.sale_fence`, raised by the writers in the
//! stock row's `UPDATE`). A sale that fails any of them is suspect: the
//! admission refuses, nothing done, and the node loads the sale again from
//! MySQL under its stock row (`load.rs`), 503 meanwhile.
//!
//! The node passes the fence as it knows it: from its own writers at once
//! (after each commit) and from MySQL at its next read of the voucher (the
//! catalog's, every few seconds, and each load's).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::ids::VoucherId;
use crate::shards::Shard;
use crate::store::{NewOrder, SaleFence};

/// Why a shard of a sale in Redis cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspicion {
    /// Redis restarted, or a replica was promoted, since the sale was
    /// loaded: the shard is what a file or a replica kept, which may lack
    /// its last writes.
    ServerChanged,
    /// The buyer set does not hold as many buyers as were added to it.
    BuyersLost,
    /// MySQL has written an admission whose number this shard never
    /// reached: Redis lost admissions.
    BehindMysql,
}

impl Suspicion {
    /// The suspicion lua/sale_fence.lua's `code` names, if it names one.
    pub fn from_code(code: i64) -> Option<Suspicion> {
        match code {
            9 => Some(Suspicion::ServerChanged),
            10 => Some(Suspicion::BuyersLost),
            11 => Some(Suspicion::BehindMysql),
            _ => None,
        }
    }

    /// The `found` label of `hmdp_sales_reloaded_total`, and the word in
    /// logs.
    pub fn label(self) -> &'static str {
        match self {
            Suspicion::ServerChanged => "server_changed",
            Suspicion::BuyersLost => "buyers_lost",
            Suspicion::BehindMysql => "behind_mysql",
        }
    }
}

/// Each sale shard's fence as this node knows MySQL's.
#[derive(Debug, Default)]
pub struct Fences {
    known: Mutex<HashMap<(VoucherId, Shard), u64>>,
}

impl Fences {
    /// The fence of `voucher_id`'s `shard`: no admission there may find
    /// Redis's sequence below it.
    pub fn floor(&self, voucher_id: VoucherId, shard: Shard) -> u64 {
        let known = self.known.lock().expect("fences poisoned");
        known.get(&(voucher_id, shard)).copied().unwrap_or(0)
    }

    /// What a read of MySQL found for `voucher_id`.
    pub fn learn(&self, voucher_id: VoucherId, fence: &SaleFence) {
        let mut known = self.known.lock().expect("fences poisoned");
        for (shard, sequence) in fence.shards() {
            let floor = known.entry((voucher_id, shard)).or_default();
            *floor = (*floor).max(sequence);
        }
    }

    /// What this node's writer just committed: `orders` written.
    pub fn written<'a>(&self, orders: impl IntoIterator<Item = &'a NewOrder>) {
        let mut by_voucher: HashMap<VoucherId, Vec<&NewOrder>> = HashMap::new();
        for order in orders {
            by_voucher.entry(order.voucher_id).or_default().push(order);
        }
        for (voucher_id, orders) in by_voucher {
            self.learn(voucher_id, &SaleFence::of_orders(orders));
        }
    }

    /// Forgets a voucher removed from MySQL.
    pub fn forget(&self, voucher_id: VoucherId) {
        let mut known = self.known.lock().expect("fences poisoned");
        known.retain(|(voucher, _), _| *voucher != voucher_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{OrderId, UserId};

    #[test]
    fn a_floor_only_rises_from_reads_and_commits() {
        let fences = Fences::default();
        let voucher = VoucherId::new(10);
        fences.learn(voucher, &SaleFence::parse(r#"{"s0": 5}"#));
        fences.learn(voucher, &SaleFence::parse(r#"{"s0": 3}"#));
        assert_eq!(fences.floor(voucher, Shard::SINGLE), 5);
        let order = NewOrder {
            id: OrderId::new((9 << 32) | Shard::SINGLE.sequence_base() as i64),
            user_id: UserId::new(1),
            voucher_id: voucher,
            sequence: 8,
            idempotency: None,
        };
        fences.written(&[order]);
        assert_eq!(fences.floor(voucher, Shard::SINGLE), 8);
        assert_eq!(fences.floor(VoucherId::new(11), Shard::SINGLE), 0);
        fences.forget(voucher);
        assert_eq!(fences.floor(voucher, Shard::SINGLE), 0);
    }
}
