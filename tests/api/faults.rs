//! Faults survived: Redis or MySQL unreachable or frozen. Purchases fail fast with 503
//! `UNAVAILABLE`, nothing is written without the lock, and service resumes
//! by itself when the backend is back.

use std::time::{Duration, Instant};

use futures::future::join_all;
use hmdp::ids::VoucherId;
use hmdp_lock::LockMode;
use hmdp_test_support::{free_ports, wait_until, RedisServer};
use serde_json::Value;

use crate::helpers::{phone, spawn_app, spawn_app_on, TestApp};
use crate::slow_mysql::SlowCommitMariaDb;

/// Generous bound on a request while a backend is down: the backend timeout
/// is 500 ms; this only catches hangs, it does not measure speed.
const NO_HANG: Duration = Duration::from_secs(5);

async fn timed_purchase(app: &TestApp, voucher: VoucherId, token: &str) -> (u16, Value, Duration) {
    let started = Instant::now();
    // Cut off here, so a regression fails in seconds instead of hanging
    // the suite for as long as MySQL waits.
    let path = format!("/voucher-order/seckill/{voucher}");
    let purchase = app.post(&path, Some(token));
    let response = tokio::time::timeout(NO_HANG, purchase)
        .await
        .unwrap_or_else(|_| panic!("the purchase hung for more than {NO_HANG:?}"));
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, started.elapsed())
}

/// Redis dies during a run and comes back empty on the same port.
async fn redis_outage_with(lock: LockMode) {
    let mut redis = RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.lock.mode = lock;
        s.store.timeout.backend_timeout_ms = 500;
    })
    .await;
    let voucher = app.create_open_seckill(100).await;
    let tokens = app.login_many(20).await;
    for token in &tokens[..5] {
        assert_eq!(app.purchase(voucher, token).await["success"], true);
    }

    redis.kill();
    let during = join_all(tokens[5..].iter().map(|t| timed_purchase(&app, voucher, t))).await;
    for (status, body, took) in &during {
        assert_eq!(*status, 503, "{body}");
        assert_eq!(body["errorCode"], "UNAVAILABLE");
        assert!(*took < NO_HANG, "a request hung for {took:?}");
    }
    assert_eq!(app.get("/ready", None).await.status(), 503);
    assert_eq!(app.get("/health", None).await.status(), 200);
    let audit = app.audit(voucher).await;
    assert_eq!(audit.active_orders, 5, "no order without Redis: {audit:?}");
    assert!(audit.stock_balances(100));

    redis.restart().await.unwrap();
    wait_until("service resumed", Duration::from_secs(10), || async {
        app.get("/ready", None).await.status() == 200
    })
    .await;
    // The harness's own connection reports the restart once, then reconnects.
    let _: redis::RedisResult<String> =
        redis::cmd("PING").query_async(&mut app.redis.clone()).await;
    // Sessions lived in the Redis that died: users log in again.
    let token = app.login(&phone(100)).await;
    let after = app.purchase(voucher, &token).await;
    assert_eq!(after["success"], true, "{after}");
    let audit = app.audit(voucher).await;
    assert_eq!((audit.active_orders, audit.duplicate_users), (6, 0));
    assert!(audit.stock_balances(100));
}

#[tokio::test]
async fn redis_outage_fails_fast_and_recovers_local() {
    redis_outage_with(LockMode::Local).await;
}

#[tokio::test]
async fn redis_outage_fails_fast_and_recovers_redis_lua() {
    redis_outage_with(LockMode::RedisLua).await;
}

#[tokio::test]
async fn unreachable_mysql_answers_503_fast() {
    // A healthy node logs the user in; a second node sharing its Redis
    // namespace has MySQL on a closed port.
    let healthy = spawn_app(|_| {}).await;
    let token = healthy.login(&phone(1)).await;
    let [closed] = free_ports().unwrap();
    let app = spawn_app(|s| {
        s.store.database.url = format!("mysql://root@127.0.0.1:{closed}/hmdp");
        s.store.redis.prefix = healthy.prefix.clone();
        s.no_migrate = true;
        s.store.timeout.backend_timeout_ms = 500;
    })
    .await;
    for _ in 0..2 {
        let (status, body, took) = timed_purchase(&app, VoucherId::new(10), &token).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["errorCode"], "UNAVAILABLE");
        assert_eq!(body["errorMsg"], "服务繁忙，请稍后再试");
        assert!(took < NO_HANG, "hung for {took:?}");
    }
    assert_eq!(app.get("/ready", None).await.status(), 503);
    assert_eq!(app.get("/health", None).await.status(), 200);
}

