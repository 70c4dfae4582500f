//! `hmdp check` proves that it sees: a load test records its history
//! (`loadtest --history`) on each configuration known to break a promise,
//! and the checker, judging that history against MySQL, reports the break:
//! `--lock none` (users told success twice), `queue` with its nodes
//! SIGKILLed (orders told and never written), `stream` on a Redis without
//! persistence restarted mid-sale (the same). And on a configuration that
//! keeps its promises, every check holds.

mod common;

use std::path::{Path, PathBuf};

use hmdp::config::{RedisSettings, SeckillMode};
use hmdp_lock::LockMode;
use hmdp_test_support::{mysql_server_url, RedisServer};
use hmdp_tools::nodes::{node_flags, Nodes, NodesSpec, Sandbox};

use common::hmdp;

/// Two nodes behind nginx on `sandbox`, with `flags`.
async fn start_nodes(sandbox: &Sandbox, flags: Vec<String>) -> Nodes {
    let spec = NodesSpec::in_sandbox(PathBuf::from(env!("CARGO_BIN_EXE_hmdp")), sandbox);
    Nodes::start(spec, &flags).await.unwrap()
}

/// A load test through the nodes recording its history to `history`;
/// its exit code does not matter (a broken configuration may fail it).
fn recorded_load(sandbox: &Sandbox, nodes: &Nodes, history: &Path, args: &[&str]) {
    let target = nodes.url();
    let admin = nodes.spec().admin_token.clone();
    let mut all = vec!["loadtest", "--target", &target, "--admin-token", &admin];
    all.extend(args);
    all.extend(["--history", history.to_str().unwrap()]);
    hmdp(sandbox, &all);
}

/// `hmdp check` on `history`: its exit code and output.
fn check(sandbox: &Sandbox, history: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["check", "--history", history.to_str().unwrap()];
    args.extend(extra);
    hmdp(sandbox, &args)
}

/// The nodes SIGKILLed (nothing writes the orders left on their way), then
/// `hmdp check`: success answers whose orders MySQL lacks, reported.
async fn reported_lost_once_the_nodes_die(sandbox: &Sandbox, nodes: &mut Nodes, history: &Path) {
    nodes.kill_node(0).await;
    nodes.kill_node(1).await;
    let (code, out) = check(sandbox, history, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("success-written    BROKEN"), "{out}");
    assert!(out.contains("is not in MySQL"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_holds_where_the_promise_holds_and_sees_lock_none_tell_users_twice() {
    let sandbox = common::sandbox().await;
    let history = tempfile::NamedTempFile::new().unwrap();

    // The reentrant lock keeps one order per user: every check holds.
    let flags = node_flags(LockMode::Reentrant, SeckillMode::Sync, 5);
    let mut nodes = start_nodes(&sandbox, flags).await;
    let storm = [
        "--workload=storm",
        "--users=100",
        "--per-user=4",
        "--stock=60",
    ];
    recorded_load(&sandbox, &nodes, history.path(), &storm);
    let (code, out) = check(&sandbox, history.path(), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict: every check holds"), "{out}");
    assert!(out.contains("success answers (purchases) 60"), "{out}");

    // No lock: a user's simultaneous purchases each check, then each buy.
    nodes
        .restart_nodes(&node_flags(LockMode::NoLock, SeckillMode::Sync, 20))
        .await
        .unwrap();
    recorded_load(&sandbox, &nodes, history.path(), &storm);
    let (code, out) = check(&sandbox, history.path(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("told-twice         BROKEN"), "{out}");
    assert!(out.contains("one-order-per-user BROKEN"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_sees_the_orders_a_killed_queue_node_took_with_it() {
    let sandbox = common::sandbox().await;
    let history = tempfile::NamedTempFile::new().unwrap();
    // Each order's transaction holds 200 ms: the queues are long when the
    // nodes die.
    let flags = node_flags(LockMode::Reentrant, SeckillMode::Queue, 200);
    let mut nodes = start_nodes(&sandbox, flags).await;
    recorded_load(
        &sandbox,
        &nodes,
        history.path(),
        &["--workload=sale", "--users=100"],
    );
    reported_lost_once_the_nodes_die(&sandbox, &mut nodes, history.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_sees_the_orders_a_redis_without_persistence_forgot() {
    let mut redis = RedisServer::start().await.unwrap();
    let sandbox = Sandbox::create(
        &format!("{}/hmdp", mysql_server_url()),
        &RedisSettings::at(redis.url()),
        "test",
    )
    .await
    .unwrap();
    let history = tempfile::NamedTempFile::new().unwrap();
    // Each batch's transaction holds 200 ms: the stream is long when Redis
    // restarts.
    let flags = node_flags(LockMode::Reentrant, SeckillMode::Stream, 200);
    let mut nodes = start_nodes(&sandbox, flags).await;
    recorded_load(
        &sandbox,
        &nodes,
        history.path(),
        &["--workload=sale", "--users=300"],
    );
    redis.restart().await.unwrap();
    reported_lost_once_the_nodes_die(&sandbox, &mut nodes, history.path()).await;
}
