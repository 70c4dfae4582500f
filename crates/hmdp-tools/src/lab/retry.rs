//! `hmdp lab retry`: what a waiter does while the lock is busy. hmdp's
//! `tryLock()` does not wait at all; a waiting lock should hand over the
//! moment the holder releases, not at its next poll or at the lease's end.
//!
//! Timeline: A holds the lock from 0 to 300 ms. At 100 ms C tries with no
//! wait (hmdp's `tryLock()`) and is turned away at once; B tries with a
//! 2000 ms wait. When A releases, B gets in; the lab prints the hand-off
//! latency from A starting its release to B holding the lock. `reentrant`
//! wakes B with the release message it subscribed to before it retried.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::harness::Lab;

/// A's lease: longer than B's whole wait, so that B can get in only when
/// A's release hands the lock over, never when the lease runs out.
const LEASE: Duration = Duration::from_millis(10_000);
const WAIT: Duration = Duration::from_millis(2000);

pub(super) async fn run(lab: &Lab) -> anyhow::Result<String> {
    let impatient = lab.lock(LEASE, Duration::ZERO)?;
    let patient = lab.lock(LEASE, WAIT)?;
    let release_started = Mutex::new(None);
    let a = async {
        let held = lab.acquire_and_enter("A", &*impatient).await?;
        lab.at(300).await;
        lab.leave("A");
        *release_started.lock().expect("poisoned") = Some(Instant::now());
        lab.release("A", held).await?;
        anyhow::Ok(())
    };
    let c = async {
        lab.at(100).await;
        lab.say("C", "tries without waiting, like hmdp's tryLock()");
        if !lab.visit("C", &*impatient, None).await? {
            lab.say("C", "gets 不允许重复下单！ at once");
        }
        Ok(())
    };
    let b = async {
        lab.at(100).await;
        lab.say("B", "tries, willing to wait up to 2000 ms");
        let held = lab.acquire("B", &*patient).await?;
        let entered = Instant::now();
        let Some(held) = held else {
            return Ok(None);
        };
        lab.enter("B");
        lab.leave("B");
        lab.release("B", held).await?;
        Ok(Some(entered))
    };
    let ((), (), entered) = tokio::try_join!(a, c, b)?;

    let started = *release_started.lock().expect("poisoned");
    Ok(match (started, entered) {
        (Some(started), Some(entered)) => {
            let latency = entered.saturating_duration_since(started);
            let latency = format!("{:.1} ms", latency.as_secs_f64() * 1000.0);
            lab.say("lab", format!("hand-off latency: {latency}"));
            format!(
                "B held the lock {latency} after A began to release it (hand-off \
                 latency), while C, not waiting, was turned away at once."
            )
        }
        _ => "B did not get the lock within its 2000 ms wait.".to_owned(),
    })
}
