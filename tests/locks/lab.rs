//! The lab's verdicts: each scenario run in-process against real Redis with
//! each simple mode, checking who overlapped in the critical section and what
//! the releases reported; and the `hmdp lab` command's exit codes and help.

use std::process::Command;

use hmdp::config::LockMode;
use hmdp::lab::{self, LabArgs, Report, Scenario};
use hmdp::lock::Release;
use redis::AsyncCommands;

use crate::helpers::redis_url;

/// Runs a scenario under a prefix of this test's own, and checks the run left
/// no key behind.
async fn run(scenario: fn(LabArgs) -> Scenario, mode: LockMode) -> Report {
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let scenario = scenario(LabArgs {
        mode: Some(mode),
        redis_url: redis_url(),
        redis_prefix: prefix.clone(),
        lock_nodes: Vec::new(),
    });
    let report = lab::run(&scenario).await.expect("the scenario runs");
    println!("{report}");

    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
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

#[tokio::test]
async fn misdelete_breaks_redis_naive() {
    let report = run(Scenario::Misdelete, LockMode::RedisNaive).await;
    assert_broken(&report, &["B", "C"]);
    // Lock v1 cannot tell: its DEL removed B's key and it calls that a release.
    assert_eq!(report.release_of("A"), Some(Release::Released));
}

#[tokio::test]
async fn misdelete_is_kept_by_redis_owner() {
    let report = run(Scenario::Misdelete, LockMode::RedisOwner).await;
    assert_kept(&report);
    assert_eq!(report.release_of("A"), Some(Release::NotOwner));
    assert_eq!(report.release_of("B"), Some(Release::Released));
    assert_eq!(report.release_of("C"), None, "C was refused");
}

#[tokio::test]
async fn misdelete_is_kept_by_redis_lua() {
    let report = run(Scenario::Misdelete, LockMode::RedisLua).await;
    assert_kept(&report);
    assert_eq!(report.release_of("A"), Some(Release::NotOwner));
    assert_eq!(report.release_of("C"), None, "C was refused");
}

#[tokio::test]
async fn check_then_delete_breaks_redis_owner() {
    let report = run(Scenario::CheckThenDelete, LockMode::RedisOwner).await;
    assert_broken(&report, &["B", "C"]);
    // A's check passed before its lease ran out; the DEL after it hit B's key.
    assert_eq!(report.release_of("A"), Some(Release::Released));
    assert_eq!(report.release_of("B"), Some(Release::NotOwner));
}

#[tokio::test]
async fn check_then_delete_is_kept_by_redis_lua() {
    let report = run(Scenario::CheckThenDelete, LockMode::RedisLua).await;
    assert_kept(&report);
    assert_eq!(report.release_of("A"), Some(Release::NotOwner));
    assert_eq!(report.release_of("C"), None, "C was refused");
}

#[tokio::test]
async fn check_then_delete_breaks_redis_naive() {
    let report = run(Scenario::CheckThenDelete, LockMode::RedisNaive).await;
    assert_broken(&report, &["B", "C"]);
}

#[tokio::test]
async fn lease_expiry_breaks_redis_naive() {
    let report = run(Scenario::LeaseExpiry, LockMode::RedisNaive).await;
    assert_broken(&report, &["A", "B"]);
    assert!(
        report.verdict().contains("watchdog"),
        "{}",
        report.verdict()
    );
}

#[tokio::test]
async fn lease_expiry_breaks_redis_owner() {
    let report = run(Scenario::LeaseExpiry, LockMode::RedisOwner).await;
    assert_broken(&report, &["A", "B"]);
    assert_eq!(report.release_of("A"), Some(Release::NotOwner));
    assert!(
        report.verdict().contains("watchdog"),
        "{}",
        report.verdict()
    );
}

#[tokio::test]
async fn lease_expiry_breaks_redis_lua() {
    let report = run(Scenario::LeaseExpiry, LockMode::RedisLua).await;
    assert_broken(&report, &["A", "B"]);
    assert_eq!(report.release_of("A"), Some(Release::NotOwner));
    assert!(
        report.verdict().contains("watchdog"),
        "{}",
        report.verdict()
    );
}

#[tokio::test]
async fn lease_expiry_is_kept_by_the_leaseless_local_lock() {
    let report = run(Scenario::LeaseExpiry, LockMode::Local).await;
    assert_kept(&report);
    assert_eq!(report.release_of("B"), None, "B was refused");
}

/// Runs the built `hmdp lab ...`; returns its exit code and output.
fn hmdp_lab(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_hmdp"))
        .arg("lab")
        .args(args)
        .env("REDIS_URL", redis_url())
        .output()
        .expect("hmdp runs");
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
    ] {
        let (code, out) = hmdp_lab(&[scenario, "--help"]);
        assert_eq!(code, 0);
        assert!(out.contains("Course stage"), "{scenario}: {out}");
        assert!(out.contains(stage), "{scenario}: {out}");
    }
}
