//! `hmdp lab misdelete`: lock v1's release deletes another holder's lock
//! (the course's 误删 problem, fixed by lock v2's owner check).
//!
//! The [`late_release`](super::late_release) story with the pause before the
//! release: A finishes its work by 50 ms, then a GC pause stalls it until
//! 600 ms, past its 400 ms lease and after B took the lock. Lock v1's plain
//! DEL then deletes B's key, and C enters beside B.

use super::harness::Lab;
use super::late_release::{self, Pause};

/// A's work is short: the GC pause, not the work, outlasts its lease.
const WORK_UNTIL: u64 = 50;

pub(super) async fn run(lab: &Lab) -> anyhow::Result<String> {
    late_release::play(lab, WORK_UNTIL, Pause::BeforeRelease).await?;

    Ok(if lab.broken() {
        "A's late release deleted B's lock without checking whose it was, so C got in \
         while B still worked; the fix is to check the owner token before deleting \
         (lock v2, --lock redis-owner)."
    } else {
        "A's late release freed no other holder's lock, so nobody entered beside a holder."
    }
    .to_owned())
}
