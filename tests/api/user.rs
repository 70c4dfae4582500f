//! `/user/*`: login by code, sessions, logout.

use std::time::{Duration, Instant};

use futures::future::join_all;
use hmdp_test_support::{wait_until, RedisServer};
use redis::AsyncCommands;
use serde_json::Value;

use crate::helpers::{command_calls, phone, send_then_reset, socket_address, spawn_app, TestApp};

#[tokio::test]
async fn code_then_login_returns_a_random_hex_token() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(1)).await;
    assert_eq!(token.len(), 32);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));

    let body: Value = app.get_json("/user/me", Some(&token)).await;
    assert_eq!(body["success"], true);
    assert!(body["data"]["id"].as_u64().unwrap() >= 1010);
    assert!(body["data"]["nickName"]
        .as_str()
        .unwrap()
        .starts_with("user_"));
}

#[tokio::test]
async fn same_phone_logs_in_as_the_same_user() {
    let app = spawn_app(|s| s.code_interval_secs = 0).await;
    let first = app.login(&phone(7)).await;
    let second = app.login(&phone(7)).await;
    assert_ne!(first, second);
    let me = |token: String| {
        let app = &app;
        async move {
            let body: Value = app.get_json("/user/me", Some(&token)).await;
            body["data"]["id"].clone()
        }
    };
    assert_eq!(me(first).await, me(second).await);
}

#[tokio::test]
async fn bad_phone_is_refused_with_phone_invalid() {
    let app = spawn_app(|_| {}).await;
    for bad in ["12345", "23812345678", "1381234567x"] {
        let response = app.request_code(bad).await;
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["success"], false);
        assert_eq!(body["errorCode"], "PHONE_INVALID");
        assert_eq!(body["errorMsg"], "手机号格式错误！");
    }
    let body: Value = app.try_login("123", "123456").await;
    assert_eq!(body["errorCode"], "PHONE_INVALID");
}

#[tokio::test]
async fn missing_phone_parameter_is_400() {
    let app = spawn_app(|_| {}).await;
    let response = app.post("/user/code", None).await;
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn wrong_code_is_refused_and_right_code_is_single_use() {
    let app = spawn_app(|_| {}).await;
    let phone = phone(2);
    app.request_code(&phone).await;
    let code = app.stored_code(&phone).await.unwrap();
    let wrong = if code == "000000" { "111111" } else { "000000" };
    let body: Value = app.try_login(&phone, wrong).await;
    assert_eq!(body["errorCode"], "CODE_INVALID");

    let ok: Value = app.try_login(&phone, &code).await;
    assert_eq!(ok["success"], true);
    let reused: Value = app.try_login(&phone, &code).await;
    assert_eq!(reused["errorCode"], "CODE_INVALID");
}

#[tokio::test]
async fn login_without_code_request_is_refused() {
    let app = spawn_app(|_| {}).await;
    let body: Value = app.try_login(&phone(3), "123456").await;
    assert_eq!(body["errorCode"], "CODE_INVALID");
}

#[tokio::test]
async fn malformed_and_oversized_login_bodies() {
    let app = spawn_app(|_| {}).await;
    let send = |body: String| {
        app.client
            .post(app.url("/user/login"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let response = send("{not json".into()).await.unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["errorCode"], "BAD_REQUEST");

    let response = send(r#"{"phone":"13800000001"}"#.into()).await.unwrap();
    assert_eq!(response.status(), 400, "missing field");

    let huge = format!(r#"{{"phone":"{}","code":"1"}}"#, "1".repeat(100_000));
    let response = send(huge).await.unwrap();
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["errorCode"], "PAYLOAD_TOO_LARGE");
}

#[tokio::test]
async fn missing_forged_and_expired_tokens_are_401() {
    let app = spawn_app(|_| {}).await;
    assert_eq!(app.get("/user/me", None).await.status(), 401);
    assert_eq!(
        app.get("/user/me", Some("0123456789abcdef0123456789abcdef"))
            .await
            .status(),
        401
    );

    let token = app.login(&phone(4)).await;
    end_session_in_redis(&app, &token).await;
    assert_eq!(app.get("/user/me", Some(&token)).await.status(), 401);
}

/// A node reading a session from Redis refreshes its TTL (a request within
/// the node's keeping time reads nothing, and refreshes nothing).
#[tokio::test]
async fn a_session_read_from_redis_refreshes_its_ttl() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(5)).await;
    let key = app.keys().login_token(&token);
    let _: () = app.redis.clone().expire(&key, 5).await.unwrap();
    assert_eq!(app.get("/user/me", Some(&token)).await.status(), 200);
    let ttl: i64 = app.redis.clone().ttl(&key).await.unwrap();
    assert!(ttl > 29 * 60, "ttl after refresh: {ttl}");
}

#[tokio::test]
async fn logout_ends_the_session() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(6)).await;
    // Read once, so that the node keeps the session in memory: the logout
    // must forget it there too.
    assert_eq!(app.get("/user/me", Some(&token)).await.status(), 200);
    let body: Value = app.post_json("/user/logout", Some(&token)).await;
    assert_eq!(body["success"], true);
    assert_eq!(app.get("/user/me", Some(&token)).await.status(), 401);
    assert_eq!(app.post("/user/logout", Some(&token)).await.status(), 401);
}

