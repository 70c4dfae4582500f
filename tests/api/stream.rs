//! The order stream's consumers (`--seckill stream`), run as `hmdp serve`
//! processes against real Redis and MariaDB. Orders enter the stream here
//! as the admission script adds them (`XADD` with `id`, `userId`,
//! `voucherId`, and the order in the pending hash).

use std::time::Duration;

use hmdp::config::SeckillMode;
use hmdp::ids::{UserId, VoucherId};
use hmdp::seckill::stream::GROUP;
use hmdp::store::{self, NewOrder};
use hmdp_test_support::wait_until;
use redis::streams::{StreamInfoConsumersReply, StreamRangeReply};
use redis::AsyncCommands;
use serde_json::Value;

use crate::helpers::{metric, spawn_app, NodeProcess, TestApp};

/// A user's order id in these tests.
fn order_id(user: u64) -> i64 {
    700_000_000 + user as i64
}

/// Adds one entry per user, and their orders to the pending hash.
async fn add_orders(app: &TestApp, voucher: VoucherId, users: impl IntoIterator<Item = u64>) {
    let keys = app.keys();
    let mut pipe = redis::pipe();
    for user in users {
        let (id, user, voucher) = (order_id(user), user.to_string(), voucher.to_string());
        pipe.xadd(
            keys.single().orders(),
            "*",
            &[
                ("id", id.to_string()),
                ("userId", user.clone()),
                ("voucherId", voucher.clone()),
            ],
        )
        .ignore()
        .hset(keys.single().pending(), id, format!("{user}:{voucher}"))
        .ignore();
    }
    let () = pipe.query_async(&mut app.redis.clone()).await.unwrap();
}

/// Adds one entry with exactly these fields.
async fn add_entry(app: &TestApp, fields: &[(&str, &str)]) {
    let _: String = app
        .redis
        .clone()
        .xadd(app.keys().single().orders(), "*", fields)
        .await
        .unwrap();
}

/// Entries delivered to a consumer of the group and not acknowledged; 0
/// before a node has created the group.
async fn pending(app: &TestApp) -> i64 {
    let summary: redis::RedisResult<(i64, redis::Value, redis::Value, redis::Value)> =
        redis::cmd("XPENDING")
            .arg(app.keys().single().orders())
            .arg(GROUP)
            .query_async(&mut app.redis.clone())
            .await;
    match summary {
        Ok((count, _, _, _)) => count,
        Err(error) if error.code() == Some("NOGROUP") => 0,
        Err(error) => panic!("XPENDING: {error}"),
    }
}

async fn stream_length(app: &TestApp) -> usize {
    app.redis
        .clone()
        .xlen(app.keys().single().orders())
        .await
        .unwrap()
}

/// Entries in the dead-letter stream.
async fn dead_letters(app: &TestApp) -> usize {
    app.redis
        .clone()
        .xlen(app.keys().single().dead_letters())
        .await
        .unwrap()
}

/// The names of the group's consumers; none before a node has created the
/// stream and the group.
async fn consumers(app: &TestApp) -> Vec<String> {
    // `XINFO CONSUMERS` of a missing key fails with a plain `ERR`.
    if !app.key_exists(&app.keys().single().orders()).await {
        return Vec::new();
    }
    let reply: redis::RedisResult<StreamInfoConsumersReply> = app
        .redis
        .clone()
        .xinfo_consumers(app.keys().single().orders(), GROUP)
        .await;
    match reply {
        Ok(reply) => reply
            .consumers
            .into_iter()
            .map(|consumer| consumer.name)
            .collect(),
        Err(error) if error.code() == Some("NOGROUP") => Vec::new(),
        Err(error) => panic!("XINFO CONSUMERS: {error}"),
    }
}

/// Waits until `orders` orders of `voucher` are written and every entry is
/// acknowledged and gone from the stream.
async fn wait_drained(app: &TestApp, voucher: VoucherId, orders: i64) {
    wait_until(
        &format!("{orders} orders written and the stream drained"),
        Duration::from_secs(30),
        || async {
            app.audit(voucher).await.active_orders == orders
                && pending(app).await == 0
                && stream_length(app).await == 0
        },
    )
    .await;
}

const STREAM: &str = "--seckill=stream";