/// MySQL drops the node's connections while a purchase holds the lock with
/// its transaction open: the transaction is rolled back, the answer is 503,
/// the lock is released, and the next attempt succeeds.
#[tokio::test]
async fn mysql_lost_mid_transaction_rolls_back_and_releases_the_lock() {
    let app = spawn_app(|s| {
        s.lock.mode = LockMode::RedisLua;
        s.chaos_hold_ms = 1000;
    })
    .await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;

    let (attempt, ()) = tokio::join!(timed_purchase(&app, voucher, &token), async {
        inside_the_transaction(&app, &token).await;
        kill_connections_to(&app).await;
    });
    let (status, body, _) = attempt;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["errorCode"], "UNAVAILABLE");

    let locks = app.lock_keys().await;
    assert!(locks.is_empty(), "lock released: {locks:?}");
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (0, 10),
        "rolled back"
    );

    let retry = app.purchase(voucher, &token).await;
    assert_eq!(retry["success"], true, "{retry}");
}

/// Waits until the purchase of `token`'s user is inside its transaction,
/// held there by the chaos hold (800 ms or more).
///
/// What shows is the user's lock taken: the transaction opens right after,
/// with a consistent read, which `innodb_trx` does not show yet. So the
/// wait for that state ends with a part of the scenario: 200 ms more, well
/// inside the hold and far beyond the few milliseconds from the lock to
/// the hold.
async fn inside_the_transaction(app: &TestApp, token: &str) {
    let lock_key = app.keys().order_lock(app.user_id(token).await);
    wait_until("the purchase took its lock", NO_HANG, || async {
        app.key_exists(&lock_key).await
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Another session takes a lock the purchase needs (`lock`, on a connection
/// of its own, not the pool's: if an assertion fails, it is closed on the way
/// out and MySQL lets the lock go, where a pooled one would keep it and the
/// database's removal would wait on it). The purchase must answer 503 within
/// the backend timeout instead of waiting; then `unlock` lets the lock go.
async fn purchase_answers_503_behind(
    app: &TestApp,
    voucher: VoucherId,
    token: &str,
    lock: &str,
    unlock: &str,
) {
    let mut blocker = app.mysql_session_with(lock).await;
    let (status, body, took) = timed_purchase(app, voucher, token).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["errorCode"], "UNAVAILABLE");
    assert!(took < NO_HANG, "waited {took:?} behind `{lock}`");
    sqlx::raw_sql(sqlx::AssertSqlSafe(unlock.to_owned()))
        .execute(&mut blocker)
        .await
        .unwrap();
}

/// A node whose backend calls give up after 1 s, a voucher of stock 10 on
/// sale and a user logged in: the set-up of the tests that hold a lock the
/// purchase needs.
async fn impatient_node_with_a_voucher() -> (TestApp, VoucherId, String) {
    let app = spawn_app(|s| {
        s.lock.mode = LockMode::RedisLua;
        s.store.timeout.backend_timeout_ms = 1000;
    })
    .await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;
    (app, voucher, token)
}

/// MySQL freezes (SIGSTOP: its sockets stay open, it answers nothing) while
/// a purchase has its transaction open and its user's lock held: the
/// purchase gives up within the backend timeout with 503 instead of waiting
/// for as long as MySQL stays silent, and commits nothing; once MySQL is
/// back, the transaction is gone and the same user's next purchase succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_frozen_mid_transaction_answers_503_within_the_backend_timeout() {
    let mysql = SlowCommitMariaDb::start().await;
    let app = spawn_app_on(&mysql.url(), |s| {
        s.lock.mode = LockMode::Reentrant;
        s.store.timeout.backend_timeout_ms = 2000;
        // The transaction stays open this long after its first statement:
        // the freeze lands there, before the order's INSERT.
        s.chaos_hold_ms = 800;
    })
    .await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;

    let purchase = tokio::spawn({
        let (client, url) = (
            app.client.clone(),
            app.url(&format!("/voucher-order/seckill/{voucher}")),
        );
        let token = token.clone();
        async move {
            let response = client
                .post(url)
                .header("authorization", token)
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    });
    inside_the_transaction(&app, &token).await;
    mysql.pause();
    let paused = Instant::now();
    // While MySQL is frozen: a purchase that waits for it never answers.
    let answered = tokio::time::timeout(Duration::from_secs(30), purchase).await;
    let waited = paused.elapsed();
    mysql.resume();
    let (status, body) = answered.expect("an answer while MySQL is frozen").unwrap();
    assert_eq!(
        (status, body["errorCode"].as_str()),
        (503, Some("UNAVAILABLE")),
        "{body}"
    );
    // Within the statements' 2 s backend timeout (a generous bound: it
    // tells a deadline from a hang, it does not measure speed).
    assert!(
        waited < Duration::from_secs(2) + NO_HANG,
        "answered after {waited:?}"
    );

    assert_eq!(
        app.open_transactions_after(Duration::from_secs(20)).await,
        0,
        "the given-up transaction stayed open"
    );
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (0, 10),
        "nothing committed"
    );
    let retry = app.purchase(voucher, &token).await;
    assert_eq!(retry["success"], true, "{retry}");
}

/// Something else holds the voucher's stock row (a frozen node mid-commit,
/// an admin's open transaction): a purchase waits on that row lock no
/// longer than the backend timeout, answers 503, keeps nothing, and the
/// next purchase after the row is free succeeds. (MySQL's own limit on
/// that wait, `innodb_lock_wait_timeout`, is 50 s.)
#[tokio::test]
async fn a_stock_row_held_elsewhere_answers_503_within_the_backend_timeout() {
    let (app, voucher, token) = impatient_node_with_a_voucher().await;

    let lock_the_row = format!(
        "BEGIN; SELECT stock FROM tb_seckill_voucher WHERE voucher_id = {voucher} FOR UPDATE"
    );
    purchase_answers_503_behind(&app, voucher, &token, &lock_the_row, "ROLLBACK").await;

    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (0, 10),
        "rolled back"
    );
    let retry = app.purchase(voucher, &token).await;
    assert_eq!(retry["success"], true, "{retry}");
}

/// A table lock (an admin's `LOCK TABLES`, a long `ALTER TABLE`) is a
/// metadata lock, which MySQL waits for up to `lock_wait_timeout`: a day by
/// default, not the row lock's `innodb_lock_wait_timeout`.
#[tokio::test]
async fn a_table_locked_elsewhere_answers_503_within_the_backend_timeout() {
    let (app, voucher, token) = impatient_node_with_a_voucher().await;
    // The voucher is in the node's catalog: only the transaction needs
    // the orders table.
    let first = app.purchase(voucher, &token).await;
    assert_eq!(first["success"], true, "{first}");
    let token = app.login(&phone(2)).await;

    purchase_answers_503_behind(
        &app,
        voucher,
        &token,
        "LOCK TABLES tb_voucher_order WRITE",
        "UNLOCK TABLES",
    )
    .await;

    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (1, 9),
        "rolled back"
    );
    let retry = app.purchase(voucher, &token).await;
    assert_eq!(retry["success"], true, "{retry}");
}

