//! A sale's shards: how one voucher's admission state is split over hash
//! tags, so that a Redis Cluster spreads a hot sale over its masters.
//!
//! A sale of one shard keeps every key under the hash tag `{seckill}`, as
//! it always has. A sale of N shards keeps each shard's part of the stock,
//! the buyers routed to it, its order stream, its pending orders and its
//! id sequence under a tag of its own. The tags come from a table of 127
//! (plus `seckill`), tag *i* chosen so that its slot falls in the *i*-th of
//! 127 equal bands of the 16,384 slots; shard *k* of N takes the tag whose
//! band holds the middle of the *k*-th N-th of the slots. A cluster whose
//! masters hold even slot ranges thus gets an even share of the shards
//! (6 shards on 3 masters: two each). The tags name slots, not masters:
//! when the cluster is resharded, a shard's keys move with their slot and
//! the shard follows them; how even the spread stays is then how even the
//! new slot ranges are.
//!
//! A buyer belongs to the shard of `user id mod N`, so "one order per user"
//! stays one check in one script. An order's id carries its shard's table
//! index (bits 24–30 of its low word), so whatever reads an order back
//! (its pending entry, its give-back) finds its shard from the id alone.

use std::sync::LazyLock;

use crate::ids::{OrderId, UserId};

/// The most shards a sale may have.
pub const MAX_SHARDS: u16 = 64;

/// Tags in the table: `seckill` (index 0), then one per slot band.
const TABLE: usize = 128;
const SLOTS: u32 = 16_384;
const BANDS: u32 = TABLE as u32 - 1;

/// The hash tags, index 0 the one-shard sale's `seckill`.
static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut tags = vec!["seckill".to_owned()];
    for band in 0..BANDS {
        let (low, high) = (band * SLOTS / BANDS, (band + 1) * SLOTS / BANDS);
        let tag = (0u32..)
            .map(|attempt| format!("seckill.{}.{attempt}", band + 1))
            .find(|tag| (low..high).contains(&u32::from(slot(tag))))
            .expect("every band of slots is hit by some tag");
        tags.push(tag);
    }
    tags
});

/// The Redis Cluster slot of a hash tag (CRC16/XMODEM mod 16,384).
pub fn slot(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS as u16
}

/// One shard's hash tag, by its index in the tag table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shard(u8);

impl Shard {
    /// The shard of every one-shard sale: the tag `seckill`.
    pub const SINGLE: Shard = Shard(0);

    /// The tag, without its braces.
    pub fn tag(self) -> &'static str {
        &TAGS[usize::from(self.0)]
    }

    /// Its index in the tag table, what an order id carries.
    pub fn index(self) -> u8 {
        self.0
    }

    /// The shard whose table index is `index`, if there is one.
    pub fn from_index(index: u8) -> Option<Shard> {
        (usize::from(index) < TABLE).then_some(Shard(index))
    }

    /// The shard whose tag is `tag`, if there is one.
    pub fn from_tag(tag: &str) -> Option<Shard> {
        (TAGS.iter().position(|known| known == tag)).map(|index| Shard(index as u8))
    }

    /// The shard whose admission script drew `order_id`: the table index in
    /// the low word of an id the script draws (top bit set), the one-shard
    /// sale's for an id the id worker drew (top bit clear: `sync` mode).
    pub fn of_order(order_id: OrderId) -> Shard {
        let low = order_id.get() as u64 & 0xFFFF_FFFF;
        if low & (1 << 31) == 0 {
            return Shard::SINGLE;
        }
        Shard(((low >> SEQUENCE_BITS) & 0x7F) as u8)
    }

    /// The first of this shard's order-id sequence numbers: the low word's
    /// top bit set (the id worker's are clear), then the table index, then
    /// [`SEQUENCE_BITS`] of sequence, so two shards never draw one id.
    pub fn sequence_base(self) -> u64 {
        (1 << 31) | (u64::from(self.0) << SEQUENCE_BITS)
    }
}

/// Bits of the number in an admitted order id's low word (leased from
/// MySQL, `seckill/sale_state/order_ids.rs`): 16.7 million ids a second
/// before one could repeat.
pub const SEQUENCE_BITS: u32 = 24;

/// How a sale is split: its number of shards, 1 to [`MAX_SHARDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    count: u16,
}

