//! The order that an admitted order's fields stand for, as the admission
//! script writes them into the order stream (and a dead letter keeps
//! them): `id`, `userId`, `voucherId` and the admission's `seq` as decimal
//! strings. Read by the
//! consumers and by the audit's reads of orders in flight.

use std::collections::HashMap;

use redis::Value;

use crate::ids::{positive_id, OrderId, UserId, VoucherId};
use crate::store::NewOrder;

/// The order that the fields of an order stream entry (or a dead letter)
/// stand for, or why they cannot be one.
pub(super) fn order_of(fields: &HashMap<String, Value>) -> Result<NewOrder, String> {
    Ok(NewOrder {
        id: OrderId::new(number(fields, "id")?),
        // Positive, so its absolute value is itself.
        user_id: UserId::new(number(fields, "userId")?.unsigned_abs()),
        voucher_id: VoucherId::new(number(fields, "voucherId")?),
        // An entry written before admissions were numbered has none.
        sequence: match fields.contains_key("seq") {
            true => number(fields, "seq")?.unsigned_abs(),
            false => 0,
        },
        idempotency: None,
    })
}

/// A positive decimal field.
fn number(fields: &HashMap<String, Value>, field: &str) -> Result<i64, String> {
    let raw: String = fields
        .get(field)
        .and_then(|value| redis::from_redis_value_ref(value).ok())
        .ok_or_else(|| format!("field `{field}` missing or not text"))?;
    positive_id(&raw).map_err(|_| format!("field `{field}` is not a positive id: {raw:?}"))
}
