//! `hmdp up --prometheus` run as a user runs it, against the machine's
//! MySQL, Redis, nginx and Debian's Prometheus: Prometheus scrapes both
//! nodes, and when a node is frozen (SIGSTOP, a stalled machine) while it
//! holds a user's lock, past the lock's lease, it sees the node go down and
//! fires `HmdpLocksLost` once the node runs again and finds its lock gone.
//! What Prometheus answered is printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;
use tokio::task::JoinHandle;

use hmdp::config::connect_redis;
use hmdp::ids::UserId;
use hmdp::keys::Keys;
use hmdp::redis_handle::RedisConnection;
use hmdp_test_support::{
    free_ports, mysql_server_url, phone, redis_url, send_signal, wait_for, wait_until,
};
use hmdp_tools::loadtest::{self, tokens::Login};
use hmdp_tools::nodes::prometheus::{Alert, PrometheusApi, Target};

/// How long Prometheus may take to see a change: a scrape and a rule
/// evaluation every second, on a busy two-core machine.
const SEEN_WITHIN: Duration = Duration::from_secs(15);

/// The lease the nodes' lock watchdog keeps renewing: a freeze of a few
/// seconds outlasts it.
const LEASE_MS: u64 = 1000;

/// `hmdp up` running as a child; on drop it gets SIGTERM and is waited
/// for, so that it stops its nodes, nginx and Prometheus and removes its
/// sandbox (a SIGKILL would leave them all behind).
struct RunningNodes {
    child: Child,
    /// The `NAME=value` lines of its --env-file.
    env: BTreeMap<String, String>,
    /// Its standard output and error.
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl RunningNodes {
    /// Runs `hmdp up` with `args` and the nodes' environment `node_env`
    /// (they inherit it); returns once it wrote its env file, i.e. once
    /// nginx, both nodes and Prometheus answer.
    async fn start(args: &[String], node_env: &[(&str, String)]) -> RunningNodes {
        let dir = tempfile::tempdir().unwrap();
        let env_file = dir.path().join("up.env");
        let log = dir.path().join("up.log");
        let output = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_hmdp"))
            .arg("up")
            .args(args)
            .arg("--env-file")
            .arg(&env_file)
            .env("DATABASE_URL", format!("{}/hmdp", mysql_server_url()))
            .env("REDIS_URL", redis_url())
            .envs(node_env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn()
            .expect("hmdp runs");
        let mut nodes = RunningNodes {
            child,
            env: BTreeMap::new(),
            log,
            _dir: dir,
        };
        let (child, log) = (&mut nodes.child, &nodes.log);
        nodes.env = wait_for("hmdp up's env file", Duration::from_secs(90), || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("hmdp up exited ({status}):\n{}", read(log));
            }
            let env = read_env(&env_file);
            async move { env.contains_key("HMDP_PROMETHEUS").then_some(env) }
        })
        .await;
        nodes
    }

    fn var(&self, name: &str) -> &str {
        self.env
            .get(name)
            .unwrap_or_else(|| panic!("{name} not in the env file: {:?}", self.env))
    }

    /// SIGTERM, then its exit status once it has stopped everything.
    async fn stop(&mut self) -> std::process::ExitStatus {
        send_signal(self.child.id(), "TERM").unwrap();
        let child = &mut self.child;
        wait_for("hmdp up to stop", Duration::from_secs(30), || {
            let status = child.try_wait().unwrap();
            async move { status }
        })
        .await
    }
}

impl Drop for RunningNodes {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        send_signal(self.child.id(), "TERM").unwrap();
        for _ in 0..300 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The `NAME=value` lines of an env file, quotes taken off; empty while the
/// file is not there.
fn read_env(path: &Path) -> BTreeMap<String, String> {
    (read(path).lines())
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.trim_matches('"').to_owned()))
        .collect()
}

fn instance_of(labels: &BTreeMap<String, String>) -> &str {
    labels.get("instance").map_or("", String::as_str)
}

/// Polls `/api/v1/alerts` until an alert named `name` on `instance` is in
/// `state`; that alert.
async fn wait_for_alert(api: &PrometheusApi, name: &str, instance: &str, state: &str) -> Alert {
    let what = format!("{name} {state} on {instance}");
    wait_for(&what, SEEN_WITHIN, || async move {
        (api.alerts().await.ok()?.into_iter()).find(|alert| {
            alert.name() == name && alert.state == state && instance_of(&alert.labels) == instance
        })
    })
    .await
}

/// Polls `/api/v1/targets` until both nodes' targets are up; the targets.
async fn wait_until_both_up(api: &PrometheusApi) -> Vec<Target> {
    wait_for("both nodes' targets up", SEEN_WITHIN, || async move {
        let targets = api.targets().await.ok()?;
        let up = |node: &str| {
            (targets.iter())
                .any(|target| instance_of(&target.labels) == node && target.health == "up")
        };
        (up("node1") && up("node2")).then_some(targets)
    })
    .await
}

