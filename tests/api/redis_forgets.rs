//! Redis is a cache of the sale that may forget; MySQL is the truth. Each
//! test here is a way Redis forgets, or a state a forgetting leaves, and
//! what a buyer is owed through it: a replayed Idempotency-Key gets its
//! order, no unit is destroyed between shards, and no order a buyer was
//! told of is dropped by the writer holding it.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{Local, NaiveDateTime};
use futures::future::join_all;
use hmdp::config::SeckillMode;
use hmdp::ids::{UserId, VoucherId};
use hmdp::shards::Layout;
use hmdp_test_support::{wait_for, wait_until, RedisServer};
use redis::AsyncCommands;
use serde_json::Value;

use crate::helpers::{metric, spawn_app, TestApp};

const WAIT: Duration = Duration::from_secs(30);

/// How many orders MySQL holds under `id`.
async fn written(app: &TestApp, id: i64) -> i64 {
    app.tables().orders_with_id(id).await.unwrap()
}

/// Buys until the answer is final: a reloaded sale answers 503 until it
/// reopens.
async fn final_answer(app: &TestApp, voucher: VoucherId, token: &str) -> Value {
    wait_for("a final answer", WAIT, || async {
        let answer = app.purchase(voucher, token).await;
        (answer["errorCode"] != "UNAVAILABLE").then_some(answer)
    })
    .await
}

/// Stock 1, a sale that ends a few seconds from now: A buys with key `k`,
/// B is refused `SOLD_OUT` (the node now remembers the sale sold out), A
/// sends `k` again and gets the same order; once the sale has ended, again.
/// The key exists for exactly this case: the answer was lost while buying
/// one of the last units.
async fn a_replayed_key_gets_its_order_after_sold_out_and_after_the_end(mode: SeckillMode) {
    let app = spawn_app(|s| s.seckill = mode).await;
    let format = "%Y-%m-%dT%H:%M:%S";
    let end: NaiveDateTime = Local::now().naive_local() + chrono::Duration::seconds(5);
    let voucher = app
        .create_seckill(1, "2020-01-01T00:00:00", &end.format(format).to_string())
        .await;
    let tokens = app.login_many(2).await;

    let bought = app.purchase_with_key(voucher, &tokens[0], "k").await;
    assert_eq!(bought["success"], true, "{bought}");
    let refused = app.purchase(voucher, &tokens[1]).await;
    assert_eq!(refused["errorCode"], "SOLD_OUT", "{refused}");
    let replayed = app.purchase_with_key(voucher, &tokens[0], "k").await;
    assert_eq!(
        replayed, bought,
        "a replay after the sale sold out gets its order"
    );

    wait_until("the sale ended", WAIT, || async {
        Local::now().naive_local() > end + chrono::Duration::seconds(1)
    })
    .await;
    let refused = app.purchase(voucher, &tokens[1]).await;
    assert_eq!(refused["success"], false, "{refused}");
    let replayed = app.purchase_with_key(voucher, &tokens[0], "k").await;
    assert_eq!(
        replayed, bought,
        "a replay after the sale ended gets its order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_idempotency_key_gets_its_order_after_sold_out_and_after_the_end_sync() {
    a_replayed_key_gets_its_order_after_sold_out_and_after_the_end(SeckillMode::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_idempotency_key_gets_its_order_after_sold_out_and_after_the_end_stream() {
    a_replayed_key_gets_its_order_after_sold_out_and_after_the_end(SeckillMode::Stream).await;
}

/// Two shards of 10, one of them carrying another load's epoch (what a
/// reload that rewrote one shard and died before the other leaves): the
/// node sees the shards disagree and loads the sale again from MySQL, so
/// that buyers of both shards buy all 20 units. Without that, the lends
/// the receiving shard refuses for their epoch destroyed their units: ten
/// never sold, MySQL kept stock 10 while every buyer heard SOLD_OUT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_of_two_epochs_are_reloaded_and_every_unit_sells() {
    let app = spawn_app(|s| {
        s.seckill = SeckillMode::Stream;
        s.seckill_shards = 2;
        s.store.timeout.backend_timeout_ms = 1000;
    })
    .await;
    let voucher = app.create_open_seckill(20).await;
    let layout = Layout::new(2).unwrap();
    let broken = app.keys().shard(layout.shard(1)).voucher(voucher);
    let _: () = app.redis.clone().hset(&broken, "epoch", "1").await.unwrap();

    let mut by_shard: [Vec<(UserId, String)>; 2] = Default::default();
    for token in app.login_many(60).await {
        let user = app.user_id(&token).await;
        by_shard[usize::from(layout.position_of(user))].push((user, token));
    }
    let [lenders, borrowers] = by_shard;
    assert!(
        lenders.len() >= 9 && borrowers.len() >= 12,
        "enough users in each shard: {} and {}",
        lenders.len(),
        borrowers.len()
    );
    // The unbroken shard's buyers first: ten of its own, then two more,
    // who need units from the other shard; then the other shard's buyers.
    let buyers = borrowers.iter().take(12).chain(lenders.iter().take(8));
    let mut sold = 0;
    for (user, token) in buyers {
        let answer = final_answer(&app, voucher, token).await;
        assert_eq!(answer["success"], true, "user {user}: {answer}");
        sold += 1;
    }
    assert_eq!(sold, 20);
    let last = final_answer(&app, voucher, &lenders[8].1).await;
    assert_eq!(last["errorCode"], "SOLD_OUT", "{last}");

    wait_until("the orders written", WAIT, || async {
        app.audit(voucher).await.active_orders == 20
    })
    .await;
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.stock_left, audit.duplicate_users),
        (0, 0),
        "{audit:?}"
    );
    let sale = app.redis_sale(voucher).await.expect("the sale in Redis");
    assert_eq!((sale.stock, sale.in_transit), (0, 0), "{sale:?}");
}

