//! `hmdp audit` and `hmdp loadtest --verify` on an asynchronous sale, run as
//! commands against two `stream` nodes behind nginx: the verified load test
//! waits for the orders to be written and audits them; the audit holds on
//! the clean sale and names what a buyer added in Redis or an order row
//! deleted by hand broke; a voucher Redis holds no sale for gets the MySQL
//! checks only. And `hmdp bench-drain` on the same nodes.

mod common;

use std::path::PathBuf;

use chrono::{TimeDelta, Utc};
use hmdp::config::SeckillMode;
use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::shards::{slot, Layout};
use hmdp_lock::LockMode;
use hmdp_tools::cluster::{node_flags, Cluster, ClusterSpec, Sandbox};
use redis::AsyncCommands;

use common::{hmdp, seckill_voucher_in_mysql};

fn audit(sandbox: &Sandbox, voucher: i64) -> (i32, String) {
    hmdp(sandbox, &["audit", "--voucher", &voucher.to_string()])
}

/// Two `stream` nodes (with `extra` flags) behind nginx, on a sandbox of
/// their own.
async fn stream_nodes(extra: &[&str]) -> (Sandbox, ClusterSpec, Cluster) {
    let sandbox = common::sandbox().await;
    let spec = ClusterSpec::in_sandbox(PathBuf::from(env!("CARGO_BIN_EXE_hmdp")), &sandbox);
    let mut flags = node_flags(LockMode::Reentrant, SeckillMode::Stream, 0);
    flags.push("--db-pool=8".to_owned());
    flags.extend(extra.iter().map(|flag| flag.to_string()));
    let cluster = Cluster::start(spec.clone(), &flags).await.unwrap();
    (sandbox, spec, cluster)
}

/// `hmdp loadtest --workload=sale --verify` through the nodes, with `extra`
/// arguments, which must succeed: its output and its JSON report.
fn verified_sale(
    sandbox: &Sandbox,
    spec: &ClusterSpec,
    cluster: &Cluster,
    extra: &[&str],
) -> (String, serde_json::Value) {
    let json = tempfile::NamedTempFile::new().unwrap();
    let target = cluster.url();
    let mut args = vec!["loadtest", "--target", &target, "--workload=sale"];
    args.extend(extra);
    args.extend(["--admin-token", &spec.admin_token, "--verify", "--json"]);
    args.push(json.path().to_str().unwrap());
    let (code, out) = hmdp(sandbox, &args);
    assert_eq!(code, 0, "{out}");
    let report = serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap();
    (out, report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_holds_after_a_drained_sale_and_names_what_breaks_it() {
    let (sandbox, spec, cluster) = stream_nodes(&[]).await;

    // A verified sale through nginx: drained, then audited.
    let (out, report) = verified_sale(&sandbox, &spec, &cluster, &["--users=30"]);
    assert!(out.contains("drained "), "{out}");
    assert!(report["drain_s"].as_f64().is_some(), "{report}");
    assert_eq!(report["orders"], 30);
    assert_eq!(report["audit"]["buyers"], 30);
    let checks = report["audit"]["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 7);
    assert!(
        checks.iter().all(|check| check["status"] == "holds"),
        "{report}"
    );
    let voucher = report["voucher"].as_i64().unwrap();

    let (code, out) = audit(&sandbox, voucher);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict: every check holds"), "{out}");

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
    let (order, user): (i64, u64) = sqlx::query_as(
        "SELECT id, user_id FROM tb_voucher_order WHERE voucher_id = ? ORDER BY id LIMIT 1",
    )
    .bind(voucher)
    .fetch_one(store.pool())
    .await
    .unwrap();
    sqlx::query("DELETE FROM tb_voucher_order WHERE id = ?")
        .bind(order)
        .execute(store.pool())
        .await
        .unwrap();
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
        out.contains("verdict: NOT CHECKED: redis-stock, buyers, dead-letters"),
        "{out}"
    );
    let (code, out) = hmdp(
        &sandbox,
        &[&sync_audit[..], &["--allow-unchecked"]].concat(),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "verdict: every check made holds (redis-stock, buyers, dead-letters not checked)"
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

    // `bench-drain` on the same nodes: a backlog admitted straight in Redis
    // is written by their consumers, every order once (the benchmark checks
    // that before it removes its voucher).
    let json = tempfile::NamedTempFile::new().unwrap();
    let (code, out) = hmdp(
        &sandbox,
        &[
            "bench-drain",
            "--orders=300",
            "--json",
            json.path().to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("all in MySQL after"), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap();
    assert_eq!(report["orders"], 300, "{report}");
    assert!(report["written_per_s"].as_f64().unwrap() > 0.0, "{report}");
    let voucher: i64 = report["voucher"].as_str().unwrap().parse().unwrap();
    let left: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM tb_voucher_order WHERE voucher_id = ?")
            .bind(voucher)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(left, 0, "the benchmark's orders are removed");
}

/// A sale split into four shards (on one Redis: the tags are only names
/// there): the verified load test drains it, the audit shows each shard and
/// the total, counts units on their way between shards, and names the shard
/// whose own balance a unit added by hand broke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_of_a_sharded_sale_shows_each_shard_and_the_total() {
    let (sandbox, spec, cluster) = stream_nodes(&["--seckill-shards=4"]).await;
    let (_, report) = verified_sale(&sandbox, &spec, &cluster, &["--users=40", "--stock=48"]);
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

    // A unit lent by shard 1 and not yet received: on its way, not lost.
    let keys = Keys::new(sandbox.redis.prefix.clone());
    let lender = keys.shard(layout.shard(1)).voucher(VoucherId::new(voucher));
    let mut redis = common::redis().await;
    let lend = |units: i64| {
        redis::pipe()
            .hincr(&lender, "stock", -units)
            .hincr(&lender, "lent", units)
            .clone()
    };
    let (): () = lend(1).query_async(&mut redis).await.unwrap();
    let (code, out) = audit(&sandbox, voucher);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("+ 1 in transit"), "{out}");
    let (): () = lend(-1).query_async(&mut redis).await.unwrap();

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
