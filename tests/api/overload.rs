//! Load shedding: a node whose purchases run past its latency target admits
//! fewer at once and answers the rest at once, 503 OVERLOADED with
//! `Retry-After`, instead of queueing them.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{metric, spawn_app};

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
