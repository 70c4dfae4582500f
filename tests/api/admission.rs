//! `queue` mode: purchases admitted by `lua/seckill.lua` in Redis, sales
//! loaded from MySQL, pending orders, the queue's writer — and the orders the
//! queue loses when its node is killed.

use std::time::Duration;

use chrono::{Local, TimeDelta};
use futures::future::join_all;
use hmdp::config::SeckillMode;
use hmdp::error::Rejection;
use hmdp::id_worker::EPOCH_SECONDS;
use hmdp::ids::{OrderId, UserId, VoucherId};
use hmdp::limits::Counting;
use hmdp::seckill::{Admission, RedisSale, SaleRef, ID_BLOCK};
use hmdp::shards::Layout;
use hmdp_lock::LockMode;
use hmdp_test_support::{wait_until, RedisServer};
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::helpers::{buy_at, metric, phone, request_scripts, spawn_app, NodeProcess, TestApp};

async fn queue_app(chaos_hold_ms: u64) -> TestApp {
    spawn_app(|s| {
        s.seckill = SeckillMode::Queue;
        s.chaos_hold_ms = chaos_hold_ms;
    })
    .await
}

fn error_code(body: &Value) -> &str {
    body["errorCode"].as_str().unwrap_or("none")
}

/// A local wall-clock time `seconds` from now, as the voucher API takes it.
fn seconds_from_now(seconds: i64) -> String {
    (Local::now() + TimeDelta::seconds(seconds))
        .format("%Y-%m-%dT%H:%M:%S")
        .to_string()
}

/// Waits until the queue's writer has written every admitted order.
async fn wait_until_written(app: &TestApp) {
    wait_until(
        "every admitted order written",
        Duration::from_secs(20),
        || async { app.pending_orders().await == 0 },
    )
    .await;
}

/// User ids in ascending order, as [`RedisSale::buyers`] lists them.
fn users(ids: &[UserId]) -> Vec<UserId> {
    let mut users = ids.to_vec();
    users.sort_unstable();
    users
}

#[tokio::test]
async fn the_script_answers_every_outcome() {
    let app = queue_app(0).await;
    let [first, second, third] = <[String; 3]>::try_from(app.login_many(3).await).unwrap();

    assert_eq!(
        error_code(&app.purchase(VoucherId::new(999_999), &first).await),
        "VOUCHER_NOT_FOUND"
    );
    let past = app
        .create_seckill(10, "2020-01-01T00:00:00", "2020-12-31T00:00:00")
        .await;
    assert_eq!(error_code(&app.purchase(past, &first).await), "ENDED");
    let empty = app.create_open_seckill(0).await;
    assert_eq!(error_code(&app.purchase(empty, &first).await), "SOLD_OUT");

    let two = app.create_open_seckill(2).await;
    let admitted = app.purchase(two, &first).await;
    assert_eq!(admitted["success"], true, "{admitted}");
    // The script composed the id: Redis's clock in the high word, and in
    // the low one, top bit set, a number of the block the node leased
    // from MySQL's counter.
    let id: i64 = admitted["data"].as_str().unwrap().parse().unwrap();
    let (redis_now, _): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    let age = redis_now - EPOCH_SECONDS - (id >> 32);
    assert!((0..=5).contains(&age), "id {id} is {age} s old");
    let leased = app.tables().next_order_id_number().await.unwrap() as i64;
    let number = (id & 0xFFFF_FFFF) - (1 << 31);
    assert!(
        (leased - ID_BLOCK as i64..leased).contains(&number),
        "id {id}: number {number}, leased up to {leased}"
    );
    assert_eq!(
        error_code(&app.purchase(two, &first).await),
        "ALREADY_ORDERED"
    );
    assert_eq!(app.purchase(two, &second).await["success"], true);
    assert_eq!(error_code(&app.purchase(two, &third).await), "SOLD_OUT");

    // A window of a few seconds, crossed by Redis's clock: not started,
    // then on sale, then ended.
    let soon = app
        .create_seckill(10, &seconds_from_now(3), &seconds_from_now(5))
        .await;
    assert_eq!(error_code(&app.purchase(soon, &first).await), "NOT_STARTED");
    wait_until("the sale begins", Duration::from_secs(10), || async {
        app.purchase(soon, &first).await["success"] == true
    })
    .await;
    wait_until("the sale ends", Duration::from_secs(10), || async {
        error_code(&app.purchase(soon, &first).await) == "ENDED"
    })
    .await;

    // Every outcome happened above, and was counted.
    for label in Admission::labels() {
        let series = format!("hmdp_admissions_total{{outcome=\"{label}\"}}");
        let count = metric(&app.address, &series).await;
        assert!(count >= 1.0, "{series} {count}");
    }
    wait_until_written(&app).await;
}

