//! RedLock over independent Redis servers: a hold is granted when a
//! majority of them took it within the validity time, and each round
//! reports what every server said.
//!
//! ```sh
//! REDLOCK_NODES=redis://127.0.0.1:6379/0,redis://127.0.0.1:6380/0,redis://127.0.0.1:6381/0 \
//!   cargo run -p hmdp-lock --example redlock
//! ```
//!
//! With fewer than three servers running, the majority is counted over the
//! URLs given: a single URL makes a quorum of one.

use std::time::Duration;

use hmdp_lock::{DistributedLock, Holder, QuorumLock};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes: Vec<String> = std::env::var("REDLOCK_NODES")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let lease = Duration::from_secs(10);
    let lock = QuorumLock::redlock(&nodes, lease, Duration::from_millis(500))?;
    let key = format!("example:redlock:{}", std::process::id());

    let (held, votes) = lock
        .acquire_reported(Holder::new(), &key, lock.wait())
        .await?;
    for vote in &votes {
        println!("{vote:?}");
    }
    match held {
        Some(held) => {
            println!(
                "granted by {} of {} (quorum {})",
                votes.iter().filter(|v| v.agreed).count(),
                nodes.len(),
                lock.quorum()
            );
            println!("release: {:?}", held.release().await?);
        }
        None => println!("no quorum within the wait"),
    }
    Ok(())
}
