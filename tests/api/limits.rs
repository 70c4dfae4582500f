//! The request limits: shared by the nodes through Redis, per user and per
//! client address, answered 429 with `Retry-After`, the `RateLimit` headers
//! and hmdp's body; counted by each node alone while Redis is down; login
//! guessing cut off per phone.

use hmdp::config::{SeckillMode, ServeSettings};
use hmdp::limits::Rule;
use hmdp_lock::LockMode;
use hmdp_test_support::{phone, RedisServer};
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::helpers::{
    limits_enforcing_only, metric, request_scripts, spawn_app, NodeProcess, TestApp,
};

async fn spawn_limited(quotas: &[(Rule, &str)]) -> TestApp {
    let limits = limits_enforcing_only(quotas);
    spawn_app(move |s: &mut ServeSettings| s.limits = limits).await
}

/// A purchase of voucher `voucher` by `token`'s user at `address`, sent as
/// nginx would pass on a client at `ip`.
async fn purchase_from(address: &str, voucher: &str, token: &str, ip: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{address}/voucher-order/seckill/{voucher}"))
        .header("authorization", token)
        .header("x-real-ip", ip)
        .send()
        .await
        .unwrap()
}

async fn assert_limited(response: reqwest::Response, policy: &str) -> u64 {
    assert_eq!(response.status(), 429);
    let header = |name: &str| {
        (response.headers().get(name))
            .unwrap_or_else(|| panic!("no {name} header"))
            .to_str()
            .unwrap()
            .to_owned()
    };
    let retry_after: u64 = header("retry-after").parse().unwrap();
    assert!(retry_after >= 1, "Retry-After {retry_after}");
    assert_eq!(header("ratelimit-policy"), policy);
    let name = policy.split(';').next().unwrap();
    let rate_limit = header("ratelimit");
    assert!(
        rate_limit.starts_with(&format!("{name};r=0;t=")),
        "RateLimit: {rate_limit}"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["errorCode"], "RATE_LIMITED", "{body}");
    assert!(
        body["errorMsg"].as_str().unwrap().contains("操作太频繁"),
        "{body}"
    );
    retry_after
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_over_the_users_limit_is_answered_429_with_retry_after_and_ratelimit() {
    let app = spawn_limited(&[(Rule::PurchaseByUser, "2/1m")]).await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;
    let other = app.login(&phone(2)).await;
    let path = format!("/voucher-order/seckill/{voucher}");
    // The nodes of every test in this process count into one registry: this
    // refusal is among what the count gains from here.
    let refusals = "hmdp_rate_limited_total{rule=\"purchase-user\"}";
    let refusals_before = metric(&app.address, refusals).await;

    let first: Value = app.post_json(&path, Some(&token)).await;
    assert_eq!(first["success"], true, "{first}");
    let second: Value = app.post_json(&path, Some(&token)).await;
    assert_eq!(second["errorCode"], "ALREADY_ORDERED", "{second}");
    let third = app.post(&path, Some(&token)).await;
    // Two per minute: the next one is allowed half a minute after the first.
    let retry_after = assert_limited(third, "\"purchase-user\";q=2;w=60").await;
    assert!(retry_after <= 30, "Retry-After {retry_after}");

    // Another user's purchases are their own.
    let theirs: Value = app.post_json(&path, Some(&other)).await;
    assert_eq!(theirs["success"], true, "{theirs}");
    assert!(metric(&app.address, refusals).await > refusals_before);
}

/// Two nodes of `mode` share one user's purchase limit: the second node
/// refuses what the first allowed up to the limit (an admitted purchase
/// counts it in the admission script's call, a synchronous one in a call
/// of its own).
async fn two_nodes_share_one_users_limit(mode: SeckillMode) {
    let app = spawn_app(|s: &mut ServeSettings| {
        s.limits = limits_enforcing_only(&[(Rule::PurchaseByUser, "3/1m")]);
        s.seckill = mode;
    })
    .await;
    let seckill = format!("--seckill={mode}");
    let flags = ["--limits=on", "--limit-purchase-user=3/1m", &seckill];
    let second = NodeProcess::start(&app, &flags).await;
    let token = app.login(&phone(1)).await;
    let voucher = app.create_open_seckill(10).await.to_string();

    // Each purchase is counted, whatever its answer.
    let answers = ["", "ALREADY_ORDERED", "ALREADY_ORDERED"];
    for (address, answer) in [&app.address, &second.address, &app.address]
        .iter()
        .zip(answers)
    {
        let allowed = purchase_from(address, &voucher, &token, "10.0.0.1").await;
        let body: Value = allowed.json().await.unwrap();
        match answer {
            "" => assert_eq!(body["success"], true, "at {address}: {body}"),
            code => assert_eq!(body["errorCode"], code, "at {address}: {body}"),
        }
    }
    // The second node refuses what the first allowed up to the limit.
    let refused = purchase_from(&second.address, &voucher, &token, "10.0.0.1").await;
    assert_limited(refused, "\"purchase-user\";q=3;w=60").await;
    let refused = purchase_from(&app.address, &voucher, &token, "10.0.0.1").await;
    assert_limited(refused, "\"purchase-user\";q=3;w=60").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sync_nodes_share_one_users_limit() {
    two_nodes_share_one_users_limit(SeckillMode::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stream_nodes_share_one_users_limit() {
    two_nodes_share_one_users_limit(SeckillMode::Stream).await;
}

/// An admitted purchase counts its limits in the admission script's own
/// call: one script a purchase whether its limits allow it or refuse it,
/// the rules in turn (a purchase refused per user spends nothing of its
/// address's quota), and a purchase they refuse admits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_purchase_counts_its_limits_in_the_admission_scripts_call() {
    let redis = RedisServer::start().await.unwrap();
    let limits =
        limits_enforcing_only(&[(Rule::PurchaseByUser, "1/1m"), (Rule::PurchaseByIp, "3/1m")]);
    let redis_url = redis.url();
    let app = spawn_app(move |s: &mut ServeSettings| {
        s.store.redis.url = redis_url;
        s.seckill = SeckillMode::Stream;
        // No lock: the consumer runs no script of its own.
        s.lock.mode = LockMode::NoLock;
        s.limits = limits;
        s.session_cache_ms = 60_000;
    })
    .await;
    let vouchers = [
        app.create_open_seckill(5).await,
        app.create_open_seckill(5).await,
    ];
    let tokens = app.login_many(4).await;
    let buy = |voucher: usize, user: usize| {
        let (address, voucher, token) =
            (&app.address, vouchers[voucher].to_string(), &tokens[user]);
        async move { purchase_from(address, &voucher, token, "10.0.0.1").await }
    };
    let bought: Value = buy(0, 0).await.json().await.unwrap();
    assert_eq!(bought["success"], true, "{bought}");

    // Over the user's limit: one call of the admission script refuses it.
    let scripts_before = request_scripts(&redis, &app).await;
    assert_limited(buy(1, 0).await, "\"purchase-user\";q=1;w=60").await;
    assert_eq!(request_scripts(&redis, &app).await, scripts_before + 1);
    // Within both limits: one call admits it and counts them.
    let bought: Value = buy(1, 1).await.json().await.unwrap();
    assert_eq!(bought["success"], true, "{bought}");
    assert_eq!(request_scripts(&redis, &app).await, scripts_before + 2);

    // The refused purchase took nothing: its voucher sold one unit, to
    // the second user.
    let stock_key = app.keys().single().voucher(vouchers[1]);
    let stock: i64 = app.redis.clone().hget(&stock_key, "stock").await.unwrap();
    assert_eq!(stock, 4);
    // ...and spent nothing of its address's quota of three: a third buyer
    // gets through, the fourth is refused per address.
    let bought: Value = buy(1, 2).await.json().await.unwrap();
    assert_eq!(bought["success"], true, "{bought}");
    assert_limited(buy(1, 3).await, "\"purchase-ip\";q=3;w=60").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_are_limited_per_client_address_as_nginx_reports_it() {
    let app = spawn_limited(&[(Rule::PurchaseByIp, "2/1m")]).await;
    let tokens = app.login_many(4).await;
    let missing = "999999";

    for token in &tokens[..2] {
        let allowed = purchase_from(&app.address, missing, token, "10.0.0.1").await;
        assert_eq!(allowed.status(), 200);
    }
    // A third buyer behind the same address is turned away...
    let refused = purchase_from(&app.address, missing, &tokens[2], "10.0.0.1").await;
    assert_limited(refused, "\"purchase-ip\";q=2;w=60").await;
    // ...and one behind another address is not.
    let elsewhere = purchase_from(&app.address, missing, &tokens[3], "10.0.0.2").await;
    assert_eq!(elsewhere.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_each_node_still_limits_on_its_own() {
    let mut redis = RedisServer::start().await.unwrap();
    let limits = limits_enforcing_only(&[(Rule::OrderByUser, "2/1m")]);
    let redis_url = redis.url();
    let app = spawn_app(move |s: &mut ServeSettings| {
        s.store.redis.url = redis_url;
        s.limits = limits;
        // The session is read once and kept: the requests below need no
        // Redis to know their user.
        s.session_cache_ms = 60_000;
        s.store.timeout.backend_timeout_ms = 1_000;
    })
    .await;
    let token = app.login(&phone(1)).await;
    assert_eq!(
        app.get_json("/user/me", Some(&token)).await["success"],
        true
    );
    let fallbacks_before = metric(&app.address, "hmdp_rate_limit_fallbacks_total").await;
    redis.kill();

    // A cancel of an order that is not there: its answer needs Redis (is
    // it pending?) and fails, but the limit is counted first, in memory.
    let cancel = "/voucher-order/1/cancel";
    for _ in 0..2 {
        let answered = app.post(cancel, Some(&token)).await;
        assert_ne!(answered.status(), 429);
    }
    let refused = app.post(cancel, Some(&token)).await;
    assert_limited(refused, "\"order-user\";q=2;w=60").await;
    let fallbacks = metric(&app.address, "hmdp_rate_limit_fallbacks_total").await;
    assert!(
        fallbacks >= fallbacks_before + 3.0,
        "{fallbacks_before} -> {fallbacks}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_a_phones_code_is_cut_off_after_its_wrong_codes() {
    let limits = limits_enforcing_only(&[(Rule::WrongCodesByPhone, "3/1h")]);
    let app = spawn_app(move |s: &mut ServeSettings| {
        s.limits = limits;
        // The victim asks for a second code right away.
        s.code_interval_secs = 0;
    })
    .await;
    let victim = phone(1);
    // A right code gives its count back: logging in is not guessing.
    let first = app.login(&victim).await;
    assert!(!first.is_empty());
    app.request_code(&victim).await;
    let code = app.stored_code(&victim).await.unwrap();
    let wrong = if code == "000000" { "000001" } else { "000000" };

    // Guesses sent all at once are counted as they come: three of them
    // are looked at, the rest refused.
    let guess = json!({ "phone": victim, "code": wrong });
    let guesses = (0..12).map(|_| app.post_login(&guess));
    let answers = futures::future::join_all(guesses).await;
    let statuses: Vec<u16> = answers
        .iter()
        .map(|answer| answer.status().as_u16())
        .collect();
    assert_eq!(
        statuses.iter().filter(|status| **status == 200).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|status| **status == 429).count(),
        9,
        "{statuses:?}"
    );

    // Past its wrong codes the phone is locked, the right code included: an
    // attacker cannot tell a right guess from a wrong one any more.
    let locked = app
        .post_login(&json!({ "phone": victim, "code": code }))
        .await;
    let retry_after = assert_limited(locked, "\"wrong-codes-phone\";q=3;w=3600").await;
    assert!(
        (1..=1200).contains(&retry_after),
        "a third of an hour at most: {retry_after}"
    );
    // Another phone logs in as before.
    app.login(&phone(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_requests_are_limited_per_address_and_for_everyone() {
    let app = spawn_limited(&[(Rule::CodeByIp, "2/1m"), (Rule::CodeByAll, "3/1m")]).await;
    let request_code = |phone: String, ip: &'static str| {
        let client = app.client.clone();
        let url = app.url("/user/code");
        async move {
            (client.post(url).query(&[("phone", phone)]))
                .header("x-real-ip", ip)
                .send()
                .await
                .unwrap()
        }
    };
    for i in 0..2 {
        assert_eq!(request_code(phone(i), "10.0.0.1").await.status(), 200);
    }
    let refused = request_code(phone(2), "10.0.0.1").await;
    assert_limited(refused, "\"code-ip\";q=2;w=60").await;
    // The third code of everyone's three, from another address...
    assert_eq!(request_code(phone(3), "10.0.0.2").await.status(), 200);
    // ...and the fourth is refused wherever it comes from.
    let refused = request_code(phone(4), "10.0.0.3").await;
    assert_limited(refused, "\"code-all\";q=3;w=60").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_refused_is_refused_from_memory_until_its_retry_after() {
    let redis = RedisServer::start().await.unwrap();
    let limits = limits_enforcing_only(&[(Rule::PurchaseByUser, "1/1m")]);
    let redis_url = redis.url();
    let app = spawn_app(move |s: &mut ServeSettings| {
        s.store.redis.url = redis_url;
        s.limits = limits;
        s.session_cache_ms = 60_000;
    })
    .await;
    let token = app.login(&phone(1)).await;
    let missing = "/voucher-order/seckill/999999";
    assert_eq!(app.post(missing, Some(&token)).await.status(), 200);
    let refused = app.post(missing, Some(&token)).await;
    assert_limited(refused, "\"purchase-user\";q=1;w=60").await;

    // The limit answered once that the user is refused for a minute: this
    // node takes its word for it until then, without asking Redis again.
    let scripts_before = request_scripts(&redis, &app).await;
    for _ in 0..20 {
        let refused = app.post(missing, Some(&token)).await;
        let retry_after = assert_limited(refused, "\"purchase-user\";q=1;w=60").await;
        assert!(retry_after <= 60, "Retry-After {retry_after}");
    }
    assert_eq!(request_scripts(&redis, &app).await, scripts_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_known_sold_out_is_answered_so_before_the_limits_count() {
    let app = spawn_limited(&[(Rule::PurchaseByUser, "2/1m")]).await;
    let voucher = app.create_open_seckill(1).await;
    let tokens = app.login_many(2).await;
    let path = format!("/voucher-order/seckill/{voucher}");
    let bought = app.post_json(&path, Some(&tokens[0])).await;
    assert_eq!(bought["success"], true, "{bought}");

    // Asked again and again, a sold-out sale answers SOLD_OUT from memory:
    // no limit is spent on it, none refuses it.
    for _ in 0..10 {
        let refused = app.post_json(&path, Some(&tokens[1])).await;
        assert_eq!(refused["errorCode"], "SOLD_OUT", "{refused}");
    }
}

/// Rules are counted in turn, the narrowest first: a purchase refused per
/// user spends nothing of its address's quota, which the other buyers
/// behind that address still have whole.
#[tokio::test]
async fn a_purchase_refused_per_user_spends_nothing_of_its_addresss_quota() {
    let app = spawn_limited(&[(Rule::PurchaseByUser, "1/1m"), (Rule::PurchaseByIp, "3/1m")]).await;
    let tokens = app.login_many(4).await;
    let missing = "999999";

    let first = purchase_from(&app.address, missing, &tokens[0], "10.0.0.1").await;
    assert_eq!(first.status(), 200);
    for _ in 0..3 {
        let again = purchase_from(&app.address, missing, &tokens[0], "10.0.0.1").await;
        assert_limited(again, "\"purchase-user\";q=1;w=60").await;
    }
    // The address spent one of its three: two more buyers get through.
    for token in &tokens[1..3] {
        let allowed = purchase_from(&app.address, missing, token, "10.0.0.1").await;
        assert_eq!(allowed.status(), 200);
    }
    let refused = purchase_from(&app.address, missing, &tokens[3], "10.0.0.1").await;
    assert_limited(refused, "\"purchase-ip\";q=3;w=60").await;
}

/// A purchase whose address this node remembers refusing is refused
/// (after its user's rule is counted, as the rules are counted in turn),
/// and not admitted: an admission script never counts a request already
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_purchase_from_an_address_remembered_refused_is_not_admitted() {
    let limits =
        limits_enforcing_only(&[(Rule::PurchaseByUser, "5/1m"), (Rule::PurchaseByIp, "1/1m")]);
    let app = spawn_app(move |s: &mut ServeSettings| {
        s.seckill = SeckillMode::Stream;
        s.limits = limits;
    })
    .await;
    let voucher = app.create_open_seckill(5).await.to_string();
    let tokens = app.login_many(3).await;
    let bought: Value = (purchase_from(&app.address, &voucher, &tokens[0], "10.0.0.1").await)
        .json()
        .await
        .unwrap();
    assert_eq!(bought["success"], true, "{bought}");
    // The address's one purchase a minute is spent: refused, and remembered.
    let refused = purchase_from(&app.address, &voucher, &tokens[1], "10.0.0.1").await;
    assert_limited(refused, "\"purchase-ip\";q=1;w=60").await;
    let refused = purchase_from(&app.address, &voucher, &tokens[2], "10.0.0.1").await;
    assert_limited(refused, "\"purchase-ip\";q=1;w=60").await;

    // The third user was refused, not sold a unit: from elsewhere, they buy.
    let elsewhere: Value = (purchase_from(&app.address, &voucher, &tokens[2], "10.0.0.2").await)
        .json()
        .await
        .unwrap();
    assert_eq!(elsewhere["success"], true, "{elsewhere}");
}
