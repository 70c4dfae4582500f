//! Two nodes behind nginx in a sandbox of their own, with users logged in
//! through nginx, started as `hmdp demo` starts them: what the two-node and
//! contract tests stand on.

use std::path::PathBuf;
use std::time::Duration;

use hmdp::config::{RedisSettings, SeckillMode};
use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::store::Store;
use hmdp_lock::LockMode;
use hmdp_test_support::{mysql_server_url, redis_url};
use hmdp_tools::loadtest::tokens::Login;
use hmdp_tools::loadtest::{self, Plan, Report};
use hmdp_tools::nodes::{node_flags, Nodes, NodesSpec, Sandbox};

/// Two nodes in their own sandbox, with users logged in through nginx. Fields
/// drop in order: the processes go before their database does.
pub struct TestNodes {
    pub nodes: Nodes,
    pub client: reqwest::Client,
    pub store: Store,
    pub tokens: Vec<String>,
    pub sandbox: Sandbox,
}

impl TestNodes {
    pub async fn start(mode: LockMode, chaos_hold_ms: u64, users: usize) -> TestNodes {
        Self::start_on(&redis_url(), mode, &[], chaos_hold_ms, users).await
    }

    /// Nodes on the Redis at `redis_url` (a Redis Cluster's too), with `extra`
    /// flags.
    pub async fn start_on(
        redis_url: &str,
        mode: LockMode,
        extra: &[&str],
        chaos_hold_ms: u64,
        users: usize,
    ) -> TestNodes {
        hmdp::telemetry::init();
        let sandbox = Sandbox::create(&mysql_server_url(), &RedisSettings::at(redis_url), "test")
            .await
            .expect("MySQL is reachable (scripts/services.sh starts it)");
        let spec = NodesSpec::in_sandbox(PathBuf::from(env!("CARGO_BIN_EXE_hmdp")), &sandbox);
        // Several pairs of nodes run at once next to the other test binaries' nodes:
        // small pools keep them all within MySQL's connection limit.
        let mut flags = node_flags(mode, SeckillMode::Sync, chaos_hold_ms);
        flags.push("--db-pool=16".into());
        flags.extend(extra.iter().map(|flag| flag.to_string()));
        let nodes = Nodes::start(spec, &flags)
            .await
            .unwrap_or_else(|error| panic!("the nodes did not start: {error:#}"));
        let client = loadtest::http_client(200).unwrap();
        let redis =
            hmdp::config::connect_redis(&sandbox.redis.redis_url, Duration::from_secs(10)).unwrap();
        let tokens = Login::new(
            client.clone(),
            &nodes.url(),
            redis,
            Keys::new(sandbox.redis.prefix.clone()),
        )
        .users(0, users, 32)
        .await
        .expect("users log in through nginx");
        TestNodes {
            nodes,
            client,
            store: sandbox.store(2).unwrap(),
            tokens,
            sandbox,
        }
    }

    /// A voucher on sale now, created through nginx as the load test does.
    pub async fn create_voucher(&self, stock: i64) -> i64 {
        let stock = i32::try_from(stock).unwrap();
        loadtest::create_voucher(
            &self.client,
            &self.nodes.url(),
            &self.nodes.spec().admin_token,
            stock,
        )
        .await
        .unwrap()
    }

    pub fn plan(&self, voucher: i64, users: usize, per_user: usize) -> Plan {
        Plan {
            target: self.nodes.url(),
            voucher,
            tokens: self.tokens[..users].to_vec(),
            per_user,
            concurrency: 200,
            addresses: 1,
            progress: loadtest::progress_bar((users * per_user) as u64),
        }
    }

    pub async fn run(&self, plan: &Plan, stock: i64) -> Report {
        run(&self.store, plan, stock).await
    }
}

/// Runs the plan and audits the voucher, as `loadtest --verify` does.
pub async fn run(store: &Store, plan: &Plan, stock: i64) -> Report {
    let measured = loadtest::run(plan).await.unwrap();
    let mut report = Report::new(plan, &measured);
    report.add_audit(
        stock,
        &store
            .audit_voucher(VoucherId::new(plan.voucher))
            .await
            .unwrap(),
        // Each test asserts the duplicates its lock mode should (or should
        // not) let through.
        false,
    );
    println!("{}", report.table());
    report
}
