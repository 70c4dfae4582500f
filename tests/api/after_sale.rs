//! The order's life after the sale, on every purchase path and across two
//! nodes: pay, cancel, use, the unpaid-order timeout, the unit and the
//! buyer's turn given back exactly once (a payment racing the close, two
//! nodes closing one order, a node killed between MySQL and Redis, due
//! times lost with Redis, give-backs owed while Redis is gone and counted
//! on `hmdp_givebacks_owed`), and `Idempotency-Key` on purchases.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use hmdp::after_sale::{AfterSale, PayDeadlines};
use hmdp::config::SeckillMode;
use hmdp::ids::{OrderId, UserId, VoucherId};
use hmdp::store::{CloseCause, Closing, Store};
use hmdp_test_support::{wait_for, wait_until, RedisServer};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::helpers::{
    buy_at, metric, socket_address, spawn_app, NodeProcess, TestApp, ADMIN_TOKEN, OVERDUE_BY,
};

const WAIT: Duration = Duration::from_secs(30);

/// The `Result` body `request` is answered with.
async fn answer(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// A request from `token`'s user to the order `order` at `address`,
/// `action` after its path (`""`: the order itself).
fn on_order(address: &str, order: &str, action: &str, token: &str) -> reqwest::RequestBuilder {
    let url = format!("{address}/voucher-order/{order}{action}");
    let client = reqwest::Client::new();
    let request = if action.is_empty() {
        client.get(url)
    } else {
        client.post(url)
    };
    request.header("authorization", token)
}

async fn pay_at(address: &str, order: &str, token: &str) -> Value {
    answer(on_order(address, order, "/pay", token).json(&json!({"payType": 2}))).await
}

async fn cancel_at(address: &str, order: &str, token: &str) -> Value {
    answer(on_order(address, order, "/cancel", token)).await
}

async fn use_at(address: &str, order: &str) -> Value {
    let request = on_order(address, order, "/use", "").header("x-admin-token", ADMIN_TOKEN);
    answer(request).await
}

async fn order_at(address: &str, order: &str, token: &str) -> Value {
    answer(on_order(address, order, "", token)).await
}

/// Buys at `address`; the order id, once MySQL has the order (`queue` and
/// `stream` write it after the answer).
async fn bought(app: &TestApp, address: &str, voucher: VoucherId, token: &str) -> String {
    let answer = buy_at(address, voucher, token).await;
    assert_eq!(answer["success"], true, "{answer}");
    let order = answer["data"].as_str().unwrap().to_owned();
    wait_until("the order written to MySQL", WAIT, || async {
        order_at(&app.address, &order, token).await["data"]["status"] == 1
    })
    .await;
    order
}

/// `retry` answered with anything but `ORDER_PENDING`, within [`WAIT`].
async fn settled<F, Fut>(mut retry: F) -> Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    wait_for("an answer other than ORDER_PENDING", WAIT, || {
        let answer = retry();
        async move {
            let answer = answer.await;
            (answer["errorCode"] != "ORDER_PENDING").then_some(answer)
        }
    })
    .await
}

/// Far longer than the test takes: an order closes at its deadline only
/// once the test moves it past it ([`TestApp::make_overdue`]).
const PAY_TIMEOUT_SECS: u64 = 900;

