//! The purchase under locks that can be lost: a node killed while holding a
//! user's lock, a watchdog that finds the lock gone, and fencing tokens that
//! turn away a holder whose lease ran out while it was paused.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;

use hmdp::ids::UserId;
use hmdp::store::{record_fence, Store};
use hmdp_lock::LockMode;
use hmdp_test_support::wait_until;

use crate::helpers::{phone, spawn_app, NodeProcess, TestApp};

/// The lock key of the user behind `token`.
async fn lock_key(app: &TestApp, token: &str) -> String {
    let me: Value = app.get_json("/user/me", Some(token)).await;
    let id = me["data"]["id"].as_u64().expect("user id");
    app.keys().order_lock(UserId::new(id))
}

/// Waits until `key` is `present` (or absent), failing after `within`.
async fn wait_for_key(app: &TestApp, key: &str, present: bool, within: Duration) {
    let what = format!("{key} {}", if present { "present" } else { "absent" });
    wait_until(&what, within, || async {
        app.key_exists(key).await == present
    })
    .await;
}

#[tokio::test]
async fn a_node_killed_while_holding_a_lock_frees_it_within_the_lease() {
    const LEASE: Duration = Duration::from_millis(1000);
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;
    let key = lock_key(&app, &token).await;
    let mut node = NodeProcess::start(
        &app,
        &[
            "--lock=reentrant",
            &format!("--lock-watchdog-ms={}", LEASE.as_millis()),
            "--chaos-hold-ms=60000",
            // The purchase's statements may take that long.
            "--backend-timeout-ms=120000",
        ],
    )
    .await;

    let purchase = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{}/voucher-order/seckill/{voucher}", node.address))
            .header("authorization", token.clone())
            .send(),
    );
    wait_for_key(&app, &key, true, Duration::from_secs(5)).await;
    // Past the first lease: the node's watchdog is what keeps the key. What
    // must not happen is the key running out meanwhile, so the time is
    // waited out: two leases, six of the watchdog's renewals.
    tokio::time::sleep(LEASE * 2).await;
    assert!(
        app.key_exists(&key).await,
        "{key} kept past its first lease"
    );

    node.kill().await;
    // Redis's own word on when the key goes, read once the node is dead: at
    // most one lease (-2: gone already). A renewal the node sent just
    // before it died may still land, and sets the same lease; none can
    // come after it. Then the key goes; waiting for that is a hang guard.
    let left_ms: i64 = app.redis.clone().pttl(&key).await.unwrap();
    assert!(
        left_ms == -2 || (0..=LEASE.as_millis() as i64).contains(&left_ms),
        "{key} expires in {left_ms} ms after its holder died, more than a lease"
    );
    wait_for_key(&app, &key, false, LEASE * 10).await;
    assert!(
        purchase.await.unwrap().is_err(),
        "the node died mid-request"
    );
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (0, 10),
        "rolled back"
    );
    assert_eq!(app.purchase(voucher, &token).await["success"], true);
}

#[tokio::test]
async fn a_purchase_whose_lock_is_lost_rolls_back() {
    let app = spawn_app(|s| {
        s.lock.mode = LockMode::Reentrant;
        s.lock.lock_watchdog_ms = 300;
        s.chaos_hold_ms = 800;
    })
    .await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;
    let key = lock_key(&app, &token).await;

    let purchase = tokio::spawn({
        let request = app
            .client
            .post(app.url(&format!("/voucher-order/seckill/{voucher}")))
            .header("authorization", token.clone());
        async move { request.send().await.unwrap() }
    });
    wait_for_key(&app, &key, true, Duration::from_secs(5)).await;
    // The lock vanishes under the holder (a failover, an operator's DEL).
    let _: () = app.redis.clone().del(&key).await.unwrap();

    let response = purchase.await.unwrap();
    assert_eq!(response.status().as_u16(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["errorCode"], "UNAVAILABLE", "{body}");
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (0, 10),
        "rolled back"
    );
}

/// Two purchases of one user under `redis-lua` with a lease shorter than the
/// pause inside the transaction: the second takes the expired lock while the
/// first is paused. Returns the number of orders written.
async fn stale_holder_race(fencing: bool) -> (i64, Vec<Value>) {
    let app = spawn_app(|s| {
        s.lock.mode = LockMode::RedisLua;
        s.lock.lock_lease_ms = Some(300);
        s.chaos_hold_ms = 800;
        s.lock.fencing = fencing;
    })
    .await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;
    let key = lock_key(&app, &token).await;
    let first = tokio::spawn({
        let request = app
            .client
            .post(app.url(&format!("/voucher-order/seckill/{voucher}")))
            .header("authorization", token.clone());
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    });
    // The first purchase takes the lock, then pauses past its lease.
    wait_for_key(&app, &key, true, Duration::from_secs(5)).await;
    wait_for_key(&app, &key, false, Duration::from_secs(5)).await;
    let second = app.purchase(voucher, &token).await;
    let first = first.await.unwrap();
    let audit = app.audit(voucher).await;
    assert!(audit.stock_balances(10));
    (audit.active_orders, vec![first, second])
}

#[tokio::test]
async fn fencing_turns_away_a_holder_whose_lease_ran_out() {
    let (orders, bodies) = stale_holder_race(false).await;
    assert_eq!(orders, 2, "without fencing both commit: {bodies:?}");

    let (orders, bodies) = stale_holder_race(true).await;
    assert_eq!(orders, 1, "{bodies:?}");
    assert_eq!(
        bodies[0]["errorCode"], "UNAVAILABLE",
        "the stale holder: {bodies:?}"
    );
    assert_eq!(bodies[1]["success"], true, "the newer holder: {bodies:?}");
}

/// Two holders of one user's lock overlap (the first one's lease ran out
/// while it was paused) and write that user's first fence at the same
/// moment: the newer token is recorded and the older refused, and neither
/// transaction dies as a deadlock victim (a 503 for its buyer).
#[tokio::test]
async fn overlapping_first_fenced_writes_do_not_deadlock() {
    async fn fence(store: &Store, user: u64, token: u64) -> Result<bool, sqlx::Error> {
        let mut tx = store.begin().await?;
        let recorded = record_fence(&mut tx, UserId::new(user), token).await?;
        tx.commit().await?;
        Ok(recorded)
    }
    let app = spawn_app(|_| {}).await;
    for user in 1..=50 {
        let (older, newer) = tokio::join!(fence(&app.store, user, 10), fence(&app.store, user, 11));
        assert!(
            newer.as_ref().is_ok_and(|recorded| *recorded),
            "user {user}: {newer:?}"
        );
        assert!(older.is_ok(), "user {user}: {older:?}");
        let kept = app.tables().fence_token(user).await.unwrap();
        assert_eq!(kept, 11, "user {user}");
    }
    // A stale token's answer does not linger on the connection into the
    // next user's first write.
    let mut conn = app.store.connection().await.unwrap();
    assert!(record_fence(&mut conn, UserId::new(100), 5).await.unwrap());
    assert!(
        !record_fence(&mut conn, UserId::new(100), 4).await.unwrap(),
        "stale"
    );
    assert!(
        !record_fence(&mut conn, UserId::new(100), 5).await.unwrap(),
        "the same token"
    );
    assert!(
        record_fence(&mut conn, UserId::new(101), 3).await.unwrap(),
        "a new user"
    );
    assert!(
        record_fence(&mut conn, UserId::new(100), 6).await.unwrap(),
        "newer"
    );
}
