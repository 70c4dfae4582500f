//! The test harness: every test gets its own node on a free port, its own
//! database (dropped afterwards) and its own Redis key prefix, against the
//! machine's real MySQL and Redis.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use clap::Parser;
use futures::future::join_all;
use hmdp::after_sale::Closer;
use hmdp::config::AdminToken;
use hmdp::config::ServeSettings;
use hmdp::ids::{UserId, VoucherId};
use hmdp::keys::Keys;
use hmdp::limits::{Enforced, LimitSettings, Rule};
use hmdp::seckill::stream::RoundsNow;
use hmdp::seckill::{RedisSale, SaleState};
use hmdp::startup::Application;
use hmdp::store::{Store, VoucherAudit};
pub use hmdp_test_support::phone;
use hmdp_test_support::{
    free_ports, mysql_server_url, poll_until, redis_url, wait_for, wait_until, ChildProcess,
    NodeCommand, Probe, RedisNamespace, RedisServer, Stdout, Tables, TestDatabase,
};
use redis::AsyncCommands;
use serde_json::{json, Value};
use tempfile::NamedTempFile;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub const ADMIN_TOKEN: &str = "test-admin-token";

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    serve: ServeSettings,
}

/// The settings of `hmdp serve` with `flags` (and the environment).
pub fn serve_settings(flags: &[&str]) -> ServeSettings {
    let args = std::iter::once("hmdp").chain(flags.iter().copied());
    Flags::try_parse_from(args).expect("flags parse").serve
}

/// The limits on, with only `quotas` (`(Rule::PurchaseByUser, "2/1m")`)
/// enforced: the others would count the test's own setup against it.
pub fn limits_enforcing_only(quotas: &[(Rule, &str)]) -> LimitSettings {
    let flags = Rule::flags_enforcing_only(quotas);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    serve_settings(&flags).limits
}

/// A running node with its private database and Redis namespace.
pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub store: Store,
    pub redis: hmdp_lock::Connection,
    pub prefix: String,
    /// The node's closer, for a test to run a round of at once instead of
    /// waiting for its timers (the node runs it in the background too).
    pub closer: Closer,
    /// With `--seckill stream`: asks the node's consumer for its next
    /// rounds at once (a claim, the end of a back-off) instead of waiting
    /// for its timers.
    pub stream_rounds: Option<RoundsNow>,
    /// The test's database and Redis namespace, removed when the app is
    /// dropped; declared last so they go after the connections above.
    database: TestDatabase,
    _namespace: RedisNamespace,
}

/// Starts a node with the test's own database, Redis prefix and admin token;
/// `configure` changes any setting after the harness has set its own
/// (`|s| s.lock.mode = LockMode::Local`).
pub async fn spawn_app(configure: impl FnOnce(&mut ServeSettings)) -> TestApp {
    spawn_app_on(&mysql_server_url(), configure).await
}

/// As [`spawn_app`], with the test's database on the MySQL server at
/// `mysql_server` (`mysql://user@host:port`) instead of the machine's.
pub async fn spawn_app_on(
    mysql_server: &str,
    configure: impl FnOnce(&mut ServeSettings),
) -> TestApp {
    // Node logs only when asked for: `TEST_LOG=1 cargo test`.
    if std::env::var_os("TEST_LOG").is_some() {
        hmdp::telemetry::init();
    }
    let database = TestDatabase::create(mysql_server, "test")
        .await
        .expect("a test database (scripts/services.sh starts MySQL)");
    let store = Store::connect_lazy(&database.url, 4, Duration::from_secs(10)).unwrap();
    store.migrate().await.expect("migrations apply");
    let mut namespace = RedisNamespace::new(&redis_url(), "test");

    // The settings of `hmdp serve` with no flags (the environment still
    // counts, as for a node), then the harness's own.
    let mut settings = serve_settings(&[]);
    settings.port = 0;
    settings.host = "127.0.0.1".into();
    settings.store.database.url = database.url.clone();
    settings.store.redis.url = namespace.redis_url.clone();
    settings.store.redis.prefix = namespace.prefix.clone();
    settings.admin_token = Some(AdminToken::parse(ADMIN_TOKEN).expect("a valid admin token"));
    settings.db_pool = 16;
    settings.store.timeout.backend_timeout_ms = 10_000;
    settings.workers = Some(2);
    // The limits count per client address, and every test's client is
    // 127.0.0.1: the tests of everything else run without them (the tests
    // of the limits, `limits.rs`, turn them on).
    settings.limits.enforced = Enforced::Off;
    // Nor do they shed: many hold purchases on purpose (--chaos-hold-ms)
    // to see what a slow one does (`overload.rs` turns it on).
    settings.shed.shed_latency_ms = 0;
    configure(&mut settings);
    // The namespace is cleaned on the Redis the node writes to.
    namespace.redis_url = settings.store.redis.url.clone();

    let redis =
        hmdp::config::connect_redis(&settings.store.redis.url, Duration::from_secs(10)).unwrap();
    let app = Application::build(settings).await.expect("node starts");
    let address = format!("http://127.0.0.1:{}", app.port());
    let closer = app.closer().clone();
    let stream_rounds = app.stream_rounds();
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        client: reqwest::Client::new(),
        store,
        redis,
        prefix: namespace.prefix.clone(),
        closer,
        stream_rounds,
        database,
        _namespace: namespace,
    }
}

