//! `hmdp demo` run as a user runs it, against the machine's MySQL, Redis and
//! nginx: with `--seckill sync,stream` every lock mode gets a row per
//! purchase path, and the stream rows keep one order per user, sell nothing
//! twice and say how long the orders took to reach MySQL; `--report` writes
//! the picture of those runs. With `--payers` every run goes on past the
//! sale, and the units that came back are sold again without breaking the
//! balance.

use std::ffi::OsStr;
use std::process::Command;

use hmdp_test_support::{mysql_server_url, redis_url};
use serde_json::Value;

/// Runs `hmdp demo` with `args` on a small sale (40 users firing 3
/// purchases each, stock 20) against the machine's MySQL and Redis; checks
/// it exited 0 and returns what it printed.
fn demo<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(args: I) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_hmdp"))
        .arg("demo")
        .args(args)
        .args(["--users", "40", "--per-user", "3", "--stock", "20"])
        .env("DATABASE_URL", format!("{}/hmdp", mysql_server_url()))
        .env("REDIS_URL", redis_url())
        .output()
        .expect("hmdp runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    println!("{stdout}");
    stdout
}

#[test]
fn the_demo_runs_every_lock_mode_on_both_paths_and_times_the_stream_drain() {
    let json = tempfile::NamedTempFile::new().unwrap();
    let report = tempfile::NamedTempFile::new().unwrap();
    let stdout = demo([
        "--modes".as_ref(),
        "local,reentrant".as_ref(),
        "--seckill".as_ref(),
        "sync,stream".as_ref(),
        "--json".as_ref(),
        json.path().as_os_str(),
        "--report".as_ref(),
        report.path().as_os_str(),
    ]);

    let header = stdout
        .lines()
        .find(|line| line.starts_with("mode"))
        .expect("a table");
    assert!(
        header.contains("seckill") && header.ends_with("drain ms"),
        "{header}"
    );
    let row = |mode: &str, seckill: &str| {
        stdout
            .lines()
            .find(|line| line.split_whitespace().take(2).eq([mode, seckill]))
            .unwrap_or_else(|| panic!("no row for {mode} {seckill}:\n{stdout}"))
    };
    assert!(row("reentrant", "sync").ends_with(" -"), "{stdout}");
    let drain = row("reentrant", "stream")
        .split_whitespace()
        .last()
        .unwrap();
    assert!(drain.parse::<u64>().is_ok(), "drain {drain:?}: {stdout}");

    let result: Value = serde_json::from_slice(&std::fs::read(json.path()).unwrap()).unwrap();
    let runs = result["modes"].as_array().unwrap();
    let shape: Vec<(&str, &str)> = runs
        .iter()
        .map(|run| {
            (
                run["mode"].as_str().unwrap(),
                run["seckill"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("local", "sync"),
            ("reentrant", "sync"),
            ("local", "stream"),
            ("reentrant", "stream")
        ]
    );
    for run in runs {
        let report = &run["report"];
        assert_eq!(report["oversold"], 0, "{run}");
        assert_eq!(report["violations"], Value::Array(vec![]), "{run}");
        assert_eq!(report["orders"], 20, "the stock sold out: {run}");
        let one_order_per_user = run["mode"] == "reentrant" || run["seckill"] == "stream";
        if one_order_per_user {
            assert_eq!(report["duplicate_users"], 0, "{run}");
        }
        assert_eq!(
            run["drain_ms"].is_number(),
            run["seckill"] == "stream",
            "{run}"
        );
    }

    // `local` on the synchronous path breaks in practically every run, but
    // not by promise: only the runs that must hold are held to a verdict.
    let page = std::fs::read_to_string(report.path()).unwrap();
    for (label, verdict) in [
        ("local", None),
        ("reentrant", Some("✓ HELD")),
        ("local + stream", Some("✓ HELD")),
        ("reentrant + stream", Some("✓ HELD")),
    ] {
        let row = page
            .split("<tr data-run=")
            .find(|row| row.starts_with(&format!("\"{label}\"")))
            .unwrap_or_else(|| panic!("no row for {label} in the report"));
        if let Some(verdict) = verdict {
            assert!(row.contains(verdict), "{label}: {row}");
        }
    }

    // Last, the crowd with the limits on: the demo's 40 users as honest
    // buyers and 200 bots at a stock of 10, every unit sold once.
    let crowd = &result["crowd"];
    let (humans, bots) = (&crowd["humans"], &crowd["bots"]);
    assert_eq!(
        (humans["buyers"].as_u64(), bots["buyers"].as_u64()),
        (Some(40), Some(200))
    );
    let won = humans["units_won"].as_u64().unwrap() + bots["units_won"].as_u64().unwrap();
    assert_eq!(won, 10, "{crowd}");
    assert!(bots["most_won_by_one"].as_u64() <= Some(1), "{crowd}");
    assert_eq!(crowd["humans_429_on_first_purchase"], 0, "{crowd}");
    assert!(stdout.contains("humans' share of the units"), "{stdout}");
    assert!(
        page.contains("data-crowd=\"bots\""),
        "the crowd in the picture"
    );
}

/// `--redis-cluster`: the same table, the nodes' Redis a cluster the demo
/// starts for itself and removes afterwards.
#[test]
fn the_demo_runs_on_a_redis_cluster_of_its_own() {
    let stdout = demo(["--redis-cluster", "--modes", "local,reentrant"]);
    assert!(
        stdout.contains("two nodes behind nginx on a Redis Cluster (3 masters, 3 replicas)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("reentrant: one order per user held across two nodes"),
        "{stdout}"
    );
    assert!(stdout.contains("local: "), "{stdout}");
}

/// `--prometheus`: Prometheus scrapes the nodes through the runs (they keep
/// their ports when they restart with another lock mode), and the report
/// ends with both nodes as it scraped them after the runs, up.
#[test]
fn the_demo_runs_with_prometheus_scraping_and_reports_its_targets() {
    let stdout = demo([
        "--prometheus",
        "--modes",
        "local,reentrant",
        "--crowd-bots",
        "0",
    ]);
    assert!(
        stdout.contains("\nPrometheus http://127.0.0.1:"),
        "{stdout}"
    );
    for node in ["node1", "node2"] {
        assert!(
            stdout.contains(&format!("\n  target {node}: up\n")),
            "{stdout}"
        );
    }
}

/// `--payers 70%` on both paths: 14 of the 20 buyers pay, 1 cancels, 5 let
/// their orders time out (the demo's 5 s); the second wave sells those 6 units again;
/// then paid + used + unpaid + stock = initial, no user holds two active
/// orders and nobody paid for a closed order.
#[test]
fn after_the_sale_the_returned_units_sell_again_and_the_stock_balances() {
    let json = tempfile::NamedTempFile::new().unwrap();
    let report = tempfile::NamedTempFile::new().unwrap();
    let stdout = demo([
        "--modes".as_ref(),
        "reentrant".as_ref(),
        "--seckill".as_ref(),
        "sync,stream".as_ref(),
        "--payers".as_ref(),
        "70%".as_ref(),
        "--json".as_ref(),
        json.path().as_os_str(),
        "--report".as_ref(),
        report.path().as_os_str(),
    ]);

    let result: Value = serde_json::from_slice(&std::fs::read(json.path()).unwrap()).unwrap();
    for run in result["modes"].as_array().unwrap() {
        let after = &run["after_sale"];
        assert_eq!(
            [&after["paid"], &after["cancelled"], &after["timed_out"]],
            [14, 1, 5],
            "{run}"
        );
        assert_eq!(after["returned"], 6, "{run}");
        assert_eq!(
            after["second_wave"], 6,
            "every returned unit sold again: {run}"
        );
        let (end, audit) = (&after["end"], &after["audit"]);
        assert_eq!(end["unpaid"], 0, "{run}");
        assert_eq!(end["paid"], 20, "{run}");
        assert_eq!(audit["stock_left"], 0, "{run}");
        assert_eq!(audit["duplicate_users"], 0, "{run}");
        assert_eq!(audit["paid_and_closed"], 0, "{run}");
        assert_eq!(after["violations"], Value::Array(vec![]), "{run}");
        assert!(after["samples"].as_array().unwrap().len() > 10, "{run}");
    }
    for seckill in ["sync", "stream"] {
        let row = stdout
            .lines()
            .filter(|line| line.split_whitespace().take(2).eq(["reentrant", seckill]))
            .nth(1)
            .unwrap_or_else(|| panic!("no after-sale row for {seckill}:\n{stdout}"));
        assert!(row.contains("6 of 6") && row.ends_with("HELD"), "{row}");
    }
    let page = std::fs::read_to_string(report.path()).unwrap();
    assert!(page.contains("<h2>After the sale</h2>"));
    assert_eq!(page.matches("<tr data-after=").count(), 2);
}
