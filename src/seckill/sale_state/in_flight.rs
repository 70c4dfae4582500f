//! Orders between admission and MySQL, read back for the reconciliation
//! (`hmdp audit`): the pending orders hash, the order stream's entries not
//! yet acknowledged (the consumers delete an entry once it is written), and
//! the dead letters, of each shard. All three hold every voucher's orders;
//! these reads keep one voucher's.

use std::collections::HashSet;

use redis::streams::{StreamId, StreamRangeReply};
use redis::AsyncCommands;
use serde::Serialize;

use super::{by_shard, SaleState};
use crate::error::Error;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::seckill::order_fields::order_of;
use crate::shards::{Layout, Shard};
use crate::store::NewOrder;

/// An order admitted and not yet written, as `GET /voucher-order/{id}`
/// shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingOrder {
    pub id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
    /// Always `true`: what tells a client this order is not written yet
    /// (a written order has no such field).
    pending: bool,
}

/// Entries read per `XRANGE` / `HSCAN` round trip.
const PAGE: usize = 1000;

/// An entry the stream consumers gave up on.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Its id in the dead-letter stream, what a replay names: the entry's
    /// id, `<shard tag>/<entry id>` in a sharded sale's shard.
    pub id: String,
    /// The order it carries, or why its fields make none.
    pub order: Result<NewOrder, String>,
    /// Its fields as the order stream held them (a malformed entry's
    /// included), `name=value`, sorted.
    pub fields: Vec<String>,
    /// How often it had been delivered.
    pub deliveries: String,
    pub reason: String,
}

/// The fields a consumer adds to an entry it dead-letters.
const DEAD_LETTER_FIELDS: [&str; 3] = ["entry", "deliveries", "reason"];

impl DeadLetter {
    fn of(shard: Shard, entry: &StreamId) -> DeadLetter {
        let text = |name| entry.get(name).unwrap_or_else(|| "?".to_owned());
        let mut fields: Vec<String> = entry
            .map
            .iter()
            .filter(|(name, _)| !DEAD_LETTER_FIELDS.contains(&name.as_str()))
            .map(|(name, value)| {
                let value: String =
                    redis::from_redis_value_ref(value).unwrap_or_else(|_| format!("{value:?}"));
                format!("{name}={value}")
            })
            .collect();
        fields.sort();
        DeadLetter {
            id: match shard {
                Shard::SINGLE => entry.id.clone(),
                shard => format!("{}/{}", shard.tag(), entry.id),
            },
            order: order_of(&entry.map),
            fields,
            deliveries: text("deliveries"),
            reason: text("reason"),
        }
    }
}

