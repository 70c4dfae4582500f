//! Fencing tokens (`--fencing`): minted per acquisition, never backwards for
//! a key, kept by a re-entering holder, and held in a counter that expires.

use std::sync::Arc;
use std::time::Duration;

use hmdp_lock::{DistributedLock, Fenced, Holder, ReentrantLock, ReentrantOptions};
use redis::AsyncCommands;

use crate::helpers::{connect, redis_url};

fn fenced() -> Fenced {
    let url = redis_url();
    let redis = hmdp_lock::connection::connection_manager(&url, Duration::from_secs(10)).unwrap();
    let lock = ReentrantLock::new(
        redis::Client::open(url.as_str()).unwrap(),
        redis.clone(),
        ReentrantOptions {
            lease: None,
            watchdog_lease: Duration::from_secs(30),
            max_hold: None,
            wait: Duration::ZERO,
        },
    );
    Fenced::new(Arc::new(lock), redis)
}

async fn token(lock: &Fenced, holder: Holder, key: &str) -> (u64, Box<dyn hmdp_lock::LockGuard>) {
    let held = lock
        .acquire_as(holder, key)
        .await
        .unwrap()
        .expect("free key");
    (held.fencing_token().expect("fenced"), held)
}

#[tokio::test]
async fn tokens_grow_per_acquisition_and_survive_a_lost_counter() {
    let lock = fenced();
    let key = format!("test:{}:lock:order:1", uuid::Uuid::new_v4().simple());
    let mut redis = connect(&redis_url()).await;

    let holder = Holder::new();
    let (first, outer) = token(&lock, holder, &key).await;
    let (again, inner) = token(&lock, holder, &key).await;
    assert_eq!(again, first, "a re-entering holder keeps its token");
    inner.release().await.unwrap();
    outer.release().await.unwrap();

    let (second, held) = token(&lock, Holder::new(), &key).await;
    assert!(second > first, "{second} > {first}");
    held.ensure_held().await.expect("the newest token");
    let counter = hmdp_lock::sibling(&key, "fence");
    let ttl: i64 = redis.pttl(&counter).await.unwrap();
    assert!(ttl > 0, "the counter expires: {ttl}");
    held.release().await.unwrap();

    // A failover or an expiry loses the counter: tokens still move forward.
    let _: () = redis.del(&counter).await.unwrap();
    let (third, held) = token(&lock, Holder::new(), &key).await;
    assert!(third > second, "{third} > {second}");
    held.release().await.unwrap();
    let _: () = redis.del(&counter).await.unwrap();
}

#[tokio::test]
async fn a_holder_outdated_by_a_newer_token_knows_it() {
    let lock = fenced();
    let key = format!("test:{}:lock:order:1", uuid::Uuid::new_v4().simple());
    let (_, stale) = token(&lock, Holder::new(), &key).await;
    // Its lock is gone (say, expired) and someone else acquires.
    let mut redis = connect(&redis_url()).await;
    let _: () = redis.del(&key).await.unwrap();
    let (_, newer) = token(&lock, Holder::new(), &key).await;

    assert!(stale.ensure_held().await.is_err(), "outdated");
    newer.ensure_held().await.expect("the newest holder");
    newer.release().await.unwrap();
    let _: () = redis.del(format!("{key}:fence")).await.unwrap();
}

/// The mint checks, in the same script, that the acquisition still holds the
/// lock key: a holder whose lease ran out before minting gets no token that
/// could outdate the next holder's.
#[tokio::test]
async fn no_token_for_an_acquisition_that_no_longer_holds_the_key() {
    let mint = redis::Script::new(include_str!("../../lua/fence.lua"));
    let key = format!("test:{}:lock:order:1", uuid::Uuid::new_v4().simple());
    let counter = hmdp_lock::sibling(&key, "fence");
    let mut redis = connect(&redis_url()).await;
    let minting = redis.clone();
    let mint_as = |owner_in_key: &'static str| {
        let mut invocation = mint.key(&counter);
        invocation
            .key(&key)
            .arg(owner_in_key)
            .arg(60_000)
            .arg(owner_in_key);
        let mut redis = minting.clone();
        async move { invocation.invoke_async::<i64>(&mut redis).await.unwrap() }
    };

    assert_eq!(mint_as("a").await, -1, "the key is gone: no token");
    let _: () = redis.set(&key, "a").await.unwrap();
    assert!(mint_as("a").await > 0, "a string key holding the owner");
    assert_eq!(mint_as("b").await, -1, "a string key holding someone else");
    let _: () = redis.del(&key).await.unwrap();
    let _: () = redis.hset(&key, "c", 1).await.unwrap();
    assert!(
        mint_as("c").await > 0,
        "a reentrant hash with the owner's field"
    );
    assert_eq!(mint_as("d").await, -1, "a reentrant hash of someone else");
    assert!(
        mint_as("").await > 0,
        "nothing to check for locks kept elsewhere"
    );
    let _: () = redis.del(&[&key, &counter]).await.unwrap();
}
