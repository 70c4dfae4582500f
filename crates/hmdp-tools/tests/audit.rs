//! `hmdp audit` and `hmdp loadtest --verify` on an asynchronous sale, run as
//! commands against two `stream` nodes behind nginx: the verified load test
//! waits for the orders to be written and audits them; the audit holds on
//! the clean sale and names what a buyer added in Redis or an order row
//! deleted by hand broke (the nodes stopped first: their reconciler heals
//! such breaks); a voucher Redis holds no sale for gets the MySQL
//! checks only. And `hmdp bench-drain` on the same nodes.

mod common;

use std::path::PathBuf;

use chrono::{TimeDelta, Utc};
use hmdp::config::SeckillMode;
use hmdp::id_worker::compose;
use hmdp::ids::{OrderId, UserId, VoucherId};
use hmdp::keys::Keys;
use hmdp::shards::{slot, Layout, Shard};
use hmdp_lock::LockMode;
use hmdp_test_support::Tables;
use hmdp_tools::nodes::{node_flags, Nodes, NodesSpec, Sandbox};
use redis::AsyncCommands;

use common::{hmdp, hmdp_report, seckill_voucher_in_mysql};

fn audit(sandbox: &Sandbox, voucher: i64) -> (i32, String) {
    hmdp(sandbox, &["audit", "--voucher", &voucher.to_string()])
}

/// Two `stream` nodes (with `extra` flags) behind nginx, on a sandbox of
/// their own.
async fn stream_nodes(extra: &[&str]) -> (Sandbox, NodesSpec, Nodes) {
    let sandbox = common::sandbox().await;
    let spec = NodesSpec::in_sandbox(PathBuf::from(env!("CARGO_BIN_EXE_hmdp")), &sandbox);
    let mut flags = node_flags(LockMode::Reentrant, SeckillMode::Stream, 0);
    flags.push("--db-pool=8".to_owned());
    flags.extend(extra.iter().map(|flag| flag.to_string()));
    let nodes = Nodes::start(spec.clone(), &flags).await.unwrap();
    (sandbox, spec, nodes)
}