impl SaleState {
    /// The order if it is admitted, not yet written, and `user_id`'s.
    pub async fn pending_order(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<PendingOrder>, Error> {
        let entry: Option<String> = self
            .redis
            .clone()
            .hget(self.pending_of(order_id), order_id.get())
            .await?;
        let Some(entry) = entry else {
            return Ok(None);
        };
        let order = pending_entry(order_id, &entry)?;
        Ok((order.user_id == user_id).then_some(PendingOrder {
            id: order_id,
            user_id,
            voucher_id: order.voucher_id,
            pending: true,
        }))
    }

    /// Marks orders as written (or as never to be written): they leave
    /// their shards' pending hashes.
    pub async fn forget_pending(&self, order_ids: &[OrderId]) -> Result<(), Error> {
        let ids = by_shard(order_ids.iter().copied());
        self.on_shards(ids.keys().copied(), |mut redis, keys| {
            let ids = &ids[&keys.shard()];
            async move { redis.hdel::<_, _, ()>(keys.pending(), ids).await }
        })
        .await?;
        Ok(())
    }

    /// How many orders of every voucher are pending, and how many entries
    /// the order streams hold, over every shard in use: two `O(1)` reads a
    /// shard, for polling.
    pub async fn orders_on_their_way(&self) -> Result<(u64, u64), Error> {
        let shards = self.shards_in_use().await?;
        let counts: Vec<(u64, u64)> = self
            .on_shards(shards, |mut redis, keys| async move {
                redis::pipe()
                    .hlen(keys.pending())
                    .cmd("XLEN")
                    .arg(keys.orders())
                    .query_async(&mut redis)
                    .await
            })
            .await?;
        Ok(counts
            .into_iter()
            .fold((0, 0), |(p, s), (pending, streamed)| {
                (p + pending, s + streamed)
            }))
    }

    /// The shards of `voucher_id`'s sale (a one-shard sale's when MySQL no
    /// longer has the voucher).
    async fn shards_of(&self, voucher_id: VoucherId) -> Result<Vec<Shard>, Error> {
        let layout = self.layout(voucher_id).await?.unwrap_or(Layout::SINGLE);
        Ok(layout.shards().collect())
    }

    /// Orders of `voucher_id` in its shards' pending orders hashes:
    /// admitted, not yet written (`queue` and `stream`).
    pub async fn pending_orders_of(&self, voucher_id: VoucherId) -> Result<Vec<NewOrder>, Error> {
        let mut orders = Vec::new();
        for shard in self.shards_of(voucher_id).await? {
            let mut redis = self.redis.clone();
            let mut entries = redis
                .hscan::<_, (i64, String)>(self.keys.shard(shard).pending())
                .await?;
            while let Some(entry) = entries.next_item().await {
                let (id, value) = entry?;
                let order = pending_entry(OrderId::new(id), &value)?;
                if order.voucher_id == voucher_id {
                    orders.push(order);
                }
            }
        }
        Ok(orders)
    }

    /// The closed orders of `voucher_id` whose units are back in its
    /// sale's stock in Redis (its shards' given-back sets).
    pub async fn given_back_of(&self, voucher_id: VoucherId) -> Result<Vec<OrderId>, Error> {
        let sets: Vec<Vec<i64>> = self
            .on_shards(
                self.shards_of(voucher_id).await?,
                |mut redis, keys| async move { redis.smembers(keys.given_back(voucher_id)).await },
            )
            .await?;
        Ok(sets.into_iter().flatten().map(OrderId::new).collect())
    }

    /// Orders of `voucher_id` still in its shards' order streams
    /// (`stream`): not yet delivered, or delivered and not yet acknowledged.
    pub async fn streamed_orders_of(&self, voucher_id: VoucherId) -> Result<Vec<NewOrder>, Error> {
        let mut orders = Vec::new();
        for shard in self.shards_of(voucher_id).await? {
            for entry in self.read_stream(&self.keys.shard(shard).orders()).await? {
                let order = order_of_entry(&entry)?;
                if order.voucher_id == voucher_id {
                    orders.push(order);
                }
            }
        }
        Ok(orders)
    }

    /// Every dead letter of every shard in use, oldest first in each.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let mut letters = Vec::new();
        for shard in self.shards_in_use().await? {
            let entries = self
                .read_stream(&self.keys.shard(shard).dead_letters())
                .await?;
            letters.extend(entries.iter().map(|entry| DeadLetter::of(shard, entry)));
        }
        Ok(letters)
    }

    /// The ids of the orders in the dead letters (of every voucher: an
    /// order id is never another voucher's): on no way any more.
    pub(super) async fn dead_order_ids(&self) -> Result<HashSet<OrderId>, Error> {
        Ok((self.dead_letters().await?.into_iter())
            .filter_map(|letter| letter.order.ok().map(|order| order.id))
            .collect())
    }

    /// The dead letters carrying an order of `voucher_id`.
    pub async fn dead_letters_of(&self, voucher_id: VoucherId) -> Result<Vec<DeadLetter>, Error> {
        let mut letters = self.dead_letters().await?;
        letters
            .retain(|letter| matches!(&letter.order, Ok(order) if order.voucher_id == voucher_id));
        Ok(letters)
    }

    /// Puts an admitted order that can never be written, and why, in the
    /// dead letters of the shard that drew it (`queue` mode's writer: its
    /// orders have no stream entry). Its pending entry stays, as a stream
    /// consumer's dead letter's does, until a replay writes it.
    pub async fn dead_letter_order(&self, order: NewOrder, reason: &str) -> Result<(), Error> {
        let keys = self.keys.shard(Shard::of_order(order.id));
        let fields = [
            ("id", order.id.to_string()),
            ("userId", order.user_id.to_string()),
            ("voucherId", order.voucher_id.to_string()),
            ("entry", "queue".to_owned()),
            ("deliveries", "1".to_owned()),
            ("reason", reason.to_owned()),
        ];
        let _: String = self
            .redis
            .clone()
            .xadd(keys.dead_letters(), "*", &fields)
            .await?;
        Ok(())
    }

    /// The dead letter `id` (as [`DeadLetter::id`] names it), `None` when
    /// there is none (replayed already, or never one).
    pub async fn dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, Error> {
        let Some((shard, entry)) = letter_id(id) else {
            return Ok(None);
        };
        let page: StreamRangeReply = self
            .redis
            .clone()
            .xrange(self.keys.shard(shard).dead_letters(), entry, entry)
            .await?;
        Ok(page.ids.first().map(|entry| DeadLetter::of(shard, entry)))
    }

