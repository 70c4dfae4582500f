//! `/voucher-order/*`: every purchase outcome and the order query.

use std::time::Duration;

use futures::future::join_all;
use hmdp::ids::VoucherId;
use hmdp_lock::LockMode;
use hmdp_test_support::wait_until;
use serde_json::Value;

use crate::helpers::{metric, phone, spawn_app};

fn assert_rejected(body: &Value, code: &str, message: &str) {
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["errorCode"], code, "{body}");
    assert_eq!(body["errorMsg"], message, "{body}");
}

#[tokio::test]
async fn buying_once_succeeds_and_twice_is_already_ordered() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;

    let first = app.purchase(voucher, &token).await;
    assert_eq!(first["success"], true, "{first}");
    let order_id = first["data"].as_str().expect("order id is a string");
    assert!(order_id.parse::<i64>().unwrap() > 1 << 32);

    let second = app.purchase(voucher, &token).await;
    assert_rejected(&second, "ALREADY_ORDERED", "用户已经购买过一次！");

    let audit = app.audit(voucher).await;
    assert_eq!((audit.active_orders, audit.stock_left), (1, 9));
}

#[tokio::test]
async fn purchase_outcomes_in_the_documented_order() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(2)).await;

    let missing = app.purchase(VoucherId::new(999_999), &token).await;
    assert_rejected(&missing, "VOUCHER_NOT_FOUND", "秒杀券不存在！");

    let future = app
        .create_seckill(10, "2037-01-01T00:00:00", "2037-12-31T00:00:00")
        .await;
    assert_rejected(
        &app.purchase(future, &token).await,
        "NOT_STARTED",
        "秒杀尚未开始！",
    );

    let past = app
        .create_seckill(10, "2020-01-01T00:00:00", "2020-12-31T00:00:00")
        .await;
    assert_rejected(&app.purchase(past, &token).await, "ENDED", "秒杀已经结束！");

    let empty = app.create_open_seckill(0).await;
    assert_rejected(&app.purchase(empty, &token).await, "SOLD_OUT", "库存不足！");

    let last_one = app.create_open_seckill(1).await;
    assert_eq!(app.purchase(last_one, &token).await["success"], true);
    let other = app.login(&phone(3)).await;
    assert_rejected(
        &app.purchase(last_one, &other).await,
        "SOLD_OUT",
        "库存不足！",
    );
}

#[tokio::test]
async fn busy_user_lock_is_duplicate_request() {
    let app = spawn_app(|s| {
        s.lock.mode = LockMode::Local;
        s.chaos_hold_ms = 300;
    })
    .await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(4)).await;
    let (a, b) = tokio::join!(app.purchase(voucher, &token), app.purchase(voucher, &token));
    let codes = [a["errorCode"].clone(), b["errorCode"].clone()];
    assert!(codes.contains(&Value::Null), "one succeeds: {a} {b}");
    assert!(codes.contains(&Value::from("DUPLICATE_REQUEST")), "{a} {b}");
}

#[tokio::test]
async fn purchase_needs_a_session_and_a_numeric_id() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    assert_eq!(
        app.post(&format!("/voucher-order/seckill/{voucher}"), None)
            .await
            .status(),
        401
    );
    let token = app.login(&phone(5)).await;
    for bad in ["abc", "-3", "0", "1.5", "99999999999999999999"] {
        let response = app
            .post(&format!("/voucher-order/seckill/{bad}"), Some(&token))
            .await;
        assert_eq!(response.status(), 400, "{bad}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["errorCode"], "BAD_REQUEST");
    }
}

