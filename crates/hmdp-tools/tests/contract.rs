//! The API against its contract (`/openapi.json`, docs/openapi.json),
//! fuzzed through nginx and two nodes with real MySQL and Redis. It runs
//! alone (`.config/nextest.toml`): the fuzzing loads the machine, and the
//! other tests' backend timeouts should not share it.

use hmdp_lock::LockMode;

mod common;
use common::nodes::TestNodes;

/// The API against its contract: schemathesis generates requests from
/// `/openapi.json` (settings in `tests/schemathesis.toml`) and sends them
/// through nginx to both nodes, logged in and with the admin token. No
/// answer may be a 5xx or stray from the contract: its statuses, bodies,
/// headers, `Allow` on a method a path does not take, 401 without the
/// session. Logout is left out: it would end the session the rest uses.
/// The seed is fixed, so a run is the same run until the contract changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_holds_its_contract_under_schemathesis() {
    let test = TestNodes::start(LockMode::Reentrant, 0, 1).await;
    let url = test.nodes.url();
    // Found by the fuzzing: nginx refuses TRACE itself, and its 405 named
    // no method; the node's answer to OPTIONS names them.
    let trace = (test.client)
        .request(reqwest::Method::TRACE, format!("{url}/api/user/code"))
        .send()
        .await
        .unwrap();
    assert_eq!(trace.status(), 405);
    assert_eq!(trace.headers()["allow"], "POST");

    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/schemathesis.toml");
    // Its example database goes where it runs: not into the source tree.
    let output = tokio::process::Command::new("schemathesis")
        .current_dir(std::env::temp_dir())
        .args(["--no-color", "--config-file", config, "run"])
        .arg(format!("{url}/openapi.json"))
        .args(["--url", &url, "--seed", "20261202", "--max-examples", "100"])
        .args(["--exclude-path", "/user/logout"])
        .args(["-H", &format!("authorization: {}", test.tokens[0])])
        .args([
            "-H",
            &format!("x-admin-token: {}", test.nodes.spec().admin_token),
        ])
        .output()
        .await
        .expect("schemathesis is installed (scripts/services.sh)");
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "schemathesis found failures");
    let generated: u64 = (report.lines())
        .find_map(|line| line.trim().split_once(" generated,")?.0.parse().ok())
        .expect("schemathesis reports how many test cases it generated");
    assert!(generated >= 2000, "only {generated} requests generated");
}