/// Redis without persistence, buyers told success, the consumer in its
/// transaction with their orders, Redis SIGKILLed: the consumer cannot ask
/// Redis whether it still holds them, keeps the batch and tries again.
/// Redis comes back empty (the stream with it): every order of the batch
/// is written from the consumer's memory, once. (Orders admitted and not
/// yet read by a consumer go with Redis: docs/guarantees.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_consumer_cannot_check_while_redis_is_down_is_kept_and_written() {
    let mut redis = RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.seckill = SeckillMode::Stream;
        // The batch stays in its transaction 3 s, before its INSERT.
        s.chaos_hold_ms = 3000;
    })
    .await;
    let voucher = app.create_open_seckill(3).await;
    let tokens = app.login_many(3).await;
    let answers = join_all(tokens.iter().map(|token| app.purchase(voucher, token))).await;
    let mut told = HashMap::new();
    for (token, answer) in tokens.iter().zip(&answers) {
        assert_eq!(answer["success"], true, "{answer}");
        let order: i64 = answer["data"].as_str().unwrap().parse().unwrap();
        told.insert(app.keys().order_lock(app.user_id(token).await), order);
    }
    // The batch holds its users' locks, taken at once, for its 3 s.
    let in_hand = wait_for("a batch in its writer's hands", WAIT, || async {
        let first = app.lock_keys().await;
        let second = app.lock_keys().await;
        (!first.is_empty() && first == second).then_some(first)
    })
    .await;
    let in_hand: Vec<i64> = in_hand.iter().map(|key| told[key]).collect();

    // The counter is the test process's: other tests' nodes add to it too.
    let failures = "hmdp_stream_round_failures_total";
    let before = metric(&app.address, failures).await;
    redis.kill();
    // The consumer's back-offs are cut short: each poll asks for its next
    // round at once.
    let rounds = app.stream_rounds.clone().expect("a stream node");
    wait_until(
        "the consumer failed twice with Redis down",
        WAIT,
        || async {
            rounds.ask();
            metric(&app.address, failures).await >= before + 2.0
        },
    )
    .await;
    redis.restart().await.unwrap();

    wait_until("every order of the batch written", WAIT, || async {
        rounds.ask();
        for &id in &in_hand {
            if written(&app, id).await == 0 {
                return false;
            }
        }
        true
    })
    .await;
    for &id in &in_hand {
        assert_eq!(written(&app, id).await, 1, "order {id}");
    }
    assert_eq!(app.audit(voucher).await.duplicate_users, 0);
}