/// `hmdp loadtest --workload=sale --verify` through the nodes, with `extra`
/// arguments, which must succeed: its output and its JSON report.
fn verified_sale(
    sandbox: &Sandbox,
    spec: &NodesSpec,
    nodes: &Nodes,
    extra: &[&str],
) -> (String, serde_json::Value) {
    let target = nodes.url();
    let mut args = vec!["loadtest", "--target", &target, "--workload=sale"];
    args.extend(extra);
    args.extend(["--admin-token", &spec.admin_token, "--verify"]);
    hmdp_report(sandbox, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_holds_after_a_drained_sale_and_names_what_breaks_it() {
    let (sandbox, spec, mut nodes) = stream_nodes(&[]).await;

    // A verified sale through nginx: drained, then audited.
    let (out, report) = verified_sale(&sandbox, &spec, &nodes, &["--users=30"]);
    assert!(out.contains("drained "), "{out}");
    assert!(report["drain_s"].as_f64().is_some(), "{report}");
    assert_eq!(report["orders"], 30);
    assert_eq!(report["audit"]["buyers"], 30);
    let checks = report["audit"]["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 9);
    assert!(
        checks.iter().all(|check| check["status"] == "holds"),
        "{report}"
    );
    let voucher = report["voucher"].as_i64().unwrap();

    let (code, out) = audit(&sandbox, voucher);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict: every check holds"), "{out}");

    // `bench-drain` on the same nodes: a backlog admitted straight in Redis
    // is written by their consumers, every order once (the benchmark checks
    // that before it removes its voucher).
    let (out, report) = hmdp_report(&sandbox, &["bench-drain", "--orders=300"]);
    assert!(out.contains("all in MySQL after"), "{out}");
    assert_eq!(report["orders"], 300, "{report}");
    assert!(report["written_per_s"].as_f64().unwrap() > 0.0, "{report}");
    let drained: i64 = report["voucher"].as_str().unwrap().parse().unwrap();
    let store = sandbox.store(1).unwrap();
    let left = (Tables::of(store.pool()))
        .orders_of_voucher(drained)
        .await
        .unwrap();
    assert_eq!(left, 0, "the benchmark's orders are removed");

    // The nodes stop: their reconciler would heal what the test breaks.
    nodes.kill_node(0).await;
    nodes.kill_node(1).await;

    // A buyer Redis admitted who has no order and none on its way.
    let keys = Keys::new(sandbox.redis.prefix.clone());
    let buyers = keys.single().buyers(VoucherId::new(voucher));
    let mut redis = common::redis().await;
    let _: () = redis.sadd(&buyers, 424_242).await.unwrap();
    let (code, out) = audit(&sandbox, voucher);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("verdict: BROKEN: redis-stock, buyers"),
        "{out}"
    );
    assert!(
        out.contains("1 buyer(s) told success with no order and none on its way: users 424242"),
        "{out}"
    );
    let _: () = redis.srem(&buyers, 424_242).await.unwrap();

    // An order row deleted by hand: its buyer has lost the order.
    let store = sandbox.store(1).unwrap();
    let tables = Tables::of(store.pool());
    let (order, user) = tables.first_order(voucher).await.unwrap();
    tables.delete_order(order).await.unwrap();
    let (code, out) = audit(&sandbox, voucher);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("verdict: BROKEN: mysql-stock, buyers"),
        "{out}"
    );
    assert!(out.contains("orders + stock is 29, 1 fewer"), "{out}");
    assert!(
        out.contains(&format!("none on its way: users {user}")),
        "{out}"
    );

    // A voucher only MySQL knows (a sync sale): the MySQL checks alone.
    let sync_voucher = seckill_voucher_in_mysql(&store, 5).await;
    let sync_audit = [
        "audit",
        "--voucher",
        &sync_voucher.to_string(),
        "--initial-stock=5",
    ];
    let (code, out) = hmdp(&sandbox, &sync_audit);
    assert_eq!(code, 1, "a check not made is no pass: {out}");
    assert!(out.contains("Redis not checked"), "{out}");
    assert!(out.contains("mysql-stock               holds"), "{out}");
    assert!(
        out.contains(
            "verdict: NOT CHECKED: redis-stock, buyers, redis-mysql, transit, dead-letters"
        ),
        "{out}"
    );
    let (code, out) = hmdp(
        &sandbox,
        &[&sync_audit[..], &["--allow-unchecked"]].concat(),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "verdict: every check made holds (redis-stock, buyers, redis-mysql, transit, dead-letters \
             not checked)"
        ),
        "{out}"
    );
    // The asynchronous sale audited under a prefix no node uses (Redis
    // restarted, or a typo): it cannot see, and says so.
    let (code, out) = hmdp(
        &sandbox,
        &[
            "audit",
            "--voucher",
            &voucher.to_string(),
            "--redis-prefix=no-such-prefix:",
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("NOT CHECKED"), "{out}");

    // An order pending long past the bound with no stream entry (a `queue`
    // node died holding it): lost, not on its way.
    let stale_id = hmdp::id_worker::compose(Utc::now() - TimeDelta::minutes(10), 77);
    let _: () = redis
        .hset(
            keys.single().pending(),
            stale_id,
            format!("515151:{voucher}"),
        )
        .await
        .unwrap();
    let _: () = redis.sadd(&buyers, 515_151).await.unwrap();
    let _: () = redis
        .hincr(keys.single().voucher(VoucherId::new(voucher)), "stock", -1)
        .await
        .unwrap();
    let (code, out) = audit(&sandbox, voucher);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("1 order(s) pending for more than 60s with no order stream entry"),
        "{out}"
    );
    assert!(out.contains("(1 of them lost)"), "{out}");
    let _: () = redis.hdel(keys.single().pending(), stale_id).await.unwrap();
    let _: () = redis.srem(&buyers, 515_151).await.unwrap();
    let _: () = redis
        .hincr(keys.single().voucher(VoucherId::new(voucher)), "stock", 1)
        .await
        .unwrap();

    let (code, out) = hmdp(&sandbox, &["audit", "--voucher", "999999999"]);
    assert_eq!(code, 2, "{out}");
}