    /// Removes the dead letter `id`, whose order is written, and the order
    /// from the pending hash, in one `MULTI`; removing it twice is harmless.
    pub async fn remove_dead_letter(&self, id: &str, order_id: OrderId) -> Result<(), Error> {
        let Some((shard, entry)) = letter_id(id) else {
            return Ok(());
        };
        let keys = self.keys.shard(shard);
        redis::pipe()
            .atomic()
            .xdel(keys.dead_letters(), &[entry])
            .ignore()
            .hdel(keys.pending(), order_id.get())
            .ignore()
            .query_async::<()>(&mut self.redis.clone())
            .await?;
        Ok(())
    }

    /// Every entry of the stream at `key`, oldest first, a page at a time;
    /// none when the stream does not exist.
    async fn read_stream(&self, key: &str) -> Result<Vec<StreamId>, Error> {
        let mut redis = self.redis.clone();
        let mut entries: Vec<StreamId> = Vec::new();
        let mut from = "-".to_owned();
        loop {
            let page: StreamRangeReply = redis.xrange_count(key, &from, "+", PAGE).await?;
            let full = page.ids.len() == PAGE;
            entries.extend(page.ids);
            match entries.last() {
                Some(last) if full => from = format!("({}", last.id),
                _ => return Ok(entries),
            }
        }
    }
}

/// The order an entry of the order stream (or a dead letter) carries.
fn order_of_entry(entry: &StreamId) -> Result<NewOrder, Error> {
    order_of(&entry.map).map_err(|why| {
        Error::Internal(anyhow::anyhow!(
            "stream entry {} holds no order: {why}",
            entry.id
        ))
    })
}

/// The shard and entry id a dead letter's id names.
fn letter_id(id: &str) -> Option<(Shard, &str)> {
    match id.split_once('/') {
        None => Some((Shard::SINGLE, id)),
        Some((tag, entry)) => Shard::from_tag(tag).map(|shard| (shard, entry)),
    }
}

/// The order the pending orders hash holds under `order_id`, as the
/// admission script writes it: `<userId>:<voucherId>`.
pub(super) fn pending_entry(order_id: OrderId, entry: &str) -> Result<NewOrder, Error> {
    let mut parts = entry.split(':');
    let mut next = || parts.next().and_then(|part| part.parse::<u64>().ok());
    let (user, voucher) = (next(), next());
    // An entry written before admissions were numbered has no sequence.
    let sequence = next().unwrap_or(0);
    match (
        user,
        voucher.and_then(|voucher| i64::try_from(voucher).ok()),
    ) {
        (Some(user), Some(voucher)) => Ok(NewOrder {
            id: order_id,
            user_id: UserId::new(user),
            voucher_id: VoucherId::new(voucher),
            sequence,
            idempotency: None,
        }),
        _ => Err(Error::Internal(anyhow::anyhow!(
            "pending order {order_id} holds {entry:?}, not userId:voucherId:sequence"
        ))),
    }
}

/// Of the `pending` orders, those on their way to MySQL: not written, not
/// dead-lettered, each of a buyer with no active order there (another
/// order of such a buyer is a dead letter to be).
pub(super) fn on_their_way(
    pending: impl Iterator<Item = NewOrder>,
    written: &HashSet<OrderId>,
    dead: &HashSet<OrderId>,
    buyers: &[UserId],
) -> Vec<NewOrder> {
    let mut users: HashSet<UserId> = buyers.iter().copied().collect();
    pending
        .filter(|order| !written.contains(&order.id) && !dead.contains(&order.id))
        .filter(|order| users.insert(order.user_id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: i64, user: u64) -> NewOrder {
        NewOrder::unsequenced(OrderId::new(id), UserId::new(user), VoucherId::new(7))
    }

    #[test]
    fn orders_on_their_way_are_pending_unwritten_not_dead_and_one_per_new_buyer() {
        let pending = [
            order(1, 10),
            order(2, 11), // written: its commit beat its acknowledgement
            order(3, 12), // dead-lettered
            order(4, 13), // its buyer holds an order in MySQL
            order(5, 14),
            order(6, 14), // the same buyer twice: one counts
        ];
        let written = HashSet::from([OrderId::new(2)]);
        let dead = HashSet::from([OrderId::new(3)]);
        let buyers = [UserId::new(13)];
        let on_their_way = on_their_way(pending.into_iter(), &written, &dead, &buyers);
        assert_eq!(on_their_way, [order(1, 10), order(5, 14)]);
    }
}
