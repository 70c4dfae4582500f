//! Orders between admission and MySQL, read back for the reconciliation
//! (`hmdp audit`): the pending orders hash, the order stream's entries not
//! yet acknowledged (the consumers delete an entry once it is written), and
//! the dead letters. All three hold every voucher's orders; these reads keep
//! one voucher's.

use redis::streams::{StreamId, StreamRangeReply};
use redis::AsyncCommands;

use super::sale_state::{pending_entry, SaleState};
use super::stream::entry::order_of;
use crate::error::Error;
use crate::ids::{OrderId, VoucherId};
use crate::store::NewOrder;

/// Entries read per `XRANGE` / `HSCAN` round trip.
const PAGE: usize = 1000;

/// An entry the stream consumers gave up on.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Its id in the dead-letter stream, what a replay names.
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
    fn of(entry: &StreamId) -> DeadLetter {
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
            id: entry.id.clone(),
            order: order_of(&entry.map),
            fields,
            deliveries: text("deliveries"),
            reason: text("reason"),
        }
    }
}

impl SaleState {
    /// How many orders of every voucher are pending, and how many entries
    /// the order stream holds: two `O(1)` reads, for polling.
    pub async fn orders_on_their_way(&self) -> Result<(u64, u64), Error> {
        let counts = redis::pipe()
            .hlen(self.keys.pending_orders())
            .cmd("XLEN")
            .arg(self.keys.order_stream())
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(counts)
    }

    /// Orders of `voucher_id` in the pending orders hash: admitted, not yet
    /// written (`queue` and `stream`).
    pub async fn pending_orders_of(&self, voucher_id: VoucherId) -> Result<Vec<NewOrder>, Error> {
        let mut redis = self.redis.clone();
        let mut entries = redis
            .hscan::<_, (i64, String)>(self.keys.pending_orders())
            .await?;
        let mut orders = Vec::new();
        while let Some(entry) = entries.next_item().await {
            let (id, value) = entry?;
            let order = pending_entry(OrderId::new(id), &value)?;
            if order.voucher_id == voucher_id {
                orders.push(order);
            }
        }
        Ok(orders)
    }

    /// Orders of `voucher_id` still in the order stream (`stream`): not yet
    /// delivered, or delivered and not yet acknowledged.
    pub async fn streamed_orders_of(&self, voucher_id: VoucherId) -> Result<Vec<NewOrder>, Error> {
        let entries = self.read_stream(&self.keys.order_stream()).await?;
        let mut orders = Vec::new();
        for entry in entries {
            let order = order_of_entry(&entry)?;
            if order.voucher_id == voucher_id {
                orders.push(order);
            }
        }
        Ok(orders)
    }

    /// Every dead letter, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let entries = self.read_stream(&self.keys.dead_letters()).await?;
        Ok(entries.iter().map(DeadLetter::of).collect())
    }

    /// The dead letters carrying an order of `voucher_id`.
    pub async fn dead_letters_of(&self, voucher_id: VoucherId) -> Result<Vec<DeadLetter>, Error> {
        let mut letters = self.dead_letters().await?;
        letters
            .retain(|letter| matches!(&letter.order, Ok(order) if order.voucher_id == voucher_id));
        Ok(letters)
    }

    /// The dead letter `id`, `None` when there is none (replayed already,
    /// or never one).
    pub async fn dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, Error> {
        let page: StreamRangeReply = self
            .redis
            .clone()
            .xrange(self.keys.dead_letters(), id, id)
            .await?;
        Ok(page.ids.first().map(DeadLetter::of))
    }

    /// Removes the dead letter `id`, whose order is written, and the order
    /// from the pending hash, in one `MULTI`; removing it twice is harmless.
    pub async fn remove_dead_letter(&self, id: &str, order_id: OrderId) -> Result<(), Error> {
        redis::pipe()
            .atomic()
            .xdel(self.keys.dead_letters(), &[id])
            .ignore()
            .hdel(self.keys.pending_orders(), order_id.get())
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