#[tokio::test]
async fn users_see_only_their_own_orders() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let owner = app.login(&phone(6)).await;
    let stranger = app.login(&phone(7)).await;
    let order_id = app.purchase(voucher, &owner).await["data"]
        .as_str()
        .unwrap()
        .to_owned();

    let mine: Value = app
        .get_json(&format!("/voucher-order/{order_id}"), Some(&owner))
        .await;
    assert_eq!(mine["success"], true);
    assert_eq!(mine["data"]["id"], order_id.as_str());
    assert_eq!(mine["data"]["voucherId"], voucher.to_string());
    assert_eq!(mine["data"]["status"], 1);

    let theirs: Value = app
        .get_json(&format!("/voucher-order/{order_id}"), Some(&stranger))
        .await;
    assert_eq!(theirs["errorCode"], "ORDER_NOT_FOUND");
    assert_eq!(
        app.get(&format!("/voucher-order/{order_id}"), None)
            .await
            .status(),
        401
    );
    assert_eq!(
        app.get("/voucher-order/xyz", Some(&owner)).await.status(),
        400
    );
}

/// Redis restarted empty: the id counter starts over, and the next id can be
/// one an order already has. The insert fails, and the purchase is placed
/// again under the next id.
#[tokio::test]
async fn an_order_id_already_taken_is_replaced_by_the_next_one() {
    an_order_id_already_taken_is_replaced_by_the_next_one_with(false).await;
}

/// The same with `--fencing`: the purchase is placed again in a transaction
/// of its own, whose fence is its lock's token as the first one's was.
#[tokio::test]
async fn an_order_id_already_taken_is_replaced_by_the_next_one_when_fenced() {
    an_order_id_already_taken_is_replaced_by_the_next_one_with(true).await;
}

async fn an_order_id_already_taken_is_replaced_by_the_next_one_with(fencing: bool) {
    let app = spawn_app(|s| s.lock.fencing = fencing).await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(3)).await;

    // The counter's next value is 1; orders of another user already have
    // that id for this second and the next few, whichever second the
    // purchase lands in.
    let day = chrono::Utc::now().format("%Y:%m:%d").to_string();
    let counter = app.keys().id_counter("order", &day);
    let mut redis = app.redis.clone();
    let () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut redis)
        .await
        .unwrap();
    let now = chrono::Utc::now();
    for ahead in 0..5 {
        let taken = hmdp::id_worker::compose(now + chrono::Duration::seconds(ahead), 1);
        app.tables().insert_order(taken, 1, 1).await.unwrap();
    }

    let bought = app.purchase(voucher, &token).await;
    assert_eq!(bought["success"], true, "{bought}");
    let id: i64 = bought["data"].as_str().unwrap().parse().unwrap();
    assert_eq!(id & 0xFFFF_FFFF, 2, "the next id: {id:#x}");
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (1, 9),
        "one unit taken"
    );
}

/// The purchases of a voucher this node has not read yet, arriving
/// together as at a sale's opening, share one read of it from MySQL
/// instead of each asking (and queueing for the pool's connections ahead
/// of the transactions). The read is held up behind a table lock until
/// it waits in MySQL, the others sent with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_of_a_voucher_not_read_yet_share_one_read_of_it() {
    let app = spawn_app(|_| {}).await;
    let tokens = app.login_many(32).await;
    let warm_up = app.create_open_seckill(1).await;
    assert_eq!(app.purchase(warm_up, &tokens[0]).await["success"], true);
    let reads = || metric(&app.address, "hmdp_voucher_reads_total");
    let before = reads().await;

    let voucher = app.create_open_seckill(32).await;
    let mut blocker = app
        .mysql_session_with("LOCK TABLES tb_seckill_voucher WRITE")
        .await;
    let purchases = join_all(tokens.iter().map(|token| app.purchase(voucher, token)));
    let held_up = async {
        wait_until(
            "the voucher's read to wait behind the lock",
            Duration::from_secs(5),
            || async { app.tables().waiting_for_a_table_lock().await.unwrap() > 0 },
        )
        .await;
        sqlx::raw_sql("UNLOCK TABLES")
            .execute(&mut blocker)
            .await
            .unwrap();
    };
    let (answers, ()) = tokio::join!(purchases, held_up);
    for answer in &answers {
        assert_eq!(answer["success"], true, "{answer}");
    }
    assert_eq!(reads().await - before, 1.0, "reads of the voucher");
}
