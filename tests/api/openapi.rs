//! The contract (`/openapi.json`): what the node serves is the copy kept in
//! `docs/openapi.json`, it is a valid OpenAPI document, and what fuzzing it
//! found stays fixed (the fuzzing itself runs against two nodes behind
//! nginx: `the_api_holds_its_contract_under_schemathesis` in the tools'
//! `tests/contract.rs`).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::helpers::{spawn_app, ADMIN_TOKEN};

const KEPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");

#[tokio::test]
async fn the_served_contract_is_the_one_kept_in_docs_and_it_validates() {
    let app = spawn_app(|_| {}).await;
    let response = app.get("/openapi.json", None).await;
    assert_eq!(response.status(), 200);
    let served: Value = response.json().await.unwrap();
    let kept: Value = serde_json::from_str(&std::fs::read_to_string(KEPT).unwrap()).unwrap();
    assert!(
        served == kept,
        "docs/openapi.json is not what the node serves: \
         run `cargo run --bin hmdp-server -- openapi > docs/openapi.json`"
    );
    assert_eq!(served["openapi"], "3.1.0");

    let validated = Command::new("openapi-spec-validator")
        .arg(Path::new(KEPT))
        .output()
        .expect("openapi-spec-validator is installed (scripts/services.sh)");
    assert!(
        validated.status.success(),
        "{}{}",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );
}

/// Found by fuzzing: a method a path does not take was answered 404, as if
/// the path did not exist. It is 405 with the path's methods in `Allow`.
#[tokio::test]
async fn a_method_the_path_does_not_take_is_405_with_allow() {
    let app = spawn_app(|_| {}).await;
    let client = reqwest::Client::new();
    for (method, path, allowed) in [
        (reqwest::Method::PUT, "/user/code", "POST"),
        (reqwest::Method::DELETE, "/voucher-order/1", "GET"),
        (reqwest::Method::GET, "/voucher/seckill", "POST"),
    ] {
        let response = client
            .request(method.clone(), app.url(path))
            .header("x-admin-token", ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{method} {path}");
        assert_eq!(response.headers()["allow"], allowed, "{method} {path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["errorCode"], "METHOD_NOT_ALLOWED", "{body}");
    }
    assert_eq!(app.get("/no/such/path", None).await.status(), 404);
}

/// Found by fuzzing: a page number past a Java `Integer` (hmdp's type for
/// `current`) was read as a page.
#[tokio::test]
async fn a_page_number_past_a_java_integer_is_400() {
    let app = spawn_app(|_| {}).await;
    for query in ["current=2147483648", "current=0", "current=-1"] {
        let response = app.get(&format!("/blog/hot?{query}"), None).await;
        assert_eq!(response.status(), 400, "{query}");
    }
    assert_eq!(
        app.get("/blog/hot?current=2147483647", None).await.status(),
        200
    );
}
