//! A client that hangs up must not buy twice, nor leave a transaction open.
//!
//! A TCP reset makes actix drop the request's future wherever it is. These
//! tests reset requests at every step of a purchase (before the lock, with
//! the lock held, inside the transaction, while its `COMMIT` is in flight on
//! a MariaDB whose commits take 20 ms) while the same user keeps buying on
//! two other connections, and reset admin writes and cancel transactions
//! around `BEGIN`; then they check that no user holds two orders, that no
//! transaction is left open on a pooled connection, and that every success
//! the API answered is visible to other sessions.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hmdp::config::ServeSettings;
use hmdp::ids::{OrderId, UserId, VoucherId};
use hmdp::store::{Found, Lookup, NewSeckillVoucher, NewVoucher, Store, Tx};
use hmdp_lock::LockMode;
use hmdp_test_support::{RedisServer, Tables};
use serde_json::Value;
use sqlx::Connection;

use crate::helpers::{
    open_seckill_body, send_then_reset, socket_address, spawn_app, spawn_app_on, TestApp,
    ADMIN_TOKEN,
};
use crate::slow_mysql::{DelayedReplies, SlowCommitMariaDb, COMMIT_DELAY};

/// Users per lock mode, each with one reset purchase and two buyers.
const USERS: usize = 40;
/// How long the two buyers keep buying after the reset request was sent.
const BUYING_FOR: Duration = Duration::from_millis(80);

/// A purchase as raw HTTP/1.1, for a connection a test resets.
pub fn purchase_request(voucher: VoucherId, token: &str) -> String {
    format!(
        "POST /voucher-order/seckill/{voucher} HTTP/1.1\r\nhost: node\r\n\
         authorization: {token}\r\ncontent-length: 0\r\n\r\n"
    )
}

/// One user's race: a purchase reset `reset_after` it was sent, and two
/// buyers that start right after it and keep buying. Returns the order ids
/// the API answered with.
async fn race(app: &TestApp, voucher: VoucherId, token: &str, reset_after: Duration) -> Vec<i64> {
    let request = purchase_request(voucher, token);
    let reset = send_then_reset(socket_address(app), &request, reset_after);
    let buyer = || async {
        // Part of the scenario: the buyers start just after the reset
        // request is sent.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let until = Instant::now() + reset_after + BUYING_FOR;
        let mut orders = Vec::new();
        while Instant::now() < until {
            let body = app.purchase(voucher, token).await;
            if body["success"] == true {
                orders.push(body["data"].as_str().unwrap().parse().unwrap());
            }
        }
        orders
    };
    let ((), first, second) = tokio::join!(reset, buyer(), buyer());
    first.into_iter().chain(second).collect()
}

/// Transactions open on `app`'s database, waiting a while for purchases still
/// finishing (a cancelled request's work goes on) to end; with each one left
/// open, what its session is doing (printed should the test fail).
///
/// The wait is generous: on a loaded machine a purchase queued behind the
/// stock row can take seconds to end (each lock wait is bounded by the
/// backend timeout), while a transaction leaked on a pooled connection
/// never ends at all.
async fn open_transactions(app: &TestApp) -> (i64, Vec<String>) {
    let open = app.open_transactions_after(Duration::from_secs(20)).await;
    (open, describe_open_transactions(app).await)
}

/// Each open transaction: its state, its session's, and the last
/// statements that session ran, oldest first, each with how long ago it
/// ended (the slow-commit server keeps a history of them; other servers
/// answer without it). A prepared statement's execution has no text there:
/// it shows as `Execute`, with the rows it changed.
async fn describe_open_transactions(app: &TestApp) -> Vec<String> {
    app.tables().describe_open_transactions().await.unwrap()
}

/// How many of `orders` another session can see.
async fn visible(app: &TestApp, orders: &[i64]) -> usize {
    let mut other = sqlx::MySqlConnection::connect(&app.database_url())
        .await
        .unwrap();
    let mut seen = 0;
    for order in orders {
        let found: Option<i64> = sqlx::query_scalar("SELECT id FROM tb_voucher_order WHERE id = ?")
            .bind(order)
            .fetch_optional(&mut other)
            .await
            .unwrap();
        seen += usize::from(found.is_some());
    }
    seen
}

struct Outcome {
    setup: String,
    orders: i64,
    duplicate_users: i64,
    open_transactions: i64,
    /// What each open transaction's session is doing.
    open_detail: Vec<String>,
    answered: usize,
    visible: usize,
    stock_balances: bool,
}

/// One lock setup of the reset test, named as its flags would read.
struct Setup {
    name: &'static str,
    mode: LockMode,
    fencing: bool,
}

