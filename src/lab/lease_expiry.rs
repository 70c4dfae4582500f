//! `hmdp lab lease-expiry`: a holder whose work outlasts the lease loses the
//! lock without noticing, whatever the release does. The simple locks (v1 to
//! v3) have nothing that renews the lease; Redisson's watchdog does.
//!
//! Timeline (lease 400 ms, every acquisition tries once):
//! A takes the lock and works until 700 ms; nothing renews its lease, so the
//! key expires at 400 ms. B tries at 500 ms: if the key is gone, B enters
//! while A still works.

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
        lab.say("A", "works for 700 ms, longer than its 400 ms lease");
        lab.at(700).await;
        lab.leave("A");
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
    let redis = async {
        lab.at(450).await;
        lab.observe_key().await
    };
    tokio::try_join!(a, b, redis)?;

    Ok(if lab.broken() {
        "A's work outlasted its 400 ms lease and nothing renewed it, so the key expired \
         under a live holder and B got in; an owner check cannot help here. The fix is \
         a watchdog that keeps extending the lease while its holder is alive \
         (Redisson's watchdog, --lock reentrant)."
    } else {
        "B was refused while A worked past 400 ms: the lock did not lapse under a live holder."
    }
    .to_owned())
}
