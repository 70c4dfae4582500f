//! The synchronous purchase, hmdp's `seckillVoucher`: the sale's window,
//! then the buyer's lock, the order id and the Idempotency-Key's claim in
//! one trip to Redis, the order written under the lock — in the voucher's
//! next shared commit, or in a transaction of its own — and the lock
//! released after the commit, before the answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Local;
use hmdp_lock::LockGuard;

use super::shared_commits::{answered, Placed, Written};
use super::writer::Locks;
use super::Seckill;
use crate::error::{Error, Rejection};
use crate::idempotency::{Claim, ClaimId, IdempotencyKey};
use crate::ids::{OrderId, UserId, VoucherId};
use crate::metrics;
use crate::store::NewOrder;

/// How many order ids a purchase draws at most, each found taken already.
const ORDER_ID_ATTEMPTS: usize = 8;

/// How long the answer waits for the lock's release even when the
/// purchase's time is up: a healthy Redis answers within a millisecond.
const RELEASE_GRACE: Duration = Duration::from_millis(200);

impl Seckill {
    /// The synchronous purchase: the sale's window, then the user's lock
    /// and the order placed in MySQL under it; with the buyer's
    /// Idempotency-Key `key`, the order an earlier request with it got
    /// (`true`) instead.
    pub(super) async fn purchase_sync(
        self: &Arc<Self>,
        user_id: UserId,
        voucher_id: VoucherId,
        requested_at: Instant,
        key: Option<&IdempotencyKey>,
    ) -> Result<(OrderId, bool), Error> {
        let budget = self.store.backend_timeout() + self.writer.lock_wait();
        let answer_by = requested_at + budget;
        let voucher = self
            .catalog
            .sale(voucher_id)
            .await?
            .ok_or(Rejection::VoucherNotFound)?;
        if let Some(refusal) = voucher.refusal_at(Local::now().naive_local()) {
            // A key that got an order is answered with it, not refused.
            if let Some(key) = key {
                if let Some(order_id) = self.kept_answer(user_id, voucher_id, key, None).await? {
                    return Ok((order_id, true));
                }
                if let Some(order_id) = self.placed_with_key(user_id, voucher_id, key).await? {
                    return Ok((order_id, true));
                }
            }
            return Err(refusal.into());
        }

        // The order id is drawn, and the Idempotency-Key claimed, alongside
        // the lock: with a Redis lock, the commands are queued on the thread's
        // connection before its writer runs, so they leave in one write and
        // come back in one read — they cost no round trip of their own, and
        // none while the voucher's stock row is locked. A purchase refused
        // after this leaves a gap in the counter, which ids allow.
        // Given up on at the end of the budget (an acquisition abandoned in
        // flight gives back whatever it took).
        let claim_id = ClaimId::new(voucher_id);
        let joined = tokio::time::timeout_at(answer_by.into(), async {
            tokio::join!(
                self.writer.acquire(user_id),
                self.next_order_id(),
                self.idempotency.claim(user_id, key, voucher_id, &claim_id)
            )
        })
        .await;
        step("lock", requested_at);
        let Ok((held, id, claim)) = joined else {
            // Given up before the claim's answer: whether it landed is not
            // known. It is freed if it did (the key would answer 409 for a
            // minute for a purchase that never ran), in a task of its own:
            // this answer is due.
            if let Some(key) = key.cloned() {
                let seckill = self.clone();
                tokio::spawn(async move {
                    (seckill.idempotency)
                        .settle(user_id, &key, &claim_id, None)
                        .await
                });
            }
            return Err(Error::over_budget("taking the lock", budget));
        };
        let drawn = id.as_ref().ok().copied();
        let claimed = match claim {
            Ok(Some(Claim::Ours)) => key,
            Ok(None) => None,
            // Answered by an earlier request with the key, or refused.
            Ok(Some(Claim::Kept(order_id))) => {
                self.release_taken(user_id, held, answer_by).await;
                return Ok((order_id, true));
            }
            Err(error) => {
                self.release_taken(user_id, held, answer_by).await;
                return Err(error);
            }
        };
        let (outcome, held) = match (held, id) {
            (Ok(held), Ok(id)) => {
                let order = NewOrder {
                    idempotency: key.map(IdempotencyKey::digest),
                    ..NewOrder::unsequenced(id, user_id, voucher_id)
                };
                let placing = Instant::now();
                let placed = self.write_under_lock(order, held, answer_by).await;
                step("placed", placing);
                placed
            }
            (held, Err(error)) => (Err(error.into()), held.ok()),
            (Err(error), Ok(_)) => (Err(error), None),
        };
        // The lock's release and the key's answer go to Redis together: on
        // the thread's connection they leave in one write.
        let release = async {
            if let Some(held) = held {
                self.release_awaited_until(user_id, held, answer_by).await;
            }
        };
        let settle = async {
            if let Some(key) = claimed {
                self.settle_claim(user_id, voucher_id, key, &claim_id, drawn, &outcome)
                    .await;
            }
        };
        let releasing = Instant::now();
        tokio::join!(release, settle);
        step("release", releasing);
        if matches!(outcome, Err(Error::Rejected(Rejection::SoldOut))) {
            self.sold_out(voucher_id, &voucher);
        }
        // A key Redis forgot the answer of (a restart, a failover): the
        // order MySQL wrote for it is the answer, not the refusal.
        if let (Some(key), Err(Error::Rejected(_))) = (claimed, &outcome) {
            if let Some(order_id) = self.placed_with_key(user_id, voucher_id, key).await? {
                return Ok((order_id, true));
            }
        }
        outcome.map(|order_id| (order_id, false))
    }