/// A shard count outside 1 to [`MAX_SHARDS`].
#[derive(Debug, thiserror::Error)]
#[error("a sale has 1 to {MAX_SHARDS} shards, not {0}")]
pub struct BadShardCount(pub i64);

impl Layout {
    /// The one-shard layout: every key under `{seckill}`.
    pub const SINGLE: Layout = Layout { count: 1 };

    pub fn new(count: i64) -> Result<Layout, BadShardCount> {
        u16::try_from(count)
            .ok()
            .filter(|count| (1..=MAX_SHARDS).contains(count))
            .map(|count| Layout { count })
            .ok_or(BadShardCount(count))
    }

    pub fn count(self) -> u16 {
        self.count
    }

    /// Shard `position` (0 to count − 1).
    pub fn shard(self, position: u16) -> Shard {
        if self.count == 1 {
            return Shard::SINGLE;
        }
        let (position, count) = (u32::from(position), u32::from(self.count));
        Shard((1 + (2 * position + 1) * BANDS / (2 * count)) as u8)
    }

    /// Every shard, by position.
    pub fn shards(self) -> impl Iterator<Item = Shard> {
        (0..self.count).map(move |position| self.shard(position))
    }

    /// The position of the shard a buyer belongs to.
    pub fn position_of(self, user_id: UserId) -> u16 {
        (user_id.get() % u64::from(self.count)) as u16
    }

    /// The shard a buyer belongs to.
    pub fn shard_of(self, user_id: UserId) -> Shard {
        self.shard(self.position_of(user_id))
    }

    /// Splits `units` over the shards, the remainder to the first ones.
    pub fn split(self, units: i64) -> Vec<i64> {
        let count = i64::from(self.count);
        (0..count)
            .map(|position| units / count + i64::from(position < units % count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_is_the_seckill_tag_and_its_ids_carry_index_zero() {
        assert_eq!(Layout::SINGLE.shard(0), Shard::SINGLE);
        assert_eq!(Shard::SINGLE.tag(), "seckill");
        let id = OrderId::new((7 << 32) | (Shard::SINGLE.sequence_base() as i64 + 5));
        assert_eq!(Shard::of_order(id), Shard::SINGLE);
        // The id worker's ids (low word's top bit clear) are the one shard's.
        assert_eq!(Shard::of_order(OrderId::new((7 << 32) | 5)), Shard::SINGLE);
    }

    #[test]
    fn every_tag_lies_in_its_band_and_shards_of_a_layout_are_distinct() {
        for index in 1..TABLE {
            let band = (index as u32 - 1, index as u32);
            let slot = u32::from(slot(Shard(index as u8).tag()));
            assert!((band.0 * SLOTS / BANDS..band.1 * SLOTS / BANDS).contains(&slot));
        }
        for count in 1..=MAX_SHARDS {
            let layout = Layout::new(count.into()).unwrap();
            let mut shards: Vec<_> = layout.shards().collect();
            shards.dedup();
            assert_eq!(shards.len(), usize::from(count));
        }
    }

    #[test]
    fn six_shards_land_two_on_each_third_of_the_slots() {
        let layout = Layout::new(6).unwrap();
        let mut per_third = [0; 3];
        for shard in layout.shards() {
            per_third[usize::from(slot(shard.tag())) * 3 / SLOTS as usize] += 1;
        }
        assert_eq!(per_third, [2, 2, 2]);
    }

    #[test]
    fn an_order_id_names_the_shard_that_drew_it() {
        let layout = Layout::new(6).unwrap();
        for shard in layout.shards() {
            let low = shard.sequence_base() + (1 << SEQUENCE_BITS) - 1;
            assert_eq!(
                Shard::of_order(OrderId::new((99 << 32) | low as i64)),
                shard
            );
        }
    }

    #[test]
    fn stock_splits_whole_and_buyers_route_by_user_id() {
        let layout = Layout::new(4).unwrap();
        assert_eq!(layout.split(10), [3, 3, 2, 2]);
        assert_eq!(layout.split(0), [0, 0, 0, 0]);
        assert_eq!(layout.position_of(UserId::new(9)), 1);
        assert!(Layout::new(0).is_err() && Layout::new(65).is_err());
    }
}
