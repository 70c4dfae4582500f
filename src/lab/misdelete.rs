//! `hmdp lab misdelete`: lock v1's release deletes another holder's lock
//! (the course's 误删 problem, fixed by lock v2's owner check).
//!
//! Timeline (lease 400 ms, every acquisition tries once):
//! A takes the lock and finishes its work by 50 ms, then a GC pause stalls it
//! before its release until 600 ms. Its key expires at 400 ms; B takes the
//! lock at 500 ms and works until 800 ms. A's release at 600 ms, then C's
//! attempt at 700 ms: if A's release freed B's key, C enters beside B.

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
        lab.at(50).await;
        lab.leave("A");
        lab.say("A", "is stalled by a GC pause before it can release");
        lab.at(600).await;
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
        "A's late release deleted B's lock without checking whose it was, so C got in \
         while B still worked; the fix is to check the owner token before deleting \
         (lock v2, --lock redis-owner)."
    } else {
        "A's late release freed no other holder's lock, so nobody entered beside a holder."
    }
    .to_owned())
}
