//! `--seckill queue` loses only what a killed process loses: a stop request
//! writes the queue before the node exits, and a busy lock delays an order
//! for as long as it stays busy, never drops it, nor holds up the others.

use std::time::Duration;

use crate::helpers::{buy_at, NodeProcess, TestApp};
use futures::future::join_all;
use hmdp::ids::VoucherId;
use hmdp_test_support::wait_until;

/// Buys `voucher` for each token through `node`, all at once; the order ids
/// its buyers were told.
async fn buy(node: &NodeProcess, voucher: VoucherId, tokens: &[String]) -> Vec<i64> {
    let answers = join_all(
        tokens
            .iter()
            .map(|token| buy_at(&node.address, voucher, token)),
    )
    .await;
    answers
        .iter()
        .map(|answer| {
            assert_eq!(answer["success"], true, "{answer}");
            answer["data"].as_str().unwrap().parse().unwrap()
        })
        .collect()
}

/// How many times each order id is in MySQL.
async fn written(app: &TestApp, ids: &[i64]) -> Vec<i64> {
    let mut counts = Vec::with_capacity(ids.len());
    for id in ids {
        counts.push(app.tables().orders_with_id(*id).await.unwrap());
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_writes_every_queued_order_before_the_node_exits() {
    const USERS: usize = 15;
    let app = crate::helpers::spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(100).await;
    let tokens = app.login_many(USERS).await;
    // The writer takes 300 ms an order; the buyers are answered at once.
    let mut node = NodeProcess::start(&app, &["--seckill=queue", "--chaos-hold-ms=300"]).await;
    let ids = buy(&node, voucher, &tokens).await;
    assert!(
        app.audit(voucher).await.active_orders < USERS as i64,
        "orders still queued when the stop request comes"
    );

    node.terminate().expect("SIGTERM sent");
    let status = node
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the node exits once its queue is written");
    assert!(status.success(), "{status:?}\n{}", node.log());
    assert_eq!(
        written(&app, &ids).await,
        vec![1; USERS],
        "every order its buyer was told of is written, once"
    );
    assert_eq!(app.pending_orders().await, 0);
    assert!(node.log().contains("order queue drained"), "{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_whose_users_lock_stays_busy_for_seconds_is_written_not_dropped() {
    let app = crate::helpers::spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login("13800000042").await;
    let user = app.user_id(&token).await;
    let node = NodeProcess::start(&app, &["--seckill=queue", "--lock=redis-lua"]).await;
    // Another holder (a killed node's purchase, say) keeps the user's lock
    // for 4 s: longer than any fixed number of quick retries.
    let _: () = redis::cmd("SET")
        .arg(app.keys().order_lock(user))
        .arg("another-holder")
        .arg("PX")
        .arg(4000)
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    let ids = buy(&node, voucher, &[token]).await;

    wait_until(
        "the order written once the lock is free",
        Duration::from_secs(30),
        || async { written(&app, &ids).await == [1] },
    )
    .await;
    wait_until(
        "the order no longer pending",
        Duration::from_secs(10),
        || async { app.pending_orders().await == 0 },
    )
    .await;
    assert!(
        !node.log().contains("Redis and MySQL disagree"),
        "{}",
        node.log()
    );
}

/// One user's lock held elsewhere does not hold up the queue: that order
/// is parked, the orders behind it are written, and it is written once the
/// lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_whose_users_lock_is_busy_is_parked_and_the_others_are_written() {
    let app = crate::helpers::spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let tokens = app.login_many(4).await;
    let busy = app.user_id(&tokens[0]).await;
    let node = NodeProcess::start(&app, &["--seckill=queue", "--lock=redis-lua"]).await;
    let lock = app.keys().order_lock(busy);
    let _: () = redis::cmd("SET")
        .arg(&lock)
        .arg("another-holder")
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    // The busy user's order first in the queue, then three others.
    let first = buy(&node, voucher, &tokens[..1]).await;
    let others = buy(&node, voucher, &tokens[1..]).await;

    wait_until(
        "the orders behind the busy one written",
        Duration::from_secs(30),
        || async { written(&app, &others).await == [1, 1, 1] },
    )
    .await;
    assert_eq!(written(&app, &first).await, [0], "its lock is still held");
    let _: () = redis::cmd("DEL")
        .arg(&lock)
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    wait_until(
        "the parked order written once its lock is free",
        Duration::from_secs(30),
        || async { written(&app, &first).await == [1] },
    )
    .await;
    wait_until("nothing pending", Duration::from_secs(10), || async {
        app.pending_orders().await == 0
    })
    .await;
}

/// `queue`'s writer in its transaction when Redis restarts empty: its order
/// is counted again in the reloaded sale before its commit, as a stream
/// batch's are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_order_in_its_transaction_when_redis_restarts_is_counted_in_the_reloaded_sale() {
    crate::stream::an_order_in_its_transaction_when_redis_restarts_is_counted_in_the_reloaded_sale(
        hmdp::config::SeckillMode::Queue,
        1,
    )
    .await;
}
