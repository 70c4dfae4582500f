//! One entry of the order stream as a consumer receives it, and the order it
//! stands for. The admission script writes the fields `id`, `userId` and
//! `voucherId` as decimal strings; anything else is malformed and goes to the
//! dead letters at once, since no retry can make it parse. With traces
//! exported it adds the admission's `traceparent`, which entries written
//! without it (and by older nodes) lack.

use std::collections::HashMap;

use redis::streams::StreamId;
use redis::Value;

use crate::seckill::order_fields::order_of;
use crate::store::NewOrder;
use crate::telemetry::traces::TRACEPARENT;

/// An entry delivered to this consumer.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// The stream entry id (`<ms>-<seq>`), what `XACK` names.
    pub id: String,
    pub fields: HashMap<String, Value>,
    /// How many times the group has delivered it, this delivery included.
    pub deliveries: usize,
}

impl Entry {
    pub fn new(entry: StreamId, deliveries: usize) -> Entry {
        Entry {
            id: entry.id,
            fields: entry.map,
            deliveries,
        }
    }

    /// The order this entry asks to write, or why it cannot be one.
    pub fn order(&self) -> Result<NewOrder, String> {
        order_of(&self.fields)
    }

    /// The W3C trace context of the admission that wrote this entry, if it
    /// carries one.
    pub fn traceparent(&self) -> Option<&str> {
        match self.fields.get(TRACEPARENT)? {
            Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
            _ => None,
        }
    }

    /// The entry's fields as the dead-letter stream keeps them: each value's
    /// bytes, whatever they were.
    pub fn raw_fields(&self) -> Vec<(String, Vec<u8>)> {
        let mut fields: Vec<(String, Vec<u8>)> = self
            .fields
            .iter()
            .map(|(name, value)| {
                let bytes = redis::from_redis_value_ref(value)
                    .unwrap_or_else(|_| format!("{value:?}").into_bytes());
                (name.clone(), bytes)
            })
            .collect();
        fields.sort();
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{OrderId, UserId, VoucherId};

    fn entry(fields: &[(&str, &str)]) -> Entry {
        Entry {
            id: "1-0".into(),
            fields: fields
                .iter()
                .map(|(name, value)| (name.to_string(), Value::BulkString(value.as_bytes().into())))
                .collect(),
            deliveries: 1,
        }
    }

    #[test]
    fn the_admission_scripts_fields_make_an_order() {
        let order = entry(&[
            ("id", "665762232012898305"),
            ("userId", "1010"),
            ("voucherId", "10"),
        ])
        .order()
        .unwrap();
        assert_eq!(order.id, OrderId::new(665_762_232_012_898_305));
        assert_eq!(order.user_id, UserId::new(1010));
        assert_eq!(order.voucher_id, VoucherId::new(10));
    }

    #[test]
    fn a_dead_letters_fields_in_any_order_carry_its_order() {
        let order = entry(&[
            ("reason", "malformed"),
            ("voucherId", "9"),
            ("id", "77"),
            ("userId", "5"),
        ])
        .order()
        .unwrap();
        assert_eq!(
            (order.id, order.user_id, order.voucher_id),
            (OrderId::new(77), UserId::new(5), VoucherId::new(9))
        );
        assert!(entry(&[("id", "77"), ("userId", "x"), ("voucherId", "9")])
            .order()
            .is_err());
        assert!(entry(&[("id", "77")]).order().is_err());
    }

    #[test]
    fn missing_or_malformed_fields_say_which() {
        let missing = entry(&[("id", "1"), ("voucherId", "10")]).order();
        assert!(missing.unwrap_err().contains("`userId` missing"));
        for bad in ["abc", "-5", "0", "1e3", ""] {
            let error = entry(&[("id", "1"), ("userId", bad), ("voucherId", "10")])
                .order()
                .unwrap_err();
            assert!(error.contains("`userId` is not a positive id"), "{error}");
        }
    }
}