#[tokio::test]
async fn five_wrong_guesses_invalidate_the_code() {
    let app = spawn_app(|_| {}).await;
    let phone = phone(8);
    app.request_code(&phone).await;
    let code = app.stored_code(&phone).await.unwrap();
    let wrong = if code == "000000" { "111111" } else { "000000" };
    for _ in 0..5 {
        let body: Value = app.try_login(&phone, wrong).await;
        assert_eq!(body["errorCode"], "CODE_INVALID");
    }
    assert_eq!(app.stored_code(&phone).await, None, "code invalidated");
    let body: Value = app.try_login(&phone, &code).await;
    assert_eq!(
        body["errorCode"], "CODE_INVALID",
        "the right code no longer works"
    );
}

#[tokio::test]
async fn a_phone_gets_one_code_per_interval() {
    let app = spawn_app(|s| s.code_interval_secs = 1).await;
    let phone = phone(9);
    let first: Value = app.request_code(&phone).await.json().await.unwrap();
    assert_eq!(first["success"], true);
    let second: Value = app.request_code(&phone).await.json().await.unwrap();
    assert_eq!(second["errorCode"], "CODE_TOO_FREQUENT");
    let other: Value = app
        .request_code(&super::helpers::phone(10))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(other["success"], true, "the limit is per phone");
    let limit = app.keys().login_code_limit(&phone);
    wait_until("the interval over", Duration::from_secs(10), || async {
        !app.key_exists(&limit).await
    })
    .await;
    let third: Value = app.request_code(&phone).await.json().await.unwrap();
    assert_eq!(third["success"], true, "allowed again after the interval");
}

/// A session closed elsewhere (a logout served by another node, or
/// deleted in Redis) is still known to a node that read it lately, for its
/// keeping time at most; with no keeping time, not for a moment.
#[tokio::test]
async fn a_session_read_lately_outlives_its_redis_key_by_the_keeping_time_at_most() {
    const KEEP: Duration = Duration::from_secs(3);
    let app = spawn_app(|s| s.session_cache_ms = KEEP.as_millis() as u64).await;
    let token = app.login(&phone(10)).await;
    // The node keeps the session from some moment of this request on, so
    // for KEEP after this instant at least.
    let read_at = Instant::now();
    assert_eq!(app.get("/user/me", Some(&token)).await.status(), 200);
    end_session_in_redis(&app, &token).await;
    let still = app.get("/user/me", Some(&token)).await.status();
    if read_at.elapsed() < KEEP {
        assert_eq!(still, 200, "read from Redis within the keeping time");
    }
    wait_until("the session is forgotten", KEEP * 5, || async {
        app.get("/user/me", Some(&token)).await.status() == 401
    })
    .await;
    assert!(
        read_at.elapsed() >= KEEP,
        "forgotten before its keeping time ended"
    );

    let app = spawn_app(|s| s.session_cache_ms = 0).await;
    let token = app.login(&phone(11)).await;
    assert_eq!(app.get("/user/me", Some(&token)).await.status(), 200);
    end_session_in_redis(&app, &token).await;
    assert_eq!(app.get("/user/me", Some(&token)).await.status(), 401);
}

