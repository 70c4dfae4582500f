//! `/health`, `/ready` and unknown routes.

use serde_json::Value;

use crate::helpers::spawn_app;

#[tokio::test]
async fn health_and_ready_answer_200() {
    let app = spawn_app(&[]).await;
    for path in ["/health", "/ready"] {
        let response = app.get(path, None).await;
        assert_eq!(response.status(), 200, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["success"], true);
    }
}

#[tokio::test]
async fn unknown_route_is_404_with_result_body() {
    let app = spawn_app(&[]).await;
    let response = app.get("/no/such/route", None).await;
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["success"], false);
    assert_eq!(body["errorCode"], "NOT_FOUND");
}
