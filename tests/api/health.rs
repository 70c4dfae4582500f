//! `/health`, `/ready` and unknown routes.

use serde_json::Value;

use crate::helpers::spawn_app;

#[tokio::test]
async fn health_and_ready_answer_200() {
    let app = spawn_app(|_| {}).await;
    for path in ["/health", "/ready"] {
        let response = app.get(path, None).await;
        assert_eq!(response.status(), 200, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["success"], true);
    }
}

#[tokio::test]
async fn unknown_route_is_404_with_result_body() {
    let app = spawn_app(|_| {}).await;
    let response = app.get("/no/such/route", None).await;
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["success"], false);
    assert_eq!(body["errorCode"], "NOT_FOUND");
}

#[tokio::test]
async fn metrics_count_requests_and_purchases() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(5).await;
    let token = app.login(&crate::helpers::phone(1)).await;
    app.purchase(voucher, &token).await;
    app.purchase(voucher, &token).await;
    let response = app.get("/metrics", None).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    for expected in [
        "http_requests_total{method=\"POST\",route=\"/voucher-order/seckill/{voucherId}\",status=\"200\"}",
        "purchases_total{outcome=\"ok\"}",
        "purchases_total{outcome=\"ALREADY_ORDERED\"}",
        "lock_acquire_duration_seconds_bucket{mode=\"reentrant\"",
        "db_pool_connections{state=\"idle\"}",
        "http_request_duration_seconds_bucket",
        "lock_busy_total",
        "redis_errors_total{kind=\"moved\"}",
        "redis_errors_total{kind=\"connection\"}",
        "lock_watchdog_renewals_total",
        "lock_lost_total",
        "fencing_rejections_total",
    ] {
        assert!(text.contains(expected), "missing {expected} in:\n{text}");
    }
}

#[tokio::test]
async fn made_up_methods_share_one_metrics_label() {
    let app = spawn_app(|_| {}).await;
    for method in ["FOOBAR", "BREW", "X-ANYTHING"] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = app
            .client
            .request(method, app.url("/health"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405);
        assert_eq!(response.headers()["allow"], "GET");
    }
    let text = app.get("/metrics", None).await.text().await.unwrap();
    assert!(text.contains("method=\"OTHER\""), "{text}");
    for made_up in ["FOOBAR", "BREW", "X-ANYTHING"] {
        assert!(!text.contains(made_up), "{made_up} became a label");
    }
}
