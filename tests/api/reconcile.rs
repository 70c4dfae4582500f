//! The reconciler costs what the live sales need: an ended sale whose
//! orders are settled is let go (its keys expire, no round reads it
//! again, its buyers' Idempotency-Key answers keep their day), an open one
//! is still compared and healed, and counts are compared before any member
//! is read.

use std::time::Duration;

use chrono::{Local, NaiveDateTime};
use hmdp::config::SeckillMode;
use hmdp::ids::VoucherId;
use hmdp_test_support::{wait_until, RedisServer};
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::helpers::{command_calls, spawn_app, TestApp};

const WAIT: Duration = Duration::from_secs(30);

/// The seconds `key` has left, as Redis's `TTL` answers (-1: no expiry).
async fn ttl(app: &TestApp, key: &str) -> i64 {
    app.redis.clone().ttl(key).await.unwrap()
}

/// Whether MySQL says Redis is meant to hold the voucher's sale: what the
/// reconciler reads each round.
async fn live(app: &TestApp, voucher: VoucherId) -> bool {
    let sales = app.store.live_sales().await.unwrap();
    sales.iter().any(|sale| sale.voucher_id == voucher)
}

/// Two sales, one ending in a few seconds, one open: a buyer of each, the
/// first with an Idempotency-Key. Ended with its order unpaid, the first is
/// still reconciled (the order may close and owe a give-back); paid, it is
/// let go. Redis drifted in both then: the open sale is healed, the ended
/// one is not read. The key still gets its order, and keeps its day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_settled_sale_is_let_go_and_an_open_one_still_reconciled() {
    let app = spawn_app(|s| s.seckill = SeckillMode::Stream).await;
    let end: NaiveDateTime = Local::now().naive_local() + chrono::Duration::seconds(3);
    let ended = app
        .create_seckill(
            5,
            "2020-01-01T00:00:00",
            &end.format("%Y-%m-%dT%H:%M:%S").to_string(),
        )
        .await;
    let open = app.create_open_seckill(5).await;
    let tokens = app.login_many(2).await;
    let bought = app.purchase_with_key(ended, &tokens[0], "k").await;
    assert_eq!(bought["success"], true, "{bought}");
    assert_eq!(app.purchase(open, &tokens[1]).await["success"], true);
    wait_until("the orders written", WAIT, || async {
        app.audit(ended).await.active_orders == 1
            && app.audit(open).await.active_orders == 1
            && app.pending_orders().await == 0
    })
    .await;
    wait_until("the sale ended", WAIT, || async {
        Local::now().naive_local() > end + chrono::Duration::seconds(1)
    })
    .await;

    let keys = app.keys();
    let sale_key = keys.single().voucher(ended);
    app.sale_state().reconcile_once().await.unwrap();
    assert!(live(&app, ended).await, "an unpaid order may still close");
    assert_eq!(ttl(&app, &sale_key).await, -1);

    let order = bought["data"].as_str().unwrap();
    let paid: Value = (app.client)
        .post(app.url(&format!("/voucher-order/{order}/pay")))
        .header("authorization", &tokens[0])
        .json(&json!({"payType": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(paid["success"], true, "{paid}");
    wait_until("the ended sale let go", WAIT, || async {
        app.sale_state().reconcile_once().await.unwrap();
        !live(&app, ended).await
    })
    .await;
    let kept = ttl(&app, &sale_key).await;
    assert!(
        (1..=3600).contains(&kept),
        "the sale's hash expires: {kept}"
    );
    let buyers = ttl(&app, &keys.single().buyers(ended)).await;
    assert!(buyers > kept, "its buyers outlive the hash: {buyers}");
    let user = app.user_id(&tokens[0]).await;
    let answer = ttl(&app, &keys.single().idempotency(user, "k")).await;
    assert!(
        answer > 23 * 3600,
        "the key's answer keeps its day: {answer}"
    );
    assert!(live(&app, open).await);
    assert_eq!(ttl(&app, &keys.single().voucher(open)).await, -1);

    for voucher in [ended, open] {
        let _: () = (app.redis.clone())
            .hincr(keys.single().voucher(voucher), "stock", 3)
            .await
            .unwrap();
    }
    app.sale_state().reconcile_once().await.unwrap();
    let app = &app;
    let stock = |voucher| async move { app.redis_sale(voucher).await.unwrap().stock };
    assert_eq!(stock(open).await, 4, "the open sale is compared and healed");
    assert_eq!(stock(ended).await, 7, "the ended one is not read");

    let replayed = app.purchase_with_key(ended, &tokens[0], "k").await;
    assert_eq!(replayed, bought, "a replay after the let-go gets its order");
}

/// Once an ended sale's keys are gone, a late purchase is refused as
/// ended at once: the sale is loaded again as a first load (nothing of
/// it was in a writer's hands), not as a sale Redis lost, and let go
/// again by the next round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_after_the_let_go_sale_expired_is_refused_as_ended() {
    let app = spawn_app(|s| s.seckill = SeckillMode::Stream).await;
    let ended = app
        .create_seckill(5, "2020-01-01T00:00:00", "2020-01-02T00:00:00")
        .await;
    app.sale_state().reconcile_once().await.unwrap();
    assert!(!live(&app, ended).await, "nothing sold: let go at once");
    let keys = app.keys();
    let sale_keys = [keys.single().voucher(ended), keys.single().buyers(ended)];
    let _: () = app.redis.clone().del(&sale_keys).await.unwrap();

    let token = &app.login_many(1).await[0];
    let refused = app.purchase(ended, token).await;
    assert_eq!(refused["errorCode"], "ENDED", "{refused}");
    assert!(live(&app, ended).await, "loaded again for the purchase");
    app.sale_state().reconcile_once().await.unwrap();
    assert!(!live(&app, ended).await, "and let go again");
}

/// On a Redis of the test's own: a round over a sale that agrees with
/// MySQL reads counts only (`SCARD`, no `SMEMBERS`); once Redis lost a
/// buyer, the counts differ, the members are read and the sale healed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_are_compared_before_members_are_read() {
    let redis = RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.seckill = SeckillMode::Stream;
    })
    .await;
    let voucher = app.create_open_seckill(5).await;
    let tokens = app.login_many(2).await;
    for token in &tokens {
        assert_eq!(app.purchase(voucher, token).await["success"], true);
    }
    wait_until("the orders written", WAIT, || async {
        app.audit(voucher).await.active_orders == 2 && app.pending_orders().await == 0
    })
    .await;

    let scards = command_calls(&redis, "scard").await;
    app.sale_state().reconcile_once().await.unwrap();
    assert!(command_calls(&redis, "scard").await > scards);
    assert_eq!(command_calls(&redis, "smembers").await, 0);

    let user = app.user_id(&tokens[1]).await;
    let buyers = app.keys().single().buyers(voucher);
    let _: () = app.redis.clone().srem(&buyers, user.get()).await.unwrap();
    app.sale_state().reconcile_once().await.unwrap();
    assert!(command_calls(&redis, "smembers").await > 0);
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!((sale.stock, sale.buyers.len()), (3, 2), "healed: {sale:?}");
}
