//! `hmdp lab check-then-delete`: lock v2 checks the owner with `GET` and
//! deletes with `DEL`, two commands; a lease that runs out between them lets
//! the `DEL` delete the next holder's lock (fixed by lock v3's Lua script).
//!
//! Timeline (lease 400 ms, every acquisition tries once):
//! A works until 300 ms and releases; the lab stalls that release right
//! before its deleting command until 600 ms (for lock v2: after the `GET`
//! found A's own token). A's key expires at 400 ms; B takes the lock at
//! 500 ms and works until 800 ms. A's release resumes at 600 ms, then C tries
//! at 700 ms: if A's release freed B's key, C enters beside B.

use std::time::Duration;

use anyhow::Context;

use super::harness::Lab;

const LEASE: Duration = Duration::from_millis(400);

pub(super) async fn run(lab: &Lab) -> anyhow::Result<String> {
    let lock = lab.lock(LEASE, Duration::ZERO)?;
    let a = async {
        let held = lab
            .acquire("A", &*lock)
            .await?
            .context("A found the key busy")?;
        lab.enter("A");
        lab.at(300).await;
        lab.leave("A");
        lab.stall_next_release("A", 600);
        lab.release("A", held).await?;
        anyhow::Ok(())
    };
    let b = async {
        lab.at(500).await;
        if let Some(held) = lab.acquire("B", &*lock).await? {
            lab.enter("B");
            lab.at(800).await;
            lab.leave("B");
            lab.release("B", held).await?;
        }
        Ok(())
    };
    let c = async {
        lab.at(700).await;
        if let Some(held) = lab.acquire("C", &*lock).await? {
            lab.enter("C");
            lab.at(850).await;
            lab.leave("C");
            lab.release("C", held).await?;
        }
        Ok(())
    };
    let redis = async {
        lab.at(450).await;
        lab.observe_key().await?;
        lab.at(650).await;
        lab.observe_key().await
    };
    tokio::try_join!(a, b, c, redis)?;

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
