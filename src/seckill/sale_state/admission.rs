//! Admission in Redis, the purchase of `queue` and `stream` mode:
//! `lua/seckill.lua` checks the sale window by Redis's clock, the stock and
//! the buyer set, takes a unit, adds the buyer and hands the order off, all
//! in one call. The purchase answers the order id as soon as the script
//! admitted it; MySQL sees the order later, from the node's queue (`queue`)
//! or the order stream (`stream`).
//!
//! One call is also what makes it cancellation-safe: Redis runs a script to
//! its end or not at all, so a client hanging up may lose the answer, never
//! half an admission. A reply lost on the way is what redis-rs's cluster
//! connection answers by sending the call again: on a cluster each call
//! carries a random attempt id, and the script answers an attempt it admitted
//! already with the id it gave, instead of refusing its own buyer as one who
//! ordered. A purchase sent with an `Idempotency-Key` is such an attempt on
//! every connection, its answer kept for 24 hours: the script itself keeps
//! it, at no round trip of its own.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, Script};

use super::stock_moves::{Refill, SaleRef};
use super::SaleState;
use crate::error::{Error, Rejection};
use crate::idempotency::{IdempotencyKey, ANSWER_KEPT};
use crate::ids::{OrderId, UserId};
use crate::limits::{Counting, GCRA_COUNT};
use crate::metrics;
use crate::redis_handle::RedisConnection;
use crate::shards::Shard;
use crate::telemetry::traces;

use super::fence::Suspicion;

/// The admission script, after the GCRA count with which it counts its
/// purchase's limits in the same call, and the fence's check.
static ADMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            GCRA_COUNT,
            SALE_FENCE,
            include_str!("../../../lua/seckill.lua"),
        ]
        .concat(),
    )
});

/// lua/sale_fence.lua, put in front of the scripts that check a shard.
pub(super) const SALE_FENCE: &str = include_str!("../../../lua/sale_fence.lua");

/// The refusals `lua/seckill.lua` answers, at the index of their code.
const REFUSALS: [Option<Rejection>; 6] = [
    None,
    Some(Rejection::VoucherNotFound),
    Some(Rejection::NotStarted),
    Some(Rejection::Ended),
    Some(Rejection::SoldOut),
    Some(Rejection::AlreadyOrdered),
];

/// What `lua/seckill.lua` answered; no other code reads its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Stock taken, buyer added, order handed off and recorded as pending,
    /// under the id the script composed, with its admission's number in
    /// the shard's sequence.
    Admitted(OrderId, u64),
    /// This very attempt (its Idempotency-Key, or a call the cluster
    /// connection sent again) was admitted before, under this id: nothing
    /// done now.
    Again(OrderId),
    /// Nothing done: the Idempotency-Key was first sent for another voucher.
    KeyReused,
    /// Refused: the voucher has no sale in Redis, the sale has not started
    /// or has ended, it is sold out, or the user has bought already.
    Refused(Rejection),
    /// Nothing done: the sale in Redis carries another sale token than the
    /// voucher MySQL has under this id (an earlier voucher's). Never an
    /// answer to the buyer: the sale is replaced and admission tried again.
    Stale,
    /// Nothing done: the sale was loaded again after Redis lost it, and
    /// admits nobody until writers holding orders admitted before the loss
    /// have counted them again. The buyer hears 503: try again shortly.
    Reopening,
    /// Nothing done: the shard cannot be trusted (`fence.rs`); the sale is
    /// loaded again from MySQL, and the buyer hears 503.
    Suspect(Suspicion),
}

/// How long an admitted attempt's answer is kept for the same attempt sent
/// again: redis-rs's cluster connection re-sends a request whose connection
/// dropped before its reply, up to 3 times, each after at most a reply's
/// timeout (the backend timeout) and 200 ms — far within this.
const ATTEMPT_ANSWER_KEPT: Duration = Duration::from_secs(600);

/// `lua/seckill.lua`'s code for a sale of another token.
const STALE: i64 = 6;
/// `lua/seckill.lua`'s code for a sale reloaded and not open yet.
const REOPENING: i64 = 7;
/// `lua/seckill.lua`'s code for an Idempotency-Key of another voucher.
const KEY_REUSED: i64 = 8;

