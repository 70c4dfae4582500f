//! The test harness: every test gets its own node on a free port, its own
//! database (dropped afterwards) and its own Redis key prefix, against the
//! machine's real MySQL and Redis.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::future::join_all;
use hmdp::cluster::Sandbox;
use hmdp::config::ServeSettings;
use hmdp::ids::VoucherId;
use hmdp::redis_server::free_port;
use hmdp::startup::Application;
use hmdp::store::{Store, VoucherAudit};
use redis::AsyncCommands;
use serde_json::{json, Value};

pub const ADMIN_TOKEN: &str = "test-admin-token";

/// MySQL server the tests create their databases on.
pub fn mysql_server_url() -> String {
    std::env::var("TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    serve: ServeSettings,
}

/// A running node with its private database and Redis namespace.
pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub store: Store,
    pub redis: redis::aio::ConnectionManager,
    pub prefix: String,
    /// The test's database and Redis namespace, removed when the app is
    /// dropped; declared last so it goes after the connections above.
    sandbox: Sandbox,
}

/// Starts a node with the test's own database, Redis prefix and admin token;
/// `flags` (`--lock=local`, `--chaos-hold-ms=50`, ...) add to or override the
/// harness defaults, always in `--name=value` form.
pub async fn spawn_app(flags: &[&str]) -> TestApp {
    spawn_app_on(&mysql_server_url(), flags).await
}

/// As [`spawn_app`], with the test's database on the MySQL server at
/// `mysql_server` (`mysql://user@host:port`) instead of the machine's.
pub async fn spawn_app_on(mysql_server: &str, flags: &[&str]) -> TestApp {
    // Node logs only when asked for: `TEST_LOG=1 cargo test`.
    if std::env::var_os("TEST_LOG").is_some() {
        hmdp::telemetry::init();
    }
    let node_redis_url = flags
        .iter()
        .find_map(|flag| flag.strip_prefix("--redis-url="))
        .map_or_else(redis_url, str::to_owned);
    let sandbox = Sandbox::create(&format!("{mysql_server}/hmdp"), &node_redis_url, "test")
        .await
        .expect("test database and Redis namespace");
    let defaults = [
        "--port=0".to_owned(),
        "--host=127.0.0.1".into(),
        format!("--database-url={}", sandbox.database_url),
        format!("--redis-url={node_redis_url}"),
        format!("--redis-prefix={}", sandbox.redis_prefix),
        format!("--admin-token={ADMIN_TOKEN}"),
        "--db-pool=16".into(),
        "--backend-timeout-ms=10000".into(),
        "--workers=2".into(),
    ];
    let overridden = |default: &str| {
        let name = &default[..default.find('=').expect("--name=value")];
        flags
            .iter()
            .any(|flag| flag.split('=').next() == Some(name))
    };
    let args: Vec<String> = std::iter::once("hmdp".to_owned())
        .chain(defaults.into_iter().filter(|default| !overridden(default)))
        .chain(flags.iter().map(|flag| flag.to_string()))
        .collect();
    let settings = Flags::try_parse_from(args).expect("valid test flags").serve;
    let app = Application::build(settings).await.expect("node starts");
    let address = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        client: reqwest::Client::new(),
        store: sandbox.store(4).unwrap(),
        redis: hmdp::startup::connect_redis(&node_redis_url, Duration::from_secs(10)).unwrap(),
        prefix: sandbox.redis_prefix.clone(),
        sandbox,
    }
}

