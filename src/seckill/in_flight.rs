//! Orders between admission and MySQL, read back for the reconciliation
//! (`hmdp audit`): the pending orders hash, the order stream's entries not
//! yet acknowledged (the consumers delete an entry once it is written), and
//! the dead letters. All three hold every voucher's orders; these reads keep
//! one voucher's.

use redis::AsyncCommands;

use super::sale_state::SaleState;
use crate::error::Error;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::store::NewOrder;

/// Entries read per `XRANGE` / `HSCAN` round trip.
const PAGE: usize = 1000;

/// An order the stream consumers gave up on.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub order: NewOrder,
    /// How often it had been delivered.
    pub deliveries: String,
    pub reason: String,
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
            let order = value
                .split_once(':')
                .and_then(|(user, voucher)| Some((user.parse().ok()?, voucher.parse().ok()?)))
                .map(|(user, voucher)| NewOrder {
                    id: OrderId::new(id),
                    user_id: UserId::new(user),
                    voucher_id: VoucherId::new(voucher),
                })
                .ok_or_else(|| {
                    Error::Internal(anyhow::anyhow!(
                        "pending order {id} holds {value:?}, not userId:voucherId"
                    ))
                })?;
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
        for (id, fields) in entries {
            let order = order_of_entry(&id, &fields)?;
            if order.voucher_id == voucher_id {
                orders.push(order);
            }
        }
        Ok(orders)
    }

    /// Orders of `voucher_id` in the dead-letter stream.
    pub async fn dead_letters_of(&self, voucher_id: VoucherId) -> Result<Vec<DeadLetter>, Error> {
        let entries = self.read_stream(&self.keys.dead_letters()).await?;
        let mut letters = Vec::new();
        for (id, fields) in entries {
            let order = order_of_entry(&id, &fields)?;
            if order.voucher_id == voucher_id {
                letters.push(DeadLetter {
                    order,
                    deliveries: field(&fields, "deliveries").unwrap_or("?").to_owned(),
                    reason: field(&fields, "reason").unwrap_or("?").to_owned(),
                });
            }
        }
        Ok(letters)
    }

    /// Every entry of the stream at `key`, oldest first, a page at a time;
    /// none when the stream does not exist.
    async fn read_stream(&self, key: &str) -> Result<Vec<(String, Vec<String>)>, Error> {
        let mut redis = self.redis.clone();
        let mut entries: Vec<(String, Vec<String>)> = Vec::new();
        let mut from = "-".to_owned();
        loop {
            let page: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
                .arg(key)
                .arg(&from)
                .arg("+")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut redis)
                .await?;
            let full = page.len() == PAGE;
            entries.extend(page);
            match entries.last() {
                Some((last, _)) if full => from = format!("({last}"),
                _ => return Ok(entries),
            }
        }
    }
}

/// A field of a stream entry, whose fields come as a flat name, value list.
fn field<'a>(fields: &'a [String], name: &str) -> Option<&'a str> {
    fields
        .chunks_exact(2)
        .find(|pair| pair[0] == name)
        .map(|pair| pair[1].as_str())
}

/// The order an entry of the order stream (or a dead letter) carries in its
/// `id`, `userId` and `voucherId` fields.
fn order_of_entry(entry: &str, fields: &[String]) -> Result<NewOrder, Error> {
    let number = |name| field(fields, name).and_then(|value| value.parse::<i64>().ok());
    match (number("id"), number("userId"), number("voucherId")) {
        (Some(id), Some(user), Some(voucher)) if user >= 0 => Ok(NewOrder {
            id: OrderId::new(id),
            user_id: UserId::new(user as u64),
            voucher_id: VoucherId::new(voucher),
        }),
        _ => Err(Error::Internal(anyhow::anyhow!(
            "stream entry {entry} holds {fields:?}, not an order's id, userId and voucherId"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Vec<String> {
        pairs
            .iter()
            .flat_map(|(name, value)| [name.to_string(), value.to_string()])
            .collect()
    }

    #[test]
    fn an_entry_carries_its_order_in_any_field_order() {
        let entry = fields(&[("voucherId", "9"), ("id", "77"), ("userId", "5")]);
        let order = order_of_entry("1-0", &entry).unwrap();
        assert_eq!(
            (order.id, order.user_id, order.voucher_id),
            (OrderId::new(77), UserId::new(5), VoucherId::new(9))
        );
    }

    #[test]
    fn an_entry_without_an_order_is_an_error() {
        let entry = fields(&[("id", "77"), ("userId", "x"), ("voucherId", "9")]);
        assert!(order_of_entry("1-0", &entry).is_err());
        assert!(order_of_entry("1-0", &fields(&[("id", "77")])).is_err());
    }
}
