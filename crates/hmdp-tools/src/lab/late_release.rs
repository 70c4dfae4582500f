//! The story `misdelete` and `check-then-delete` share: A's release lands
//! after its lease ran out and B took the lock, and C's attempt shows whether
//! that release freed B's key. The two scenarios differ only in where A is
//! held up ([`Pause`]), which decides which lock version the story catches.
//!
//! Timeline (lease 400 ms, every acquisition tries once): A works from 0 ms
//! until the scenario's `work_until`, leaves, and is held up until 600 ms.
//! Its key expires at 400 ms; B takes the lock at 500 ms and works until
//! 800 ms. A's release goes through at 600 ms, then C tries at 700 ms and
//! works until 850 ms: if A's release freed B's key, C enters beside B.
//! Redis's view of the key goes on the timeline at 450 and 650 ms.

use std::time::Duration;

use super::harness::Lab;

const LEASE: Duration = Duration::from_millis(400);
/// When A's held-up release goes through: past A's lease, after B took the
/// lock at 500 ms and before C tries at 700 ms.
const RELEASE_AT: u64 = 600;

/// Where A is held up on its way out.
pub(super) enum Pause {
    /// Between leaving the critical section and calling release (a GC pause):
    /// any release that does not check the owner deletes B's key.
    BeforeRelease,
    /// Inside the release, just before the command that deletes the key: a
    /// release that checked the owner in an earlier command deletes B's key.
    InsideRelease,
}

/// Plays the story; the lab's verdict and timeline tell what happened.
pub(super) async fn play(lab: &Lab, work_until: u64, pause: Pause) -> anyhow::Result<()> {
    let lock = lab.lock(LEASE, Duration::ZERO)?;
    let a = async {
        let held = lab.acquire_and_enter("A", &*lock).await?;
        lab.at(work_until).await;
        lab.leave("A");
        match pause {
            Pause::BeforeRelease => {
                lab.say("A", "is stalled by a GC pause before it can release");
                lab.at(RELEASE_AT).await;
            }
            Pause::InsideRelease => lab.stall_next_release("A", RELEASE_AT),
        }
        lab.release("A", held).await?;
        anyhow::Ok(())
    };
    let b = async {
        lab.at(500).await;
        lab.visit("B", &*lock, Some(800)).await
    };
    let c = async {
        lab.at(700).await;
        lab.visit("C", &*lock, Some(850)).await
    };
    let redis = lab.observe_key_at([450, 650]);
    tokio::try_join!(a, b, c, redis)?;
    Ok(())
}