#[tokio::test]
async fn a_voucher_missing_in_redis_is_an_answer_not_a_script_error() {
    let app = queue_app(0).await;
    let sale_state = &app.sale_state();
    let admit = |voucher: i64, append: bool| async move {
        let sale = SaleRef {
            voucher_id: VoucherId::new(voucher),
            token: 0,
            layout: Layout::SINGLE,
        };
        sale_state
            .admit(UserId::new(1), &sale, append, None, &mut Counting::Done)
            .await
    };
    let not_found = Admission::Refused(Rejection::VoucherNotFound);

    // Neither Redis nor MySQL knows it.
    assert_eq!(admit(424_242, false).await.unwrap(), not_found);

    // A hash without its window (written by hand, or half evicted) is no
    // sale either: the script never reads a missing field as a number.
    let key = app.keys().single().voucher(VoucherId::new(424_243));
    let _: () = app.redis.clone().hset(&key, "stock", 5).await.unwrap();
    assert_eq!(admit(424_243, true).await.unwrap(), not_found);

    // Refusals write nothing: no buyer, no pending order, no stream entry.
    assert_eq!(app.pending_orders().await, 0);
    assert!(
        !app.key_exists(&app.keys().single().orders()).await,
        "a refused admission appended to the stream"
    );
    let stock: i64 = app.redis.clone().hget(&key, "stock").await.unwrap();
    assert_eq!(stock, 5);
}