/// A sale split into four shards (on one Redis: the tags are only names
/// there): the verified load test drains it, the audit shows each shard and
/// the total, and names the shard whose own balance a unit added by hand
/// broke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_of_a_sharded_sale_shows_each_shard_and_the_total() {
    let (sandbox, spec, mut nodes) = stream_nodes(&["--seckill-shards=4"]).await;
    let (_, report) = verified_sale(&sandbox, &spec, &nodes, &["--users=40", "--stock=48"]);
    let voucher = report["voucher"].as_i64().unwrap();
    // Ten buyers and two units left in each shard.
    assert_eq!(
        report["audit"]["shards"].as_array().unwrap().len(),
        4,
        "{report}"
    );

    let (code, out) = audit(&sandbox, voucher);
    assert_eq!(code, 0, "{out}");
    let layout = Layout::new(4).unwrap();
    for shard in layout.shards() {
        assert!(
            out.contains(&format!("  {:<18} {:>5}", shard.tag(), slot(shard.tag()))),
            "{out}"
        );
    }
    assert!(out.contains("total (4)"), "{out}");
    assert!(out.contains("verdict: every check holds"), "{out}");

    let keys = Keys::new(sandbox.redis.prefix.clone());
    let mut redis = common::redis().await;
    // The nodes stop: their reconciler would heal what the test breaks.
    nodes.kill_node(0).await;
    nodes.kill_node(1).await;

    // A unit that appeared in shard 2 out of nowhere.
    let shard = layout.shard(2);
    let grown = keys.shard(shard).voucher(VoucherId::new(voucher));
    let _: () = redis.hincr(&grown, "stock", 1).await.unwrap();
    let (code, out) = audit(&sandbox, voucher);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("verdict: BROKEN: redis-stock"), "{out}");
    assert!(
        out.contains(&format!("shard {}: stock 3 + 10 buyers", shard.tag())),
        "{out}"
    );
}

/// The audit's verdict after one corruption: exit 1 and each of `checks`
/// BROKEN.
fn reported_broken(sandbox: &Sandbox, voucher: i64, corruption: &str, checks: &[&str]) {
    let (code, out) = audit(sandbox, voucher);
    assert_eq!(code, 1, "{corruption}: {out}");
    for check in checks {
        assert!(
            out.contains(&format!("  {check:<25} BROKEN")),
            "{corruption}: {check} BROKEN in\n{out}"
        );
    }
}

fn holds(sandbox: &Sandbox, voucher: i64, after: &str) {
    let (code, out) = audit(sandbox, voucher);
    assert_eq!(code, 0, "after {after}: {out}");
}

