//! `hmdp lab gc-pause`: a holder paused past its lease (a GC pause, a slow
//! disk) wakes up and commits as if it still held the lock. Only the storage
//! can tell, with fencing tokens (`--fencing`).
//!
//! It runs the real purchase against a database of its own (created, then
//! dropped). Timeline (lease 400 ms, nothing renews it): A's purchase takes
//! the lock, checks that user 1 has no order yet, then pauses 1200 ms inside
//! its transaction. The key expires; 600 ms after A started, B's purchase
//! for the same user takes the lock. Without fencing both commit: two orders. With
//! `--fencing` B's newer token wins: A finds it before committing and rolls
//! back, and the fence row orders B's transaction after A's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::harness::{open_voucher, Lab};
use super::report::Actor;
use hmdp::after_sale::{PayDeadlines, DEFAULT_PAY_TIMEOUT};
use hmdp::error::Error;
use hmdp::ids::{OrderId, UserId};
use hmdp::keys::Keys;
use hmdp::seckill::Seckill;
use hmdp::store::Store;

const LEASE: Duration = Duration::from_millis(400);
const PAUSE: Duration = Duration::from_millis(1200);
/// When B's purchase starts, after A's: past A's lease, however long A's
/// first look at the voucher took before it locked.
const B_STARTS: u64 = 600;
/// The user both purchases are for: the lab's key is `lock:order:1`.
const USER: UserId = UserId::new(1);

/// Plays the scenario on `store`, a database of the run's own, created and
/// migrated before the lab's clock started.
pub(super) async fn run(lab: &Lab, store: &Store) -> anyhow::Result<String> {
    let voucher = open_voucher(store, "gc-pause", 10).await?;
    let lock = lab.lock(LEASE, Duration::ZERO)?;
    let keys = Keys::new(lab.namespace());
    let paused = Arc::new(Seckill::new(
        store.clone(),
        lock.clone(),
        lab.redis(),
        keys.clone(),
        PayDeadlines::new(lab.redis(), &keys, DEFAULT_PAY_TIMEOUT),
        PAUSE,
    ));
    let prompt = Arc::new(Seckill::new(
        store.clone(),
        lock,
        lab.redis(),
        keys.clone(),
        PayDeadlines::new(lab.redis(), &keys, DEFAULT_PAY_TIMEOUT),
        Duration::ZERO,
    ));

    let start = lab.soon();
    let a = async {
        lab.at(start).await;
        lab.say(
            "A",
            "purchases: takes the lock, finds no order of user 1, then pauses 1200 ms \
             inside its transaction",
        );
        let outcome = paused.purchase(USER, voucher, Instant::now()).await;
        say_outcome(lab, "A", outcome);
    };
    let b = async {
        lab.at(start + B_STARTS).await;
        lab.say("B", "purchases for the same user");
        let outcome = prompt.purchase(USER, voucher, Instant::now()).await;
        say_outcome(lab, "B", outcome);
    };
    let redis = lab.observe_key_at([start + B_STARTS - 50]);
    let ((), (), observed) = tokio::join!(a, b, redis);
    observed?;

    let audit = store.audit_voucher(voucher).await?;
    lab.say(
        "mysql",
        format!("user 1 has {} order(s)", audit.active_orders),
    );
    if audit.active_orders > 1 {
        lab.fail("A", "committed after its lease ran out, beside B's order");
    }
    Ok(if lab.broken() {
        "A's lease expired during its pause and B took the lock; A woke up still \
         believing it held the lock, and its write landed next to B's. No lock can \
         prevent this alone: the storage has to reject the stale holder (--fencing)."
    } else if lab.fencing() {
        "B's acquisition minted a newer fencing token than A's; the fence row made B's \
         transaction wait for A's, and A, seeing the newer token before committing, \
         rolled back. One order."
    } else {
        "Only one purchase committed."
    }
    .to_owned())
}

fn say_outcome(lab: &Lab, who: Actor, outcome: Result<OrderId, Error>) {
    match outcome {
        Ok(order) => lab.say(who, format!("commits order {order}")),
        Err(error) => {
            let cause = std::error::Error::source(&error)
                .map(|cause| format!(": {cause}"))
                .unwrap_or_default();
            let ended = if matches!(error, Error::Rejected(_)) {
                "gets no order"
            } else {
                "is rolled back"
            };
            lab.say(
                who,
                format!("{ended}: {} {error}{cause}", error.error_code()),
            );
        }
    }
}