/// A sale in two shards, the consumer holding orders of one shard in its
/// transaction longer than a reloaded sale stays closed, and the other
/// shard lost: the sale is loaded again from MySQL, where those orders are
/// not yet. The load keeps them counted, since Redis still holds them as
/// pending in the shard it did not forget: the buyers after the loss get
/// only the units nobody holds, every success answer is an order written
/// once, and nothing is dead-lettered. (Taking them out for their writers
/// to count again sold their units a second time once the sale reopened.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_orders_redis_still_holds_counted_however_long_their_writer_takes() {
    let app = spawn_app(|s| {
        s.seckill = SeckillMode::Stream;
        s.seckill_shards = 2;
        s.store.timeout.backend_timeout_ms = 1000;
        // Each batch stays in its transaction 4 s, before its INSERT.
        s.chaos_hold_ms = 4000;
    })
    .await;
    let voucher = app.create_open_seckill(4).await;
    let layout = Layout::new(2).unwrap();
    let mut by_shard: [Vec<String>; 2] = Default::default();
    for token in app.login_many(30).await {
        let user = app.user_id(&token).await;
        by_shard[usize::from(layout.position_of(user))].push(token);
    }
    let [kept, lost] = by_shard;
    assert!(kept.len() >= 4 && lost.len() >= 2, "users in each shard");

    let mut told = Vec::new();
    for token in &kept[..2] {
        let answer = app.purchase(voucher, token).await;
        assert_eq!(answer["success"], true, "{answer}");
        told.push(answer["data"].as_str().unwrap().parse::<i64>().unwrap());
    }
    let gone = app.keys().shard(layout.shard(1)).voucher(voucher);
    let _: () = app.redis.clone().del(&gone).await.unwrap();

    let mut refused = 0;
    for token in lost[..2].iter().chain(&kept[2..4]) {
        let answer = final_answer(&app, voucher, token).await;
        match answer["data"].as_str() {
            Some(order) => told.push(order.parse().unwrap()),
            None => {
                assert_eq!(answer["errorCode"], "SOLD_OUT", "{answer}");
                refused += 1;
            }
        }
    }
    assert_eq!((told.len(), refused), (4, 2), "stock 4: {told:?}");

    wait_until(
        "every order its buyer was told of written",
        Duration::from_secs(60),
        || async {
            for &id in &told {
                if written(&app, id).await == 0 {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left, audit.duplicate_users),
        (4, 0, 0),
        "{audit:?}"
    );
    let dead = app.sale_state().dead_letters_of(voucher).await.unwrap();
    assert!(dead.is_empty(), "{dead:?}");
}

/// Redis comes back with the sale but without its last writes (an
/// `appendfsync everysec` crash, a failover to a replica that missed
/// them): two admissions whose orders MySQL already holds are undone in
/// Redis, their units back in its stock, their buyers gone. A round of the
/// reconciler (driven by the test; every node runs one every 5 s) finds
/// Redis drifted from MySQL and loads the sale again: those buyers cannot
/// buy a second time, and the units they hold are not sold again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_redis_kept_with_its_last_writes_lost_is_reconciled_with_mysql() {
    let app = spawn_app(|s| s.seckill = SeckillMode::Stream).await;
    let voucher = app.create_open_seckill(10).await;
    let tokens = app.login_many(3).await;
    for token in &tokens {
        let answer = app.purchase(voucher, token).await;
        assert_eq!(answer["success"], true, "{answer}");
    }
    wait_until("the orders written", WAIT, || async {
        app.audit(voucher).await.active_orders == 3 && app.pending_orders().await == 0
    })
    .await;

    let keys = app.keys();
    let mut redis = app.redis.clone();
    for token in &tokens[1..] {
        let user = app.user_id(token).await;
        let _: () = redis
            .srem(keys.single().buyers(voucher), user.get())
            .await
            .unwrap();
    }
    let _: () = redis
        .hincr(keys.single().voucher(voucher), "stock", 2)
        .await
        .unwrap();

    app.sale_state().reconcile_once().await.unwrap();
    let sale = app.redis_sale(voucher).await.expect("the sale in Redis");
    assert_eq!((sale.stock, sale.buyers.len()), (7, 3), "healed: {sale:?}");
    for token in &tokens[1..] {
        let again = final_answer(&app, voucher, token).await;
        assert_eq!(again["errorCode"], "ALREADY_ORDERED", "{again}");
    }
    let audit = app.audit(voucher).await;
    assert_eq!((audit.active_orders, audit.stock_left), (3, 7), "{audit:?}");
}

/// An Idempotency-Key first sent for a one-shard sale, sent again for a
/// sale in four shards (where the buyer's shard is another): refused 422,
/// as for any other voucher, not admitted as a new purchase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_sent_again_for_a_sale_of_another_shard_count_is_refused() {
    let app = spawn_app(|s| s.seckill = SeckillMode::Stream).await;
    let one = app.create_open_seckill(5).await;
    let mut body = crate::helpers::open_seckill_body(5);
    body["shards"] = serde_json::json!(4);
    let four: Value = app
        .post_voucher("/voucher/seckill", crate::helpers::ADMIN_TOKEN, &body)
        .await
        .json()
        .await
        .unwrap();
    let four = VoucherId::new(four["data"].as_str().unwrap().parse().unwrap());
    let token = &app.login_many(1).await[0];
    let bought = app.purchase_with_key(one, token, "k").await;
    assert_eq!(bought["success"], true, "{bought}");

    let response = app
        .client
        .post(app.url(&format!("/voucher-order/seckill/{four}")))
        .header("authorization", token)
        .header("idempotency-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let sale = app.redis_sale(four).await.expect("the sale in Redis");
    assert_eq!((sale.stock, sale.buyers.len()), (5, 0), "{sale:?}");
}