async fn order_life_on_two_nodes(mode: SeckillMode) {
    let app = spawn_app(|s| {
        s.seckill = mode;
        s.after_sale.pay_timeout_secs = PAY_TIMEOUT_SECS;
    })
    .await;
    let flags = [
        format!("--seckill={mode}"),
        format!("--pay-timeout-secs={PAY_TIMEOUT_SECS}"),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let other = NodeProcess::start(&app, &flags).await;
    let (one, two) = (app.address.as_str(), other.address.as_str());
    let voucher = app.create_open_seckill(3).await;
    let tokens = app.login_many(5).await;
    let [payer, canceller, late, rebuyer, stranger] = &tokens[..] else {
        unreachable!()
    };

    // Paid on the other node; paying again is the same order; used.
    let paid = bought(&app, one, voucher, payer).await;
    let unpaid = order_at(one, &paid, payer).await;
    assert!(unpaid["data"]["payDeadline"].is_string(), "{unpaid}");
    let answer = settled(|| pay_at(two, &paid, payer)).await;
    assert_eq!(answer["success"], true, "{answer}");
    assert_eq!(
        (
            answer["data"]["status"].clone(),
            answer["data"]["payType"].clone()
        ),
        (json!(2), json!(2))
    );
    assert!(answer["data"]["payDeadline"].is_null(), "{answer}");
    let again = pay_at(one, &paid, payer).await;
    assert_eq!(
        (again["success"].clone(), again["data"]["id"].clone()),
        (json!(true), json!(paid))
    );
    let refused = cancel_at(one, &paid, payer).await;
    assert_eq!(refused["errorCode"], "ORDER_PAID", "{refused}");
    assert_eq!(
        pay_at(one, &paid, stranger).await["errorCode"],
        "ORDER_NOT_FOUND"
    );
    assert_eq!(
        cancel_at(two, &paid, stranger).await["errorCode"],
        "ORDER_NOT_FOUND"
    );
    let used = use_at(two, &paid).await;
    assert_eq!(used["data"]["status"], 3, "{used}");
    assert_eq!(
        buy_at(two, voucher, payer).await["errorCode"],
        "ALREADY_ORDERED"
    );

    // Cancelled on one node: the unit and the turn come back, and the same
    // buyer buys again on the other.
    let cancelled = bought(&app, two, voucher, canceller).await;
    let answer = cancel_at(one, &cancelled, canceller).await;
    assert_eq!(answer["data"]["status"], 4, "{answer}");
    assert_eq!(
        cancel_at(two, &cancelled, canceller).await["data"]["status"],
        4
    );
    assert_eq!(
        pay_at(two, &cancelled, canceller).await["errorCode"],
        "ORDER_CLOSED"
    );
    let again = bought(&app, two, voucher, canceller).await;
    assert_ne!(again, cancelled);

    // Left unpaid: closed at its deadline by a node; paying then is refused;
    // the buyer may buy again.
    let timed_out = bought(&app, one, voucher, late).await;
    assert_eq!(buy_at(two, voucher, rebuyer).await["errorCode"], "SOLD_OUT");
    for order in [&again, &timed_out] {
        let token = if order == &again { canceller } else { late };
        app.make_overdue(order).await;
        wait_until("the unpaid order closed at its deadline", WAIT, || async {
            order_at(two, order, token).await["data"]["status"] == 4
        })
        .await;
    }
    assert_eq!(
        pay_at(two, &timed_out, late).await["errorCode"],
        "ORDER_CLOSED"
    );
    // Two units came back: every node sells them (its sold-out memory is
    // forgotten within its re-read of the voucher). A close commits before
    // its give-back reaches the sale: both have, once none is owed.
    wait_until("both give-backs made", WAIT, || async {
        app.store
            .givebacks_owed_of(voucher)
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    wait_for("the units given back on sale", WAIT, || async {
        (buy_at(two, voucher, rebuyer).await["success"] == true).then_some(())
    })
    .await;
    let answer = buy_at(one, voucher, late).await;
    assert_eq!(answer["success"], true, "{answer}");

    wait_until(
        "every order written and the audit balanced",
        WAIT,
        || async {
            let audit = app.audit(voucher).await;
            audit.active_orders + audit.stock_left == 3 && audit.active_orders == 3
        },
    )
    .await;
    let audit = app.audit(voucher).await;
    assert!(audit.violations(3, true).is_empty(), "{audit:?}");
    assert_eq!(audit.closed_orders, 3, "{audit:?}");
    if mode != SeckillMode::Sync {
        let sale = app.redis_sale(voucher).await.expect("the sale in Redis");
        assert_eq!((sale.stock, sale.buyers.len()), (0, 3), "{sale:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pay_cancel_use_and_timeout_on_two_nodes_sync() {
    order_life_on_two_nodes(SeckillMode::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pay_cancel_use_and_timeout_on_two_nodes_queue() {
    order_life_on_two_nodes(SeckillMode::Queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pay_cancel_use_and_timeout_on_two_nodes_stream() {
    order_life_on_two_nodes(SeckillMode::Stream).await;
}

/// A node's after-sale service over `app`'s database and Redis, for the
/// races the HTTP API cannot time.
fn node_of(app: &TestApp, pay_timeout: Duration) -> Arc<AfterSale> {
    let store = Store::connect_lazy(&app.database_url(), 16, Duration::from_secs(10)).unwrap();
    Arc::new(AfterSale::new(
        store,
        app.redis.clone(),
        app.keys(),
        PayDeadlines::new(app.redis.clone(), &app.keys(), pay_timeout),
        Arc::new(|_| {}),
        Duration::ZERO,
    ))
}

/// Writes `count` unpaid orders of a voucher of that stock straight into
/// MySQL, as purchases leave them; their ids and buyers.
async fn unpaid_orders(app: &TestApp, count: i64) -> (VoucherId, Vec<(OrderId, UserId)>) {
    let voucher = app.create_open_seckill(count).await;
    let orders: Vec<(OrderId, UserId)> = (1..=count)
        .map(|i| (OrderId::new(1 << 40 | i), UserId::new(500_000 + i as u64)))
        .collect();
    for (order, user) in &orders {
        (app.tables())
            .insert_order(order.get(), user.get(), voucher.get())
            .await
            .unwrap();
    }
    app.tables().set_stock(voucher.get(), 0).await.unwrap();
    (voucher, orders)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_racing_the_close_a_thousand_times_never_both_wins() {
    const ORDERS: i64 = 1000;
    let app = spawn_app(|_| {}).await;
    let (voucher, orders) = unpaid_orders(&app, ORDERS).await;
    let (payer, closer) = (
        node_of(&app, Duration::from_secs(900)),
        node_of(&app, Duration::from_secs(900)),
    );
    let outcomes: Vec<(bool, bool)> = futures::stream::iter(orders.into_iter().enumerate())
        .map(|(i, (order, user))| {
            let (payer, closer) = (payer.clone(), closer.clone());
            async move {
                let pay = async { payer.pay(order, user, 1).await.is_ok() };
                let close = async {
                    matches!(
                        closer
                            .close(order, Some(user), CloseCause::Cancel)
                            .await
                            .unwrap(),
                        Closing::Closed(_)
                    )
                };
                // Either side sends first, in turn.
                if i % 2 == 0 {
                    tokio::join!(pay, close)
                } else {
                    let (closed, paid) = tokio::join!(close, pay);
                    (paid, closed)
                }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let both = outcomes
        .iter()
        .filter(|(paid, closed)| *paid && *closed)
        .count();
    let neither = outcomes
        .iter()
        .filter(|(paid, closed)| !*paid && !*closed)
        .count();
    let closed = outcomes.iter().filter(|(_, closed)| *closed).count() as i64;
    assert_eq!((both, neither), (0, 0), "each race has exactly one winner");
    assert!(
        closed > 0 && closed < ORDERS,
        "both sides won some races: {closed} closes"
    );
    let audit = app.audit(voucher).await;
    assert_eq!(
        (
            audit.active_orders,
            audit.closed_orders,
            audit.stock_left,
            audit.paid_and_closed
        ),
        (ORDERS - closed, closed, closed, 0),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_closing_one_order_give_its_unit_back_once() {
    const BUYERS: usize = 20;
    let app = spawn_app(|s| s.seckill = SeckillMode::Stream).await;
    let voucher = app.create_open_seckill(BUYERS as i64).await;
    let tokens = app.login_many(BUYERS).await;
    let mut orders = Vec::new();
    for token in &tokens {
        let order: OrderId = bought(&app, &app.address, voucher, token)
            .await
            .parse()
            .unwrap();
        orders.push(order);
    }
    let (a, b) = (
        node_of(&app, Duration::from_secs(900)),
        node_of(&app, Duration::from_secs(900)),
    );
    let mut closes = 0;
    for order in &orders {
        let (first, second) = tokio::join!(
            a.close(*order, None, CloseCause::Cancel),
            b.close(*order, None, CloseCause::Cancel)
        );
        for closing in [first.unwrap(), second.unwrap()] {
            if let Closing::Closed(giveback) = closing {
                closes += 1;
                // A give-back sent again (a retry, a relay) counts once.
                a.give_back(giveback).await.unwrap();
                b.give_back(giveback).await.unwrap();
            }
        }
    }
    assert_eq!(closes, BUYERS, "one close per order");
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!(
        (sale.stock, sale.buyers.len()),
        (BUYERS as i64, 0),
        "{sale:?}"
    );
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (0, BUYERS as i64),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_between_the_mysql_close_and_the_redis_give_back_leaves_a_unit_that_sells() {
    let app = spawn_app(|s| s.seckill = SeckillMode::Stream).await;
    // This node sleeps a minute between its close's commit and its give-back.
    let mut doomed = NodeProcess::start(
        &app,
        &["--seckill=stream", "--chaos-giveback-delay-ms=60000"],
    )
    .await;
    let voucher = app.create_open_seckill(1).await;
    let tokens = app.login_many(2).await;
    let order = bought(&app, &app.address, voucher, &tokens[0]).await;
    assert_eq!(
        buy_at(&app.address, voucher, &tokens[1]).await["errorCode"],
        "SOLD_OUT"
    );

    let address = doomed.address.clone();
    let (order_id, token) = (order.clone(), tokens[0].clone());
    let cancel = tokio::spawn(async move {
        // Never answered: the node dies first.
        let _ = on_order(&address, &order_id, "/cancel", &token)
            .send()
            .await;
    });
    wait_until("the close committed, its give-back owed", WAIT, || async {
        app.tables().givebacks_owed().await.unwrap() == 1
    })
    .await;
    doomed.kill().await;
    let _ = cancel.await;
    assert_eq!(
        app.redis_sale(voucher).await.unwrap().stock,
        0,
        "the unit is not back in Redis yet"
    );

    // The give-back has been owed for long (moved back, instead of waiting
    // until it is): the live node's closer sends it, and the unit sells
    // again.
    (app.tables())
        .age_givebacks(OVERDUE_BY.as_secs())
        .await
        .unwrap();
    app.closer.run_once().await;
    assert_eq!(
        app.redis_sale(voucher).await.unwrap().stock,
        1,
        "the unit back in Redis"
    );
    wait_for("the stranded unit sold again", WAIT, || async {
        let answer = buy_at(&app.address, voucher, &tokens[1]).await;
        (answer["success"] == true).then_some(())
    })
    .await;
    wait_until("the new order written", WAIT, || async {
        app.audit(voucher).await.active_orders == 1
    })
    .await;
    let audit = app.audit(voucher).await;
    assert!(audit.violations(1, true).is_empty(), "{audit:?}");
    assert_eq!(app.redis_sale(voucher).await.unwrap().stock, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_times_lost_with_a_redis_restart_are_closed_by_the_sweep() {
    let mut redis = RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        // Far longer than the test: the order is overdue only once the
        // test moves it past its deadline, after its due time is lost.
        // The node's own sweep runs as it starts, then only after the
        // test: the test runs the round that sweeps.
        s.after_sale.pay_timeout_secs = 900;
    })
    .await;
    let voucher = app.create_open_seckill(2).await;
    let token = app.login_many(1).await.remove(0);
    let order = bought(&app, &app.address, voucher, &token).await;
    wait_until("the order's due time in Redis", WAIT, || async {
        let due: i64 = redis::cmd("ZCARD")
            .arg(app.keys().pay_deadlines())
            .query_async(&mut app.redis.clone())
            .await
            .unwrap_or(0);
        due == 1
    })
    .await;
    // The nodes of every test in this process count into one registry:
    // this order's close is the one the count gains from here.
    let swept = "hmdp_orders_closed_total{cause=\"sweep\"}";
    let swept_before = metric(&app.address, swept).await;
    // Redis keeps nothing on disk: the due time goes with it.
    redis.restart().await.unwrap();
    let order_id: i64 = order.parse().unwrap();
    let status = app.tables().order_status(order_id).await.unwrap();
    assert_eq!(status, 1, "still unpaid when Redis lost its due time");
    app.make_overdue(&order).await;
    let round = app.closer.run_once().await;
    assert_eq!((round.closed_due, round.swept), (0, 1), "{round:?}");
    let status = app.tables().order_status(order_id).await.unwrap();
    assert_eq!(status, 4, "closed by the sweep");
    assert!(metric(&app.address, swept).await > swept_before);
    let audit = app.audit(voucher).await;
    assert_eq!((audit.active_orders, audit.stock_left), (0, 2), "{audit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_backs_redis_cannot_take_are_counted_owed_until_it_takes_them() {
    let mut redis = RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.after_sale.pay_timeout_secs = PAY_TIMEOUT_SECS;
    })
    .await;
    // The gauge is read off a node in a process of its own (the nodes of
    // every test in this process set one registry's gauges), which sweeps
    // MySQL for overdue orders every second.
    let redis_url = format!("--redis-url={}", redis.url());
    let node = NodeProcess::start(&app, &[&redis_url, "--pay-sweep-secs=1"]).await;
    let owed = "hmdp_givebacks_owed";
    assert_eq!(metric(&node.address, owed).await, 0.0);
    let voucher = app.create_open_seckill(1).await;
    let token = app.login_many(1).await.remove(0);
    let order: i64 = bought(&app, &app.address, voucher, &token)
        .await
        .parse()
        .unwrap();

    // Redis goes away; the order, past its deadline in MySQL, is closed by
    // the sweep, and its give-back has nowhere to go.
    redis.kill();
    let aged = (app.tables())
        .age_unpaid_order(order, 24 * 3600)
        .await
        .unwrap();
    assert_eq!(aged, 1, "the order is unpaid");
    wait_until("the give-back counted owed", WAIT, || async {
        metric(&node.address, owed).await == 1.0
    })
    .await;
    let owed_in_mysql = || async { app.tables().givebacks_owed_for(order).await.unwrap() };
    assert_eq!(owed_in_mysql().await, 1);

    // Redis is back (empty): the closers send the give-back, and it is
    // owed no more.
    redis.restart().await.unwrap();
    wait_until("the give-back no longer counted owed", WAIT, || async {
        metric(&node.address, owed).await == 0.0
    })
    .await;
    assert_eq!(owed_in_mysql().await, 0);
}

fn keyed_purchase(voucher: VoucherId, token: &str, key: &str) -> String {
    format!(
        "POST /voucher-order/seckill/{voucher} HTTP/1.1\r\nhost: node\r\n\
         authorization: {token}\r\nidempotency-key: {key}\r\ncontent-length: 0\r\n\r\n"
    )
}

async fn an_idempotency_key_replayed_after_a_reset(mode: SeckillMode) {
    // Each writer holds its transaction 2 s: in `sync` the purchase's
    // answer comes after it, and the reset comes first.
    let app = spawn_app(|s| {
        s.seckill = mode;
        s.chaos_hold_ms = 2000;
    })
    .await;
    let voucher = app.create_open_seckill(5).await;
    let other = app.create_open_seckill(5).await;
    let tokens = app.login_many(2).await;
    let token = &tokens[0];
    let user = app.user_id(token).await;
    let claimed = app.keys().single().idempotency(user, "buy-1");
    // The connection is reset once the node holds the key: the purchase has
    // begun, and its answer (`sync`) is still to come.
    let mut connection = TcpStream::connect(socket_address(&app)).await.unwrap();
    let request = keyed_purchase(voucher, token, "buy-1");
    connection.write_all(request.as_bytes()).await.unwrap();
    wait_until("the key claimed", WAIT, || app.key_exists(&claimed)).await;
    connection.set_zero_linger().unwrap();
    drop(connection);

    if mode == SeckillMode::Sync {
        // While the first is still running, the same key is refused.
        let busy = app
            .purchase_response_with_key(voucher, token, "buy-1")
            .await;
        assert_eq!(busy.status(), 409);
    }
    let written = wait_for("the reset request's order written", WAIT, || async {
        let written = app.tables().order_ids_of_voucher(voucher.get()).await;
        written.unwrap().first().copied()
    })
    .await;
    let replay = wait_for("the first answer kept", WAIT, || async {
        let response = app
            .purchase_response_with_key(voucher, token, "buy-1")
            .await;
        (response.status() == 200).then_some(response)
    })
    .await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let body: Value = replay.json().await.unwrap();
    assert_eq!(body["data"], written.to_string(), "{body}");

    // The same key for another voucher: 422. Another key: a new request,
    // whose refusal is not kept (it changed nothing).
    let reused = app.purchase_response_with_key(other, token, "buy-1").await;
    assert_eq!(reused.status(), 422);
    for _ in 0..2 {
        let refused = app
            .purchase_response_with_key(voucher, token, "buy-2")
            .await;
        assert!(refused.headers().get("idempotent-replayed").is_none());
        let refused: Value = refused.json().await.unwrap();
        assert_eq!(refused["errorCode"], "ALREADY_ORDERED", "{refused}");
    }
    // Another user's same key is another request.
    let theirs: Value = app
        .purchase_response_with_key(voucher, &tokens[1], "buy-1")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(theirs["success"], true, "{theirs}");
    assert_ne!(theirs["data"], body["data"]);
    let bad = app
        .purchase_response_with_key(voucher, token, "spaces are not allowed")
        .await;
    assert_eq!(bad.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_replayed_after_a_reset_connection_returns_the_same_order_sync() {
    an_idempotency_key_replayed_after_a_reset(SeckillMode::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_replayed_after_a_reset_connection_returns_the_same_order_stream() {
    an_idempotency_key_replayed_after_a_reset(SeckillMode::Stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_still_on_its_way_after_a_redis_restart_changes_nothing() {
    let mut redis = RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.seckill = SeckillMode::Stream;
    })
    .await;
    let voucher = app.create_open_seckill(1).await;
    let token = app.login_many(1).await.remove(0);
    let order: OrderId = bought(&app, &app.address, voucher, &token)
        .await
        .parse()
        .unwrap();
    let node = node_of(&app, Duration::from_secs(900));
    let Closing::Closed(giveback) = node.close(order, None, CloseCause::Cancel).await.unwrap()
    else {
        panic!("the order closes");
    };
    // Redis restarts empty (the given-back set with it), and the sale is
    // loaded again from MySQL, the unit in its stock.
    redis.restart().await.unwrap();
    wait_until("the sale loaded again", WAIT, || async {
        app.sale_state().load(voucher).await.is_ok()
    })
    .await;
    assert_eq!(app.redis_sale(voucher).await.unwrap().stock, 1);
    // A node that read the give-back before the restart sends it now.
    node.give_back(giveback).await.unwrap();
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!((sale.stock, sale.buyers.len()), (1, 0), "{sale:?}");
}
