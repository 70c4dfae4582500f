//! An ended sale let go from Redis. Once MySQL has nothing more for the
//! sale's Redis side (ended, no unpaid order left to close, no give-back
//! owed) and Redis agrees (ended by its own clock, the clock the admission
//! script reads; no order of it pending; no unit in transit between its
//! shards), its keys expire after [`LET_GO_KEPT`] and MySQL marks it as a
//! sale Redis is no longer meant to hold: no reconciler reads it again.
//!
//! Its buyers' Idempotency-Key answers are keys of their own
//! (`{tag}:idempotency:<userId>:<key>`, kept 24 h by the admission script)
//! and keep their time: a buyer who lost the answer still gets the order.

use std::time::Duration;

use redis::Value;

use super::super::in_flight::pending_entry;
use super::super::{layout_of, SaleState};
use super::parse;
use crate::error::Error;
use crate::ids::OrderId;
use crate::store::LiveSale;

/// How long an ended sale's keys stay once it is let go: a late purchase
/// meanwhile is refused from Redis (the window closed) without a load from
/// MySQL; one after is refused once the sale is loaded again, as a first
/// load, which the reconciler lets go again.
pub const LET_GO_KEPT: Duration = Duration::from_secs(3600);

/// The sale's sets outlive its hash by this much: every script that
/// writes a set looks at the hash first, so none adds to a set that
/// expired, which would come back with no expiry.
const SETS_OUTLIVE_HASH: Duration = Duration::from_secs(60);

impl SaleState {
    /// Lets `sale` go when MySQL and Redis both say it is settled;
    /// `true` when it was.
    pub(super) async fn let_go(&self, sale: &LiveSale) -> Result<bool, Error> {
        let voucher_id = sale.voucher_id;
        let Some(tx) = self.store.hold_settled_sale(voucher_id).await? else {
            return Ok(false);
        };
        let layout = layout_of(sale.shards)?;
        // Each shard read in one MULTI: no admission can come between its
        // clock and its pending orders.
        let looks: Vec<Vec<Value>> = self
            .on_shards(layout.shards(), |mut redis, keys| async move {
                redis::pipe()
                    .atomic()
                    .cmd("HMGET")
                    .arg(keys.voucher(voucher_id))
                    .arg(&["token", "end_ms", "in_transit"])
                    .hgetall(keys.pending())
                    .cmd("TIME")
                    .query_async(&mut redis)
                    .await
            })
            .await?;
        let mut settled = true;
        for look in looks {
            let mut look = look.into_iter();
            let mut next = || look.next().unwrap_or(Value::Nil);
            let (token, end_ms, in_transit) =
                parse::<(Option<u64>, Option<i64>, Option<i64>)>(next())?;
            let pending = parse::<Vec<(i64, String)>>(next())?;
            let (seconds, micros) = parse::<(i64, i64)>(next())?;
            let now_ms = seconds * 1000 + micros / 1000;
            let mut ours = false;
            for (id, entry) in pending {
                ours |= pending_entry(OrderId::new(id), &entry)?.voucher_id == voucher_id;
            }
            settled &= token.unwrap_or(0) == sale.token
                && end_ms.is_some_and(|end_ms| end_ms <= now_ms)
                && in_transit.unwrap_or(0) == 0
                && !ours;
        }
        if !settled {
            tx.rollback().await?;
            return Ok(false);
        }
        let (hash_ms, sets_ms) = (
            LET_GO_KEPT.as_millis() as i64,
            (LET_GO_KEPT + SETS_OUTLIVE_HASH).as_millis() as i64,
        );
        self.on_shards(layout.shards(), |mut redis, keys| async move {
            redis::pipe()
                .pexpire(keys.voucher(voucher_id), hash_ms)
                .pexpire(keys.buyers(voucher_id), sets_ms)
                .pexpire(keys.given_back(voucher_id), sets_ms)
                .pexpire(keys.received(voucher_id), sets_ms)
                .query_async::<()>(&mut redis)
                .await
        })
        .await?;
        self.store.let_go(tx, voucher_id).await?;
        tracing::info!(%voucher_id, kept_s = LET_GO_KEPT.as_secs(),
            "ended seckill sale settled: its Redis side expires, no longer reconciled");
        Ok(true)
    }
}
