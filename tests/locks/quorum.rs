//! `multi` and `redlock` with a node down: all-or-nothing fails cleanly and
//! leaves nothing behind, a majority still locks, and both say who agreed.

use std::time::Duration;

use hmdp::lock::{Holder, QuorumLock, Release};
use hmdp::redis_server::RedisServer;
use redis::AsyncCommands;

use crate::helpers::connect;

const LEASE: Duration = Duration::from_secs(10);

fn three_nodes() -> (Vec<RedisServer>, Vec<String>) {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let urls = servers.iter().map(RedisServer::url).collect();
    (servers, urls)
}

async fn exists_on(server: &RedisServer, key: &str) -> bool {
    let mut redis = connect(&server.url()).await;
    redis.exists(key).await.unwrap()
}

#[tokio::test]
async fn multi_with_a_node_down_fails_cleanly_and_leaves_no_partial_locks() {
    let (mut servers, urls) = three_nodes();
    let lock = QuorumLock::multi(&urls, LEASE, Duration::from_millis(300)).unwrap();
    servers[1].kill();

    let (held, votes) = lock
        .acquire_reported(Holder::new(), "lock:order:1")
        .await
        .unwrap();
    assert!(held.is_none(), "all-or-nothing: one node is down");
    let agreed: Vec<bool> = votes.iter().map(|vote| vote.agreed).collect();
    assert_eq!(agreed, [true, false, true], "{votes:?}");
    assert!(!exists_on(&servers[0], "lock:order:1").await, "undone");
    assert!(!exists_on(&servers[2], "lock:order:1").await, "undone");
}

#[tokio::test]
async fn redlock_with_one_of_three_down_still_locks() {
    let (mut servers, urls) = three_nodes();
    let lock = QuorumLock::redlock(&urls, LEASE, Duration::ZERO).unwrap();
    let rival = QuorumLock::redlock(&urls, LEASE, Duration::ZERO).unwrap();
    servers[2].kill();

    let (held, votes) = lock
        .acquire_reported(Holder::new(), "lock:order:1")
        .await
        .unwrap();
    let held = held.expect("two of three is a majority");
    let agreed: Vec<bool> = votes.iter().map(|vote| vote.agreed).collect();
    assert_eq!(agreed, [true, true, false], "{votes:?}");
    held.ensure_held().await.expect("within its validity time");

    let (refused, _) = rival
        .acquire_reported(Holder::new(), "lock:order:1")
        .await
        .unwrap();
    assert!(refused.is_none(), "the majority is taken");
    assert_eq!(held.release().await.unwrap(), Release::Released);
    assert!(!exists_on(&servers[0], "lock:order:1").await);
    assert!(!exists_on(&servers[1], "lock:order:1").await);
}

#[tokio::test]
async fn redlock_without_a_majority_fails_and_releases_what_it_took() {
    let (mut servers, urls) = three_nodes();
    let lock = QuorumLock::redlock(&urls, LEASE, Duration::ZERO).unwrap();
    servers[1].kill();
    servers[2].kill();

    let (held, votes) = lock
        .acquire_reported(Holder::new(), "lock:order:1")
        .await
        .unwrap();
    assert!(held.is_none(), "one of three is no majority: {votes:?}");
    assert!(!exists_on(&servers[0], "lock:order:1").await, "undone");
}