/// A user's requests arriving together (a storm's five purchases, a page's
/// calls) share one read of the session; with no keeping time each reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_requests_of_one_user_read_the_session_once() {
    for (keep_ms, reads) in [(60_000, 1), (0, 20)] {
        // A Redis of its own: its command counts are this test's alone.
        let redis = RedisServer::start().await.unwrap();
        let app = spawn_app(|s| {
            s.store.redis.url = redis.url();
            s.session_cache_ms = keep_ms;
        })
        .await;
        let token = app.login(&phone(12)).await;
        let statuses = join_all((0..20).map(|_| app.get("/user/me", Some(&token)))).await;
        assert!(statuses.iter().all(|response| response.status() == 200));
        assert_eq!(
            command_calls(&redis, "hgetall").await,
            reads,
            "session reads with --session-cache-ms {keep_ms}"
        );
    }
}

/// The request that reads a session for others may be the one whose client
/// hangs up mid-read: its read ends with it, and a request that was waiting
/// for that read must read again rather than wait for an answer that never
/// comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_session_read_survives_the_client_that_started_it_hanging_up() {
    let redis = RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.session_cache_ms = 60_000;
    })
    .await;
    let token = app.login(&phone(13)).await;
    // Each request worker sends on a Redis connection of its own, opened
    // by its first command: every worker reads an unknown session once
    // (actix hands new connections to its workers in turn), so that the
    // first request below finds its worker's connection open and its read
    // reaches Redis.
    let fresh_connections = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for unknown in 0..4u32 {
        let answer = fresh_connections
            .get(format!("{}/user/me", app.address))
            .header("authorization", format!("{unknown:032x}"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 401);
    }
    let reads_before = command_calls(&redis, "hgetall").await;

    // Redis frozen: the first request's read hangs, and its client resets
    // the connection, which makes actix drop that request's future.
    redis.pause().unwrap();
    let request = format!("GET /user/me HTTP/1.1\r\nhost: node\r\nauthorization: {token}\r\n\r\n");
    let first = send_then_reset(socket_address(&app), &request, Duration::from_millis(1000));
    // The timings below are the scenario, not waits for states (Redis is
    // frozen, nothing can be asked): the second request comes while the
    // first one's read hangs, the first one's client resets while the
    // second waits on that read, Redis thaws after both. Each step is
    // half a second or more from the next, a hundred times what a request
    // takes to get that far.
    let second = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let asked = Instant::now();
        let status = app.get("/user/me", Some(&token)).await.status();
        (status, asked.elapsed())
    };
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(2000)).await;
        redis.resume().unwrap();
    };
    let ((), (status, took), ()) = tokio::join!(first, second, thaw);
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_secs(5),
        "the second request waited {took:?} after Redis came back"
    );
    // The reset request's read was abandoned, and the waiting one read
    // again: the case this test is about did happen.
    assert_eq!(command_calls(&redis, "hgetall").await - reads_before, 2);
}

/// Deletes the session in Redis behind the node's back, as its expiry or
/// a logout served by another node would.
async fn end_session_in_redis(app: &TestApp, token: &str) {
    let _: () = app
        .redis
        .clone()
        .del(app.keys().login_token(token))
        .await
        .unwrap();
}