impl TestApp {
    /// The test database, for a second node (or process) to share.
    pub fn database_url(&self) -> String {
        self.database.url.clone()
    }

    /// A MySQL session of the test's own on its database, which has run
    /// `sql` (a lock to hold, a session setting).
    pub async fn mysql_session_with(&self, sql: &str) -> sqlx::MySqlConnection {
        use sqlx::Connection;
        let mut session = sqlx::MySqlConnection::connect(&self.database_url())
            .await
            .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut session)
            .await
            .unwrap();
        session
    }

    /// The node's Redis keys, under the test's prefix.
    pub fn keys(&self) -> Keys {
        Keys::new(self.prefix.clone())
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
        let key = self.keys().login_code(phone);
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

    /// Restarts `redis`, the node's private Redis, empty, and waits until
    /// the node answers ready again and the harness's own connection, which
    /// reports the restart once, has reconnected.
    pub async fn restart_redis(&self, redis: &mut RedisServer) {
        redis.restart().await.unwrap();
        wait_until(
            "the node and the test reconnected to Redis",
            Duration::from_secs(20),
            || async {
                let ping: redis::RedisResult<String> = redis::cmd("PING")
                    .query_async(&mut self.redis.clone())
                    .await;
                ping.is_ok() && self.get("/ready", None).await.status() == 200
            },
        )
        .await;
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

    /// The `Result` body of a `GET`.
    pub async fn get_json(&self, path: &str, token: Option<&str>) -> Value {
        self.get(path, token).await.json().await.unwrap()
    }

    /// The `Result` body of a `POST` without a body.
    pub async fn post_json(&self, path: &str, token: Option<&str>) -> Value {
        self.post(path, token).await.json().await.unwrap()
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
    pub async fn create_seckill(&self, stock: i64, begin: &str, end: &str) -> VoucherId {
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
        VoucherId::new(body["data"].as_str().unwrap().parse().unwrap())
    }

    /// Creates a seckill voucher on sale now and for years, the tests' one
    /// open sale, and returns its id.
    pub async fn create_open_seckill(&self, stock: i64) -> VoucherId {
        self.create_seckill(stock, OPEN_SINCE, OPEN_UNTIL).await
    }

    pub async fn purchase(&self, voucher_id: VoucherId, token: &str) -> Value {
        self.post_json(&format!("/voucher-order/seckill/{voucher_id}"), Some(token))
            .await
    }

    /// A purchase sent with the Idempotency-Key `key`: the response.
    pub async fn purchase_response_with_key(
        &self,
        voucher_id: VoucherId,
        token: &str,
        key: &str,
    ) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/voucher-order/seckill/{voucher_id}")))
            .header("authorization", token)
            .header("idempotency-key", key)
            .send()
            .await
            .unwrap()
    }

    /// A purchase sent with the Idempotency-Key `key`: the answer's body.
    pub async fn purchase_with_key(&self, voucher_id: VoucherId, token: &str, key: &str) -> Value {
        let response = self.purchase_response_with_key(voucher_id, token, key);
        response.await.json().await.unwrap()
    }

    /// Transactions open on the test database once those still ending
    /// have ended, waiting for that at most `within`: 0, or how many were
    /// still open then.
    ///
    /// InnoDB answers `information_schema.innodb_trx` from a cache that it
    /// refreshes only when nobody has read it for 0.1 s: read more often
    /// than that, it keeps showing transactions that ended long ago. Reads
    /// here are spaced further apart (the test's server must have no other
    /// such reader).
    pub async fn open_transactions_after(&self, within: Duration) -> i64 {
        const READS_APART: Duration = Duration::from_millis(250);
        let open = AtomicI64::new(0);
        // The first read too comes a while after any earlier one.
        tokio::time::sleep(READS_APART).await;
        let none_open = poll_until("no open transaction", within, READS_APART, || async {
            let now_open = self.tables().open_transactions().await.unwrap();
            open.store(now_open, Ordering::SeqCst);
            Ok(now_open == 0)
        });
        // Still some after `within` (the only error here): how many is the
        // answer.
        let _ = none_open.await;
        open.load(Ordering::SeqCst)
    }

    /// Whether `key` exists in the node's Redis.
    pub async fn key_exists(&self, key: &str) -> bool {
        self.redis.clone().exists(key).await.unwrap()
    }

    /// The id of the user logged in with `token`.
    pub async fn user_id(&self, token: &str) -> UserId {
        let me = self.get_json("/user/me", Some(token)).await;
        UserId::new(me["data"]["id"].as_u64().expect("a user id"))
    }

    /// The asynchronous purchase's Redis state under the test's prefix.
    pub fn sale_state(&self) -> SaleState {
        SaleState::new(self.redis.clone(), self.keys(), self.store.clone())
    }

    /// The voucher's sale as Redis holds it.
    pub async fn redis_sale(&self, voucher_id: VoucherId) -> Option<RedisSale> {
        self.sale_state().read(voucher_id).await.unwrap()
    }

    /// Orders admitted and not yet written, in every shard in use.
    pub async fn pending_orders(&self) -> usize {
        let (pending, _) = self.sale_state().orders_on_their_way().await.unwrap();
        pending as usize
    }

    /// The node's tables, as a test reads and breaks them.
    pub fn tables(&self) -> Tables<'_> {
        Tables::of(self.store.pool())
    }

    pub async fn audit(&self, voucher_id: VoucherId) -> VoucherAudit {
        self.store.audit_voucher(voucher_id).await.unwrap()
    }

    /// Moves the unpaid order `order_id` past its payment deadline at once,
    /// instead of waiting for it: created [`OVERDUE_BY`] ago in MySQL (past
    /// any pay timeout a test sets, and the sweep's grace), due now in Redis
    /// if Redis has its due time. The nodes' closers then close it within a
    /// tick, or their sweep does, or a round the test runs
    /// ([`TestApp::closer`]).
    pub async fn make_overdue(&self, order_id: &str) {
        let order_id: i64 = order_id.parse().expect("an order id");
        (self.tables())
            .age_unpaid_order(order_id, OVERDUE_BY.as_secs())
            .await
            .unwrap();
        // A connection a Redis restart broke reconnects on a later command.
        let moved = || async {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            redis::cmd("ZADD")
                .arg(self.keys().pay_deadlines())
                .arg("XX")
                .arg(now_ms)
                .arg(order_id)
                .query_async::<i64>(&mut self.redis.clone())
                .await
                .ok()
        };
        wait_for("Redis to answer", Duration::from_secs(30), moved).await;
    }
}