    /// The order MySQL wrote for `user_id`'s purchase of `voucher_id` with
    /// `key`, if any (`tb_voucher_order.idempotency_key_digest`).
    async fn placed_with_key(
        &self,
        user_id: UserId,
        voucher_id: VoucherId,
        key: &IdempotencyKey,
    ) -> Result<Option<OrderId>, Error> {
        let digest = key.digest();
        Ok((self.store)
            .order_placed_with_key(user_id, voucher_id, digest)
            .await?)
    }

    /// Ends the claim of the purchase's Idempotency-Key `key` by its
    /// `outcome`; `drawn`, the order id it drew, if any.
    async fn settle_claim(
        &self,
        user_id: UserId,
        voucher_id: VoucherId,
        key: &IdempotencyKey,
        claim_id: &ClaimId,
        drawn: Option<OrderId>,
        outcome: &Result<OrderId, Error>,
    ) {
        let placed = match outcome {
            Ok(order_id) => Some(Some(*order_id)),
            // A refusal wrote nothing: the key may ask again.
            Err(Error::Rejected(_)) => Some(None),
            // Anything else may have committed all the same (its COMMIT's
            // answer lost on the way): the key keeps the order if MySQL has
            // it, and stays claimed (a minute) if MySQL cannot say.
            Err(_) => match drawn {
                Some(id) => match self.store.order_of_user(id, user_id).await {
                    Ok(written) => Some(written.map(|_| id)),
                    Err(_) => None,
                },
                None => Some(None),
            },
        };
        if let Some(placed) = placed {
            let placed = placed.map(|order_id| (voucher_id, order_id));
            (self.idempotency)
                .settle(user_id, key, claim_id, placed)
                .await;
        }
    }

