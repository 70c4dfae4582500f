//! Load shedding: a node whose purchases run past its latency target admits
//! fewer at once and answers the rest at once, 503 OVERLOADED with
//! `Retry-After`, instead of queueing them.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;

use hmdp::limits::Rule;
use hmdp_test_support::wait_until;

use crate::helpers::{limits_enforcing_only, metric, spawn_app};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_past_what_the_node_admits_at_once_are_answered_503_at_once() {
    let app = spawn_app(|s| {
        s.shed.shed_latency_ms = 100;
        s.shed.shed_min_in_flight = 2;
        s.shed.shed_max_in_flight = 4;
        // Every purchase holds its lock and transaction this long: four
        // of them fill the node for that long.
        s.chaos_hold_ms = 1_500;
    })
    .await;
    let voucher = app.create_open_seckill(100).await;
    let tokens = app.login_many(12).await;
    let shed_before = metric(&app.address, "hmdp_purchases_shed_total").await;
    let path = format!("/voucher-order/seckill/{voucher}");

    let started = Instant::now();
    let answers = join_all(tokens.iter().map(|token| async {
        let answer = app.post(&path, Some(token)).await;
        (answer.status(), started.elapsed(), answer)
    }))
    .await;

    let mut shed = 0;
    for (status, took, answer) in answers {
        if status != StatusCode::SERVICE_UNAVAILABLE {
            let body: Value = answer.json().await.unwrap();
            assert_eq!(body["success"], true, "{body}");
            continue;
        }
        shed += 1;
        assert_eq!(answer.headers()["retry-after"], "1");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["errorCode"], "OVERLOADED", "{body}");
        // At once: not after waiting behind the purchases held.
        assert!(took < Duration::from_millis(1_500), "shed after {took:?}");
    }
    // Four admitted at once at most: the others were shed.
    assert!(shed >= 8, "{shed} of 12 shed");
    let shed_metric = metric(&app.address, "hmdp_purchases_shed_total").await;
    assert_eq!(shed_metric - shed_before, f64::from(shed));
}

/// A synchronous purchase over its buyer's limit is refused by the limit
/// (429) before the node sheds: it never takes a place among the purchases
/// admitted, nor is it told to come back in a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_over_its_limit_is_refused_429_even_when_the_node_sheds() {
    let limits = limits_enforcing_only(&[(Rule::PurchaseByUser, "1/1m")]);
    let app = spawn_app(|s| {
        s.shed.shed_latency_ms = 100;
        s.shed.shed_min_in_flight = 1;
        s.shed.shed_max_in_flight = 1;
        s.chaos_hold_ms = 1_500;
        s.limits = limits;
    })
    .await;
    let voucher = app.create_open_seckill(10).await;
    let tokens = app.login_many(2).await;
    let path = format!("/voucher-order/seckill/{voucher}");
    // The second user spends their one purchase a minute on a voucher that
    // is not there (answered at once, nothing held).
    let spent: Value = app
        .post_json("/voucher-order/seckill/999999", Some(&tokens[1]))
        .await;
    assert_eq!(spent["errorCode"], "VOUCHER_NOT_FOUND", "{spent}");

    // The first user's purchase fills the node's one place for 1.5 s (its
    // lock taken: it was admitted)...
    let lock = app.keys().order_lock(app.user_id(&tokens[0]).await);
    let held = app.post_json(&path, Some(&tokens[0]));
    let over = async {
        wait_until(
            "the first purchase admitted",
            Duration::from_secs(10),
            || app.key_exists(&lock),
        )
        .await;
        app.post(&path, Some(&tokens[1])).await
    };
    let (held, over) = tokio::join!(held, over);
    assert_eq!(held["success"], true, "{held}");
    // ...and the second user's, over their limit, is refused by it.
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = over.json().await.unwrap();
    assert_eq!(body["errorCode"], "RATE_LIMITED", "{body}");
}
