//! Shared commits: the synchronous purchases of one voucher written together,
//! each under its buyer's lock, each answered only after the commit that
//! holds its order, one bad order refused alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use hmdp::after_sale::PayDeadlines;
use hmdp::ids::{OrderId, UserId, VoucherId};
use hmdp::seckill::{Deferral, Locks, Outcome, Seckill};
use hmdp::startup::build_lock;
use hmdp::store::NewOrder;
use hmdp_lock::LockMode;
use hmdp_test_support::{poll_until, redis_url, wait_until};
use redis::AsyncCommands;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::disconnects::purchase_request;
use crate::helpers::{
    buy_at, metric, send_then_reset, serve_settings, socket_address, spawn_app, NodeProcess,
    TestApp,
};

/// Whether MySQL holds `order_id` as `user`'s order of `voucher`.
async fn written(app: &TestApp, order_id: OrderId, user: UserId, voucher: VoucherId) -> bool {
    let row = app.tables().order(order_id.get()).await.unwrap();
    row == Some((user.get(), voucher.get()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_buyers_three_times_each_on_two_nodes_get_one_order_each_written_before_the_answer(
) {
    const BUYERS: usize = 2_000;
    const STOCK: i64 = 500;
    let app = spawn_app(|s| s.lock.mode = LockMode::Reentrant).await;
    // A debug build under this load: the harness's backend timeout.
    let other = NodeProcess::start(&app, &["--lock=reentrant", "--backend-timeout-ms=10000"]).await;
    let voucher = app.create_open_seckill(STOCK).await;
    let tokens = app.login_many(BUYERS).await;
    let users = join_all(tokens.iter().map(|token| app.user_id(token))).await;

    // Every buyer's three purchases at once, over both nodes; each success
    // checked in MySQL the moment it is answered.
    let at_once = Arc::new(Semaphore::new(256));
    let app = &app;
    let purchases = (0..BUYERS * 3).map(|i| {
        let (token, user) = (&tokens[i % BUYERS], users[i % BUYERS]);
        let address = if i % 2 == 0 {
            &app.address
        } else {
            &other.address
        };
        let at_once = at_once.clone();
        async move {
            let _turn = at_once.acquire().await.unwrap();
            let answer = buy_at(address, voucher, token).await;
            let order = answer["data"]
                .as_str()
                .map(|id| OrderId::new(id.parse().unwrap()));
            let in_mysql = match order {
                Some(order) => written(app, order, user, voucher).await,
                None => false,
            };
            (user, answer, order, in_mysql)
        }
    });
    let answers = join_all(purchases).await;

    let mut told: HashMap<UserId, usize> = HashMap::new();
    for (user, answer, order, in_mysql) in &answers {
        match order {
            Some(order) => {
                assert!(
                    in_mysql,
                    "order {order} of user {user} answered before MySQL had it"
                );
                *told.entry(*user).or_default() += 1;
            }
            None => {
                let code = answer["errorCode"].as_str().unwrap_or_default();
                assert!(
                    ["SOLD_OUT", "ALREADY_ORDERED", "DUPLICATE_REQUEST"].contains(&code),
                    "{answer}"
                );
            }
        }
    }
    assert_eq!(told.len(), STOCK as usize, "buyers told success");
    assert!(told.values().all(|&n| n == 1), "a buyer told success twice");
    let audit = app.audit(voucher).await;
    assert_eq!(audit.active_orders, STOCK);
    assert_eq!(audit.duplicate_users, 0);
    assert_eq!(audit.stock_left, 0);

    // Shared: more orders than transactions.
    let (mut orders, mut transactions) = (0.0, 0.0);
    for address in [&app.address, &other.address] {
        orders += metric(address, "hmdp_sync_batch_orders_sum").await;
        transactions += metric(address, "hmdp_sync_batch_orders_count").await;
    }
    assert!(
        orders > transactions,
        "{orders} orders in {transactions} transactions"
    );
}

/// A writer on `app`'s database and Redis, with the locks of `flags`.
fn purchase_writer(app: &TestApp, flags: &[&str]) -> Arc<Seckill> {
    let settings = serve_settings(flags);
    let lock = build_lock(&settings.lock, app.redis.clone(), &redis_url()).unwrap();
    let keys = app.keys();
    let deadlines = PayDeadlines::new(app.redis.clone(), &keys, Duration::from_secs(900));
    Arc::new(Seckill::new(
        app.store.clone(),
        lock,
        app.redis.clone(),
        keys,
        deadlines,
        Duration::ZERO,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_with_a_duplicate_a_fenced_out_holder_a_lost_lock_and_a_taken_id_refuses_only_those(
) {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let elsewhere = app.create_open_seckill(10).await;
    let tokens = app.login_many(6).await;
    let users: Vec<UserId> = join_all(tokens.iter().map(|token| app.user_id(token))).await;
    let [bought, fenced, lost, taken, fine, also_fine] = users[..] else {
        unreachable!()
    };
    let seckill = purchase_writer(&app, &["--lock=reentrant", "--fencing"]);
    let writer = seckill.writer();

    // `bought` holds an order of the voucher already.
    assert_eq!(app.purchase(voucher, &tokens[0]).await["success"], true);
    let mut held = BTreeMap::new();
    for user in &users {
        held.insert(*user, writer.acquire(*user).await.unwrap());
    }
    // A newer holder of `fenced`'s lock wrote (its fence row is ahead).
    (app.tables())
        .insert_fence(fenced.get(), 1_u64 << 60)
        .await
        .unwrap();
    // A newer holder took `lost`'s lock (its Redis counter is ahead).
    let mut redis = app.redis.clone();
    let pattern = format!("*{}*{lost}*fence*", app.prefix);
    let counters: Vec<String> = redis.keys(&pattern).await.unwrap();
    assert_eq!(counters.len(), 1, "{pattern}: {counters:?}");
    let _: () = redis
        .hset(&counters[0], "token", 1_u64 << 60)
        .await
        .unwrap();
    // `taken`'s order id belongs to an order of another voucher.
    let base = chrono::Utc::now().timestamp_micros() << 8;
    let id = |n: i64| OrderId::new(base + n);
    (app.tables())
        .insert_order(id(3).get(), fine.get(), elsewhere.get())
        .await
        .unwrap();

    let orders: Vec<NewOrder> = [bought, fenced, lost, taken, fine, also_fine]
        .iter()
        .enumerate()
        .map(|(n, user)| NewOrder::unsequenced(id(n as i64), *user, voucher))
        .collect();
    let locks = Locks::held_by(held);
    let outcomes = writer
        .write_purchases(&orders, &locks, Instant::now() + Duration::from_secs(10))
        .await;
    for (user, held) in locks.into_held_by_user() {
        writer.release(user, held).await;
    }
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(Result::unwrap).collect();
    assert_eq!(outcomes[0], Outcome::DuplicateUser);
    assert_eq!(outcomes[1], Outcome::Deferred(Deferral::FencedOut));
    assert_eq!(outcomes[2], Outcome::Deferred(Deferral::LockLost));
    assert_eq!(outcomes[3], Outcome::IdTaken);
    assert_eq!(outcomes[4..], [Outcome::Written, Outcome::Written]);
    for (order, expected) in orders.iter().zip([false, false, false, false, true, true]) {
        let mine = written(&app, order.id, order.user_id, voucher).await;
        assert_eq!(mine, expected, "order of user {}", order.user_id);
    }
    let audit = app.audit(voucher).await;
    assert_eq!((audit.active_orders, audit.stock_left), (3, 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buyers_who_reset_their_connections_mid_batch_get_one_order_each() {
    // Each transaction held open a while, so that the purchases sent
    // meanwhile are written together in the next one, while their
    // clients reset their connections.
    let app = spawn_app(|s| {
        s.lock.mode = LockMode::Reentrant;
        s.chaos_hold_ms = 300;
    })
    .await;
    let voucher = app.create_open_seckill(100).await;
    let tokens = app.login_many(20).await;
    let address = socket_address(&app);
    for _ in 0..3 {
        let resets = tokens.iter().map(|token| {
            let request = purchase_request(voucher, token);
            async move { send_then_reset(address, &request, Duration::from_millis(100)).await }
        });
        join_all(resets).await;
    }
    // Then each buyer asks once more and waits for the answer.
    let answers: Vec<Value> =
        join_all(tokens.iter().map(|token| app.purchase(voucher, token))).await;
    let mut buyers = HashSet::new();
    for (token, answer) in tokens.iter().zip(&answers) {
        let user = app.user_id(token).await;
        if answer["success"] == true {
            buyers.insert(user);
        } else {
            let code = answer["errorCode"].as_str().unwrap_or_default();
            assert!(
                ["ALREADY_ORDERED", "DUPLICATE_REQUEST"].contains(&code),
                "{answer}"
            );
        }
    }
    // Every buyer's first purchase runs to its commit, its client gone.
    let every_buyer = tokens.len() as i64;
    poll_until(
        "every buyer's order",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok(app.audit(voucher).await.active_orders >= every_buyer) },
    )
    .await
    .unwrap();
    let audit = app.audit(voucher).await;
    assert_eq!(audit.duplicate_users, 0);
    assert_eq!(audit.active_orders + audit.stock_left, 100);
    assert_eq!(audit.active_orders, every_buyer, "one order per buyer");
}

/// The purchases found waiting when a voucher's transaction commits wait
/// for company (`--sync-batch-linger-ms`): one that comes meanwhile joins
/// their transaction, which starts as soon as it holds `--sync-batch-max`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_waiting_after_a_commit_are_joined_by_one_that_comes_while_they_linger() {
    let app = spawn_app(|_| {}).await;
    // Each transaction held open 3 s, a linger far longer than a purchase
    // takes to arrive, and three purchases a transaction.
    let node = NodeProcess::start(
        &app,
        &[
            "--chaos-hold-ms=3000",
            "--backend-timeout-ms=20000",
            "--sync-batch-linger-ms=1000",
            "--sync-batch-max=3",
        ],
    )
    .await;
    let voucher = app.create_open_seckill(10).await;
    let tokens = app.login_many(4).await;
    let transactions = || metric(&node.address, "hmdp_sync_batch_orders_count");

    // The first purchase, of an idle voucher, starts a transaction alone;
    // two more come while it is open and wait for the next.
    let first = tokio::spawn(buy_at_owned(&node.address, voucher, &tokens[0]));
    wait_until("the first transaction", Duration::from_secs(30), || async {
        transactions().await == 1.0
    })
    .await;
    let waiting: Vec<_> = (tokens[1..3].iter())
        .map(|token| tokio::spawn(buy_at_owned(&node.address, voucher, token)))
        .collect();
    let first = first.await.unwrap();
    assert_eq!(first["success"], true, "{first}");
    // ...and the fourth, sent once the first was answered (its transaction
    // committed), joins the two lingering: one transaction for the three.
    let fourth = buy_at(&node.address, voucher, &tokens[3]).await;
    assert_eq!(fourth["success"], true, "{fourth}");
    for answer in join_all(waiting).await {
        let answer = answer.unwrap();
        assert_eq!(answer["success"], true, "{answer}");
    }
    assert_eq!(transactions().await, 2.0, "transactions");
    assert_eq!(
        metric(&node.address, "hmdp_sync_batch_orders_sum").await,
        4.0,
        "orders"
    );
    assert_eq!(app.audit(voucher).await.active_orders, 4);

    // Where the time went: each purchase's steps counted once; each
    // transaction's statements held 3 s; the two waiting purchases queued
    // through the first transaction, and their transaction lingered once.
    for step in ["lock", "placed", "release"] {
        let count = format!("hmdp_sync_purchase_step_seconds_count{{step=\"{step}\"}}");
        assert_eq!(metric(&node.address, &count).await, 4.0, "{count}");
    }
    let placed = metric(
        &node.address,
        "hmdp_sync_purchase_step_seconds_sum{step=\"placed\"}",
    )
    .await;
    assert!(
        placed >= 4.0 * 3.0,
        "each purchase placed in a 3 s transaction: {placed}"
    );
    let step = |stat: &str, step: &str| {
        format!("hmdp_order_transaction_step_seconds_{stat}{{source=\"purchase\",step=\"{step}\"}}")
    };
    for name in ["open", "statements", "commit"] {
        assert_eq!(
            metric(&node.address, &step("count", name)).await,
            2.0,
            "{name}"
        );
    }
    let held = metric(&node.address, &step("sum", "statements")).await;
    assert!(held >= 2.0 * 3.0, "two transactions held 3 s each: {held}");
    let waits =
        |stat: &str, wait: &str| format!("hmdp_sync_batch_wait_seconds_{stat}{{wait=\"{wait}\"}}");
    assert_eq!(metric(&node.address, &waits("count", "queued")).await, 4.0);
    let queued = metric(&node.address, &waits("sum", "queued")).await;
    assert!(
        queued >= 2.0,
        "two purchases queued through the first: {queued}"
    );
    assert_eq!(metric(&node.address, &waits("count", "linger")).await, 1.0);
}

/// Redis restarts empty while a shared commit is in flight and another
/// buyer's purchase waits for the next one: the locks taken before the
/// restart are gone (their watchdogs find out), so that the purchase in
/// flight and the one waiting are refused 503 and write nothing, while a
/// buyer who took the lock after the restart and joined the same next
/// transaction gets the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_with_redis_refuses_its_order_and_its_batch_writes_the_rest() {
    let mut redis = hmdp_test_support::RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.lock.mode = LockMode::Reentrant;
        // Renewed every 100 ms: a lock gone with Redis is known lost soon.
        s.lock.lock_watchdog_ms = 300;
        // Every transaction stays open 4 s, before its lock checks.
        s.chaos_hold_ms = 4000;
        s.store.timeout.backend_timeout_ms = 20_000;
    })
    .await;
    let voucher = app.create_open_seckill(10).await;
    let tokens = app.login_many(2).await;
    let address = app.address.clone();

    // The first purchase's transaction starts alone; the second waits for
    // the next, its lock taken.
    let in_flight = tokio::spawn(buy_at_owned(&address, voucher, &tokens[0]));
    let transactions = || metric(&address, "hmdp_sync_batch_orders_count");
    wait_until("the first transaction", Duration::from_secs(20), || async {
        transactions().await == 1.0
    })
    .await;
    let waiting = tokio::spawn(buy_at_owned(&address, voucher, &tokens[1]));
    wait_until(
        "the second buyer's lock",
        Duration::from_secs(20),
        || async { app.lock_keys().await.len() == 2 },
    )
    .await;

    app.restart_redis(&mut redis).await;
    // Sessions went with Redis: a third buyer logs in and buys now, while
    // the first transaction is still open, and joins the second's.
    let after = app.login_many(3).await.remove(2);
    let answer = app.purchase(voucher, &after).await;
    assert_eq!(answer["success"], true, "{answer}");
    let order: OrderId = answer["data"].as_str().unwrap().parse().unwrap();

    for lost in [in_flight.await.unwrap(), waiting.await.unwrap()] {
        assert_eq!(lost["errorCode"], "UNAVAILABLE", "{lost}");
    }
    assert_eq!(transactions().await, 2.0, "one transaction after the first");
    assert_eq!(metric(&address, "hmdp_sync_batch_orders_sum").await, 3.0);
    let audit = app.audit(voucher).await;
    assert_eq!((audit.active_orders, audit.stock_left), (1, 9), "{audit:?}");
    assert!(app.tables().order(order.get()).await.unwrap().is_some());
}

/// [`buy_at`] as a future that owns what it sends, for a task of its own.
fn buy_at_owned(
    address: &str,
    voucher: VoucherId,
    token: &str,
) -> impl std::future::Future<Output = Value> + Send + 'static {
    let (address, token) = (address.to_owned(), token.to_owned());
    async move { buy_at(&address, voucher, &token).await }
}
