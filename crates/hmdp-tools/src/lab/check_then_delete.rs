//! `hmdp lab check-then-delete`: lock v2 checks the owner with `GET` and
//! deletes with `DEL`, two commands; a lease that runs out between them lets
//! the `DEL` delete the next holder's lock (fixed by lock v3's Lua script).
//!
//! The [`late_release`](super::late_release) story with the pause inside the
//! release: A works until 300 ms and releases; the lab stalls that release
//! right before its deleting command until 600 ms (for lock v2: after the
//! `GET` found A's own token). A's key expires at 400 ms and B takes the
//! lock; A's `DEL`, checked too early, deletes B's key and C enters beside B.

use super::harness::Lab;
use super::late_release::{self, Pause};

/// A releases shortly before its 400 ms lease runs out, so its owner check
/// still passes.
const WORK_UNTIL: u64 = 300;

pub(super) async fn run(lab: &Lab) -> anyhow::Result<String> {
    late_release::play(lab, WORK_UNTIL, Pause::InsideRelease).await?;

    Ok(if lab.broken() {
        "A's owner check passed before its lease ran out, and the DEL that followed \
         deleted B's lock, so C got in while B still worked; the fix is to check and \
         delete in one atomic step (lock v3, --lock redis-lua)."
    } else {
        "A's stalled release freed no other holder's lock, so nobody entered beside a \
         holder: no lease could run out between the owner check and the delete."
    }
    .to_owned())
}
