//! The invariants under concurrency on one node: 200 users, each firing 5
//! purchases at once, stock 100.

use futures::future::join_all;
use serde_json::Value;

use hmdp_lock::LockMode;

use crate::helpers::{spawn_app, TestApp};

const USERS: usize = 200;
const PER_USER: usize = 5;
const STOCK: i64 = 100;

/// Every user fires all their purchases at once; returns the audit.
async fn storm(app: &TestApp) -> hmdp::store::VoucherAudit {
    let voucher = app.create_open_seckill(STOCK).await;
    let tokens = app.login_many(USERS).await;
    let requests = tokens
        .iter()
        .flat_map(|token| (0..PER_USER).map(move |_| app.purchase(voucher, token)));
    let results: Vec<Value> = join_all(requests).await;
    for result in &results {
        assert!(
            result["success"] == true
                || ["SOLD_OUT", "DUPLICATE_REQUEST", "ALREADY_ORDERED"]
                    .contains(&result["errorCode"].as_str().unwrap_or_default()),
            "unexpected outcome {result}"
        );
    }
    let successes = results.iter().filter(|r| r["success"] == true).count() as i64;
    let audit = app.audit(voucher).await;
    assert_eq!(successes, audit.active_orders, "every success is an order");
    println!("{USERS} users x {PER_USER} requests, stock {STOCK}: {audit:?}");
    audit
}

/// Asserts the one-order-per-user invariants of docs/design.md.
pub fn assert_one_order_per_user(audit: hmdp::store::VoucherAudit) {
    assert!(
        audit.stock_balances(STOCK),
        "orders + stock == initial: {audit:?}"
    );
    assert_eq!(audit.oversold(STOCK), 0, "{audit:?}");
    assert_eq!(audit.duplicate_users, 0, "{audit:?}");
    assert_eq!(audit.active_orders, STOCK, "all stock sold: {audit:?}");
    assert_eq!(audit.stock_left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_lock_keeps_one_order_per_user_on_one_node() {
    let app = spawn_app(|s| {
        s.lock.mode = LockMode::Local;
        s.db_pool = 64;
    })
    .await;
    assert_one_order_per_user(storm(&app).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lock_with_a_chaos_hold_lets_duplicates_through() {
    let app = spawn_app(|s| {
        s.lock.mode = LockMode::NoLock;
        s.chaos_hold_ms = 50;
        s.db_pool = 64;
    })
    .await;
    let audit = storm(&app).await;
    assert!(
        audit.duplicate_users > 0,
        "the failure must be visible: {audit:?}"
    );
    assert!(
        audit.stock_balances(STOCK),
        "stock still balances: {audit:?}"
    );
    assert_eq!(
        audit.oversold(STOCK),
        0,
        "the stock > 0 condition still holds"
    );
}

/// The purchase storm on one node, no chaos, with one lock mode: no user gets
/// two orders and nothing is oversold.
macro_rules! one_node_keeps_one_order_per_user {
    ($name:ident, $mode:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn keeps_one_order_per_user_on_one_node() {
                let app = spawn_app(|s| {
                    s.lock.mode = $mode;
                    s.db_pool = 64;
                })
                .await;
                assert_one_order_per_user(storm(&app).await);
            }
        }
    };
}

one_node_keeps_one_order_per_user!(redis_naive, LockMode::RedisNaive);
one_node_keeps_one_order_per_user!(redis_owner, LockMode::RedisOwner);
one_node_keeps_one_order_per_user!(redis_lua, LockMode::RedisLua);