/// The audit proves that it sees: a drained two-shard sale, its nodes then
/// stopped (nothing repairs what the test breaks), is corrupted in ten
/// ways, one at a time. Each is reported BROKEN by the check that owns it,
/// and the audit holds again once the corruption is undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_corruption_of_the_stores_is_reported_broken() {
    let (sandbox, spec, mut nodes) = stream_nodes(&["--seckill-shards=2"]).await;
    let (_, report) = verified_sale(&sandbox, &spec, &nodes, &["--users=20", "--stock=24"]);
    let voucher = report["voucher"].as_i64().unwrap();
    nodes.kill_node(0).await;
    nodes.kill_node(1).await;
    let voucher_id = VoucherId::new(voucher);
    let layout = Layout::new(2).unwrap();
    let keys = Keys::new(sandbox.redis.prefix.clone());
    let shard_keys = |position: u16| keys.shard(layout.shard(position));
    let sale_of = |position: u16| shard_keys(position).voucher(voucher_id);
    let mut redis = common::redis().await;
    let store = sandbox.store(1).unwrap();
    let redis_time = |mut redis: redis::aio::MultiplexedConnection| async move {
        let (seconds, micros): (i64, i64) =
            redis::cmd("TIME").query_async(&mut redis).await.unwrap();
        seconds * 1000 + micros / 1000
    };
    holds(&sandbox, voucher, "the sale");

    // The stores' state the corruptions start from: a closed order whose
    // unit is back in both, and an order on its way in shard 0.
    let tables = Tables::of(store.pool());
    let (closed, closed_user) = tables.first_order(voucher).await.unwrap();
    let closed_shard = keys.shard(Shard::of_order(OrderId::new(closed)));
    tables.mark_closed(closed).await.unwrap();
    tables.add_stock(voucher, 1).await.unwrap();
    let (): () = redis::pipe()
        .srem(closed_shard.buyers(voucher_id), closed_user)
        .sadd(closed_shard.given_back(voucher_id), closed)
        .hincr(closed_shard.voucher(voucher_id), "stock", 1)
        .query_async(&mut redis)
        .await
        .unwrap();
    let coming_user = (900_000u64..)
        .find(|user| layout.position_of(UserId::new(*user)) == 0)
        .unwrap();
    let coming = compose(Utc::now(), 0) | (layout.shard(0).sequence_base() + 7) as i64;
    let pending = shard_keys(0).pending();
    let coming_entry = format!("{coming_user}:{voucher}");
    let (): () = redis::pipe()
        .hset(&pending, coming, &coming_entry)
        .sadd(shard_keys(0).buyers(voucher_id), coming_user)
        .hincr(sale_of(0), "stock", -1)
        .query_async(&mut redis)
        .await
        .unwrap();
    holds(&sandbox, voucher, "a close and an order on its way");

    // 1, 2: a unit added to a shard, a unit removed from one.
    for (corruption, units) in [("a unit added", 1), ("a unit removed", -1)] {
        let _: () = redis.hincr(sale_of(1), "stock", units).await.unwrap();
        reported_broken(
            &sandbox,
            voucher,
            corruption,
            &["redis-stock", "redis-mysql"],
        );
        let _: () = redis.hincr(sale_of(1), "stock", -units).await.unwrap();
    }
    holds(&sandbox, voucher, "the units undone");

    // 3: a buyer with an order removed from Redis.
    let (_, buyer) = tables.first_unpaid_order(voucher).await.unwrap();
    let buyers = keys
        .shard(layout.shard_of(UserId::new(buyer)))
        .buyers(voucher_id);
    let _: () = redis.srem(&buyers, buyer).await.unwrap();
    reported_broken(
        &sandbox,
        voucher,
        "a buyer removed",
        &["redis-stock", "buyers", "redis-mysql"],
    );
    let _: () = redis.sadd(&buyers, buyer).await.unwrap();

    // 4, 5: a unit lent by shard 1 to shard 0, in transit; its record
    // dropped; then its record made older than the bound.
    let lend = |units: i64| {
        redis::pipe()
            .hincr(sale_of(1), "stock", -units)
            .hincr(sale_of(1), "lent", units)
            .hincr(sale_of(1), "in_transit", units)
            .clone()
    };
    let (): () = lend(1).query_async(&mut redis).await.unwrap();
    let epoch: String = redis.hget(sale_of(1), "epoch").await.unwrap();
    let transit = shard_keys(1).transit();
    let record =
        |lent_ms: i64| format!("{voucher}:{}:1:{epoch}:{lent_ms}", layout.shard(0).index());
    let now_ms = redis_time(redis.clone()).await;
    let _: () = redis.hset(&transit, "t1", record(now_ms)).await.unwrap();
    let (code, out) = hmdp(
        &sandbox,
        &[
            "audit",
            "--voucher",
            &voucher.to_string(),
            "--transit-within-ms=600000",
        ],
    );
    assert_eq!(code, 0, "a unit in transit: {out}");
    let _: () = redis.hdel(&transit, "t1").await.unwrap();
    reported_broken(&sandbox, voucher, "a transit record dropped", &["transit"]);
    let _: () = redis
        .hset(&transit, "t1", record(now_ms - 60_000))
        .await
        .unwrap();
    reported_broken(&sandbox, voucher, "a transfer stranded", &["transit"]);
    let _: () = redis.hdel(&transit, "t1").await.unwrap();
    let (): () = lend(-1).query_async(&mut redis).await.unwrap();
    holds(&sandbox, voucher, "the lend undone");

    // 6: the order on its way dropped from the pending hash.
    let _: () = redis.hdel(&pending, coming).await.unwrap();
    reported_broken(
        &sandbox,
        voucher,
        "a pending entry dropped",
        &["buyers", "redis-mysql"],
    );
    let _: () = redis.hset(&pending, coming, &coming_entry).await.unwrap();

    // 7: MySQL's stock changed by hand.
    let change_stock = |by: i64| tables.add_stock(voucher, by);
    change_stock(1).await.unwrap();
    reported_broken(
        &sandbox,
        voucher,
        "MySQL stock changed",
        &["mysql-stock", "redis-mysql"],
    );
    change_stock(-1).await.unwrap();

    // 8: the closed order's unit given back a second time.
    let closed_sale = closed_shard.voucher(voucher_id);
    let _: () = redis.hincr(&closed_sale, "stock", 1).await.unwrap();
    reported_broken(
        &sandbox,
        voucher,
        "a unit given back twice",
        &["redis-stock", "redis-mysql"],
    );
    let _: () = redis.hincr(&closed_sale, "stock", -1).await.unwrap();

    // 9: one shard of another load.
    let _: () = redis.hset(sale_of(0), "epoch", "1").await.unwrap();
    reported_broken(&sandbox, voucher, "shards of two loads", &["transit"]);
    let _: () = redis.hset(sale_of(0), "epoch", &epoch).await.unwrap();
    holds(&sandbox, voucher, "every corruption undone");

    // 10: an order row deleted.
    tables.delete_orders_of(voucher, buyer).await.unwrap();
    reported_broken(
        &sandbox,
        voucher,
        "an order deleted",
        &["mysql-stock", "buyers"],
    );
}