async fn reset_purchases(db: &SlowCommitMariaDb, setup: &Setup, lock_nodes: &[String]) -> Outcome {
    let app = spawn_app_on(&db.url(), |s: &mut ServeSettings| {
        s.db_pool = 32;
        s.lock.mode = setup.mode;
        s.lock.fencing = setup.fencing;
        if matches!(setup.mode, LockMode::Multi | LockMode::Redlock) {
            s.lock.lock_nodes = lock_nodes.to_vec();
        }
    })
    .await;
    let stock = 1000;
    let voucher = app.create_open_seckill(stock).await;
    let tokens = app.login_many(USERS).await;
    // Resets from 1 ms to past one commit's length, so that they land on
    // every step of the purchase: waiting, locked, in the transaction, in
    // the commit.
    let span = (COMMIT_DELAY * 5 / 4).as_micros() as usize;
    // One user at a time: users buying together would queue for the
    // voucher's stock row, and most resets would land in that queue.
    let mut answered = Vec::new();
    for (user, token) in tokens.iter().enumerate() {
        let reset_after = Duration::from_micros((1000 + user * span / USERS) as u64);
        answered.extend(race(&app, voucher, token, reset_after).await);
    }
    let (open_transactions, open_detail) = open_transactions(&app).await;
    let audit = app.audit(voucher).await;
    Outcome {
        setup: setup.name.to_owned(),
        orders: audit.active_orders,
        duplicate_users: audit.duplicate_users,
        open_transactions,
        open_detail,
        answered: answered.len(),
        visible: visible(&app, &answered).await,
        stock_balances: audit.stock_balances(stock),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_reset_at_any_step_buys_at_most_once_in_every_lock_mode() {
    let db = SlowCommitMariaDb::start().await;
    let mut lock_nodes = Vec::new();
    for _ in 0..3 {
        lock_nodes.push(RedisServer::start().await.unwrap());
    }
    let nodes: Vec<String> = lock_nodes.iter().map(RedisServer::url).collect();
    let setup = |name, mode, fencing| Setup {
        name,
        mode,
        fencing,
    };
    let setups = [
        setup("--lock=reentrant", LockMode::Reentrant, false),
        setup("--lock=reentrant --fencing", LockMode::Reentrant, true),
        setup("--lock=local", LockMode::Local, false),
        setup("--lock=redis-naive", LockMode::RedisNaive, false),
        setup("--lock=redis-owner", LockMode::RedisOwner, false),
        setup("--lock=redis-lua", LockMode::RedisLua, false),
        setup("--lock=multi", LockMode::Multi, false),
        setup("--lock=redlock", LockMode::Redlock, false),
    ];
    let mut outcomes = Vec::new();
    for setup in &setups {
        outcomes.push(reset_purchases(&db, setup, &nodes).await);
    }

    println!(
        "{:<28} {:>5} {:>6} {:>16} {:>18} {:>9} {:>8}",
        "setup", "users", "orders", "two-order users", "open transactions", "answered", "visible"
    );
    for outcome in &outcomes {
        println!(
            "{:<28} {USERS:>5} {:>6} {:>16} {:>18} {:>9} {:>8}",
            outcome.setup,
            outcome.orders,
            outcome.duplicate_users,
            outcome.open_transactions,
            outcome.answered,
            outcome.visible
        );
    }
    for outcome in &outcomes {
        assert_eq!(outcome.duplicate_users, 0, "{}: two orders", outcome.setup);
        assert_eq!(
            outcome.open_transactions, 0,
            "{}: open: {:?}",
            outcome.setup, outcome.open_detail
        );
        assert_eq!(outcome.visible, outcome.answered, "{}", outcome.setup);
        assert!(outcome.stock_balances, "{}: stock", outcome.setup);
    }
}

/// How long the proxy holds back each reply of MySQL: every statement,
/// `BEGIN` included, is in flight at least this long.
const REPLY_DELAY: Duration = Duration::from_millis(4);

/// An admin write reset around its `BEGIN` (replies of MySQL delayed, so
/// that each statement is in flight for a while): whatever the client
/// learns, the node's pool must not keep a connection inside a transaction,
/// where later writes would stay invisible to everyone else.
#[tokio::test]
async fn an_admin_write_reset_around_begin_leaves_no_open_transaction() {
    let direct = spawn_app(|_| {}).await;
    let proxy = DelayedReplies::start(3306, REPLY_DELAY).await;
    let app = spawn_app(|s| {
        s.store.database.url = proxy.url(&direct.database_url());
        s.store.redis.prefix = direct.prefix.clone();
        s.no_migrate = true;
        s.db_pool = 1;
    })
    .await;
    let body = open_seckill_body(10);
    let request = format!(
        "POST /voucher/seckill HTTP/1.1\r\nhost: node\r\nx-admin-token: {ADMIN_TOKEN}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.to_string().len()
    );
    let mut other = sqlx::MySqlConnection::connect(&direct.database_url())
        .await
        .unwrap();
    // From before the connection is taken to past the commit, in steps
    // shorter than one reply's delay; after each, an ordinary voucher (one
    // `INSERT`, no transaction of its own) on the node's one connection must
    // be visible at once to another session: on a connection left inside a
    // transaction it would not be.
    for step in 0..60u64 {
        let after = Duration::from_micros(step * 500);
        send_then_reset(socket_address(&app), &request, after).await;
        let created: Value = app
            .post_voucher("/voucher", ADMIN_TOKEN, &body)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(created["success"], true, "{created}");
        let id: u64 = created["data"].as_str().unwrap().parse().unwrap();
        let found: Option<u64> = sqlx::query_scalar("SELECT id FROM tb_voucher WHERE id = ?")
            .bind(id)
            .fetch_optional(&mut other)
            .await
            .unwrap();
        assert_eq!(
            found,
            Some(id),
            "after a write reset {after:?} after it was sent, an answered voucher is invisible to others"
        );
    }
    let (open, detail) = open_transactions(&direct).await;
    assert_eq!(open, 0, "{detail:?}");
}

/// A store of one connection whose MySQL replies come `REPLY_DELAY` late,
/// with the app and the proxy behind it.
async fn store_with_late_replies() -> (TestApp, DelayedReplies, Store) {
    let direct = spawn_app(|_| {}).await;
    let proxy = DelayedReplies::start(3306, REPLY_DELAY).await;
    let url = proxy.url(&direct.database_url());
    let store = Store::connect_lazy(&url, 1, Duration::from_secs(10)).unwrap();
    (direct, proxy, store)
}

/// The same moment swept at the store: a write cancelled after 0, 1, 2, ...
/// ms (each reply 4 ms late) hands its connection back either outside any
/// transaction or not at all.
#[tokio::test]
async fn a_transaction_cancelled_at_any_moment_never_returns_to_the_pool_open() {
    let (_direct, _proxy, store) = store_with_late_replies().await;
    let (voucher, seckill) = hmdp_voucher();
    for after_ms in 0..30 {
        let write = store.insert_seckill_voucher(&voucher, &seckill);
        let _ = tokio::time::timeout(Duration::from_millis(after_ms), write).await;
        let in_transaction = Tables::of(store.pool()).in_transaction().await.unwrap();
        assert!(
            !in_transaction,
            "a write cancelled after {after_ms} ms left its connection in a transaction"
        );
    }
}

/// The order transaction's opening swept the same way: `BEGIN` rides in
/// the round trip of its lookup, and a cancellation at any moment of it
/// hands the connection back outside any transaction or not at all.
#[tokio::test]
async fn a_transaction_begun_with_its_lookup_cancelled_at_any_moment_never_returns_open() {
    let (_direct, _proxy, store) = store_with_late_replies().await;
    let lookup = Lookup {
        ids: vec![OrderId::new(1)],
        users: BTreeMap::from([(VoucherId::new(1), vec![UserId::new(1)])]),
    };
    for after_ms in 0..30 {
        let begin = async {
            let (tx, found) = Tx::begin_looking_up(store.connection().await?, &lookup).await?;
            Ok::<_, sqlx::Error>((tx, found))
        };
        // Begun or not, the transaction is dropped uncommitted.
        let begun = tokio::time::timeout(Duration::from_millis(after_ms), begin).await;
        if let Ok(begun) = begun {
            assert_eq!(begun.unwrap().1, Found::default());
        }
        let in_transaction = Tables::of(store.pool()).in_transaction().await.unwrap();
        assert!(
            !in_transaction,
            "a transaction cancelled {after_ms} ms into its opening left its connection in it"
        );
    }
}

fn hmdp_voucher() -> (NewVoucher, NewSeckillVoucher) {
    let time = |text: &str| text.parse().expect("a datetime");
    let voucher = NewVoucher {
        shop_id: 1,
        title: "100元代金券".into(),
        sub_title: None,
        rules: None,
        pay_value: 8000,
        actual_value: 10000,
        voucher_type: 1,
        status: 1,
    };
    let seckill = NewSeckillVoucher {
        stock: 10,
        begin_time: time(hmdp_test_support::OPEN_SALE.0),
        end_time: time(hmdp_test_support::OPEN_SALE.1),
        shards: 1,
    };
    (voucher, seckill)
}
