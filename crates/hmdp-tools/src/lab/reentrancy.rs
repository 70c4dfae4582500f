//! `hmdp lab reentrancy`: a holder that locks the same key again from a
//! nested step. A non-reentrant lock cannot tell its own holder from a
//! stranger and blocks it; Redisson's hash lock counts holds per holder.
//!
//! Timeline (every acquisition waits up to 300 ms): A takes the lock and,
//! inside, calls a step that takes the same user's lock again as the same
//! holder. With `redis-lua` the nested `SET NX` finds the key taken (by A),
//! waits out its 300 ms and gives up: A has blocked itself. With
//! `--lock reentrant` A enters again; the nested release leaves the lock
//! held once, B is still kept out, and A's outer release frees it.

use hmdp_lock::Holder;
use std::time::Duration;

use super::harness::Lab;

const LEASE: Duration = Duration::from_millis(2000);
const WAIT: Duration = Duration::from_millis(300);

pub(super) async fn run(lab: &Lab) -> anyhow::Result<String> {
    let lock = lab.lock(LEASE, WAIT)?;
    let a = Holder::new();
    let outer = lab.acquire_and_enter_as("A", a, &*lock).await?;
    lab.say(
        "A",
        "calls a nested step that locks the same user again, as the same holder",
    );
    let reentered = match lab.acquire_as("A", a, &*lock).await? {
        Some(inner) => {
            lab.say("A", "re-enters: the lock now counts two holds of A");
            lab.release("A", inner).await?;
            true
        }
        None => {
            lab.fail("A", "is blocked by its own lock");
            false
        }
    };
    // The outer hold must still keep everyone else out.
    lab.visit("B", &*lock, None).await?;
    lab.leave("A");
    lab.release("A", outer).await?;

    Ok(if reentered {
        "A re-entered its own lock as the same holder; the nested release only gave \
         back one hold (the key stayed A's, B was refused), and the outer release \
         freed it."
    } else {
        "A non-reentrant lock sees its own holder's key as taken: the nested step \
         waited for A, which was waiting for the nested step. A lock that counts \
         holds per holder (Redisson's RLock, --lock reentrant) lets A in again."
    }
    .to_owned())
}
