//! A reentrant lock with the watchdog: the same holder re-enters, anybody
//! else waits (by pub/sub) or gives up, and the work checks the lock is still
//! held before it commits.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/0 cargo run -p hmdp-lock --example reentrant
//! ```

use std::time::Duration;

use hmdp_lock::{Holder, LockBuilder, RedisSource, Release};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let lock = LockBuilder::reentrant().build(RedisSource::from_url(&url)?)?;
    let key = format!("example:reentrant:{}", std::process::id());

    let me = Holder::new();
    let outer = lock.acquire_as(me, &key).await?.expect("a free key");
    let inner = lock
        .acquire_as(me, &key)
        .await?
        .expect("the same holder re-enters");
    println!("held twice by one holder");

    // Another holder: at once (the lock's default wait is zero), then
    // waiting up to 200 ms for a release that does not come.
    assert!(lock.acquire(&key).await?.is_none());
    assert!(lock
        .acquire_within(&key, Duration::from_millis(200))
        .await?
        .is_none());
    println!("busy for everybody else");

    // The watchdog renews the lease while the hold lives; the last check
    // before committing work done under the lock:
    inner.ensure_held().await?;
    assert_eq!(inner.release().await?, Release::StillHeld(1));
    assert_eq!(outer.release().await?, Release::Released);
    println!("released");
    Ok(())
}
