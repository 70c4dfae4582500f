//! `/voucher*`: admin-guarded creation, validation, the shop list.

use serde_json::{json, Value};

use crate::helpers::{seckill_body, serve_refusal, spawn_app, ADMIN_TOKEN};

#[tokio::test]
async fn creating_a_voucher_needs_the_admin_token() {
    let app = spawn_app(|_| {}).await;
    let body = seckill_body(10, "2020-01-01T00:00:00", "2030-01-01T00:00:00");
    for path in ["/voucher", "/voucher/seckill"] {
        let response = app.post_voucher(path, "wrong", &body).await;
        assert_eq!(response.status(), 403, "{path}");
        let result: Value = response.json().await.unwrap();
        assert_eq!(result["errorCode"], "FORBIDDEN");
        let response = app
            .client
            .post(app.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{path} without header");
    }
}

#[tokio::test]
async fn an_empty_admin_token_header_is_refused() {
    let app = spawn_app(|_| {}).await;
    let body = seckill_body(10, "2020-01-01T00:00:00", "2030-01-01T00:00:00");
    let response = app.post_voucher("/voucher/seckill", "", &body).await;
    assert_eq!(response.status(), 403);
}

/// `HMDP_ADMIN_TOKEN=` (set, but empty) would make an empty `x-admin-token`
/// an admin's: the node must refuse to start instead.
#[tokio::test]
async fn serve_refuses_to_start_with_an_empty_admin_token() {
    let stderr = serve_refusal(&[], &[("HMDP_ADMIN_TOKEN", "")], "an empty admin token").await;
    assert!(
        stderr.contains("HMDP_ADMIN_TOKEN") && stderr.contains("16 characters"),
        "{stderr}"
    );
}

#[tokio::test]
async fn ordinary_and_seckill_vouchers_are_listed_with_string_ids() {
    let app = spawn_app(|_| {}).await;
    let ordinary = json!({
        "shopId": 1, "title": "50元代金券", "subTitle": "周末可用",
        "rules": "全场通用", "payValue": 4750, "actualValue": 5000, "type": 0
    });
    let body: Value = app
        .post_voucher("/voucher", ADMIN_TOKEN, &ordinary)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["success"], true);
    let ordinary_id = body["data"].as_str().expect("id as string").to_owned();

    let seckill_id = app
        .create_seckill(100, "2026-12-01T10:00:00", "2026-12-02T10:00:00")
        .await;

    let body: Value = app.get_json("/voucher/list/1", None).await;
    let list = body["data"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["id"], ordinary_id);
    assert!(list[0].get("stock").is_none());
    assert_eq!(list[1]["id"], seckill_id.to_string());
    assert_eq!(list[1]["stock"], 100);
    assert_eq!(list[1]["beginTime"], "2026-12-01T10:00:00");
    assert_eq!(list[1]["endTime"], "2026-12-02T10:00:00");
    assert_eq!(list[1]["payValue"], 8000);
    assert_eq!(list[1]["subTitle"], "周一至周日均可使用");

    let other: Value = app.get_json("/voucher/list/2", None).await;
    assert_eq!(other["data"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn invalid_vouchers_are_400() {
    let app = spawn_app(|_| {}).await;
    let ok = seckill_body(10, "2026-01-01T00:00:00", "2027-01-01T00:00:00");
    let with = |field: &str, value: Value| {
        let mut body = ok.clone();
        body[field] = value;
        body
    };
    let mut missing_stock = ok.clone();
    missing_stock.as_object_mut().unwrap().remove("stock");
    let cases = [
        with("endTime", json!("2025-01-01T00:00:00")),
        with("stock", json!(-1)),
        with("payValue", json!(-5)),
        with("actualValue", json!(-5)),
        with("title", json!("")),
        with("beginTime", json!("yesterday")),
        with("endTime", json!("2099-01-01T00:00:00")),
        with("status", json!(9)),
        with("shards", json!(0)),
        with("shards", json!(65)),
        with("shards", json!(-2)),
        missing_stock,
    ];
    for body in cases {
        let response = app
            .post_voucher("/voucher/seckill", ADMIN_TOKEN, &body)
            .await;
        assert_eq!(response.status(), 400, "{body}");
        let result: Value = response.json().await.unwrap();
        assert_eq!(result["errorCode"], "BAD_REQUEST");
    }
}

#[tokio::test]
async fn text_fields_are_stored_verbatim() {
    let app = spawn_app(|_| {}).await;
    let nasty = "'; DROP TABLE tb_voucher; -- \"秒杀\" \\ %_";
    let mut body = seckill_body(1, "2026-01-01T00:00:00", "2027-01-01T00:00:00");
    body["title"] = json!(nasty);
    body["rules"] = json!(nasty);
    let result: Value = app
        .post_voucher("/voucher/seckill", ADMIN_TOKEN, &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(result["success"], true);
    let list: Value = app.get_json("/voucher/list/1", None).await;
    assert_eq!(list["data"][0]["title"], nasty);
    assert_eq!(list["data"][0]["rules"], nasty);
}

#[tokio::test]
async fn non_numeric_shop_id_is_400() {
    let app = spawn_app(|_| {}).await;
    for bad in ["abc", "-1", "0", "99999999999999999999"] {
        let response = app.get(&format!("/voucher/list/{bad}"), None).await;
        assert_eq!(response.status(), 400, "{bad}");
    }
}

/// The sale's shard count is the request's, else the node's
/// `--seckill-shards`, and is kept with the voucher.
#[tokio::test]
async fn a_seckill_voucher_keeps_the_shard_count_it_was_created_with() {
    let app = spawn_app(|s| s.seckill_shards = 4).await;
    let mut body = seckill_body(10, "2026-01-01T00:00:00", "2027-01-01T00:00:00");
    let shards_of = async |body: &Value| {
        let created: Value = (app
            .post_voucher("/voucher/seckill", ADMIN_TOKEN, body)
            .await)
            .json()
            .await
            .unwrap();
        let id: i64 = created["data"].as_str().unwrap().parse().unwrap();
        app.tables().shards(id).await.unwrap()
    };
    assert_eq!(shards_of(&body).await, 4);
    body["shards"] = json!(64);
    assert_eq!(shards_of(&body).await, 64);
    body["shards"] = json!(1);
    assert_eq!(shards_of(&body).await, 1);
}
