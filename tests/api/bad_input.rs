//! Hostile and malformed input: every case gets its documented status and
//! `errorCode`, and the node keeps serving afterwards.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};

use crate::helpers::{phone, seckill_body, spawn_app, TestApp, ADMIN_TOKEN};

async fn assert_still_serving(app: &TestApp) {
    assert_eq!(app.get("/health", None).await.status(), 200);
}

#[tokio::test]
async fn random_bytes_as_json_bodies_never_cause_a_5xx() {
    let app = spawn_app(|_| {}).await;
    let mut rng = StdRng::seed_from_u64(20261130);
    let paths = ["/user/login", "/voucher", "/voucher/seckill"];
    for case in 0..300 {
        let len = rng.random_range(0..512);
        let body: Vec<u8> = match case % 3 {
            // raw bytes, often not UTF-8
            0 => (0..len).map(|_| rng.random()).collect(),
            // JSON-looking noise
            1 => {
                let alphabet = b"{}[]\":,0123456789.-eE truefalsnul\\\x00\xff";
                (0..len)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect()
            }
            // well-formed JSON with wrong types
            _ => json!({
                "phone": rng.random::<i64>(), "code": [1, 2],
                "shopId": "x", "title": null, "stock": rng.random::<f64>(),
                "payValue": -1, "beginTime": 12
            })
            .to_string()
            .into_bytes(),
        };
        let path = paths[case % paths.len()];
        let response = app
            .client
            .post(app.url(path))
            .header("content-type", "application/json")
            .header("x-admin-token", ADMIN_TOKEN)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        assert!(
            [200, 400].contains(&status),
            "{path} answered {status} to {:?}",
            String::from_utf8_lossy(&body)
        );
        if status == 400 {
            let result: Value = response.json().await.unwrap();
            assert_eq!(result["errorCode"], "BAD_REQUEST");
        }
    }
    assert_still_serving(&app).await;
}

#[tokio::test]
async fn non_utf8_and_sql_metacharacters_in_text_fields() {
    let app = spawn_app(|_| {}).await;
    let mut bytes = br#"{"phone":"13800000001","code":"12"#.to_vec();
    bytes.extend_from_slice(&[0xff, 0xfe]);
    bytes.extend_from_slice(br#""}"#);
    let response = app
        .client
        .post(app.url("/user/login"))
        .header("content-type", "application/json")
        .body(bytes)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "invalid UTF-8 in JSON");

    let code: Value = app
        .client
        .post(app.url("/user/code?phone=138%FF%FE1234567"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(code["success"], false, "{code}");

    let injected: Value = app
        .post_login(&json!({"phone": "13800000001' OR '1'='1", "code": "1' OR '1'='1"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(injected["errorCode"], "PHONE_INVALID");

    let mut body = seckill_body(1, "2026-01-01T00:00:00", "2027-01-01T00:00:00");
    body["subTitle"] = json!("\u{0}\u{1f}\u{202e}😀 `; SELECT SLEEP(10); --");
    let created: Value = app
        .post_voucher("/voucher/seckill", ADMIN_TOKEN, &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(created["success"], true);
    let list: Value = app.get_json("/voucher/list/1", None).await;
    assert_eq!(list["data"][0]["subTitle"], body["subTitle"]);
    assert_still_serving(&app).await;
}

#[tokio::test]
async fn forged_and_non_ascii_tokens_are_401() {
    let app = spawn_app(|_| {}).await;
    let long = "a".repeat(5000);
    for token in ["x", "' OR 1=1 --", "*", long.as_str()] {
        assert_eq!(
            app.get("/user/me", Some(token)).await.status(),
            401,
            "{token}"
        );
    }
    let response = app
        .client
        .get(app.url("/user/me"))
        .header(
            "authorization",
            reqwest::header::HeaderValue::from_bytes(&[0xff, 0xfe, b'a']).unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_still_serving(&app).await;
}

#[tokio::test]
async fn huge_headers_are_refused_and_the_node_keeps_serving() {
    let app = spawn_app(|_| {}).await;
    let response = app
        .client
        .get(app.url("/health"))
        .header("x-padding", "p".repeat(256 * 1024))
        .send()
        .await;
    match response {
        Ok(response) => assert!(response.status().is_client_error(), "{}", response.status()),
        // The node may also close the connection on an oversized head.
        Err(error) => assert!(
            error.is_request() || error.is_connect() || error.is_body(),
            "{error}"
        ),
    }
    assert_still_serving(&app).await;
}

#[tokio::test]
async fn overflowing_negative_and_zero_ids_are_400_everywhere() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(1)).await;
    for bad in [
        "0",
        "-1",
        "18446744073709551616",
        "9223372036854775808",
        "1x",
        "%00",
    ] {
        for (method, path) in [
            ("POST", format!("/voucher-order/seckill/{bad}")),
            ("GET", format!("/voucher-order/{bad}")),
            ("GET", format!("/voucher/list/{bad}")),
            ("GET", format!("/shop/{bad}")),
            ("GET", format!("/user/info/{bad}")),
        ] {
            let request = match method {
                "POST" => app.client.post(app.url(&path)),
                _ => app.client.get(app.url(&path)),
            };
            let response = request
                .header("authorization", &token)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 400, "{method} {path}");
        }
    }
    assert_still_serving(&app).await;
}
