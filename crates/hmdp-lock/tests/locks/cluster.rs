//! `reentrant` on a real Redis Cluster: releases are announced with sharded
//! pub/sub (`SPUBLISH` to the master of the lock's slot, `SSUBSCRIBE` there),
//! not broadcast to every node, the subscription follows the slot when its
//! master dies and a replica takes over, and waiters coming and going do not
//! make it reconnect.

use std::sync::Arc;
use std::time::Duration;

use hmdp_lock::{DistributedLock, LockBuilder, LockGuard, RedisSource};
use hmdp_test_support::{poll_until, RedisCluster, RedisServer};
use tokio::task::JoinHandle;

use crate::helpers::held_with_waiters;

/// The lock's key, and the release channel its script announces on.
const KEY: &str = "lock:order:1";
const CHANNEL: &str = "{lock:order:1}:released";
/// Far longer than the test: a waiter that gets in was woken by a release
/// message (while its subscription is live it does not poll).
const LEASE: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

fn reentrant_on(cluster: &RedisCluster) -> Arc<dyn DistributedLock> {
    let url = cluster.url();
    LockBuilder::reentrant()
        .lease(LEASE)
        .wait(WAIT)
        .reply_timeout(Duration::from_secs(5))
        .build(RedisSource::from_url(&url).expect("a cluster URL"))
        .expect("reentrant builds")
}

/// `PUBSUB SHARDNUMSUB` of `channel` on `server` (only the subscribers of
/// its own shard channels), and classic `PUBSUB NUMSUB`.
async fn subscribers(server: &RedisServer, channel: &str) -> anyhow::Result<(i64, i64)> {
    let mut redis = server.connect().await?;
    let (_, sharded): (String, i64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(&mut redis)
        .await?;
    let (_, classic): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut redis)
        .await?;
    Ok((sharded, classic))
}

/// The ports of the running servers with a sharded subscriber of
/// `channel`; an error if any has a classic one.
async fn sharded_subscribers(cluster: &RedisCluster, channel: &str) -> anyhow::Result<Vec<u16>> {
    let mut sharded = Vec::new();
    for server in cluster.servers().iter().filter(|s| s.is_running()) {
        let (shard, classic) = subscribers(server, channel).await?;
        anyhow::ensure!(classic == 0, "a classic subscriber on :{}", server.port());
        if shard > 0 {
            sharded.push(server.port());
        }
    }
    Ok(sharded)
}

/// Waits until exactly one running server has a sharded subscriber of
/// `channel`, and no server a classic one; returns that server's port.
async fn sharded_subscriber_of(cluster: &RedisCluster, channel: &str) -> u16 {
    poll_until(
        &format!("one sharded subscriber of {channel}"),
        Duration::from_secs(15),
        Duration::from_millis(50),
        || async { Ok(sharded_subscribers(cluster, channel).await?.len() == 1) },
    )
    .await
    .unwrap();
    sharded_subscribers(cluster, channel).await.unwrap()[0]
}

/// [`sharded_subscriber_of`] the release channel of [`KEY`].
async fn sharded_subscriber(cluster: &RedisCluster) -> u16 {
    sharded_subscriber_of(cluster, CHANNEL).await
}

