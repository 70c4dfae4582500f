//! The lab's verdicts: each scenario run in-process against real Redis with
//! each simple mode, checking who overlapped in the critical section and what
//! the releases reported; the asynchronous purchase's scenarios, run as the
//! `hmdp lab` command on real nodes; and the command's exit codes and help.

use std::process::Command;

use hmdp::config::{DatabaseSettings, RedisSettings};
use hmdp_lock::{LockMode, Release};
use hmdp_tools::lab::{self, LabArgs, Report, SaleLabArgs, Scenario};
use redis::AsyncCommands;

use hmdp_test_support::{mysql_server_url, redis_url};

/// Runs a scenario under a prefix of this test's own, and checks the run left
/// no key behind.
async fn run(scenario: fn(LabArgs) -> Scenario, mode: LockMode) -> Report {
    run_fenced(scenario, mode, false).await
}

/// `gc-pause`, on the machine's MySQL.
fn gc_pause(lab: LabArgs) -> Scenario {
    let database = DatabaseSettings {
        url: format!("{}/hmdp", mysql_server_url()),
    };
    Scenario::GcPause(SaleLabArgs { lab, database })
}

async fn run_fenced(scenario: fn(LabArgs) -> Scenario, mode: LockMode, fencing: bool) -> Report {
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let scenario = scenario(LabArgs {
        mode: Some(mode),
        redis: RedisSettings {
            url: redis_url(),
            prefix: prefix.clone(),
        },
        lock_nodes: Vec::new(),
        fencing,
    });
    let report = lab::run(&scenario).await.expect("the scenario runs");
    println!("{report}");

    let mut redis = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let left: Vec<String> = redis.keys(format!("{prefix}*")).await.unwrap();
    assert!(left.is_empty(), "keys left behind: {left:?}");
    report
}

fn assert_broken(report: &Report, together: &[&str]) {
    assert_eq!(report.exit_code(), 1, "{}", report.verdict());
    assert_eq!(report.overlaps, vec![together.to_vec()]);
}

fn assert_kept(report: &Report) {
    assert_eq!(report.exit_code(), 0, "{}", report.verdict());
    assert!(report.overlaps.is_empty());
}