impl Admission {
    /// The `outcome` label of `hmdp_admissions_total`: `admitted`, or the
    /// refusal's `errorCode`.
    pub fn label(self) -> &'static str {
        match self {
            Admission::Admitted(..) => "admitted",
            Admission::Again(_) => "admitted_again",
            Admission::KeyReused => "idempotency_key_reused",
            Admission::Refused(rejection) => rejection.code(),
            Admission::Stale => "stale_sale",
            Admission::Reopening => "reopening",
            Admission::Suspect(suspicion) => suspicion.label(),
        }
    }

    /// The labels of the script's everyday answers — `admitted` and each
    /// refusal's `errorCode` — which every sale shows (the metrics' zero
    /// series); the rarer answers' labels appear when they first happen.
    pub fn labels() -> impl Iterator<Item = &'static str> {
        REFUSALS
            .into_iter()
            .map(|refusal| refusal.map_or("admitted", Rejection::code))
    }

    fn from_reply(reply: &redis::Value) -> Option<Admission> {
        match reply {
            redis::Value::BulkString(id) => {
                let id = std::str::from_utf8(id).ok()?;
                match id.strip_prefix("again:") {
                    Some(again) => again.parse().ok().map(Admission::Again),
                    None => {
                        let (id, sequence) = id.split_once(':')?;
                        Some(Admission::Admitted(
                            id.parse().ok()?,
                            sequence.parse().ok()?,
                        ))
                    }
                }
            }
            redis::Value::Int(STALE) => Some(Admission::Stale),
            redis::Value::Int(KEY_REUSED) => Some(Admission::KeyReused),
            redis::Value::Int(REOPENING) => Some(Admission::Reopening),
            redis::Value::Int(code) => {
                Suspicion::from_code(*code)
                    .map(Admission::Suspect)
                    .or_else(|| {
                        let refusal = usize::try_from(*code)
                            .ok()
                            .and_then(|code| REFUSALS.get(code));
                        refusal.copied().flatten().map(Admission::Refused)
                    })
            }
            _ => None,
        }
    }
}