/// Two nodes started with `flags`, once both consumers joined the group.
async fn two_consumers(app: &TestApp, flags: &[&str]) -> [NodeProcess; 2] {
    let nodes = [
        NodeProcess::start(app, flags).await,
        NodeProcess::start(app, flags).await,
    ];
    wait_until(
        "both consumers in the group",
        Duration::from_secs(10),
        || async { consumers(app).await.len() == 2 },
    )
    .await;
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_the_stream_and_write_every_order_once() {
    const ORDERS: u64 = 300;
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(ORDERS as i64).await;
    let [first, second] =
        two_consumers(&app, &[STREAM, "--stream-batch=10", "--chaos-hold-ms=20"]).await;

    add_orders(&app, voucher, 1..=ORDERS).await;
    wait_drained(&app, voucher, ORDERS as i64).await;

    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left, audit.duplicate_users),
        (300, 0, 0)
    );
    assert_eq!(
        app.pending_orders().await,
        0,
        "written orders leave the pending hash"
    );
    let by_first = metric(&first.address, "hmdp_stream_batch_orders_sum").await;
    let by_second = metric(&second.address, "hmdp_stream_batch_orders_sum").await;
    println!("orders written: {by_first} by the first node, {by_second} by the second");
    assert!(
        by_first > 0.0 && by_second > 0.0,
        "{by_first} / {by_second}"
    );
    assert_eq!(by_first + by_second, ORDERS as f64);
    let names = consumers(&app).await;
    assert_ne!(names[0], names[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumers_pending_entries_are_claimed_and_written_once() {
    const ORDERS: u64 = 20;
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(50).await;
    add_orders(&app, voucher, 1..=ORDERS).await;
    // Short leases, so the dead node's locks free up soon after it dies.
    let mut doomed = NodeProcess::start(
        &app,
        &[STREAM, "--chaos-hold-ms=60000", "--lock-watchdog-ms=600"],
    )
    .await;
    wait_until(
        "the first node holding every entry, inside its transaction",
        Duration::from_secs(10),
        || async {
            pending(&app).await == ORDERS as i64 && app.lock_keys().await.len() == ORDERS as usize
        },
    )
    .await;
    doomed.kill().await;

    let survivor = NodeProcess::start(
        &app,
        &[
            STREAM,
            "--stream-claim-idle-ms=300",
            "--stream-max-deliveries=50",
            "--lock-watchdog-ms=600",
        ],
    )
    .await;
    wait_drained(&app, voucher, ORDERS as i64).await;

    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left, audit.duplicate_users),
        (20, 30, 0)
    );
    assert!(metric(&survivor.address, "hmdp_stream_claimed_total").await >= ORDERS as f64);
    assert_eq!(
        metric(&survivor.address, "hmdp_stream_batch_orders_sum").await,
        ORDERS as f64
    );
    assert_eq!(app.pending_orders().await, 0);
    // The killed process never left the group; with nothing pending for it
    // and no read for ten claim idle times, the survivor removes it.
    wait_until(
        "only the survivor left in the group",
        Duration::from_secs(20),
        || async { consumers(&app).await.len() == 1 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entries_go_to_the_dead_letters_and_do_not_block_the_rest() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let node = NodeProcess::start(
        &app,
        &[
            STREAM,
            "--stream-claim-idle-ms=200",
            "--stream-max-deliveries=2",
        ],
    )
    .await;

    let voucher_text = voucher.to_string();
    // Cannot parse: no retry will help.
    add_entry(
        &app,
        &[("id", "1"), ("userId", "abc"), ("voucherId", &voucher_text)],
    )
    .await;
    // Parses, but no such voucher in MySQL: its stock can never be taken.
    add_entry(
        &app,
        &[("id", "2"), ("userId", "7"), ("voucherId", "999999")],
    )
    .await;
    add_orders(&app, voucher, [8]).await;

    let dead = app.keys().single().dead_letters();
    wait_until(
        "two dead letters, nothing pending",
        Duration::from_secs(30),
        || async {
            dead_letters(&app).await == 2
                && pending(&app).await == 0
                && stream_length(&app).await == 0
        },
    )
    .await;

    let letters: StreamRangeReply = app.redis.clone().xrange_all(&dead).await.unwrap();
    let field = |i: usize, name: &str| letters.ids[i].get::<String>(name).unwrap();
    assert_eq!(field(0, "userId"), "abc");
    assert_eq!(field(0, "deliveries"), "1", "malformed: dead at once");
    assert!(field(0, "reason").contains("`userId` is not a positive id"));
    assert_eq!(field(1, "voucherId"), "999999");
    assert_eq!(
        field(1, "deliveries"),
        "3",
        "tried twice, dead on the third delivery"
    );
    assert!(
        field(1, "reason").contains("delivered 3 times"),
        "{}",
        field(1, "reason")
    );
    assert!(!field(1, "entry").is_empty());
    let malformed = r#"hmdp_stream_dead_letters_total{reason="malformed"}"#;
    let worn_out = r#"hmdp_stream_dead_letters_total{reason="max_deliveries"}"#;
    assert_eq!(metric(&node.address, malformed).await, 1.0);
    assert_eq!(metric(&node.address, worn_out).await, 1.0);
    assert!(node.log().contains("moved to the dead letters"));

    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (1, 9),
        "the good order is written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_written_order_is_acknowledged_not_written_again() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let keys = app.keys();
    let mut redis = app.redis.clone();

    // A consumer that committed the order of user 1 and died before its
    // XACK: the entry is pending under its name, the order is in MySQL.
    let () = redis
        .xgroup_create_mkstream(keys.single().orders(), GROUP, "0")
        .await
        .unwrap();
    add_orders(&app, voucher, [1]).await;
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg(&["GROUP", GROUP, "dead-node:0", "STREAMS"])
        .arg(keys.single().orders())
        .arg(">")
        .query_async(&mut redis)
        .await
        .unwrap();
    let mut tx = app.store.begin().await.unwrap();
    let order = NewOrder::unsequenced(
        hmdp::ids::OrderId::new(order_id(1)),
        hmdp::ids::UserId::new(1),
        voucher,
    );
    let short = store::insert_orders_taking_stock(&mut tx, &[order])
        .await
        .unwrap();
    assert!(short.is_empty(), "the order's unit taken");
    tx.commit().await.unwrap();
    assert_eq!(pending(&app).await, 1);
    // And a second order of the same user, under another id: Redis
    // admitted the buyer twice, and the second buyer's answer was a lie
    // that a dead letter keeps.
    add_entry(
        &app,
        &[
            ("id", "5"),
            ("userId", "1"),
            ("voucherId", &voucher.to_string()),
        ],
    )
    .await;

    let node = NodeProcess::start(&app, &[STREAM, "--stream-claim-idle-ms=200"]).await;
    wait_until(
        "every entry acknowledged",
        Duration::from_secs(30),
        || async { pending(&app).await == 0 && stream_length(&app).await == 0 },
    )
    .await;

    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left, audit.duplicate_users),
        (1, 9, 0)
    );
    let outcome = |label: &str| format!(r#"hmdp_stream_orders_total{{outcome="{label}"}}"#);
    assert_eq!(
        metric(&node.address, &outcome("already_written")).await,
        1.0
    );
    assert_eq!(metric(&node.address, &outcome("duplicate_user")).await, 1.0);
    assert_eq!(metric(&node.address, &outcome("written")).await, 0.0);
    let dead = r#"hmdp_stream_dead_letters_total{reason="duplicate_user"}"#;
    assert_eq!(metric(&node.address, dead).await, 1.0);
    assert_eq!(dead_letters(&app).await, 1);
    assert_eq!(app.pending_orders().await, 0);
    let log = node.log();
    assert!(
        log.contains("order already written (a redelivery)"),
        "{log}"
    );
    assert!(log.contains("holds another active order"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_consumer_write_and_acknowledge_the_batch_it_holds() {
    const ORDERS: u64 = 30;
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(100).await;
    // Added before any consumer exists: the group, created at `0`, still
    // delivers them.
    add_orders(&app, voucher, 1..=ORDERS).await;
    let mut node = NodeProcess::start(&app, &[STREAM, "--chaos-hold-ms=1500"]).await;
    wait_until(
        "the node holding every entry, inside its transaction",
        Duration::from_secs(10),
        || async {
            pending(&app).await == ORDERS as i64 && app.lock_keys().await.len() == ORDERS as usize
        },
    )
    .await;

    node.terminate().expect("SIGTERM sent");
    let status = node.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}"
    );

    assert_eq!(pending(&app).await, 0, "what it took is acknowledged");
    assert_eq!(stream_length(&app).await, 0);
    assert_eq!(app.pending_orders().await, 0);
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left, audit.duplicate_users),
        (30, 70, 0)
    );
    assert!(
        consumers(&app).await.is_empty(),
        "the stopped consumer left the group"
    );
    assert!(app.lock_keys().await.is_empty());
    assert!(node
        .log()
        .contains("stream consumer stopped and left the group"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_writes_many_orders_in_one_transaction() {
    const ORDERS: u64 = 200;
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(ORDERS as i64).await;
    add_orders(&app, voucher, 1..=ORDERS).await;
    let node = NodeProcess::start(&app, &[STREAM, "--stream-batch=50"]).await;
    wait_drained(&app, voucher, ORDERS as i64).await;
    // A batch is counted once its transaction has committed: the last one
    // may be in MySQL a moment before it is in the histogram.
    wait_until(
        "every order counted in a batch",
        Duration::from_secs(10),
        || async { metric(&node.address, "hmdp_stream_batch_orders_sum").await == ORDERS as f64 },
    )
    .await;

    let transactions = metric(&node.address, "hmdp_stream_batch_orders_count").await;
    let written = metric(&node.address, "hmdp_stream_batch_orders_sum").await;
    println!("{written} orders in {transactions} transactions");
    assert_eq!(
        (written, transactions),
        (200.0, 4.0),
        "four full batches of 50"
    );
    let audit = app.audit(voucher).await;
    assert!(audit.stock_balances(ORDERS as i64), "{audit:?}");
    assert_eq!(audit.duplicate_users, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_waiting_for_a_busy_lock_is_not_dead_lettered() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    // Another holder (a killed node, say) holds user 8's lock for 3 s.
    let lock_key = app.keys().order_lock(UserId::new(8));
    let _: () = redis::cmd("SET")
        .arg(&lock_key)
        .arg("another-holder")
        .arg("PX")
        .arg(3000)
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    let node = NodeProcess::start(
        &app,
        &[
            STREAM,
            "--lock=redis-lua",
            "--stream-claim-idle-ms=200",
            "--stream-max-deliveries=2",
        ],
    )
    .await;
    add_orders(&app, voucher, [8]).await;

    // Claimed every few hundred milliseconds while the lock is busy: far
    // more deliveries than the limit, and yet it waits, then is written.
    wait_drained(&app, voucher, 1).await;
    assert_eq!(
        dead_letters(&app).await,
        0,
        "no dead letter for an order that only waited"
    );
    assert!(metric(&node.address, "hmdp_stream_claimed_total").await > 2.0);
    assert_eq!(app.pending_orders().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_row_held_by_another_session_delays_orders_and_never_dead_letters_them() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    // Another session (a report, a backup, an admin's UPDATE) holds the
    // voucher's stock row: every batch waits out its lock wait time (1 s)
    // and fails with 1205, which MySQL answers quickly. Its ping works.
    let mut holder = app.store.begin().await.unwrap();
    sqlx::query("SELECT stock FROM tb_seckill_voucher WHERE voucher_id = ? FOR UPDATE")
        .bind(voucher)
        .execute(&mut *holder)
        .await
        .unwrap();
    let node = NodeProcess::start(
        &app,
        &[
            STREAM,
            "--backend-timeout-ms=1000",
            "--stream-claim-idle-ms=200",
            "--stream-max-deliveries=2",
        ],
    )
    .await;
    add_orders(&app, voucher, [21, 22, 23]).await;

    // Far more failed writes than the delivery limit while the row stays
    // held (or the orders given up on: the failure this test exists for).
    wait_until(
        "the entries delivered beyond the limit",
        Duration::from_secs(60),
        || async {
            metric(&node.address, "hmdp_stream_round_failures_total").await >= 5.0
                || dead_letters(&app).await > 0
        },
    )
    .await;
    assert_eq!(
        dead_letters(&app).await,
        0,
        "no dead letter for orders that only waited for MySQL"
    );
    holder.rollback().await.unwrap();

    wait_drained(&app, voucher, 3).await;
    assert_eq!(dead_letters(&app).await, 0);
    assert_eq!(app.pending_orders().await, 0);
}

/// Redis restarts empty while a consumer's batch, read before the loss, is
/// still in its transaction, and a purchase reloads the sale from MySQL at
/// once: the reload's snapshot does not hold the batch's orders. The batch
/// counts them again in the reloaded sale before its commit, and the sale
/// admits nobody until such batches had the time to: every buyer told
/// success, before or after the loss, gets that order once, nobody is told
/// success twice, and MySQL sells no more than its stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_flight_when_redis_restarts_is_counted_in_the_reloaded_sale() {
    an_order_in_its_transaction_when_redis_restarts_is_counted_in_the_reloaded_sale(
        SeckillMode::Stream,
        1,
    )
    .await;
}

/// The test above with the sale in four shards: the reloaded sale splits
/// MySQL's stock over them, the order in flight is counted again in its own
/// shard, and the buyers after the loss are served from every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_flight_when_redis_restarts_is_counted_in_a_reloaded_sharded_sale() {
    an_order_in_its_transaction_when_redis_restarts_is_counted_in_the_reloaded_sale(
        SeckillMode::Stream,
        4,
    )
    .await;
}

/// The test above, for an admitted order whose writer (`stream`'s consumer,
/// `queue`'s writer) is in its transaction when Redis restarts empty, in a
/// sale of `shards` shards.
pub async fn an_order_in_its_transaction_when_redis_restarts_is_counted_in_the_reloaded_sale(
    mode: SeckillMode,
    shards: u16,
) {
    const STOCK: i64 = 4;
    let mut redis = hmdp_test_support::RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.seckill = mode;
        s.seckill_shards = shards;
        // Every writer stays in its transaction 4 s, before its INSERT.
        s.chaos_hold_ms = 4000;
        s.store.timeout.backend_timeout_ms = 8000;
    })
    .await;
    let voucher = app.create_open_seckill(STOCK).await;
    let before = app.login_many(1).await;
    let answer = app.purchase(voucher, &before[0]).await;
    assert_eq!(answer["success"], true, "{answer}");
    let mut told = vec![answer["data"].as_str().unwrap().to_owned()];
    wait_until(
        "the order in its writer's hands, under its user's lock",
        Duration::from_secs(20),
        || async { app.lock_keys().await.len() == 1 },
    )
    .await;

    app.restart_redis(&mut redis).await;
    // Sessions went with Redis: everybody logs in again, and the first
    // purchase after the loss reloads the sale while the batch sleeps.
    let tokens = app.login_many(6).await;
    let first = app.purchase(voucher, &tokens[1]).await;
    assert_eq!(
        app.audit(voucher).await.active_orders,
        0,
        "the batch is still in its transaction when the sale is reloaded: {first}"
    );

    // User 0 bought before the loss; 1..6 try now, retrying while the
    // reloaded sale has not opened.
    let mut answers = Vec::new();
    for (user, token) in tokens.iter().enumerate() {
        let answer = std::sync::Mutex::new(Value::Null);
        wait_until("a final answer", Duration::from_secs(30), || async {
            let now = app.purchase(voucher, token).await;
            let settled = now["errorCode"] != "UNAVAILABLE";
            *answer.lock().unwrap() = now;
            settled
        })
        .await;
        let answer = answer.into_inner().unwrap();
        answers.push((user, answer));
    }
    for (_, answer) in &answers {
        if answer["success"] == true {
            told.push(answer["data"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        answers[0].1["errorCode"], "ALREADY_ORDERED",
        "user 0 bought before the loss: {:?}",
        answers[0]
    );

    wait_until(
        "every order its buyer was told of written",
        Duration::from_secs(60),
        || async {
            let mut all = true;
            for id in &told {
                all &= app
                    .tables()
                    .orders_with_id(id.parse().unwrap())
                    .await
                    .unwrap()
                    == 1;
            }
            all
        },
    )
    .await;
    let audit = app.audit(voucher).await;
    assert_eq!(audit.active_orders, told.len() as i64, "{audit:?} {told:?}");
    assert!(audit.stock_balances(STOCK), "{audit:?}");
    assert_eq!(audit.duplicate_users, 0);
    assert_eq!(dead_letters(&app).await, 0);
}

/// `--fencing` with two consumers: each batch records its users' fencing
/// tokens in `tb_lock_fence` inside its transaction. Two batches never hold
/// one user (each holds its users' locks), and record their fences in user-id
/// order, so they do not deadlock on fence rows: no round of either node fails,
/// and every order is written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_batches_of_two_consumers_write_every_order_without_a_failed_round() {
    const ORDERS: u64 = 300;
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(ORDERS as i64).await;
    let [first, second] = two_consumers(&app, &[STREAM, "--fencing", "--stream-batch=20"]).await;

    // Users from both ends at once, so that batches' users interleave.
    let users = (1..=ORDERS / 2).flat_map(|user| [user, ORDERS + 1 - user]);
    add_orders(&app, voucher, users).await;
    wait_drained(&app, voucher, ORDERS as i64).await;

    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.duplicate_users),
        (ORDERS as i64, 0)
    );
    let fences = app.tables().fenced_users().await.unwrap();
    assert_eq!(fences, ORDERS as i64, "one fence per user");
    for node in [&first, &second] {
        assert_eq!(
            metric(&node.address, "hmdp_stream_round_failures_total").await,
            0.0,
            "{}",
            node.log()
        );
    }
    assert_eq!(dead_letters(&app).await, 0);
}
