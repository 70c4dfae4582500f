//! What a node writes to its log: a business "no" (HTTP 200, `success:false`)
//! is routine and logs nothing, while a backend failure is still reported.

use futures::future::join_all;
use hmdp::ids::VoucherId;
use hmdp_test_support::free_ports;

use crate::helpers::{phone, spawn_app, NodeProcess};

/// Refusals made against the node; their log must stay within
/// [`MAX_LOG_BYTES_FOR_REFUSALS`].
const REFUSALS: usize = 100;
/// Room for a few lines a node may log for its own reasons meanwhile, far
/// below one line per refusal.
const MAX_LOG_BYTES_FOR_REFUSALS: u64 = 2048;

async fn purchase(node: &NodeProcess, voucher: VoucherId, token: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/voucher-order/seckill/{voucher}", node.address))
        .header("authorization", token)
        .send()
        .await
        .unwrap()
}

fn log_bytes(node: &NodeProcess) -> u64 {
    node.log().len() as u64
}

#[tokio::test]
async fn refused_purchases_are_not_logged_as_errors() {
    let app = spawn_app(|_| {}).await;
    let sold_out = app.create_open_seckill(1).await;
    let plenty = app.create_open_seckill(10).await;
    let (first, second) = (app.login(&phone(1)).await, app.login(&phone(2)).await);
    assert_eq!(app.purchase(sold_out, &first).await["success"], true);
    assert_eq!(app.purchase(plenty, &second).await["success"], true);
    let node = NodeProcess::start(&app, &[]).await;
    let before = log_bytes(&node);

    // Half buy what is gone, half buy again what they already have.
    let refusals = (0..REFUSALS).map(|i| {
        let voucher = if i % 2 == 0 { sold_out } else { plenty };
        purchase(&node, voucher, &second)
    });
    for response in join_all(refusals).await {
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["success"], false, "{body}");
    }

    let grown = log_bytes(&node) - before;
    let log = node.log();
    println!("{REFUSALS} refusals grew the node log by {grown} bytes");
    let errors: Vec<&str> = log.lines().filter(|line| line.contains("ERROR")).collect();
    assert!(
        errors.is_empty(),
        "{} ERROR lines for {REFUSALS} refusals ({grown} bytes of log), the first: {}",
        errors.len(),
        errors[0]
    );
    assert!(
        grown < MAX_LOG_BYTES_FOR_REFUSALS,
        "{REFUSALS} refusals logged {grown} bytes:\n{log}"
    );
}

#[tokio::test]
async fn an_unreachable_mysql_is_still_logged() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(1)).await;
    let [closed] = free_ports().unwrap();
    let node = NodeProcess::start(
        &app,
        &[
            &format!("--database-url=mysql://root@127.0.0.1:{closed}/hmdp"),
            "--backend-timeout-ms=500",
        ],
    )
    .await;

    let response = purchase(&node, VoucherId::new(10), &token).await;

    assert_eq!(response.status(), 503);
    let log = node.log();
    assert!(
        log.lines()
            .any(|line| line.contains("WARN") && line.contains("backend unavailable")),
        "no warning of the unreachable MySQL in:\n{log}"
    );
}

#[tokio::test]
async fn json_logs_are_one_object_a_line_with_the_requests_fields() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(1)).await;
    let [closed] = free_ports().unwrap();
    let node = NodeProcess::start(
        &app,
        &[
            "--log-format=json",
            &format!("--database-url=mysql://root@127.0.0.1:{closed}/hmdp"),
            "--backend-timeout-ms=500",
        ],
    )
    .await;

    let response = reqwest::Client::new()
        .post(format!("{}/voucher-order/seckill/10", node.address))
        .header("authorization", &token)
        .header("x-request-id", "json-log-request")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);

    let log = node.log();
    // The harness writes its own `--- ...` lines between the node's.
    let lines: Vec<serde_json::Value> = (log.lines())
        .filter(|line| !line.starts_with("--- "))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect();
    let warning = (lines.iter())
        .find(|line| line["message"] == "backend unavailable")
        .unwrap_or_else(|| panic!("no warning of the unreachable MySQL in:\n{log}"));
    assert_eq!(warning["level"], "WARN", "{warning}");
    let spans = warning["spans"].as_array().expect("the enclosing spans");
    assert!(
        spans
            .iter()
            .any(|span| span["x_request_id"] == "json-log-request"),
        "the request id on its line: {warning}"
    );
}