/// The purchases of a voucher not read yet wait for one read of it; with
/// that read stuck behind a table lock, every one of them answers 503
/// within the backend timeout, together, not one timeout after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_waiting_for_a_stuck_first_read_of_their_voucher_answer_503_together() {
    let app = spawn_app(|s| s.store.timeout.backend_timeout_ms = 1000).await;
    let voucher = app.create_open_seckill(10).await;
    let tokens = app.login_many(8).await;
    let mut blocker = app
        .mysql_session_with("LOCK TABLES tb_seckill_voucher WRITE")
        .await;
    let answers = join_all(
        tokens
            .iter()
            .map(|token| timed_purchase(&app, voucher, token)),
    )
    .await;
    for (status, body, took) in answers {
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["errorCode"], "UNAVAILABLE");
        assert!(
            took < Duration::from_secs(3),
            "waited {took:?} for the voucher's read"
        );
    }
    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut blocker)
        .await
        .unwrap();
    let bought = app.purchase(voucher, &tokens[0]).await;
    assert_eq!(bought["success"], true, "{bought}");
}

/// `KILL CONNECTION` for every session on the test's database but our own.
async fn kill_connections_to(app: &TestApp) {
    let killed = app.tables().kill_other_connections().await.unwrap();
    assert!(killed > 0, "the node holds connections");
}

