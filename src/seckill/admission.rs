//! Admission in Redis, the purchase of `queue` and `stream` mode:
//! `lua/seckill.lua` checks the sale window by Redis's clock, the stock and
//! the buyer set, takes a unit, adds the buyer and hands the order off, all
//! in one call. The purchase answers the order id as soon as the script
//! admitted it; MySQL sees the order later, from the node's queue (`queue`)
//! or the order stream (`stream`).
//!
//! One call is also what makes it cancellation-safe: Redis runs a script to
//! its end or not at all, so a client hanging up may lose the answer, never
//! half an admission.

use std::sync::LazyLock;

use chrono::Local;
use redis::Script;

use super::sale_state::SaleState;
use super::{Handoff, Seckill};
use crate::error::{Error, Rejection};
use crate::ids::{OrderId, UserId, VoucherId};
use crate::metrics;
use crate::store::NewOrder;

static ADMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/seckill.lua")));

/// What `lua/seckill.lua` answered; no other code reads its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Stock taken, buyer added, order handed off and recorded as pending.
    Admitted,
    /// Redis holds no sale for the voucher.
    VoucherNotFound,
    NotStarted,
    Ended,
    SoldOut,
    AlreadyOrdered,
}

impl Admission {
    /// Every outcome, in the script's order of codes.
    pub const ALL: [Admission; 6] = [
        Admission::Admitted,
        Admission::VoucherNotFound,
        Admission::NotStarted,
        Admission::Ended,
        Admission::SoldOut,
        Admission::AlreadyOrdered,
    ];

    fn from_reply(code: i64) -> Option<Admission> {
        usize::try_from(code)
            .ok()
            .and_then(|code| Admission::ALL.get(code).copied())
    }

    /// The answer a refused purchase gets; `None` when admitted.
    pub fn rejection(self) -> Option<Rejection> {
        match self {
            Admission::Admitted => None,
            Admission::VoucherNotFound => Some(Rejection::VoucherNotFound),
            Admission::NotStarted => Some(Rejection::NotStarted),
            Admission::Ended => Some(Rejection::Ended),
            Admission::SoldOut => Some(Rejection::SoldOut),
            Admission::AlreadyOrdered => Some(Rejection::AlreadyOrdered),
        }
    }

    /// The `outcome` label of `hmdp_admissions_total`: `admitted`, or the
    /// refusal's `errorCode`.
    pub fn label(self) -> &'static str {
        self.rejection().map_or("admitted", Rejection::code)
    }
}

impl SaleState {
    /// Runs `lua/seckill.lua` for `order`, appending it to the order stream
    /// when `append_to_stream` (`stream` mode).
    pub async fn admit(&self, order: NewOrder, append_to_stream: bool) -> Result<Admission, Error> {
        let keys = &self.keys;
        let code: i64 = ADMIT
            .key(keys.seckill_voucher(order.voucher_id))
            .key(keys.seckill_buyers(order.voucher_id))
            .key(keys.order_stream())
            .key(keys.pending_orders())
            .arg(order.id.get())
            .arg(order.user_id.get())
            .arg(order.voucher_id.get())
            .arg(u8::from(append_to_stream))
            .invoke_async(&mut self.redis.clone())
            .await?;
        Admission::from_reply(code)
            .ok_or_else(|| Error::Internal(anyhow::anyhow!("lua/seckill.lua answered {code}")))
    }
}

impl Seckill {
    /// The purchase of `queue` and `stream` mode: admitted in Redis, handed
    /// off, answered with the order id before MySQL has seen the order.
    pub(super) async fn try_admit(
        &self,
        handoff: &Handoff,
        user_id: UserId,
        voucher_id: VoucherId,
    ) -> Result<OrderId, Error> {
        // A sale this node saw sell out is refused here, as the synchronous
        // purchase does: after the last unit, a storm's requests are nearly
        // all such, and each would cost an id and a script in Redis. Only
        // within the sale window by this node's clock, so that a purchase
        // after the sale still hears that it ended.
        let sale = self.catalog.sale(voucher_id).await?;
        if let Some(sale) = &sale {
            let now = Local::now().naive_local();
            if sale.is_sold_out() && sale.begin_time <= now && now <= sale.end_time {
                metrics::ADMISSIONS
                    .with_label_values(&[Admission::SoldOut.label()])
                    .inc();
                return Err(Rejection::SoldOut.into());
            }
        }
        // The id goes into the script (the stream entry, the pending hash),
        // so it is drawn first; a refusal leaves a gap, which ids allow.
        let id = self.next_order_id().await?;
        let order = NewOrder {
            id,
            user_id,
            voucher_id,
        };
        let append = matches!(handoff, Handoff::Stream);
        let mut admission = self.sale_state.admit(order, append).await?;
        if admission == Admission::VoucherNotFound && sale.is_some() {
            // MySQL has the voucher and Redis had not: Redis restarted
            // empty, or the node that created it could not store it. The
            // load is set-if-absent from MySQL (this task's or a concurrent
            // one's), so asking once more is safe.
            self.sale_state.load(voucher_id).await?;
            admission = self.sale_state.admit(order, append).await?;
        }
        metrics::ADMISSIONS
            .with_label_values(&[admission.label()])
            .inc();
        if let (Admission::SoldOut, Some(sale)) = (admission, &sale) {
            // Stock in Redis never grows during a sale, with one exception:
            // a Redis restarted empty reloads MySQL's stock, which counts
            // the admitted orders it lost as unsold. This node keeps
            // refusing those units: their buyers were told success.
            sale.mark_sold_out();
        }
        if let Some(rejection) = admission.rejection() {
            return Err(rejection.into());
        }
        if let Handoff::Queue(queue) = handoff {
            queue.push(order).await?;
        }
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::Admission;

    #[test]
    fn every_script_code_has_one_outcome_and_others_none() {
        for (code, outcome) in Admission::ALL.iter().enumerate() {
            assert_eq!(Admission::from_reply(code as i64), Some(*outcome));
        }
        assert_eq!(Admission::from_reply(-1), None);
        assert_eq!(Admission::from_reply(6), None);
    }

    #[test]
    fn only_admission_has_no_rejection() {
        let admitted: Vec<_> = Admission::ALL
            .into_iter()
            .filter(|outcome| outcome.rejection().is_none())
            .collect();
        assert_eq!(admitted, [Admission::Admitted]);
        assert_eq!(Admission::SoldOut.label(), "SOLD_OUT");
    }
}