/// How far [`TestApp::make_overdue`] moves an order into the past.
pub const OVERDUE_BY: Duration = Duration::from_secs(3600);

/// The window of the tests' open sale: begun long ago, ending years ahead.
const OPEN_SINCE: &str = hmdp_test_support::OPEN_SALE.0;
const OPEN_UNTIL: &str = hmdp_test_support::OPEN_SALE.1;

/// The body that creates [`TestApp::create_open_seckill`]'s voucher, for a
/// test that sends it itself.
pub fn open_seckill_body(stock: i64) -> Value {
    seckill_body(stock, OPEN_SINCE, OPEN_UNTIL)
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

/// The node's binary, built by Cargo for this package's tests.
pub const NODE_BINARY: &str = env!("CARGO_BIN_EXE_hmdp-server");

/// Runs `hmdp-server serve` (on a free port, no migrations) with `flags` and
/// `env` on top, expecting it to refuse to start; returns what it logged.
/// `refusal` names the setting, for the failure message of a node that
/// served instead.
pub async fn serve_refusal(flags: &[&str], env: &[(&str, &str)], refusal: &str) -> String {
    let log = NamedTempFile::new().unwrap();
    let mut command = tokio::process::Command::new(NODE_BINARY);
    command
        .args(["serve", "--host=127.0.0.1", "--port=0", "--no-migrate"])
        .args(flags)
        .envs(env.iter().copied());
    let mut node = ChildProcess::spawn("hmdp-server serve", command, log.path(), Stdout::Discard)
        .expect("hmdp runs");
    let status = node
        .wait_exit(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("the node is serving with {refusal}"));
    assert!(!status.success());
    node.log()
}

/// A second node in a process of its own, serving a [`TestApp`]'s database
/// and Redis namespace, logging at `info` to a file a test can read; killed
/// with SIGKILL when dropped. The node itself (kill, terminate, wait_exit,
/// log) is the [`hmdp_test_support::NodeProcess`] it derefs to.
pub struct NodeProcess {
    node: hmdp_test_support::NodeProcess,
    pub address: String,
    /// Removed with the node, after it.
    _log: NamedTempFile,
}

impl NodeProcess {
    /// Starts `hmdp-server serve` with `app`'s settings given through the
    /// environment, so `flags` (`--lock=local`, `--database-url=...`)
    /// override them (flags win over the environment). It counts as started
    /// once `/health` answers: a test may start it away from its MySQL.
    pub async fn start(app: &TestApp, flags: &[&str]) -> NodeProcess {
        NodeProcess::start_with_env(app, flags, &[]).await
    }

    /// [`NodeProcess::start`], with the variables `env` set for the node
    /// on top (settings the node reads only from its environment).
    pub async fn start_with_env(
        app: &TestApp,
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> NodeProcess {
        let log = NamedTempFile::new().unwrap();
        let [port] = free_ports().unwrap();
        let mut command = NodeCommand::serve(NODE_BINARY, port);
        command
            .args(["--no-migrate", "--workers=1"])
            .args(flags)
            .env("DATABASE_URL", app.database_url())
            .env("REDIS_URL", redis_url())
            .env("HMDP_REDIS_PREFIX", &app.prefix)
            .env("HMDP_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("HMDP_LIMITS", "off")
            .env("HMDP_SHED_LATENCY_MS", "0")
            .env("RUST_LOG", "info");
        for (name, value) in env {
            command.env(name, value);
        }
        let node = command
            .start(
                "hmdp-server serve",
                log.path(),
                Probe::Health,
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|error| panic!("node up: {error:#}"));
        NodeProcess {
            address: node.url(),
            node,
            _log: log,
        }
    }
}

impl Deref for NodeProcess {
    type Target = hmdp_test_support::NodeProcess;

    fn deref(&self) -> &Self::Target {
        &self.node
    }
}

impl DerefMut for NodeProcess {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.node
    }
}

/// A purchase of `voucher` by `token`'s user at the node at `address`; the
/// answer's body.
pub async fn buy_at(address: &str, voucher: VoucherId, token: &str) -> Value {
    buy_with_headers(address, voucher, token, &[]).await
}

/// [`buy_at`], the request carrying `headers` too.
pub async fn buy_with_headers(
    address: &str,
    voucher: VoucherId,
    token: &str,
    headers: &[(&str, &str)],
) -> Value {
    let request = reqwest::Client::new()
        .post(format!("{address}/voucher-order/seckill/{voucher}"))
        .header("authorization", token);
    (headers.iter())
        .fold(request, |request, (name, value)| {
            request.header(*name, *value)
        })
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Sends a request on a connection of its own and resets that connection
/// (RST, not FIN: `SO_LINGER` 0) `after` it was sent.
pub async fn send_then_reset(address: SocketAddr, request: &str, after: Duration) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    stream.set_zero_linger().unwrap();
    drop(stream);
}

pub fn socket_address(app: &TestApp) -> SocketAddr {
    app.address
        .trim_start_matches("http://")
        .parse()
        .expect("ip:port")
}

/// How many times a Redis of a test's own ran `command` (lower case, as
/// `INFO commandstats` names it) since it started.
pub async fn command_calls(redis: &RedisServer, command: &str) -> u64 {
    let mut redis = redis.connect().await.unwrap();
    hmdp_test_support::command_calls(&mut redis, command)
        .await
        .unwrap()
}

/// How many scripts a Redis of a test's own ran for the requests of `app`
/// since this was first asked: every `EVALSHA` but the closer's claims of
/// due orders, which it runs every tick whatever the requests do.
pub async fn request_scripts(redis: &RedisServer, app: &TestApp) -> usize {
    let mut redis = redis.connect().await.unwrap();
    let due = app.keys().pay_deadlines();
    hmdp_test_support::logged_script_calls(&mut redis)
        .await
        .unwrap()
        .iter()
        .filter(|arguments| !arguments.contains(&due))
        .count()
}

/// The value of one series (`name` or `name{labels}`) on the `/metrics` of
/// the node at `address`.
pub async fn metric(address: &str, series: &str) -> f64 {
    let text = reqwest::get(format!("{address}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
        .parse()
        .unwrap()
}
