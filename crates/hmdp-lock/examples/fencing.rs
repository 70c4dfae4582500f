//! Fencing tokens: every hold of a key gets a larger token than the one
//! before, so storage that remembers the largest token it saw can refuse a
//! holder that lost its lock (a pause outlived its lease) and woke up late.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/0 cargo run -p hmdp-lock --example fencing
//! ```

use hmdp_lock::{LockBuilder, RedisSource};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let lock = LockBuilder::reentrant()
        .fencing(true)
        .build(RedisSource::from_url(&url)?)?;
    let key = format!("example:fencing:{}", std::process::id());

    // The storage's side: the largest token it has accepted.
    let mut largest_seen = 0;
    for round in 1..=3 {
        let held = lock.acquire(&key).await?.expect("a free key");
        let token = held.fencing_token().expect("a fenced lock mints tokens");
        assert!(token > largest_seen, "tokens only grow");
        largest_seen = token;
        println!("round {round}: token {token} accepted");
        held.release().await?;
    }
    // A write carrying an older token is what the storage refuses.
    println!("a write carrying a token below {largest_seen} would be refused");
    Ok(())
}
