//! Graceful shutdown: SIGTERM during load stops accepting, lets every
//! in-flight purchase finish and release its lock, and exits 0.

use std::time::Duration;

use futures::future::join_all;
use hmdp_test_support::wait_until;
use serde_json::Value;

use crate::helpers::{spawn_app, NodeProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_purchases_and_exits_zero() {
    const USERS: usize = 20;
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(100).await;
    let tokens = app.login_many(USERS).await;
    // Twenty purchases hold 1.5 s each, then queue for the stock row: the
    // statements get longer than the default 2 s.
    let flags = [
        "--lock=reentrant",
        "--chaos-hold-ms=1500",
        "--backend-timeout-ms=10000",
    ];
    let mut node = NodeProcess::start(&app, &flags).await;

    let client = reqwest::Client::new();
    let in_flight = join_all(tokens.iter().map(|token| {
        client
            .post(format!("{}/voucher-order/seckill/{voucher}", node.address))
            .header("authorization", token)
            .send()
    }));
    let terminate = async {
        wait_until(
            "every purchase inside its critical section",
            Duration::from_secs(10),
            || async { app.lock_keys().await.len() == USERS },
        )
        .await;
        node.terminate().expect("SIGTERM sent");
        // A fresh connection after SIGTERM is not served, once the node has
        // closed its listener.
        let fresh_health_check = || {
            reqwest::Client::new()
                .get(format!("{}/health", node.address))
                .timeout(Duration::from_secs(2))
                .send()
        };
        // Within 2 s, about as long as the purchases still drain: a bound
        // that is part of the check, not a hang guard. The node exits once
        // they are done, and a check after that passes whatever it did.
        wait_until(
            "the node stopped accepting",
            Duration::from_secs(2),
            || async { fresh_health_check().await.is_err() },
        )
        .await;
    };
    let (responses, ()) = tokio::join!(in_flight, terminate);

    for response in responses {
        let response = response.expect("in-flight request answered");
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["success"], true, "{body}");
    }
    let status = node.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}"
    );

    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.duplicate_users),
        (USERS as i64, 0)
    );
    assert!(audit.stock_balances(100));
    let locks = app.lock_keys().await;
    assert!(locks.is_empty(), "every lock released: {locks:?}");
}