    /// A synchronous purchase's `order` written under its buyer's lock
    /// `held`: in the voucher's next shared commit, or in a transaction of
    /// its own; given up before its `COMMIT` at the backend timeout or
    /// `answer_by`, whichever comes first. Answers with the lock, still held
    /// (`None` only should the shared commit's task have died).
    async fn write_under_lock(
        self: &Arc<Self>,
        mut order: NewOrder,
        mut held: Box<dyn LockGuard>,
        answer_by: Instant,
    ) -> (Result<OrderId, Error>, Option<Box<dyn LockGuard>>) {
        for _ in 0..ORDER_ID_ATTEMPTS {
            let placed = match &self.commits {
                Some(commits) => match commits.place(order, held, answer_by).await {
                    Ok(placed) => placed,
                    Err(error) => return (Err(error), None),
                },
                None => {
                    let locks = Locks::one(order.user_id, held);
                    let written = self.write_alone(order, &locks, Some(answer_by)).await;
                    let held = locks.into_held().next().expect("the buyer's lock is held");
                    Placed {
                        outcome: written,
                        held,
                    }
                }
            };
            held = placed.held;
            match placed.outcome {
                Ok(Written::Order(order_id)) => return (Ok(order_id), Some(held)),
                Ok(Written::IdTaken) => match self.next_order_id().await {
                    Ok(id) => {
                        tracing::warn!(taken = %order.id,
                            "order id reused after an id counter reset; drawing another");
                        order.id = id;
                    }
                    Err(error) => return (Err(error.into()), Some(held)),
                },
                Err(error) => return (Err(error), Some(held)),
            }
        }
        let error = anyhow::anyhow!("{ORDER_ID_ATTEMPTS} order ids in a row were taken already");
        (Err(Error::Internal(error)), Some(held))
    }

    /// The purchase transaction for one `order`, alone, under its user's
    /// lock in `locks` (also what `bench-db` measures, with no lock), given
    /// up before its `COMMIT` at the backend timeout or `answer_by`,
    /// whichever comes first. [`Written::IdTaken`]: the id worker's counter
    /// in Redis started over (Redis restarted empty within the same second
    /// as earlier orders) and handed out an id taken already.
    pub async fn write_alone(
        &self,
        order: NewOrder,
        locks: &Locks,
        answer_by: Option<Instant>,
    ) -> Result<Written, Error> {
        let answer_by = answer_by.unwrap_or_else(|| Instant::now() + self.store.backend_timeout());
        let mut written = (self.writer)
            .write_purchases(std::slice::from_ref(&order), locks, answer_by)
            .await;
        answered(&order, written.pop().expect("an outcome per order")?)
    }

    /// Releases `user_id`'s lock if the acquisition took it.
    async fn release_taken(
        self: &Arc<Self>,
        user_id: UserId,
        taken: Result<Box<dyn LockGuard>, Error>,
        answer_by: Instant,
    ) {
        if let Ok(held) = taken {
            self.release_awaited_until(user_id, held, answer_by).await;
        }
    }

    /// Releases `user_id`'s lock, waiting for that until `answer_by` at
    /// most (but always [`RELEASE_GRACE`]). The answer normally follows the
    /// release, so that the same user's next purchase finds the lock free;
    /// but with Redis failing over, a purchase that already waited out a
    /// Redis call inside its transaction (the fencing check) could wait as
    /// long again for the release. After that the release carries on in a
    /// task of its own (the transaction has ended: the lock has done its
    /// work); a release that ends in time, nearly all of them, costs no
    /// task.
    async fn release_awaited_until(
        self: &Arc<Self>,
        user_id: UserId,
        held: Box<dyn LockGuard>,
        answer_by: Instant,
    ) {
        let seckill = self.clone();
        // Owned, so that it can move to a task half done: a release is not
        // dropped midway.
        let mut release = Box::pin(async move { seckill.writer.release(user_id, held).await });
        let until = answer_by.max(Instant::now() + RELEASE_GRACE);
        if tokio::time::timeout_at(until.into(), &mut release)
            .await
            .is_err()
        {
            tracing::debug!("lock release still under way; answering without it");
            tokio::spawn(release);
        }
    }
}

/// Counts `since`'s time to `step` of a synchronous purchase.
fn step(step: &str, since: Instant) {
    (metrics::SYNC_PURCHASE_STEPS.with_label_values(&[step]))
        .observe(since.elapsed().as_secs_f64());
}