#[tokio::test]
async fn a_sale_redis_lost_is_reloaded_from_mysql_by_the_next_purchase() {
    let app = spawn_app(|s| {
        s.seckill = SeckillMode::Queue;
        s.store.timeout.backend_timeout_ms = 2000;
    })
    .await;
    let voucher = app.create_open_seckill(5).await;
    let tokens = app.login_many(3).await;
    for token in &tokens[..2] {
        assert_eq!(app.purchase(voucher, token).await["success"], true);
    }
    wait_until_written(&app).await;
    let buyers = [app.user_id(&tokens[0]).await, app.user_id(&tokens[1]).await];

    // Redis restarted empty: the sale and its buyers are gone.
    let keys = app.keys();
    let _: () = app
        .redis
        .clone()
        .del(&[
            keys.single().voucher(voucher),
            keys.single().buyers(voucher),
        ])
        .await
        .unwrap();
    assert_eq!(app.redis_sale(voucher).await, None);

    // The reloaded sale opens once writers that held orders admitted
    // before the loss could count them again: until then, 503.
    let again = std::sync::Mutex::new(Value::Null);
    wait_until(
        "the reloaded sale open",
        Duration::from_secs(30),
        || async {
            let answer = app.purchase(voucher, &tokens[0]).await;
            let open = error_code(&answer) != "UNAVAILABLE";
            *again.lock().unwrap() = answer;
            open
        },
    )
    .await;
    let again = again.into_inner().unwrap();
    assert_eq!(error_code(&again), "ALREADY_ORDERED", "{again}");
    let sale = app.redis_sale(voucher).await.expect("reloaded");
    assert_eq!((sale.initial, sale.stock), (5, 3));
    assert_eq!(sale.buyers, users(&buyers));

    assert_eq!(app.purchase(voucher, &tokens[2]).await["success"], true);
    wait_until_written(&app).await;
    let audit = app.audit(voucher).await;
    assert_eq!((audit.active_orders, audit.stock_left), (3, 2));
    assert_eq!(app.redis_sale(voucher).await.unwrap().stock, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_starting_together_load_one_sale_and_never_reset_it() {
    // Orders placed synchronously: MySQL has them, Redis has no sale yet.
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let tokens = app.login_many(3).await;
    for token in &tokens[..2] {
        assert_eq!(app.purchase(voucher, token).await["success"], true);
    }
    assert_eq!(app.redis_sale(voucher).await, None);
    let buyers = [app.user_id(&tokens[0]).await, app.user_id(&tokens[1]).await];

    let (first, _second) = tokio::join!(
        NodeProcess::start(&app, &["--seckill=queue"]),
        NodeProcess::start(&app, &["--seckill=queue"]),
    );
    let loaded = app.redis_sale(voucher).await.expect("loaded at start");
    let RedisSale {
        initial,
        stock,
        begin_ms,
        end_ms,
        buyers: loaded_buyers,
        ..
    } = loaded.clone();
    assert_eq!((initial, stock), (10, 8));
    assert_eq!(loaded_buyers, users(&buyers));
    assert!(begin_ms < end_ms);

    // The sale runs; a node starting now leaves it as it is.
    let admitted = buy_at(&first.address, voucher, &tokens[2]).await;
    assert_eq!(admitted["success"], true, "{admitted}");
    let _third = NodeProcess::start(&app, &["--seckill=queue"]).await;
    let running = app.redis_sale(voucher).await.unwrap();
    assert_eq!((running.initial, running.stock), (10, 7));
    assert_eq!(running.buyers.len(), 3);

    wait_until_written(&app).await;
    let audit = app.audit(voucher).await;
    assert!(audit.violations(10, true).is_empty(), "{audit:?}");
    assert_eq!(audit.active_orders, 3);
}

#[tokio::test]
async fn an_admitted_order_reads_as_pending_until_it_is_written() {
    // The writer sleeps in each order's transaction: the order stays
    // pending long enough to be read.
    let app = queue_app(1000).await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;
    let user_id = app.user_id(&token).await;

    let admitted = app.purchase(voucher, &token).await;
    let order_id = admitted["data"].as_str().expect("an order id").to_owned();
    let path = format!("/voucher-order/{order_id}");
    assert_eq!(
        app.get_json(&path, Some(&token)).await,
        json!({
            "success": true,
            "data": {
                "id": order_id,
                "userId": user_id,
                "voucherId": voucher.to_string(),
                "pending": true,
            },
        })
    );
    let stranger = app.login(&phone(2)).await;
    let body = app.get_json(&path, Some(&stranger)).await;
    assert_eq!(error_code(&body), "ORDER_NOT_FOUND", "{body}");

    wait_until_written(&app).await;
    let written = app.get_json(&path, Some(&token)).await;
    assert_eq!(written["data"]["id"], order_id.as_str(), "{written}");
    assert_eq!(written["data"]["status"], 1, "{written}");
    assert!(written["data"].get("pending").is_none(), "{written}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_mode_writes_each_admitted_order_once() {
    each_admitted_order_is_written_once(SeckillMode::Queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_mode_writes_each_admitted_order_once() {
    each_admitted_order_is_written_once(SeckillMode::Stream).await;
}

/// Through the HTTP API in `mode`: 40 users buy a stock of 20 three times
/// each at once; every admitted order is written once, Redis and MySQL agree.
async fn each_admitted_order_is_written_once(mode: SeckillMode) {
    const STOCK: i64 = 20;
    const USERS: usize = 40;
    let app = spawn_app(|s| s.seckill = mode).await;
    let voucher = app.create_open_seckill(STOCK).await;
    let tokens = app.login_many(USERS).await;

    let app = &app;
    let answers = join_all(
        tokens
            .iter()
            .flat_map(|token| [token, token, token])
            .map(|token| async move { (token, app.purchase(voucher, token).await) }),
    )
    .await;
    let admitted: Vec<(&String, String)> = answers
        .iter()
        .filter(|(_, body)| body["success"] == true)
        .map(|(token, body)| (*token, body["data"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(admitted.len() as i64, STOCK);
    for (_, body) in &answers {
        let code = error_code(body);
        assert!(
            ["none", "SOLD_OUT", "ALREADY_ORDERED"].contains(&code),
            "{body}"
        );
    }

    wait_until_written(app).await;
    let audit = app.audit(voucher).await;
    assert!(audit.violations(STOCK, true).is_empty(), "{audit:?}");
    assert_eq!(audit.active_orders, STOCK);
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!(sale.stock + sale.buyers.len() as i64, sale.initial);
    assert_eq!(sale.initial, STOCK);
    for (token, order_id) in admitted {
        let order = app
            .get_json(&format!("/voucher-order/{order_id}"), Some(token))
            .await;
        assert_eq!(order["data"]["id"], order_id.as_str(), "{order}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_loses_admitted_orders_when_its_node_is_killed() {
    const BUYERS: usize = 5;
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let tokens = app.login_many(BUYERS).await;
    // The writer holds each order 5 s inside its transaction (within its
    // statements' 10 s deadline): every order is still queued, or being
    // written, when the node dies.
    let flags = [
        "--seckill=queue",
        "--chaos-hold-ms=5000",
        "--backend-timeout-ms=10000",
    ];
    let mut node = NodeProcess::start(&app, &flags).await;

    let mut told = Vec::new();
    for token in &tokens {
        let body = buy_at(&node.address, voucher, token).await;
        assert_eq!(body["success"], true, "{body}");
        let order_id: i64 = body["data"].as_str().unwrap().parse().unwrap();
        told.push((app.user_id(token).await, order_id));
    }
    node.kill().await;

    // Every buyer was told "success"; no order exists, nor ever will.
    for (user_id, order_id) in told {
        let order = app
            .store
            .order_of_user(OrderId::new(order_id), user_id)
            .await
            .unwrap();
        assert!(order.is_none(), "order {order_id} was written");
    }
    let audit = app.audit(voucher).await;
    assert_eq!((audit.active_orders, audit.stock_left), (0, 10));
    // Redis counts them sold and pending: the loss, as an audit sees it.
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!((sale.stock, sale.buyers.len()), (5, BUYERS));
    assert_eq!(app.pending_orders().await, BUYERS);
}

/// The ids' numbers keep the low word's top bit set, and the shard's
/// index below it, as they wrap around their 24 bits: the ids stay
/// distinct, never look like the id worker's, and name their shard.
#[tokio::test]
async fn the_scripts_id_sequence_wraps_within_its_24_bits() {
    let app = queue_app(0).await;
    let voucher = app.create_open_seckill(3).await;
    let tokens = app.login_many(3).await;
    // The node leases its first block at its first admission.
    (app.tables().set_next_order_id_number((1 << 24) - 2).await).unwrap();
    let mut low_words = Vec::new();
    for token in &tokens {
        let body = app.purchase(voucher, token).await;
        let id: i64 = body["data"].as_str().unwrap().parse().unwrap();
        low_words.push(id & 0xFFFF_FFFF);
    }
    assert_eq!(
        low_words,
        [
            (1 << 31) + (1 << 24) - 2,
            (1 << 31) + (1 << 24) - 1,
            1 << 31
        ]
    );
    wait_until_written(&app).await;
}

/// A sale a node saw sell out is refused from memory: no script runs in
/// Redis for the purchases after that.
#[tokio::test]
async fn a_sold_out_sale_is_refused_without_asking_redis() {
    let redis = RedisServer::start().await.unwrap();
    // No lock: the consumer runs no script of its own.
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.seckill = SeckillMode::Stream;
        s.lock.mode = LockMode::NoLock;
    })
    .await;
    let voucher = app.create_open_seckill(1).await;
    let tokens = app.login_many(4).await;
    assert_eq!(app.purchase(voucher, &tokens[0]).await["success"], true);
    // The script says sold out once; the node remembers it.
    assert_eq!(
        error_code(&app.purchase(voucher, &tokens[1]).await),
        "SOLD_OUT"
    );
    let scripts = request_scripts(&redis, &app).await;
    for token in &tokens[2..] {
        assert_eq!(error_code(&app.purchase(voucher, token).await), "SOLD_OUT");
    }
    assert_eq!(request_scripts(&redis, &app).await, scripts);
    wait_until_written(&app).await;
}

/// The database reset (or restored) while Redis kept its keys: the voucher
/// id comes round again, and the sale Redis kept for it is an earlier
/// voucher's. Created through the API or found by a purchase, it is
/// replaced by the new voucher's own sale, never sold from.
#[tokio::test]
async fn a_reused_voucher_id_never_inherits_the_sale_redis_kept() {
    let app = queue_app(0).await;
    let voucher = app.create_open_seckill(5).await;
    let tokens = app.login_many(2).await;
    assert_eq!(app.purchase(voucher, &tokens[0]).await["success"], true);
    wait_until_written(&app).await;

    // The voucher's rows gone, and its id the next one handed out.
    let reset = || async { app.tables().forget_voucher(voucher.get()).await.unwrap() };
    // Every in-process node of the test run counts into one registry: the
    // count is read as what it gained during this test.
    let counted = || metric(&app.address, "hmdp_stale_sales_replaced_total");
    let before = counted().await;
    let replaced = || async { counted().await - before };

    // Created again through the API: the node replaces the kept sale.
    reset().await;
    let again = app.create_open_seckill(10).await;
    assert_eq!(again, voucher, "the id came round again");
    let sale = app.redis_sale(voucher).await.expect("a sale in Redis");
    assert_eq!((sale.initial, sale.stock), (10, 10), "{sale:?}");
    assert!(sale.buyers.is_empty(), "{sale:?}");
    assert_eq!(replaced().await, 1.0);
    assert_eq!(app.purchase(voucher, &tokens[0]).await["success"], true);
    wait_until_written(&app).await;

    // Restored behind the nodes' back (no API call): the first purchase
    // finds the sale's token is not the voucher's, and replaces it.
    reset().await;
    let store = app.store.clone();
    let restored = store
        .insert_seckill_voucher(
            &hmdp::store::NewVoucher::flash_sale("restored"),
            &hmdp::store::NewSeckillVoucher::open_now(3),
        )
        .await
        .unwrap();
    assert_eq!(restored, voucher);
    // Refused as a buyer of the earlier voucher until the node reads the
    // voucher again (every 5 s), then admitted to the restored one's sale.
    wait_until(
        "the restored voucher sold to the earlier voucher's buyer",
        Duration::from_secs(20),
        || async {
            let answer = app.purchase(voucher, &tokens[0]).await;
            assert!(
                answer["success"] == true || answer["errorCode"] == "ALREADY_ORDERED",
                "{answer}"
            );
            answer["success"] == true
        },
    )
    .await;
    assert_eq!(replaced().await, 2.0);
    let sale = app.redis_sale(voucher).await.expect("a sale in Redis");
    assert_eq!((sale.initial, sale.stock), (3, 2), "{sale:?}");
    assert_eq!(sale.buyers.len(), 1);
}
