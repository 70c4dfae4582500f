//! A Redis that lost its last writes, as a failover to a replica that
//! missed them or an `appendfsync everysec` crash leaves it: the buyers who
//! purchase after the loss are judged by what they were told. Nobody is
//! told success without an order in MySQL, nobody twice, no order id goes
//! to two buyers; the sale answers again within seconds.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use hmdp::config::SeckillMode;
use hmdp::ids::{UserId, VoucherId};
use hmdp::shards::Layout;
use hmdp_test_support::{wait_until, Direction, Faults, RedisServer, TcpProxy, Verdict};
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::helpers::{
    buy_at, metric, open_seckill_body, spawn_app, NodeProcess, TestApp, ADMIN_TOKEN,
};

const WAIT: Duration = Duration::from_secs(30);

/// How soon after the loss a purchase gets a definite answer (success or
/// refusal) again: the sale is closed while it is loaded again.
pub const ANSWERS_AGAIN_WITHIN: Duration = Duration::from_secs(5);

/// What one buyer was told: their id and the answer's body.
pub type Told = (UserId, Value);

/// The broken promises of a run, judged by what the clients were told
/// once every order on its way is written.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Broken {
    /// Successes whose order MySQL does not hold as that buyer's.
    pub success_without_order: usize,
    /// Buyers told success with two different orders of one voucher.
    pub told_twice: usize,
    /// Order ids answered to two buyers.
    pub ids_twice: usize,
}

/// Judges `told` (every answer of the run, before the loss and after)
/// against MySQL's orders of `voucher`.
pub async fn judge(app: &TestApp, voucher: VoucherId, told: &[Told]) -> Broken {
    let mut broken = Broken::default();
    let mut ids_of: HashMap<UserId, HashSet<i64>> = HashMap::new();
    let mut buyer_of: HashMap<i64, UserId> = HashMap::new();
    for (user, answer) in told.iter().filter(|(_, answer)| answer["success"] == true) {
        let id: i64 = answer["data"].as_str().unwrap().parse().unwrap();
        ids_of.entry(*user).or_default().insert(id);
        if buyer_of
            .insert(id, *user)
            .is_some_and(|other| other != *user)
        {
            broken.ids_twice += 1;
        }
        let orders = app.tables().order_ids_of(voucher.get(), user.get()).await;
        if !orders.unwrap().contains(&id) {
            broken.success_without_order += 1;
        }
    }
    broken.told_twice = ids_of.values().filter(|ids| ids.len() > 1).count();
    broken
}

/// A sale of `stock` units in `shards` shards, open now.
pub async fn create_sale(app: &TestApp, stock: i64, shards: u16) -> VoucherId {
    let mut body = open_seckill_body(stock);
    body["shards"] = json!(shards);
    let created: Value = (app
        .post_voucher("/voucher/seckill", ADMIN_TOKEN, &body)
        .await)
        .json()
        .await
        .unwrap();
    VoucherId::new(created["data"].as_str().unwrap().parse().unwrap())
}

/// Each of `tokens` buys once, all at once; their answers.
pub async fn buy_all(app: &TestApp, voucher: VoucherId, tokens: &[String]) -> Vec<Told> {
    join_all(
        tokens.iter().map(|token| async move {
            (app.user_id(token).await, app.purchase(voucher, token).await)
        }),
    )
    .await
}

