//! An observer counting what a lock reports while it runs (lease renewals,
//! holds found lost, holders fenced out), for the caller's metrics: the
//! crate depends on no metrics library.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/0 cargo run -p hmdp-lock --example observer
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hmdp_lock::{LockBuilder, LockEvent, RedisSource};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let renewals = Arc::new(AtomicU64::new(0));
    let counted = renewals.clone();
    let lock = LockBuilder::reentrant()
        // A short watchdog lease, renewed every third of it.
        .watchdog_lease(Duration::from_millis(600))
        .observer(Arc::new(move |event| match event {
            LockEvent::LeaseRenewed => {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            LockEvent::HoldLost(reason) => eprintln!("lock lost: {reason}"),
            LockEvent::FencingRejected => eprintln!("a newer holder fenced this one out"),
        }))
        .build(RedisSource::from_url(&url)?)?;
    let key = format!("example:observer:{}", std::process::id());

    let held = lock.acquire(&key).await?.expect("a free key");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.release().await?;
    println!(
        "the watchdog renewed the lease {} times while held",
        renewals.load(Ordering::Relaxed)
    );
    Ok(())
}