/// A transaction dropped while open (the client gone, a timeout) must not
/// stay on a pooled connection, holding the stock row for whoever uses it
/// next: the store's transaction closes a connection whose transaction it
/// did not see end, and MySQL rolls it back.
#[tokio::test]
async fn a_purchase_transaction_dropped_midway_is_rolled_back() {
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let mut tx = app.store.begin().await.unwrap();
    sqlx::query("UPDATE tb_seckill_voucher SET stock = stock - 1 WHERE voucher_id = ?")
        .bind(voucher)
        .execute(&mut *tx)
        .await
        .unwrap();
    drop(tx);

    // Free once the rollback has run: a row another session still holds
    // would make this wait out its one-second lock timeout.
    let other = app
        .mysql_session_with("SET SESSION innodb_lock_wait_timeout = 1")
        .await;
    let other = tokio::sync::Mutex::new(other);
    wait_until(
        "the dropped transaction to let the stock row go",
        NO_HANG,
        || async {
            sqlx::query("UPDATE tb_seckill_voucher SET stock = stock WHERE voucher_id = ?")
                .bind(voucher)
                .execute(&mut *other.lock().await)
                .await
                .is_ok()
        },
    )
    .await;
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.stock_left),
        (0, 10),
        "rolled back"
    );
    let token = app.login(&phone(1)).await;
    assert_eq!(app.purchase(voucher, &token).await["success"], true);
}

/// An unknown voucher id is remembered as missing for a moment, so that a
/// flood of purchases of ids that do not exist does not reach MySQL every
/// time. Shown with the voucher table locked elsewhere: the repeat is
/// refused at once instead of waiting on that lock.
#[tokio::test]
async fn an_unknown_voucher_is_refused_again_without_asking_mysql() {
    let app = spawn_app(|s| s.store.timeout.backend_timeout_ms = 1000).await;
    let token = app.login(&phone(1)).await;
    let unknown = VoucherId::new(987_654_321);
    let first = app.purchase(unknown, &token).await;
    assert_eq!(first["errorCode"], "VOUCHER_NOT_FOUND", "{first}");

    let mut blocker = app
        .mysql_session_with("LOCK TABLES tb_seckill_voucher WRITE")
        .await;
    let (status, body, _) = timed_purchase(&app, unknown, &token).await;
    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut blocker)
        .await
        .unwrap();
    assert_eq!(
        (status, &body["errorCode"]),
        (200, &Value::from("VOUCHER_NOT_FOUND")),
        "{body}"
    );
}