/// Each buyer — the node's address, their token and user id — buys until
/// the answer is definite (a reloaded sale answers 503 until it reopens),
/// all at once; every answer, and when the last definite one came.
pub async fn buy_until_answered(
    voucher: VoucherId,
    buyers: &[(&str, &str, UserId)],
) -> (Vec<Told>, Instant) {
    let answers = join_all(buyers.iter().map(|&(address, token, user)| async move {
        let mut told = Vec::new();
        loop {
            let answer = buy_at(address, voucher, token).await;
            let definite = answer["errorCode"] != "UNAVAILABLE";
            told.push((user, answer));
            if definite {
                return (told, Instant::now());
            }
            // A 503's own pace: a buyer asks again shortly.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }))
    .await;
    let last = answers.iter().map(|(_, at)| *at).max().unwrap();
    (
        answers.into_iter().flat_map(|(told, _)| told).collect(),
        last,
    )
}

/// Each answer's code (`success` for a success) and how many times it
/// was answered, in words.
pub fn summary(told: &[Told]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for (_, answer) in told {
        let code = match answer["success"] == true {
            true => "success".to_owned(),
            false => answer["errorCode"].as_str().unwrap_or("?").to_owned(),
        };
        *counts.entry(code).or_default() += 1;
    }
    let counts: Vec<String> = counts
        .iter()
        .map(|(code, n)| format!("{code} ×{n}"))
        .collect();
    counts.join(", ")
}

/// Waits until every order admitted is written or dead-lettered.
pub async fn wait_settled(app: &TestApp) {
    wait_until("no order on its way", WAIT, || async {
        app.pending_orders().await == 0
    })
    .await;
}

/// How Redis forgets in these tests.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// The issue's: three buyers gone from the buyer set and their units
    /// back in stock, as a lagging replica holds the sale.
    BuyersAndStock,
    /// The sale's hash and buyer set as they were two buyers earlier (a
    /// replica's or a file's older copy, consistent in itself). One shard's
    /// own sequence is its fence: a sharded sale's shard restored to before
    /// it lent units, on a server that kept its replication id, is the
    /// window docs/guarantees.md names (a restart or a promotion draws a
    /// new id, which the real failover below meets).
    OlderCopy,
}

/// Five buyers bought and their orders are written; Redis then forgets
/// the last three (`loss`); two new buyers and one forgotten buyer
/// purchase at once, and ask again until answered.
async fn after_redis_forgets(mode: SeckillMode, shards: u16, loss: Loss) {
    let app = spawn_app(|s| {
        s.seckill = mode;
        // A user's default: a reloaded sale is closed for this long.
        s.store.timeout.backend_timeout_ms = 2_000;
    })
    .await;
    let voucher = create_sale(&app, 5, shards).await;
    let layout = Layout::new(shards.into()).unwrap();
    let tokens = app.login_many(7).await;
    let mut redis = app.redis.clone();
    let keys = app.keys();
    let mut told = buy_all(&app, voucher, &tokens[..2]).await;
    // What each shard held after two buyers.
    let mut older = Vec::new();
    for shard in layout.shards() {
        let keys = keys.shard(shard);
        for key in [keys.voucher(voucher), keys.buyers(voucher)] {
            let dump: Option<Vec<u8>> = redis::cmd("DUMP")
                .arg(&key)
                .query_async(&mut redis)
                .await
                .unwrap();
            older.push((key, dump));
        }
    }
    told.extend(buy_all(&app, voucher, &tokens[2..5]).await);
    assert!(
        told.iter().all(|(_, answer)| answer["success"] == true),
        "{told:?}"
    );
    wait_until("five orders written", WAIT, || async {
        app.audit(voucher).await.active_orders == 5 && app.pending_orders().await == 0
    })
    .await;

    let lost_at = Instant::now();
    match loss {
        Loss::BuyersAndStock => {
            for token in &tokens[2..5] {
                let user = app.user_id(token).await;
                let shard = keys.shard(layout.shard_of(user));
                let _: () = redis.srem(shard.buyers(voucher), user.get()).await.unwrap();
                let _: () = redis
                    .hincr(shard.voucher(voucher), "stock", 1)
                    .await
                    .unwrap();
            }
        }
        Loss::OlderCopy => {
            for (key, dump) in &older {
                let _: () = redis.del(key).await.unwrap();
                if let Some(dump) = dump {
                    let _: () = redis::cmd("RESTORE")
                        .arg(key)
                        .arg(0)
                        .arg(dump)
                        .query_async(&mut redis)
                        .await
                        .unwrap();
                }
            }
        }
    }
    let mut after = Vec::new();
    for token in [&tokens[5], &tokens[6], &tokens[3]] {
        after.push((
            app.address.as_str(),
            token.as_str(),
            app.user_id(token).await,
        ));
    }
    let (again, answered_at) = buy_until_answered(voucher, &after).await;
    let waited = answered_at - lost_at;
    println!(
        "{mode:?}, {shards} shard(s), {loss:?}: answered again after {waited:?}: {}",
        summary(&again)
    );
    told.extend(again);
    wait_settled(&app).await;
    let broken = judge(&app, voucher, &told).await;
    let audit = app.audit(voucher).await;
    println!("broken promises: {broken:?}; MySQL: {audit:?}");
    assert_eq!(broken, Broken::default(), "{}", summary(&told));
    assert!(
        waited < ANSWERS_AGAIN_WITHIN,
        "answered again after {waited:?}"
    );
    assert_eq!((audit.active_orders, audit.stock_left), (5, 0), "{audit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_buyers_after_redis_forgot_buyers_and_stock_are_told_no_false_success() {
    after_redis_forgets(SeckillMode::Stream, 1, Loss::BuyersAndStock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_buyers_after_redis_went_back_to_an_older_copy_are_told_no_false_success() {
    after_redis_forgets(SeckillMode::Stream, 1, Loss::OlderCopy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_buyers_after_redis_forgot_buyers_and_stock_are_told_no_false_success() {
    after_redis_forgets(SeckillMode::Queue, 1, Loss::BuyersAndStock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_buyers_after_redis_went_back_to_an_older_copy_are_told_no_false_success() {
    after_redis_forgets(SeckillMode::Queue, 1, Loss::OlderCopy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_buyers_after_redis_forgot_buyers_and_stock_are_told_no_false_success() {
    after_redis_forgets(SeckillMode::Stream, 4, Loss::BuyersAndStock).await;
}

/// The replication link of a replica, through a proxy: cut, every chunk
/// either way closes its connection (the replica keeps reconnecting, and
/// keeps failing), as a partition between the two machines does.
struct Link {
    cut: AtomicBool,
}

impl Faults for Link {
    async fn chunk(&self, _connection: u64, _direction: Direction, _chunk: &[u8]) -> Verdict {
        match self.cut.load(Ordering::SeqCst) {
            true => Verdict::Close,
            false => Verdict::Pass,
        }
    }
}

/// `field` of `INFO replication` on `redis`.
async fn replication(redis: &RedisServer, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut redis.connect().await.unwrap())
        .await
        .unwrap();
    let line = info
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")));
    line.unwrap_or_default().trim().to_owned()
}

/// A shop's failover, for real: a Redis master with one replica, two
/// nodes of `mode` whose Redis address follows the master (a proxy, as
/// haproxy or a virtual IP would), a sale of stock 10 in `shards` shards.
/// Buyers 1–2 buy and the replica has it all; its link is cut while buyers
/// 3–5 buy and their orders reach MySQL; the master is killed, the replica
/// promoted, the address moved to it. Buyers 3–7 purchase again: the nodes
/// find the sale on another server, load it again from MySQL, and tell
/// nobody success without an order, nobody twice, no id twice.
async fn after_a_failover(mode: SeckillMode, shards: u16) {
    let mut master = RedisServer::start().await.unwrap();
    let link = Arc::new(Link {
        cut: AtomicBool::new(false),
    });
    let to_master = TcpProxy::start(master.port(), link.clone()).await.unwrap();
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &to_master.port().to_string()])
            .await
            .unwrap();
    let address = TcpProxy::start(master.port(), Arc::new(Passes))
        .await
        .unwrap();
    let redis_url = format!("redis://127.0.0.1:{}/0", address.port());
    let app = spawn_app(|s| {
        s.seckill = mode;
        s.store.redis.url = redis_url.clone();
        s.store.timeout.backend_timeout_ms = 2_000;
    })
    .await;
    let other = NodeProcess::start_with_env(
        &app,
        &[match mode {
            SeckillMode::Queue => "--seckill=queue",
            _ => "--seckill=stream",
        }],
        &[("REDIS_URL", redis_url.as_str())],
    )
    .await;
    let voucher = create_sale(&app, 10, shards).await;
    let tokens = app.login_many(7).await;
    let users = join_all(tokens.iter().map(|token| app.user_id(token))).await;
    let nodes = [app.address.clone(), other.address.clone()];
    let buy = |buyer: usize| {
        let (address, token, user) = (&nodes[buyer % 2], &tokens[buyer], users[buyer]);
        async move { (user, buy_at(address, voucher, token).await) }
    };
    let mut told: Vec<Told> = join_all((0..2).map(buy)).await;
    wait_until("the replica caught up", WAIT, || async {
        let offset = replication(&master, "master_repl_offset").await;
        replication(&replica, "master_link_status").await == "up"
            && replication(&replica, "slave_repl_offset").await == offset
    })
    .await;

    link.cut.store(true, Ordering::SeqCst);
    told.extend(join_all((2..5).map(buy)).await);
    assert!(
        told.iter().all(|(_, answer)| answer["success"] == true),
        "{}",
        summary(&told)
    );
    wait_until("five orders written", WAIT, || async {
        app.audit(voucher).await.active_orders == 5
    })
    .await;
    assert_eq!(replication(&replica, "master_link_status").await, "down");

    master.kill();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut replica.connect().await.unwrap())
        .await
        .unwrap();
    address.move_to(replica.port());
    let moved_at = Instant::now();
    let buyers: Vec<(&str, &str, UserId)> = (2..7)
        .map(|buyer| {
            (
                nodes[buyer % 2].as_str(),
                tokens[buyer].as_str(),
                users[buyer],
            )
        })
        .collect();
    let (again, answered_at) = buy_until_answered(voucher, &buyers).await;
    let waited = answered_at - moved_at;
    println!(
        "after the failover, answered again after {waited:?}: {}",
        summary(&again)
    );
    told.extend(again);
    // The test's own connection went down with the master: its first call
    // after reconnects.
    wait_until("the new buyers' orders written", WAIT, || async {
        let on_their_way = app.sale_state().orders_on_their_way().await;
        app.audit(voucher).await.active_orders == 7
            && on_their_way.is_ok_and(|(pending, _)| pending == 0)
    })
    .await;
    let broken = judge(&app, voucher, &told).await;
    let audit = app.audit(voucher).await;
    println!("broken promises: {broken:?}; MySQL: {audit:?}");
    assert_eq!(broken, Broken::default(), "{}", summary(&told));
    assert!(
        waited < ANSWERS_AGAIN_WITHIN,
        "answered again after {waited:?}"
    );
    assert_eq!(
        (audit.active_orders, audit.stock_left, audit.duplicate_users),
        (7, 3, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_buyers_after_a_failover_to_a_replica_that_missed_admissions_are_told_no_false_success(
) {
    after_a_failover(SeckillMode::Stream, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_buyers_after_a_failover_to_a_replica_that_missed_admissions_are_told_no_false_success(
) {
    after_a_failover(SeckillMode::Queue, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_buyers_after_a_failover_to_a_replica_that_missed_admissions_are_told_no_false_success(
) {
    after_a_failover(SeckillMode::Stream, 4).await;
}

/// A proxy that lets everything through.
struct Passes;

impl Faults for Passes {
    async fn chunk(&self, _connection: u64, _direction: Direction, _chunk: &[u8]) -> Verdict {
        Verdict::Pass
    }
}

/// The synchronous purchase keeps its Idempotency-Key answers in Redis;
/// Redis forgets them (a restart, a failover): the same key sent again is
/// answered with the order MySQL wrote for it, not ALREADY_ORDERED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_idempotency_key_redis_forgot_is_answered_with_its_order() {
    let app = spawn_app(|s| s.seckill = SeckillMode::Sync).await;
    let voucher = create_sale(&app, 2, 1).await;
    let token = &app.login_many(1).await[0];
    let first = app.purchase_with_key(voucher, token, "k").await;
    assert_eq!(first["success"], true, "{first}");

    let user = app.user_id(token).await;
    let kept = app.keys().single().idempotency(user, "k");
    assert!(app.key_exists(&kept).await, "the answer is kept in Redis");
    let _: () = app.redis.clone().del(&kept).await.unwrap();

    let again = app.purchase_with_key(voucher, token, "k").await;
    println!("the key sent again after Redis forgot its answer: {again}");
    assert_eq!(again["data"], first["data"], "{again}");
    let other = app.purchase_with_key(voucher, token, "another").await;
    assert_eq!(other["errorCode"], "ALREADY_ORDERED", "{other}");
    assert_eq!(app.audit(voucher).await.active_orders, 1);
}

/// A Redis restarted from its append-only file keeps the sale, whole in
/// appearance: with nobody buying, each node's per-second probe notices the
/// new server and has the sale loaded again from MySQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_is_noticed_by_the_probe_and_its_sales_reloaded_with_nobody_buying() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
        .await
        .unwrap();
    let app = spawn_app(|s| {
        s.seckill = SeckillMode::Stream;
        s.store.redis.url = redis.url();
    })
    .await;
    let voucher = create_sale(&app, 5, 1).await;
    let tokens = app.login_many(2).await;
    let told = buy_all(&app, voucher, &tokens).await;
    assert!(
        told.iter().all(|(_, answer)| answer["success"] == true),
        "{}",
        summary(&told)
    );
    wait_settled(&app).await;

    app.restart_redis(&mut redis).await;
    let reloaded = "hmdp_sales_reloaded_total{found=\"server_changed\"}";
    let changes = "hmdp_redis_server_changes_total{how=\"restarted or replaced\"}";
    wait_until(
        "the probe noticed the restart and reloaded the sale",
        WAIT,
        || async {
            metric(&app.address, changes).await >= 1.0
                && metric(&app.address, reloaded).await >= 1.0
        },
    )
    .await;
    let sale = app.redis_sale(voucher).await.expect("the sale in Redis");
    assert_eq!((sale.stock, sale.buyers.len()), (3, 2), "{sale:?}");
}
