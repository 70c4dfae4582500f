//! What a node writes to its log: a business "no" (HTTP 200, `success:false`)
//! is routine and logs nothing, while a backend failure is still reported.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::join_all;
use hmdp::redis_server::free_port;
use tempfile::NamedTempFile;

use crate::helpers::{phone, redis_url, spawn_app, TestApp, ADMIN_TOKEN};

/// Refusals made against the node; their log must stay within
/// [`MAX_LOG_BYTES_FOR_REFUSALS`].
const REFUSALS: usize = 100;
/// Room for a few lines a node may log for its own reasons meanwhile, far
/// below one line per refusal.
const MAX_LOG_BYTES_FOR_REFUSALS: u64 = 2048;

/// A node in a process of its own, logging at `info` to a file the test reads.
struct LoggedNode {
    child: Child,
    log: NamedTempFile,
    address: String,
}

impl LoggedNode {
    /// Serves `app`'s database and Redis namespace; `flags` override those
    /// settings (flags win over the environment).
    async fn start(app: &TestApp, flags: &[&str]) -> LoggedNode {
        let log = NamedTempFile::new().unwrap();
        let port = free_port().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_hmdp"))
            .arg("serve")
            .args(["--no-migrate", "--workers=1"])
            .args(flags)
            .env("HMDP_HOST", "127.0.0.1")
            .env("HMDP_PORT", port.to_string())
            .env("DATABASE_URL", app.database_url())
            .env("REDIS_URL", redis_url())
            .env("HMDP_REDIS_PREFIX", &app.prefix)
            .env("HMDP_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("hmdp runs");
        let node = LoggedNode {
            child,
            log,
            address: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        while reqwest::get(format!("{}/health", node.address))
            .await
            .is_err()
        {
            assert!(started.elapsed() < Duration::from_secs(10), "node up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        node
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }

    fn log_bytes(&self) -> u64 {
        self.log.as_file().metadata().unwrap().len()
    }

    async fn purchase(&self, voucher: i64, token: &str) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}/voucher-order/seckill/{voucher}", self.address))
            .header("authorization", token)
            .send()
            .await
            .unwrap()
    }
}

impl Drop for LoggedNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn refused_purchases_are_not_logged_as_errors() {
    let app = spawn_app(&[]).await;
    let sold_out = app.create_open_seckill(1).await;
    let plenty = app.create_open_seckill(10).await;
    let (first, second) = (app.login(&phone(1)).await, app.login(&phone(2)).await);
    assert_eq!(app.purchase(sold_out, &first).await["success"], true);
    assert_eq!(app.purchase(plenty, &second).await["success"], true);
    let node = LoggedNode::start(&app, &[]).await;
    let before = node.log_bytes();

    // Half buy what is gone, half buy again what they already have.
    let refusals = (0..REFUSALS).map(|i| {
        let voucher = if i % 2 == 0 { sold_out } else { plenty };
        node.purchase(voucher, &second)
    });
    for response in join_all(refusals).await {
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["success"], false, "{body}");
    }

    let grown = node.log_bytes() - before;
    let log = node.log();
    println!("{REFUSALS} refusals grew the node log by {grown} bytes");
    let errors: Vec<&str> = log.lines().filter(|line| line.contains("ERROR")).collect();
    assert!(
        errors.is_empty(),
        "{} ERROR lines for {REFUSALS} refusals ({grown} bytes of log), the first: {}",
        errors.len(),
        errors[0]
    );
    assert!(
        grown < MAX_LOG_BYTES_FOR_REFUSALS,
        "{REFUSALS} refusals logged {grown} bytes:\n{log}"
    );
}

#[tokio::test]
async fn an_unreachable_mysql_is_still_logged() {
    let app = spawn_app(&[]).await;
    let token = app.login(&phone(1)).await;
    let closed = free_port().unwrap();
    let node = LoggedNode::start(
        &app,
        &[
            &format!("--database-url=mysql://root@127.0.0.1:{closed}/hmdp"),
            "--backend-timeout-ms=500",
        ],
    )
    .await;

    let response = node.purchase(10, &token).await;

    assert_eq!(response.status(), 503);
    let log = node.log();
    assert!(
        log.lines()
            .any(|line| line.contains("WARN") && line.contains("backend unavailable")),
        "no warning of the unreachable MySQL in:\n{log}"
    );
}
