//! Sold out everywhere at once: the node that sees a sale sell out tells
//! the other over Redis pub/sub, which then refuses from memory; a unit
//! given back is told the same way.

use std::time::{Duration, Instant};

use hmdp_test_support::wait_until;
use serde_json::Value;

use crate::helpers::{buy_at, metric, spawn_app, NodeProcess};

/// A hang guard: the news crosses a local Redis in about a millisecond.
const HEARD_WITHIN: Duration = Duration::from_secs(5);

async fn heard(address: &str, news: &str) -> f64 {
    metric(
        address,
        &format!("hmdp_sale_news_heard_total{{news=\"{news}\"}}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_sold_out_on_one_node_is_known_to_the_other_at_once() {
    let app = spawn_app(|_| {}).await;
    let other = NodeProcess::start(&app, &[]).await;
    let voucher = app.create_open_seckill(2).await;
    let tokens = app.login_many(4).await;

    // The other node knows the voucher (and sells one of its units).
    let bought = buy_at(&other.address, voucher, &tokens[0]).await;
    assert_eq!(bought["success"], true, "{bought}");
    let bought = buy_at(&app.address, voucher, &tokens[1]).await;
    assert_eq!(bought["success"], true, "{bought}");
    let order = bought["data"].as_str().unwrap().to_owned();
    let heard_before = heard(&other.address, "sold-out").await;

    // This node sees the sale sell out...
    let refused = buy_at(&app.address, voucher, &tokens[2]).await;
    assert_eq!(refused["errorCode"], "SOLD_OUT", "{refused}");
    let seen = Instant::now();
    // ...and the other hears it.
    wait_until(
        "the other node hears the sale sold out",
        HEARD_WITHIN,
        || async { heard(&other.address, "sold-out").await > heard_before },
    )
    .await;
    println!("heard after {:?}", seen.elapsed());
    // Refused from memory: no lock taken, no transaction.
    let locks = "lock_acquire_duration_seconds_count{mode=\"reentrant\"}";
    let locks_before = metric(&other.address, locks).await;
    let refused: Value = buy_at(&other.address, voucher, &tokens[2]).await;
    assert_eq!(refused["errorCode"], "SOLD_OUT", "{refused}");
    assert_eq!(metric(&other.address, locks).await, locks_before);

    // A unit given back on this node is news too: the other node sells it
    // at once, not once it reads the voucher again.
    let returned_before = heard(&other.address, "returned").await;
    let path = format!("/voucher-order/{order}/cancel");
    let cancelled = app.post_json(&path, Some(&tokens[1])).await;
    assert_eq!(cancelled["success"], true, "{cancelled}");
    wait_until(
        "the other node hears the unit came back",
        HEARD_WITHIN,
        || async { heard(&other.address, "returned").await > returned_before },
    )
    .await;
    let bought = buy_at(&other.address, voucher, &tokens[3]).await;
    assert_eq!(bought["success"], true, "{bought}");
}