impl TestApp {
    /// The test database, for a second node (or process) to share.
    pub fn database_url(&self) -> String {
        self.sandbox.database_url.clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn request_code(&self, phone: &str) -> reqwest::Response {
        self.client
            .post(self.url("/user/code"))
            .query(&[("phone", phone)])
            .send()
            .await
            .unwrap()
    }

    /// The code the node stored for `phone` (hmdp "sends" it by logging it).
    pub async fn stored_code(&self, phone: &str) -> Option<String> {
        let key = format!("{}login:code:{phone}", self.prefix);
        self.redis.clone().get(key).await.unwrap()
    }

    pub async fn post_login(&self, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url("/user/login"))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// The `Result` body of a login attempt.
    pub async fn try_login(&self, phone: &str, code: &str) -> Value {
        self.post_login(&json!({ "phone": phone, "code": code }))
            .await
            .json()
            .await
            .unwrap()
    }

    /// Every per-user lock key left in the test's Redis namespace.
    pub async fn lock_keys(&self) -> Vec<String> {
        self.redis
            .clone()
            .keys(format!("{}lock:order:*", self.prefix))
            .await
            .unwrap()
    }

    /// Logs a phone in and returns its session token.
    pub async fn login(&self, phone: &str) -> String {
        let body: Value = self.request_code(phone).await.json().await.unwrap();
        assert_eq!(body["success"], true, "{body}");
        let code = self.stored_code(phone).await.expect("code stored");
        let body: Value = self
            .post_login(&json!({ "phone": phone, "code": code }))
            .await
            .json()
            .await
            .unwrap();
        body["data"].as_str().expect("token").to_owned()
    }

    /// Logs in `n` distinct users, a few at a time.
    pub async fn login_many(&self, n: usize) -> Vec<String> {
        let mut tokens = Vec::with_capacity(n);
        for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
            let batch = chunk.iter().map(|i| self.login_phone(*i));
            tokens.extend(join_all(batch).await);
        }
        tokens
    }

    async fn login_phone(&self, i: usize) -> String {
        self.login(&phone(i)).await
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> reqwest::Response {
        let mut request = self.client.get(self.url(path));
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        request.send().await.unwrap()
    }

    pub async fn post(&self, path: &str, token: Option<&str>) -> reqwest::Response {
        let mut request = self.client.post(self.url(path));
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        request.send().await.unwrap()
    }

    pub async fn post_voucher(
        &self,
        path: &str,
        admin_token: &str,
        body: &Value,
    ) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header("x-admin-token", admin_token)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// Creates a seckill voucher on sale now (or in the given window) and
    /// returns its id.
    pub async fn create_seckill(&self, stock: i64, begin: &str, end: &str) -> i64 {
        let body: Value = self
            .post_voucher(
                "/voucher/seckill",
                ADMIN_TOKEN,
                &seckill_body(stock, begin, end),
            )
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(body["success"], true, "{body}");
        body["data"].as_str().unwrap().parse().unwrap()
    }

    pub async fn create_open_seckill(&self, stock: i64) -> i64 {
        self.create_seckill(stock, "2020-01-01T00:00:00", "2037-12-31T00:00:00")
            .await
    }

    pub async fn purchase(&self, voucher_id: i64, token: &str) -> Value {
        self.post(&format!("/voucher-order/seckill/{voucher_id}"), Some(token))
            .await
            .json()
            .await
            .unwrap()
    }

    pub async fn audit(&self, voucher_id: i64) -> VoucherAudit {
        self.store
            .audit_voucher(VoucherId::new(voucher_id))
            .await
            .unwrap()
    }
}

/// The `i`-th test phone number (valid for hmdp's pattern).
pub fn phone(i: usize) -> String {
    format!("138{i:08}")
}

pub fn seckill_body(stock: i64, begin: &str, end: &str) -> Value {
    json!({
        "shopId": 1,
        "title": "100元代金券",
        "subTitle": "周一至周日均可使用",
        "rules": "全场通用\\n无需预约",
        "payValue": 8000,
        "actualValue": 10000,
        "type": 1,
        "stock": stock,
        "beginTime": begin,
        "endTime": end,
    })
}

/// A second node in a process of its own, killed with SIGKILL when dropped.
pub struct NodeProcess {
    child: Child,
    pub address: String,
}

impl NodeProcess {
    pub async fn start(app: &TestApp, flags: &[&str]) -> NodeProcess {
        let port = free_port().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_hmdp"))
            .arg("serve")
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--database-url", &app.database_url()])
            .args(["--redis-url", &redis_url()])
            .args(["--redis-prefix", &app.prefix])
            .args([
                "--admin-token",
                ADMIN_TOKEN,
                "--no-migrate",
                "--workers",
                "1",
            ])
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("hmdp runs");
        let node = NodeProcess {
            child,
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

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM: the node should stop accepting and finish in-flight
    /// requests.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits for the process to exit by itself; `None` if it did not within
    /// `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(status) = self.child.try_wait().expect("child status") {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