/// A task waiting for the lock; while the slot's master is down the lock
/// answers with an error (Redis unreachable, the cluster down), and the
/// task tries again, as a purchase retried by its user would, for at most
/// a [`LEASE`] (a hang guard: by then the hold would have expired, and the
/// waiter could no longer tell a release from its end).
fn waiter(lock: &Arc<dyn DistributedLock>) -> JoinHandle<Option<Box<dyn LockGuard>>> {
    let lock = lock.clone();
    tokio::spawn(async move {
        let retried = async {
            loop {
                match lock.acquire(KEY).await {
                    Ok(held) => return held,
                    Err(error) => {
                        println!("waiter: {error}; trying again");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        };
        tokio::time::timeout(LEASE, retried)
            .await
            .expect("the lock answered without an error within a lease")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_a_cluster_wakes_its_waiter_by_sharded_pub_sub_even_after_a_failover() {
    let mut cluster = RedisCluster::start().await.expect("a Redis Cluster starts");
    let lock = reentrant_on(&cluster);

    // The channel's subscription sits on the master of the lock's slot, and
    // the release reaches the waiter there.
    let held = lock.acquire(KEY).await.unwrap().expect("free");
    let first = waiter(&lock);
    let master = sharded_subscriber(&cluster).await;
    held.release().await.unwrap();
    let held = first
        .await
        .unwrap()
        .expect("woken by the release, long before the lease ends");

    // The slot's master dies with a waiter subscribed there: its replica is
    // promoted, the subscription moves to it, and the next release (sent
    // to the new master) wakes the waiter.
    let second = waiter(&lock);
    sharded_subscriber(&cluster).await;
    let replica = cluster.replica_of(master).await.unwrap();
    let position = cluster.position(master).unwrap();
    cluster.servers_mut()[position].kill();
    cluster.wait_until_ok().await.unwrap();
    // The hold may or may not have reached the replica before its master
    // died. If it did, the waiter waits on, subscribed on the promoted
    // replica, and the release below gives the hold back and announces it.
    // If not, the waiter, woken when its subscription was lost, took the
    // lock on its next try and subscribes nowhere, and the release finds
    // the hold gone.
    poll_until(
        "the waiter subscribed again, or served",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || async {
            Ok(second.is_finished() || sharded_subscribers(&cluster, CHANNEL).await?.len() == 1)
        },
    )
    .await
    .unwrap();
    let subscribed = sharded_subscribers(&cluster, CHANNEL).await.unwrap();
    if subscribed.is_empty() {
        assert!(second.is_finished(), "a waiter subscribed nowhere");
    } else {
        assert_eq!(subscribed, [replica], "subscribed on the promoted replica");
    }
    let release = held.release().await;
    assert!(release.is_ok(), "a release after the failover: {release:?}");
    let taken = second
        .await
        .unwrap()
        .expect("served after the failover within its wait");
    taken.release().await.unwrap();
}

/// The ids of the RESP3 clients of every running master: only the release
/// subscription speaks RESP3 (the lock's commands go over RESP2).
async fn subscription_clients(cluster: &RedisCluster) -> Vec<String> {
    let mut ids = Vec::new();
    for server in cluster.servers().iter().filter(|s| s.is_running()) {
        let mut redis = server.connect().await.unwrap();
        if !hmdp_test_support::is_master(&mut redis).await.unwrap() {
            continue;
        }
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut redis)
            .await
            .unwrap();
        ids.extend(
            clients
                .lines()
                .filter(|line| line.contains(" resp=3"))
                .filter_map(|line| line.split(' ').next().map(str::to_owned))
                .map(|id| format!(":{} {id}", server.port())),
        );
    }
    ids.sort();
    ids
}

/// Waiters come and go on many keys at once, so that subscribes and
/// unsubscribes of one channel follow each other closely: every waiter is
/// served, and the answers to the lock's own unsubscribes are never taken
/// for the server dropping a subscription (which would reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_coming_and_going_on_a_cluster_keep_one_subscription_connection() {
    let cluster = RedisCluster::start().await.expect("a Redis Cluster starts");
    let lock = reentrant_on(&cluster);
    // A first wait opens the subscription connection.
    let held = lock.acquire("lock:order:warm-up").await.unwrap().unwrap();
    let warm_up = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire("lock:order:warm-up").await.unwrap() })
    };
    sharded_subscriber_of(&cluster, "{lock:order:warm-up}:released").await;
    held.release().await.unwrap();
    warm_up.await.unwrap().unwrap().release().await.unwrap();
    let before = subscription_clients(&cluster).await;
    assert!(!before.is_empty(), "a RESP3 subscription connection");

    for round in 0..5 {
        let keys: Vec<String> = (0..10).map(|k| format!("lock:order:{round}-{k}")).collect();
        let (holds, waiters) = held_with_waiters(&lock, &keys, 40).await;
        // Part of the scenario: the waiters subscribe meanwhile, and the
        // releases below make them unsubscribe again while others still
        // subscribe. Each waiter is served whenever it got that far.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for held in holds {
            held.release().await.unwrap();
        }
        for waiter in futures::future::join_all(waiters).await {
            assert!(waiter.unwrap().is_clean());
        }
    }
    assert_eq!(subscription_clients(&cluster).await, before, "no reconnect");
}
