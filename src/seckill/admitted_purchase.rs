//! The purchase of `queue` and `stream` mode, the course's asynchronous
//! seckill: the sale's window, stock and one-order-per-user decided in
//! Redis by one script (`sale_state/admission.rs`), the order handed off
//! (to the in-process queue, or onto the order stream in the same script)
//! and answered with its id before MySQL has seen it.

use super::catalog::SaleInfo;
use super::sale_state::{Admission, SaleRef};
use super::{Handoff, Seckill};
use crate::error::{Error, Rejection};
use crate::idempotency::IdempotencyKey;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::limits::Counting;
use crate::metrics;
use crate::store::NewOrder;

impl Seckill {
    /// The purchase of `queue` and `stream` mode: admitted in Redis, handed
    /// off, answered with the order id before MySQL has seen the order (and
    /// whether an earlier request with the same `key` got it). The
    /// purchase's `limits` are counted in the admission script's call where
    /// they can be (one Redis), else first, in calls of their own.
    pub(super) async fn admit(
        &self,
        handoff: &Handoff,
        user_id: UserId,
        voucher_id: VoucherId,
        key: Option<&IdempotencyKey>,
        mut limits: Counting,
    ) -> Result<(OrderId, bool), Error> {
        limits.pay_unless_scripted().await?;
        // The sale as MySQL has it: a voucher Redis lacks is loaded from it,
        // and a voucher MySQL lacks is sold by no Redis sale left behind.
        let Some(mut sale) = self.catalog.sale(voucher_id).await? else {
            limits.pay_now().await?;
            let refused = Admission::Refused(Rejection::VoucherNotFound);
            metrics::ADMISSIONS
                .with_label_values(&[refused.label()])
                .inc();
            return Err(Rejection::VoucherNotFound.into());
        };
        // A key first sent for a sale of another shard count lives where
        // the admission script does not look.
        if let Some(key) = key {
            let checked = Some(sale.layout().shard_of(user_id));
            if let Some(order_id) = self.kept_answer(user_id, voucher_id, key, checked).await? {
                limits.pay_now().await?;
                return Ok((order_id, true));
            }
        }
        let append = matches!(handoff, Handoff::Stream);
        let admit = async |sale: &SaleInfo, limits: &mut Counting| {
            // What MySQL had written when the catalog last read it: another
            // node's writers raise the fence too.
            self.sale_state.fences().learn(voucher_id, sale.fence());
            let sale = SaleRef {
                voucher_id,
                token: sale.token(),
                layout: sale.layout(),
            };
            (self.sale_state)
                .admit(user_id, &sale, append, key, limits)
                .await
        };
        let mut admission = admit(&sale, &mut limits).await?;
        if admission == Admission::Stale {
            // Redis holds an earlier voucher's sale under this id, or this
            // node remembers an earlier voucher: both are read again from
            // MySQL, and the sale replaced if it is the stale one.
            self.catalog.forget(voucher_id);
            sale = self
                .catalog
                .sale(voucher_id)
                .await?
                .ok_or(Rejection::VoucherNotFound)?;
            self.sale_state.load(voucher_id).await?;
            admission = admit(&sale, &mut limits).await?;
        }
        if admission == Admission::Refused(Rejection::VoucherNotFound) {
            // MySQL has the voucher and Redis had not: Redis restarted
            // empty, or the node that created it could not store it. The
            // load is set-if-absent from MySQL (this task's or a concurrent
            // one's), so asking once more is safe.
            self.sale_state.load(voucher_id).await?;
            admission = admit(&sale, &mut limits).await?;
        }
        metrics::ADMISSIONS
            .with_label_values(&[admission.label()])
            .inc();
        let (id, sequence) = match admission {
            Admission::Admitted(id, sequence) => (id, sequence),
            // Handed off when it was admitted.
            Admission::Again(id) => return Ok((id, true)),
            Admission::KeyReused => return Err(Error::IdempotencyKeyReused),
            Admission::Reopening => {
                return Err(Error::Unavailable(anyhow::anyhow!(
                "voucher {voucher_id}'s sale was reloaded after Redis lost it; it reopens shortly"
            )))
            }
            Admission::Stale => {
                return Err(Error::Unavailable(anyhow::anyhow!(
                    "voucher {voucher_id}'s sale in Redis still carries another sale token"
                )))
            }
            Admission::Suspect(suspicion) => {
                // Redis may have forgotten admissions: nothing was done,
                // and the sale is loaded again from MySQL under its stock
                // row. It reopens once writers holding orders admitted
                // before could count them again; the buyer asks again.
                self.sale_state.load(voucher_id).await?;
                return Err(Error::Unavailable(anyhow::anyhow!(
                    "voucher {voucher_id}'s sale in Redis could not be trusted ({}): loaded \
                     again from MySQL, it reopens shortly",
                    suspicion.label()
                )));
            }
            Admission::Refused(rejection) => {
                if rejection == Rejection::SoldOut {
                    self.sold_out(voucher_id, &sale);
                }
                return Err(rejection.into());
            }
        };
        if let Handoff::Queue(queue) = handoff {
            queue
                .push(NewOrder {
                    id,
                    user_id,
                    voucher_id,
                    sequence,
                    idempotency: None,
                })
                .await?;
        }
        Ok((id, false))
    }
}