/// One test per row, for the scenarios judged by who overlapped: the
/// scenario and the mode, then `broken(who was inside together)` or `kept`,
/// then what each listed actor's release reported (`refused`: it never got
/// the lock, so it never released), then words the verdict must contain.
macro_rules! lab_verdicts {
    (@verdict $report:ident, kept) => {
        assert_kept(&$report)
    };
    (@verdict $report:ident, broken($($together:ident),+)) => {
        assert_broken(&$report, &[$(stringify!($together)),+])
    };
    (@release refused) => {
        None
    };
    (@release $release:ident) => {
        Some(Release::$release)
    };
    ($(
        $(#[$meta:meta])*
        $name:ident: $scenario:ident, $mode:ident => $verdict:ident $(($($together:ident),+))?
            $(, releases [$($who:ident: $release:ident),+])?
            $(, mentions $words:literal)?;
    )*) => {$(
        $(#[$meta])*
        #[tokio::test]
        async fn $name() {
            let report = run(Scenario::$scenario, LockMode::$mode).await;
            lab_verdicts!(@verdict report, $verdict $(($($together),+))?);
            $($(
                assert_eq!(
                    report.release_of(stringify!($who)),
                    lab_verdicts!(@release $release),
                    "what {}'s release reported (None: it was refused)",
                    stringify!($who)
                );
            )+)?
            $(assert!(report.verdict().contains($words), "{}", report.verdict());)?
        }
    )*};
}

lab_verdicts! {
    /// Lock v1 cannot tell: its DEL removed B's key and it calls that a release.
    misdelete_breaks_redis_naive: Misdelete, RedisNaive => broken(B, C),
        releases [A: Released];
    misdelete_is_kept_by_redis_owner: Misdelete, RedisOwner => kept,
        releases [A: NotOwner, B: Released, C: refused];
    misdelete_is_kept_by_redis_lua: Misdelete, RedisLua => kept,
        releases [A: NotOwner, C: refused];

    /// A's check passed before its lease ran out; the DEL after it hit B's key.
    check_then_delete_breaks_redis_owner: CheckThenDelete, RedisOwner => broken(B, C),
        releases [A: Released, B: NotOwner];
    check_then_delete_is_kept_by_redis_lua: CheckThenDelete, RedisLua => kept,
        releases [A: NotOwner, C: refused];
    check_then_delete_breaks_redis_naive: CheckThenDelete, RedisNaive => broken(B, C);

    lease_expiry_breaks_redis_naive: LeaseExpiry, RedisNaive => broken(A, B),
        mentions "watchdog";
    /// A works three leases long: by its release B's lease has run out too.
    lease_expiry_breaks_redis_owner: LeaseExpiry, RedisOwner => broken(A, B),
        releases [A: Expired], mentions "watchdog";
    /// A works three leases long: by its release B's lease has run out too.
    lease_expiry_breaks_redis_lua: LeaseExpiry, RedisLua => broken(A, B),
        releases [A: Expired], mentions "watchdog";
    lease_expiry_is_kept_by_the_leaseless_local_lock: LeaseExpiry, Local => kept,
        releases [B: refused];
    lease_expiry_is_kept_by_the_reentrant_watchdog: LeaseExpiry, Reentrant => kept,
        releases [A: Released, B: refused];

    failover_gives_a_replicated_lock_to_two_holders: Failover, Reentrant => broken(A, B);
    failover_of_one_node_is_kept_by_multi: Failover, Multi => kept;
    failover_of_one_node_is_kept_by_redlock: Failover, Redlock => kept;
}

#[tokio::test]
async fn reentrancy_blocks_redis_lua_on_itself() {
    let report = run(Scenario::Reentrancy, LockMode::RedisLua).await;
    assert_eq!(report.exit_code(), 1, "{}", report.verdict());
    assert!(report.overlaps.is_empty());
    assert_eq!(report.failures, ["A is blocked by its own lock"]);
}

#[tokio::test]
async fn reentrancy_is_kept_by_reentrant() {
    let report = run(Scenario::Reentrancy, LockMode::Reentrant).await;
    assert_kept(&report);
    let releases: Vec<_> = report.releases.iter().map(|(who, r)| (*who, *r)).collect();
    assert_eq!(
        releases,
        [("A", Release::StillHeld(1)), ("A", Release::Released)]
    );
}

#[tokio::test]
async fn retry_hands_the_lock_over_on_the_release_message() {
    let report = run(Scenario::Retry, LockMode::Reentrant).await;
    assert_kept(&report);
    // A's lease outlasts B's whole wait: B in at all is B handed the lock
    // by A's release.
    assert_eq!(report.release_of("B"), Some(Release::Released), "B got in");
    assert_eq!(report.release_of("C"), None, "C did not wait");
    assert!(
        (report.events.iter()).any(|event| event.what.starts_with("hand-off latency")),
        "latency printed"
    );
}

#[tokio::test]
async fn gc_pause_lets_a_stale_redis_lua_holder_commit() {
    let report = run(gc_pause, LockMode::RedisLua).await;
    assert_eq!(report.exit_code(), 1, "{}", report.verdict());
    assert!(
        report.to_string().contains("user 1 has 2 order(s)"),
        "{report}"
    );
}

#[tokio::test]
async fn gc_pause_is_kept_by_fencing_even_with_redis_lua() {
    let report = run_fenced(gc_pause, LockMode::RedisLua, true).await;
    assert_kept(&report);
    let text = report.to_string();
    assert!(text.contains("user 1 has 1 order(s)"), "{text}");
    assert!(text.contains("A      is rolled back"), "{text}");
    assert!(text.contains("B      commits order"), "{text}");
}

/// Runs the built `hmdp lab ...`; returns its exit code and output.
fn hmdp_lab(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_hmdp"))
        .arg("lab")
        .args(args)
        .env("REDIS_URL", redis_url())
        .env("DATABASE_URL", format!("{}/hmdp", mysql_server_url()))
        .output()
        .expect("hmdp runs");
    // Shown with a failing test's output: why a run ended in an error.
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).unwrap();
    (output.status.code().expect("exited"), stdout)
}

#[test]
fn the_command_exits_1_when_broken_and_0_when_kept() {
    let (code, out) = hmdp_lab(&["misdelete", "--lock", "redis-naive"]);
    assert_eq!(code, 1, "{out}");
    // The first event is A's acquisition, a few ms after the clock started.
    let first = out.lines().nth(1).unwrap_or_default().trim_start();
    assert!(
        first.starts_with("t=") && first.ends_with("A      acquires the lock"),
        "{out}"
    );
    assert_eq!(
        out.lines().last().unwrap().split(':').next(),
        Some("verdict")
    );
    assert!(out.contains("verdict: BROKEN"), "{out}");

    let (code, out) = hmdp_lab(&["misdelete", "--lock", "redis-lua"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict: KEPT"), "{out}");
}

#[test]
fn each_scenario_tells_its_story_in_its_help() {
    for (scenario, stage) in [
        ("misdelete", "lock v1"),
        ("check-then-delete", "lock v2"),
        ("lease-expiry", "watchdog"),
        ("reentrancy", "reentrant lock"),
        ("retry", "subscription"),
        ("failover", "MultiLock"),
        ("cluster-failover", "real failover"),
        ("gc-pause", "fencing"),
        ("queue-crash", "blocking queue"),
        ("stream-crash", "consumer group"),
        ("redis-restart", "trusts Redis with"),
        ("pay-vs-close", "check-then-act"),
        ("double-close", "idempotent"),
        ("lost-giveback", "owed record"),
    ] {
        let (code, out) = hmdp_lab(&[scenario, "--help"]);
        assert_eq!(code, 0);
        assert!(out.contains("Course stage"), "{scenario}: {out}");
        assert!(out.contains(stage), "{scenario}: {out}");
    }
}

/// On a real Redis Cluster: the master dies before the lock reached its
/// replica, the cluster promotes the replica, B gets the lock A holds; with
/// `--lock-sync-replicas 1`, `WAIT` refuses A's unreplicated lock instead.
#[test]
fn a_cluster_failover_loses_a_lock_unless_it_waits_for_a_replica() {
    let (code, out) = hmdp_lab(&["cluster-failover"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("the lock key is on it: false"), "{out}");
    assert!(
        out.contains("B      enters the critical section while A is still inside"),
        "{out}"
    );

    let (code, out) = hmdp_lab(&["cluster-failover", "--lock-sync-replicas", "1"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("A      is refused: its lock reached 0 of the 1 replica(s)"),
        "{out}"
    );
    assert!(out.contains("B      acquires the lock"), "{out}");
}

#[test]
fn queue_crash_loses_the_orders_still_queued() {
    let (code, out) = hmdp_lab(&["queue-crash"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("20 told success"), "{out}");
    assert!(
        out.contains("buyers told success have no order: BROKEN"),
        "{out}"
    );
}

#[test]
fn stream_crash_writes_every_order_once_through_the_other_node() {
    let (code, out) = hmdp_lab(&["stream-crash"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("20 order(s) of voucher"), "{out}");
    assert!(out.contains("0 user(s) with two"), "{out}");
    assert!(out.contains("audit  every check holds"), "{out}");
}

#[test]
fn redis_restart_without_persistence_loses_what_the_stream_held() {
    let (code, out) = hmdp_lab(&["redis-restart", "--seckill", "stream"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("restarts empty"), "{out}");
    assert!(
        out.contains("12 of 12 buyers told success have no order"),
        "{out}"
    );
    assert!(out.contains("appendfsync always"), "{out}");
}

#[test]
fn redis_restart_with_an_append_only_file_loses_nothing() {
    let (code, out) = hmdp_lab(&["redis-restart", "--seckill", "stream", "--redis-aof"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("restarts with its data"), "{out}");
    assert!(out.contains("12 order(s) of voucher"), "{out}");
}

#[test]
fn pay_vs_close_naive_closes_the_order_paid_between_its_read_and_its_write() {
    let (code, out) = hmdp_lab(&["pay-vs-close"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("SELECTs order"), "{out}");
    assert!(
        out.contains("which is closed, and its unit was sold again to B: BROKEN"),
        "{out}"
    );
    assert!(out.contains("1 order(s) were paid and closed"), "{out}");
}

#[test]
fn pay_vs_close_conditional_close_leaves_the_paid_order_alone() {
    let (code, out) = hmdp_lab(&["pay-vs-close", "--conditional-close"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("AND status = 1 changes no row: the order is paid"),
        "{out}"
    );
    assert!(out.contains("B      buys through node2: refused"), "{out}");
    assert!(out.contains("audit  every check holds"), "{out}");
}

#[test]
fn double_close_naive_gives_the_unit_back_twice() {
    let (code, out) = hmdp_lab(&["double-close"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("redis  sale: stock 2, buyers []"), "{out}");
    assert!(
        out.contains("B and C both bought the voucher's one unit: BROKEN"),
        "{out}"
    );
    assert!(
        out.contains("active orders + stock is 2, 1 more than the initial stock"),
        "{out}"
    );
}

#[test]
fn double_close_conditional_close_gives_the_unit_back_once() {
    let (code, out) = hmdp_lab(&["double-close", "--conditional-close"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.matches("changes 1 row").count(), 1, "{out}");
    assert_eq!(out.matches("changes no row").count(), 1, "{out}");
    assert!(out.contains("C      buys through node2: refused"), "{out}");
}

#[test]
fn lost_giveback_naive_strands_the_unit() {
    let (code, out) = hmdp_lab(&["lost-giveback"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is killed after its COMMIT"), "{out}");
    assert!(out.contains("the unit is stranded: BROKEN"), "{out}");
    assert!(out.contains("told success with no order"), "{out}");
}

#[test]
fn lost_giveback_owed_giveback_is_sent_by_the_other_node() {
    let (code, out) = hmdp_lab(&["lost-giveback", "--owed-giveback"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 give-back(s) owed to Redis"), "{out}");
    assert!(
        out.contains("node2  its closer sends the give-back node1 left owed"),
        "{out}"
    );
    assert!(out.contains("B      buys through node2: order"), "{out}");
}
