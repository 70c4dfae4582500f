//! `multi` and `redlock` with a node down: all-or-nothing fails cleanly and
//! leaves nothing behind, a majority still locks, and both say who agreed;
//! a re-entry that fails on a node leaves the outer hold there.

use hmdp_lock::{DistributedLock, Holder, LockGuard, QuorumLock, Release};
use std::time::Duration;

use hmdp_test_support::RedisServer;
use redis::AsyncCommands;

use crate::helpers::connect;

const LEASE: Duration = Duration::from_secs(10);

async fn three_nodes() -> (Vec<RedisServer>, Vec<String>) {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(RedisServer::start().await.unwrap());
    }
    let urls = servers.iter().map(RedisServer::url).collect();
    (servers, urls)
}

async fn exists_on(server: &RedisServer, key: &str) -> bool {
    let mut redis = connect(&server.url()).await;
    redis.exists(key).await.unwrap()
}

#[tokio::test]
async fn multi_with_a_node_down_fails_cleanly_and_leaves_no_partial_locks() {
    let (mut servers, urls) = three_nodes().await;
    let lock = QuorumLock::multi(&urls, LEASE, Duration::from_millis(300)).unwrap();
    servers[1].kill();

    let (held, votes) = lock
        .acquire_reported(Holder::new(), "lock:order:1", DistributedLock::wait(&lock))
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
    let (mut servers, urls) = three_nodes().await;
    let lock = QuorumLock::redlock(&urls, LEASE, Duration::ZERO).unwrap();
    let rival = QuorumLock::redlock(&urls, LEASE, Duration::ZERO).unwrap();
    servers[2].kill();

    let (held, votes) = lock
        .acquire_reported(Holder::new(), "lock:order:1", DistributedLock::wait(&lock))
        .await
        .unwrap();
    let held = held.expect("two of three is a majority");
    let agreed: Vec<bool> = votes.iter().map(|vote| vote.agreed).collect();
    assert_eq!(agreed, [true, true, false], "{votes:?}");
    held.ensure_held().await.expect("within its validity time");

    let (refused, _) = rival
        .acquire_reported(Holder::new(), "lock:order:1", DistributedLock::wait(&lock))
        .await
        .unwrap();
    assert!(refused.is_none(), "the majority is taken");
    assert_eq!(held.release().await.unwrap(), Release::Released);
    assert!(!exists_on(&servers[0], "lock:order:1").await);
    assert!(!exists_on(&servers[1], "lock:order:1").await);
}

#[tokio::test]
async fn redlock_without_a_majority_fails_and_releases_what_it_took() {
    let (mut servers, urls) = three_nodes().await;
    let lock = QuorumLock::redlock(&urls, LEASE, Duration::ZERO).unwrap();
    servers[1].kill();
    servers[2].kill();

    let (held, votes) = lock
        .acquire_reported(Holder::new(), "lock:order:1", DistributedLock::wait(&lock))
        .await
        .unwrap();
    assert!(held.is_none(), "one of three is no majority: {votes:?}");
    assert!(!exists_on(&servers[0], "lock:order:1").await, "undone");
}

/// Makes a node refuse every write (`maxmemory` below what it uses, with no
/// eviction), or accept them again: a take sent to it fails without landing.
async fn refuse_writes(server: &RedisServer, refuse: bool) {
    let mut redis = connect(&server.url()).await;
    let limit = if refuse { "1" } else { "0" };
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(limit)
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// One holder takes `lock:order:1` on all three nodes, then re-enters while
/// node 3 refuses writes: the re-entry's take fails there without landing.
/// Returns the outer hold and the re-entry's (if its round succeeded).
async fn reenter_while_node_3_refuses(
    lock: &QuorumLock,
    servers: &[RedisServer],
) -> (Box<dyn LockGuard>, Option<Box<dyn LockGuard>>) {
    let holder = Holder::new();
    let (outer, _) = lock
        .acquire_reported(holder, "lock:order:1", DistributedLock::wait(lock))
        .await
        .unwrap();
    let outer = outer.expect("all three are up");
    refuse_writes(&servers[2], true).await;
    let (inner, votes) = lock
        .acquire_reported(holder, "lock:order:1", DistributedLock::wait(lock))
        .await
        .unwrap();
    refuse_writes(&servers[2], false).await;
    let agreed: Vec<bool> = votes.iter().map(|vote| vote.agreed).collect();
    assert_eq!(agreed, [true, true, false], "{votes:?}");
    (outer, inner)
}

/// How many of the nodes have `lock:order:1`.
async fn nodes_holding(servers: &[RedisServer]) -> usize {
    let mut holding = 0;
    for server in servers {
        if exists_on(server, "lock:order:1").await {
            holding += 1;
        }
    }
    holding
}

#[tokio::test]
async fn a_failed_reentry_round_leaves_the_outer_hold_on_every_node() {
    let (servers, urls) = three_nodes().await;
    let lock = QuorumLock::multi(&urls, LEASE, Duration::ZERO).unwrap();
    let (outer, inner) = reenter_while_node_3_refuses(&lock, &servers).await;

    // The round gives back what it took on nodes 1 and 2, and nothing of
    // node 3's outer hold.
    assert!(inner.is_none(), "all-or-nothing");
    assert_eq!(nodes_holding(&servers).await, 3, "the outer hold stays");
    assert_eq!(outer.release().await.unwrap(), Release::Released);
    assert_eq!(nodes_holding(&servers).await, 0, "released");
}

#[tokio::test]
async fn releasing_a_reentry_gives_back_only_the_takes_that_landed() {
    let (servers, urls) = three_nodes().await;
    let lock = QuorumLock::redlock(&urls, LEASE, Duration::ZERO).unwrap();
    let (outer, inner) = reenter_while_node_3_refuses(&lock, &servers).await;

    // Node 3 never counted the re-entry: giving it back there must not
    // remove the outer hold.
    let inner = inner.expect("two of three is a majority");
    assert_eq!(inner.release().await.unwrap(), Release::StillHeld(1));
    assert_eq!(nodes_holding(&servers).await, 3, "the outer hold stays");
    assert_eq!(outer.release().await.unwrap(), Release::Released);
    assert_eq!(nodes_holding(&servers).await, 0, "released");
}