/// A user's purchase on `node` itself, past nginx, so that it is `node`
/// that holds the user's lock (for the chaos hold); the purchase on its
/// way and the lock's key.
async fn purchase_holding_its_lock(
    nodes: &RunningNodes,
    node: &str,
    redis: &RedisConnection,
) -> (JoinHandle<reqwest::Result<reqwest::Response>>, String) {
    let client = loadtest::http_client(4).unwrap();
    let keys = Keys::new(nodes.var("HMDP_REDIS_PREFIX").to_owned());
    let token = Login::new(client.clone(), node, redis.clone(), keys.clone())
        .user(phone(0))
        .await
        .unwrap();
    let admin_token = nodes.var("HMDP_ADMIN_TOKEN");
    let voucher = loadtest::create_voucher(&client, node, admin_token, 10)
        .await
        .unwrap();
    let me: Value = (client.get(format!("{node}/user/me")))
        .header("authorization", &token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let user = UserId::new(me["data"]["id"].as_u64().expect("user id"));
    let purchase = client
        .post(format!("{node}/voucher-order/seckill/{voucher}"))
        .header("authorization", &token)
        .send();
    (tokio::spawn(purchase), keys.order_lock(user))
}

fn print_answer(what: &str, answer: &impl serde::Serialize) {
    println!("{what}:\n{}", serde_json::to_string_pretty(answer).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_both_nodes_and_fires_locks_lost_for_a_node_frozen_holding_a_lock() {
    let [prometheus_port] = free_ports().unwrap();
    let args = [
        format!("--prometheus={prometheus_port}"),
        // A purchase holds its user's lock this long: the freeze lands inside.
        "--chaos-hold-ms=10000".to_owned(),
    ];
    let node_env = [
        ("HMDP_LOCK_WATCHDOG_MS", LEASE_MS.to_string()),
        // The purchase's statements may take the whole hold.
        ("HMDP_BACKEND_TIMEOUT_MS", "30000".to_owned()),
        ("HMDP_DB_POOL", "8".to_owned()),
    ];
    let mut nodes = RunningNodes::start(&args, &node_env).await;
    let api = PrometheusApi::new(nodes.var("HMDP_PROMETHEUS")).unwrap();
    assert_eq!(
        api.url(),
        format!("http://127.0.0.1:{prometheus_port}"),
        "the port asked for"
    );
    let up = wait_until_both_up(&api).await;
    print_answer("GET /api/v1/targets (both nodes scraped)", &up);

    let node1 = nodes.var("HMDP_NODE_URLS").split(' ').next().unwrap();
    let node1_pid: u32 = (nodes.var("HMDP_NODE_PIDS").split(' ').next().unwrap())
        .parse()
        .unwrap();
    let redis = connect_redis(nodes.var("REDIS_URL"), Duration::from_secs(5)).unwrap();
    let (purchase, lock) = purchase_holding_its_lock(&nodes, node1, &redis).await;
    let lock_is_in_redis = |present: bool| {
        let (mut redis, lock) = (redis.clone(), lock.clone());
        async move { redis.exists::<_, bool>(&lock).await.ok() == Some(present) }
    };
    wait_until("node1 to hold the lock", SEEN_WITHIN, || {
        lock_is_in_redis(true)
    })
    .await;

    // node1 freezes: Prometheus finds it down, and its lease runs out in
    // Redis with nobody to renew it.
    send_signal(node1_pid, "STOP").unwrap();
    let down = wait_for_alert(&api, "HmdpNodeDown", "node1", "pending").await;
    print_answer("GET /api/v1/alerts (node1 frozen)", &down);
    let lease_out = || lock_is_in_redis(false);
    wait_until(
        "the frozen holder's lease to run out",
        SEEN_WITHIN,
        lease_out,
    )
    .await;
    send_signal(node1_pid, "CONT").unwrap();

    // Running again, node1's watchdog finds the lock gone; the purchase
    // rolls back and Prometheus fires at the next scrape.
    let lost = wait_for_alert(&api, "HmdpLocksLost", "node1", "firing").await;
    print_answer("GET /api/v1/alerts (node1 running again)", &lost);
    assert_eq!(lost.labels["reason"], "taken_or_gone", "{lost:?}");
    assert_eq!(lost.labels["severity"], "ticket");
    let answer = (purchase.await.unwrap()).unwrap_or_else(|error| {
        panic!(
            "node1 did not answer the purchase: {error:?}\n{}",
            read(&nodes.log)
        )
    });
    assert_eq!(answer.status().as_u16(), 503, "the lost lock's purchase");
    let up = wait_until_both_up(&api).await;
    print_answer("GET /api/v1/targets (node1 back)", &up);

    // Prometheus stops with the nodes.
    assert!(nodes.stop().await.success(), "{}", read(&nodes.log));
    assert!(api.targets().await.is_err(), "Prometheus still answers");
}
