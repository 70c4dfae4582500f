//! `hmdp bench-db` on a sandbox of its own: the transactions of its
//! measured seconds, and every transaction it committed — its warm-up
//! second's included, what the CPU read around the whole process (row 4c
//! of `benches/run.sh`) is divided by; and no order left behind.

mod common;

use hmdp_test_support::Tables;

use common::hmdp_report;

#[tokio::test]
async fn bench_db_counts_the_warm_ups_transactions_apart_and_removes_its_orders() {
    let sandbox = common::sandbox().await;
    let (_, report) = hmdp_report(&sandbox, &["bench-db", "--concurrency=2", "--duration=1"]);
    let measured = report["transactions"].as_u64().unwrap();
    let all = report["all_transactions"].as_u64().unwrap();
    assert!(measured > 0, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(
        report["tx_per_s"].as_f64().unwrap(),
        measured as f64,
        "one second measured: {report}"
    );
    // The warm-up second commits as the measured one does.
    assert!(
        all > measured,
        "the warm-up second's transactions are counted in all_transactions: {report}"
    );

    let store = sandbox.store(1).unwrap();
    let orders = Tables::of(store.pool()).all_orders().await.unwrap();
    assert_eq!(orders, 0, "the benchmark removes its orders: {report}");
}