impl SaleState {
    /// Runs `lua/seckill.lua` for `user_id`'s purchase of `sale`, in the
    /// buyer's shard, appending the order to the shard's order stream when
    /// `append_to_stream` (`stream` mode), as the attempt `key` names when
    /// the buyer sent one. A buyer whose shard has no unit left is admitted
    /// with units moved from the sale's other shards (`stock_moves.rs`), and
    /// refused as sold out only when none holds one. The purchase's limits,
    /// when `limits` still owes their count, are counted in the first call
    /// of the script (a purchase they refuse is answered 429, nothing else
    /// done).
    #[tracing::instrument(name = "admission", skip_all,
        fields(%user_id, voucher_id = %sale.voucher_id))]
    pub async fn admit(
        &self,
        user_id: UserId,
        sale: &SaleRef,
        append_to_stream: bool,
        key: Option<&IdempotencyKey>,
        limits: &mut Counting,
    ) -> Result<Admission, Error> {
        let position = sale.layout.position_of(user_id);
        let shard = sale.layout.shard(position);
        let deadline = tokio::time::Instant::now() + self.store.backend_timeout();
        loop {
            let admission = self
                .admit_in(shard, user_id, sale, append_to_stream, key, limits)
                .await?;
            if admission != Admission::Refused(Rejection::SoldOut) || sale.layout.count() == 1 {
                return Ok(admission);
            }
            // A buyer who has bought moves no stock: the sale still holds
            // units elsewhere, so the answer is the one a sale with stock
            // gives.
            let buyers = self.keys.shard(shard).buyers(sale.voucher_id);
            let bought: bool = self.redis.clone().sismember(buyers, user_id.get()).await?;
            if bought {
                return Ok(Admission::Refused(Rejection::AlreadyOrdered));
            }
            match self.refill(sale, position, deadline).await? {
                Refill::SoldOut => return Ok(admission),
                Refill::Moved => {}
                // A shard is gone (Redis lost it): the sale is loaded again
                // as a whole, and the buyer's shard asked again.
                Refill::Missing => {
                    self.load(sale.voucher_id).await?;
                }
            }
        }
    }

    /// One call of `lua/seckill.lua`, in `shard`, counting what `limits`
    /// still owes.
    async fn admit_in(
        &self,
        shard: Shard,
        user_id: UserId,
        sale: &SaleRef,
        append_to_stream: bool,
        key: Option<&IdempotencyKey>,
        limits: &mut Counting,
    ) -> Result<Admission, Error> {
        let keys = self.keys.shard(shard);
        // The entry carries the admission's trace to the batch that writes
        // it, when traces are exported.
        let traceparent = append_to_stream.then(traces::traceparent).flatten();
        // Only a cluster connection sends a call again after losing its
        // reply (a `ConnectionManager` reconnects and reports the error):
        // elsewhere an attempt without an Idempotency-Key is not kept, which
        // spares a write per admission.
        let (attempt_key, kept) = match key {
            Some(key) => (keys.idempotency(user_id, key.as_str()), ANSWER_KEPT),
            None if matches!(self.redis, RedisConnection::Cluster(_)) => {
                (keys.attempt(rand::random()), ATTEMPT_ANSWER_KEPT)
            }
            None => (keys.attempt(0), Duration::ZERO),
        };
        let low_word = self.order_ids.next_low_word(shard).await?;
        metrics::SHARD_ADMISSIONS
            .with_label_values(&[shard.tag()])
            .inc();
        let mut call = ADMIT.prepare_invoke();
        call.key(keys.voucher(sale.voucher_id))
            .key(keys.buyers(sale.voucher_id))
            .key(keys.orders())
            .key(keys.pending())
            .key(attempt_key)
            .arg(user_id.get())
            .arg(sale.voucher_id.get())
            .arg(u8::from(append_to_stream))
            .arg(sale.token)
            .arg(kept.as_millis() as u64)
            .arg(low_word)
            .arg(self.fences.floor(sale.voucher_id, shard))
            .arg(traceparent.as_deref().unwrap_or(""));
        let owed = limits.for_script();
        match &owed {
            Some(owed) => owed.folded_into(&mut call),
            None => {
                call.arg(0);
            }
        }
        let reply: redis::RedisResult<redis::Value> =
            call.invoke_async(&mut self.redis.clone()).await;
        if let Some(owed) = owed {
            owed.settle(reply.as_ref())?;
        }
        let reply = reply?;
        Admission::from_reply(&reply)
            .ok_or_else(|| Error::Internal(anyhow::anyhow!("lua/seckill.lua answered {reply:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::{Admission, Suspicion};
    use crate::error::Rejection;
    use crate::ids::OrderId;
    use redis::Value;

    #[test]
    fn an_id_is_an_admission_each_code_one_refusal_and_anything_else_none() {
        assert_eq!(
            Admission::from_reply(&Value::BulkString(b"530713649031938048:7".to_vec())),
            Some(Admission::Admitted(
                OrderId::new(530_713_649_031_938_048),
                7
            ))
        );
        assert_eq!(
            [9, 10, 11].map(|code| Admission::from_reply(&Value::Int(code))),
            [
                Suspicion::ServerChanged,
                Suspicion::BuyersLost,
                Suspicion::BehindMysql
            ]
            .map(|suspicion| Some(Admission::Suspect(suspicion)))
        );
        let refusals: Vec<_> = (1..=5)
            .map(|code| Admission::from_reply(&Value::Int(code)))
            .collect();
        assert_eq!(
            refusals,
            [
                Rejection::VoucherNotFound,
                Rejection::NotStarted,
                Rejection::Ended,
                Rejection::SoldOut,
                Rejection::AlreadyOrdered
            ]
            .map(|rejection| Some(Admission::Refused(rejection)))
        );
        assert_eq!(
            Admission::from_reply(&Value::Int(6)),
            Some(Admission::Stale)
        );
        assert_eq!(
            Admission::from_reply(&Value::Int(7)),
            Some(Admission::Reopening)
        );
        assert_eq!(
            Admission::from_reply(&Value::BulkString(b"again:42".to_vec())),
            Some(Admission::Again(OrderId::new(42)))
        );
        assert_eq!(
            Admission::from_reply(&Value::Int(8)),
            Some(Admission::KeyReused)
        );
        for unknown in [
            Value::Int(0),
            Value::Int(-1),
            Value::Int(12),
            Value::BulkString(b"530713649031938048".to_vec()),
            Value::BulkString(b"again:x".to_vec()),
            Value::BulkString(b"-5".to_vec()),
            Value::BulkString(b"12x".to_vec()),
            Value::Nil,
        ] {
            assert_eq!(Admission::from_reply(&unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn the_labels_are_admitted_and_each_refusal_code() {
        let labels: Vec<_> = Admission::labels().collect();
        assert_eq!(
            labels,
            [
                "admitted",
                "VOUCHER_NOT_FOUND",
                "NOT_STARTED",
                "ENDED",
                "SOLD_OUT",
                "ALREADY_ORDERED"
            ]
        );
        assert_eq!(Admission::Refused(Rejection::SoldOut).label(), "SOLD_OUT");
    }
}