/// A replica frozen while purchases wait for it (`--lock-sync-replicas`):
/// each acquisition's `WAIT` runs out and the purchase is refused, and
/// nothing else is held up. Sessions, `/ready` and logins answer as before,
/// the `WAIT`s being on the lock's own connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_costs_purchases_their_lock_and_nothing_else() {
    const BUYERS: usize = 8;
    let master = RedisServer::start().await.unwrap();
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()])
            .await
            .unwrap();
    let mut master_connection = master.connect().await.unwrap();
    hmdp_test_support::wait_until("the replica in sync", Duration::from_secs(20), || {
        let mut redis = master_connection.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut redis)
                .await
                .unwrap();
            info.contains("connected_slaves:1") && info.contains("state=online")
        }
    })
    .await;
    let app = spawn_app(|s| {
        s.store.redis.url = master.url();
        s.lock.mode = LockMode::Reentrant;
        s.lock.lock_sync_replicas = 1;
        s.lock.lock_sync_timeout_ms = 1000;
        s.store.timeout.backend_timeout_ms = 2000;
    })
    .await;
    let voucher = app.create_open_seckill(100).await;
    let tokens = app.login_many(BUYERS).await;

    replica.pause().unwrap();
    let purchases = join_all(tokens.iter().map(|token| app.purchase(voucher, token)));
    let others = async {
        wait_until_locked(&app).await;
        let ready = app.get("/ready", None).await.status().as_u16();
        let me = app
            .get("/user/me", Some(&tokens[0]))
            .await
            .status()
            .as_u16();
        (ready, me)
    };
    let (answers, (ready, me)) = tokio::join!(purchases, others);
    replica.resume().unwrap();
    let _: () = redis::cmd("PING")
        .query_async(&mut master_connection)
        .await
        .unwrap();

    assert_eq!(
        ready, 200,
        "/ready while purchases wait for a frozen replica"
    );
    assert_eq!(
        me, 200,
        "/user/me while purchases wait for a frozen replica"
    );
    for answer in &answers {
        assert_eq!(answer["errorCode"], "UNAVAILABLE", "{answer}");
    }
    assert_eq!(
        app.audit(voucher).await.active_orders,
        0,
        "no order without its lock replicated"
    );
}

/// Waits until a purchase holds a user's lock (and so waits for its
/// replica).
async fn wait_until_locked(app: &TestApp) {
    hmdp_test_support::wait_until(
        "a purchase holding its lock",
        Duration::from_secs(20),
        || async { !app.lock_keys().await.is_empty() },
    )
    .await;
}

/// Redis lost two vouchers' sales and MySQL is frozen: each purchase that
/// must load its sale again gives up within the backend timeout (503), and
/// none waits behind another voucher's load; once MySQL is back, both sell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_mysql_makes_sale_reloads_give_up_not_pile_up() {
    let mysql = SlowCommitMariaDb::start().await;
    let app = spawn_app_on(&mysql.url(), |s| {
        s.seckill = hmdp::config::SeckillMode::Queue;
        s.store.timeout.backend_timeout_ms = 1000;
    })
    .await;
    let vouchers = [
        app.create_open_seckill(10).await,
        app.create_open_seckill(10).await,
    ];
    let tokens = app.login_many(3).await;
    for voucher in vouchers {
        assert_eq!(app.purchase(voucher, &tokens[0]).await["success"], true);
    }
    hmdp_test_support::wait_until("the orders written", Duration::from_secs(20), || async {
        app.pending_orders().await == 0
    })
    .await;
    // Redis loses both sales (evicted, or restarted empty).
    for voucher in vouchers {
        let keys = [
            app.keys().single().voucher(voucher),
            app.keys().single().buyers(voucher),
        ];
        let _: () = redis::AsyncCommands::del(&mut app.redis.clone(), &keys)
            .await
            .unwrap();
    }

    mysql.pause();
    let app = &app;
    let purchases = vouchers.iter().flat_map(|voucher| {
        tokens[1..].iter().map(move |token| async move {
            let path = format!("/voucher-order/seckill/{voucher}");
            let response =
                tokio::time::timeout(Duration::from_secs(30), app.post(&path, Some(token)))
                    .await
                    .expect("a purchase piled up behind a load that never ends");
            response.json::<Value>().await.unwrap()
        })
    });
    let answers = join_all(purchases).await;
    mysql.resume();
    for answer in &answers {
        assert_eq!(answer["errorCode"], "UNAVAILABLE", "{answer}");
    }

    // Once MySQL is back, each sale loads again, and opens after the
    // backend timeout (writers holding orders admitted before the loss
    // count them again meanwhile).
    for voucher in vouchers {
        hmdp_test_support::wait_until("the sale sells again", Duration::from_secs(30), || async {
            let answer = app.purchase(voucher, &tokens[1]).await;
            assert!(
                answer["success"] == true || answer["errorCode"] == "UNAVAILABLE",
                "{answer}"
            );
            answer["success"] == true
        })
        .await;
    }
}
