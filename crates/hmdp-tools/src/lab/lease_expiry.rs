//! `hmdp lab lease-expiry`: a holder whose work outlasts the lease loses the
//! lock without noticing, whatever the release does. The simple locks (v1 to
//! v3) have nothing that renews the lease; Redisson's watchdog does.
//!
//! Timeline (lease 400 ms, every acquisition tries once):
//! A takes the lock and works until 1200 ms, three times its lease. Without
//! renewal the key expires at 400 ms and B, trying at 500 ms, enters while A
//! still works. With `--lock reentrant` the watchdog renews the lease every
//! third of it while A lives, so B is refused.

use std::time::Duration;

use super::harness::Lab;

const LEASE: Duration = Duration::from_millis(400);

pub(super) async fn run(lab: &Lab) -> anyhow::Result<String> {
    let lock = lab.lock(LEASE, Duration::ZERO)?;
    let a = async {
        let held = lab.acquire_and_enter("A", &*lock).await?;
        lab.say("A", "works for 1200 ms, three times its 400 ms lease");
        lab.at(1200).await;
        lab.leave("A");
        lab.release("A", held).await?;
        anyhow::Ok(())
    };
    let b = async {
        lab.at(500).await;
        lab.visit("B", &*lock, Some(800)).await
    };
    let redis = lab.observe_key_at([450, 1100]);
    tokio::try_join!(a, b, redis)?;

    Ok(if lab.broken() {
        "A's work outlasted its 400 ms lease and nothing renewed it, so the key expired \
         under a live holder and B got in; an owner check cannot help here. The fix is \
         a watchdog that keeps extending the lease while its holder is alive \
         (Redisson's watchdog, --lock reentrant)."
    } else {
        "B was refused while A worked three times past its 400 ms lease: the lock did \
         not lapse under a live holder."
    }
    .to_owned())
}
