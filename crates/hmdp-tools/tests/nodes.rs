//! Two nodes behind nginx, started exactly as `hmdp demo` starts them
//! (`hmdp_tools::nodes`), against the machine's MySQL, Redis and nginx: which lock
//! modes keep one order per user across nodes, and what a node crash does.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::limits::Rule;
use hmdp_lock::LockMode;

mod common;
use common::nodes::{run, TestNodes};
use hmdp::config::RedisSettings;
use hmdp_test_support::{
    mysql_server_url, poll_until, port_was_taken, redis_url, wait_until, RedisCluster, Tables,
};
use hmdp_tools::loadtest::tokens::Login;
use hmdp_tools::loadtest::{self, Plan, Report};
use hmdp_tools::nodes::node::Node;
use hmdp_tools::nodes::{NodesSpec, Sandbox, NODE_IDS};

fn assert_served_by_both_nodes(report: &Report) {
    for node in NODE_IDS {
        assert!(
            report.served_by.get(node).copied().unwrap_or(0) > 0,
            "{node} served nothing: {:?}",
            report.served_by
        );
    }
}

/// Stock large enough that every user could buy: only the lock limits orders.
const STOCK: i64 = 1000;
const USERS: usize = 40;
const PER_USER: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_lock_lets_duplicates_through_across_two_nodes() {
    // 300 ms inside the critical section: each user's simultaneous requests,
    // spread over both nodes by round robin, overlap with certainty.
    let test = TestNodes::start(LockMode::Local, 300, USERS).await;
    let voucher = test.create_voucher(STOCK).await;

    let report = test.run(&test.plan(voucher, USERS, PER_USER), STOCK).await;

    assert!(
        report.duplicate_users.unwrap() > 0,
        "the local lock must fail across nodes: {report:?}"
    );
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_served_by_both_nodes(&report);
}

/// The same storm as the local lock's, through a lock every node shares.
async fn assert_one_order_per_user_across_two_nodes(mode: LockMode) {
    let test = TestNodes::start(mode, 300, USERS).await;
    let voucher = test.create_voucher(STOCK).await;

    let report = test.run(&test.plan(voucher, USERS, PER_USER), STOCK).await;

    assert_eq!(report.duplicate_users, Some(0), "{report:?}");
    assert_eq!(report.oversold, Some(0), "{report:?}");
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(
        report.orders,
        Some(USERS as i64),
        "every user bought once: {report:?}"
    );
    assert_served_by_both_nodes(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_lua_lock_keeps_one_order_per_user_across_two_nodes() {
    assert_one_order_per_user_across_two_nodes(LockMode::RedisLua).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_lock_keeps_one_order_per_user_across_two_nodes() {
    assert_one_order_per_user_across_two_nodes(LockMode::Reentrant).await;
}

/// What the start of two nodes and the labs' retry on: a node whose port
/// another process holds exits, and its log says why; started again, it
/// moves to another port and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_port_was_taken_says_so_and_moves_to_another() {
    let sandbox = Sandbox::create(&mysql_server_url(), &RedisSettings::at(redis_url()), "test")
        .await
        .expect("MySQL is reachable (scripts/services.sh starts it)");
    let spec = NodesSpec::in_sandbox(PathBuf::from(env!("CARGO_BIN_EXE_hmdp")), &sandbox);
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().port();
    let log = tempfile::NamedTempFile::new().unwrap();

    let mut node = Node::new("taken", taken, log.path().to_owned());
    let refused = node.start(&spec, &[]).await;

    assert!(refused.is_err(), "a node started on a taken port");
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(port_was_taken(log.path()), "{logged}");
    node.start_moving_if_taken(&spec, &[]).await.unwrap();
    assert_ne!(node.port, taken);
    assert!(!port_was_taken(log.path()));
    let health = reqwest::get(format!("{}/health", node.url()))
        .await
        .unwrap();
    assert!(health.status().is_success(), "{health:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_leaves_the_survivor_serving_and_the_stock_balanced() {
    const USERS: usize = 200;
    const PER_USER: usize = 2;
    let mut test = TestNodes::start(LockMode::Reentrant, 40, USERS + 20).await;
    let voucher = test.create_voucher(STOCK).await;
    let plan = test.plan(voucher, USERS, PER_USER);
    let total = plan.requests();

    // Kill node1 once about a quarter of the requests are answered.
    let TestNodes { nodes, store, .. } = &mut test;
    let (report, ()) = tokio::join!(run(store, &plan, STOCK), async {
        wait_until(
            "a quarter of the requests answered",
            Duration::from_secs(60),
            || async { plan.progress.position() >= total / 4 },
        )
        .await;
        nodes.kill_node(0).await;
    });
    // Purchases that were on node1 when it died get 502 from nginx, which
    // must not re-send them to node2; every other request is answered.
    let allowed: BTreeSet<&str> = ["OK", "DUPLICATE_REQUEST", "ALREADY_ORDERED", "HTTP_502"].into();
    for outcome in report.outcomes.keys() {
        assert!(allowed.contains(outcome.as_str()), "{:?}", report.outcomes);
    }
    assert_eq!(report.requests, total, "the run finished");
    assert!(report.outcome("OK") > 0);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.duplicate_users, Some(0), "{report:?}");

    // Later purchases all reach the survivor.
    let after = Plan {
        tokens: test.tokens[USERS..].to_vec(),
        ..test.plan(voucher, USERS, 1)
    };
    let later = test.run(&after, STOCK).await;
    assert_eq!(later.served_by.get(NODE_IDS[1]), Some(&20), "{later:?}");
    assert_eq!(later.outcome("OK"), 20, "{:?}", later.outcomes);
    assert!(later.violations.is_empty(), "{:?}", later.violations);
    assert_eq!(later.duplicate_users, Some(0), "{later:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokens_and_loadtest_commands_log_in_fire_verify_and_write_json() {
    const STOCK: i64 = 10;
    let test = TestNodes::start(LockMode::Reentrant, 0, 0).await;
    let voucher = test.create_voucher(STOCK).await;
    let dir = tempfile::tempdir().unwrap();
    let (tokens, json) = (dir.path().join("tokens.csv"), dir.path().join("run.json"));
    let hmdp = |args: Vec<String>| async move {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_hmdp"))
            .args(&args)
            .output()
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "hmdp {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let target = test.nodes.url();
    let redis_flags = |command: &str| {
        vec![
            command.to_owned(),
            format!("--target={target}"),
            format!("--redis-url={}", test.sandbox.redis.redis_url),
            format!("--redis-prefix={}", test.sandbox.redis.prefix),
        ]
    };
    let common = |command: &str| {
        let mut args = redis_flags(command);
        args.push(format!("--database-url={}", test.sandbox.database.url));
        args
    };

    let mut args = redis_flags("tokens");
    args.extend(["--users=30".into(), format!("--out={}", tokens.display())]);
    hmdp(args.clone()).await;
    let lines = std::fs::read_to_string(&tokens).unwrap();
    assert_eq!(lines.lines().count(), 30);
    assert!(lines
        .lines()
        .all(|token| token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit())));
    // Again at once, on the same phones: their login codes are still
    // rate-limited, so the sessions of the first run are reused.
    hmdp(args).await;
    assert_eq!(std::fs::read_to_string(&tokens).unwrap(), lines);

    let mut args = common("loadtest");
    args.extend([
        format!("--voucher={voucher}"),
        "--users=30".into(),
        "--per-user=3".into(),
        "--concurrency=40".into(),
        format!("--tokens={}", tokens.display()),
        "--verify".into(),
        format!("--json={}", json.display()),
    ]);
    let table = hmdp(args).await;
    assert!(table.contains("invariants   stock balances"), "{table}");

    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(result["requests"], 90, "{result}");
    for key in ["elapsed_s", "rps"] {
        assert!(result[key].as_f64().unwrap() > 0.0, "{key}: {result}");
    }
    for key in ["p50", "p90", "p99", "max"] {
        assert!(
            result["latency_ms"][key].as_f64().is_some(),
            "{key}: {result}"
        );
    }
    assert_eq!(result["outcomes"]["OK"], STOCK, "{result}");
    assert_eq!(result["orders"], STOCK);
    assert_eq!(result["stock_left"], 0);
    assert_eq!(result["duplicate_users"], 0);
    assert_eq!(result["extra_orders"], 0);
    assert_eq!(result["oversold"], 0);
    for node in NODE_IDS {
        assert!(result["served_by"][node].as_u64().unwrap() > 0, "{result}");
    }

    // A user holding two orders of the voucher (the second written by
    // hand: no lock here lets one through) fails a verified run of this
    // synchronous sale, even with the stock balancing.
    let tables = Tables::of(test.store.pool());
    let (_, user) = tables.first_order(voucher).await.unwrap();
    // Id 1: far below any id the id worker mints (seconds since 2022 << 32).
    tables.insert_order(1, user, voucher).await.unwrap();
    let mut args = common("loadtest");
    args.extend([
        format!("--voucher={voucher}"),
        "--users=30".into(),
        format!("--tokens={}", tokens.display()),
        "--verify".into(),
    ]);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_hmdp"))
        .args(&args)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 users hold more than one active order (1 extra orders)"),
        "{stderr}"
    );
}

/// A load test started again at once, as anyone does after changing a
/// setting, runs like the first: the users' login codes are still
/// rate-limited, and their sessions from the first run are reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storm_workload_runs_three_times_in_a_row() {
    let test = TestNodes::start(LockMode::Reentrant, 0, 0).await;
    let args = [
        "loadtest".to_owned(),
        format!("--target={}", test.nodes.url()),
        format!("--redis-url={}", test.sandbox.redis.redis_url),
        format!("--redis-prefix={}", test.sandbox.redis.prefix),
        format!("--database-url={}", test.sandbox.database.url),
        format!("--admin-token={}", test.nodes.spec().admin_token),
        "--workload=storm".into(),
        "--users=40".into(),
        "--per-user=3".into(),
        "--verify".into(),
    ];
    let mut summaries = Vec::new();
    for run in 1..=3 {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_hmdp"))
            .args(&args)
            .env_remove("HMDP_ADMIN_TOKEN")
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "run {run}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            stdout.contains("invariants   stock balances"),
            "run {run}: {stdout}"
        );
        println!("run {run}:\n{stdout}");
        summaries.push(stdout);
    }
    // Each run sells a fresh voucher of its own, a tenth of the users' stock.
    for summary in &summaries {
        assert!(
            summary.contains("orders       4 of initial stock 4, 0 left"),
            "{summary}"
        );
        assert!(summary.contains("duplicates   0 users"), "{summary}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_serves_the_api_under_api_too_and_keeps_the_request_id() {
    let test = TestNodes::start(LockMode::Reentrant, 0, 1).await;
    let get = |path: &str| {
        test.client
            .get(format!("{}{path}", test.nodes.url()))
            .header("authorization", &test.tokens[0])
            .header("x-request-id", "client-chosen-id")
    };

    for path in ["/user/me", "/api/user/me"] {
        let response = get(path).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.headers()["x-request-id"], "client-chosen-id");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["success"], true, "{path}: {body}");
        assert!(!body["data"]["id"].is_null(), "{path}: {body}");
    }
    let generated = test
        .client
        .get(format!("{}/api/health", test.nodes.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(generated.status(), 200);
    let id = generated.headers()["x-request-id"].to_str().unwrap();
    assert_eq!(id.len(), 32, "nginx's $request_id: {id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_nginx_a_limit_answers_429_and_the_front_end_its_message() {
    // Every limit of the nodes off but this one: the test's own logins
    // stay clear of the others.
    let flags = Rule::flags_enforcing_only(&[(Rule::PurchaseByUser, "1/1m")]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let test = TestNodes::start_on(&redis_url(), LockMode::Reentrant, &flags, 0, 1).await;
    let purchase = |prefix: &str| {
        // A voucher that does not exist: counted all the same.
        (test.client)
            .post(format!(
                "{}{prefix}/voucher-order/seckill/999999",
                test.nodes.url()
            ))
            .header("authorization", &test.tokens[0])
            .send()
    };

    let allowed = purchase("").await.unwrap();
    assert_eq!(allowed.status(), 200);
    let refused = purchase("").await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        "\"purchase-user\";q=1;w=60"
    );
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["errorCode"], "RATE_LIMITED", "{body}");

    // hmdp's front end (under /api) reads a refusal's message from a 200
    // only: it gets the same refusal as one.
    let front_end = purchase("/api").await.unwrap();
    assert_eq!(front_end.status(), 200);
    assert!(front_end.headers().contains_key("retry-after"));
    let body: serde_json::Value = front_end.json().await.unwrap();
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["errorCode"], "RATE_LIMITED", "{body}");
    assert_eq!(body["errorMsg"], "操作太频繁，请稍后再试", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_turns_away_a_flooding_address_before_the_nodes() {
    let test = TestNodes::start(LockMode::Reentrant, 0, 0).await;
    // Another address of this machine than the 127.0.0.1 nginx leaves
    // alone: a client somewhere else.
    let flooder = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .pool_max_idle_per_host(50)
        .build()
        .unwrap();
    let url = format!("{}/health", test.nodes.url());
    let mut sent = 0;
    let refused = loop {
        // Far beyond nginx's 100 a second and its burst of 200; a hang guard
        // only, a flood crosses the line within a few hundred.
        assert!(sent < 50_000, "nginx let {sent} requests through");
        let answers = futures::future::join_all((0..50).map(|_| flooder.get(&url).send())).await;
        sent += 50;
        let refused = answers
            .into_iter()
            .map(Result::unwrap)
            .find(|answer| answer.status() == 429);
        if let Some(refused) = refused {
            break refused;
        }
    };
    assert_eq!(refused.headers()["retry-after"], "1");
    assert!(refused.headers().contains_key("ratelimit-policy"));
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["errorCode"], "RATE_LIMITED", "{body}");
    // The machine's own address still goes through.
    let own = test.client.get(&url).send().await.unwrap();
    assert_eq!(own.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_buyers_and_bots_is_measured_class_by_class() {
    // The purchase limits at their defaults; the logins of the test's own
    // users, all from this machine's one address, not limited.
    let flags = loadtest::crowd::limit_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let test = TestNodes::start_on(&redis_url(), LockMode::Reentrant, &flags, 0, 48).await;
    let voucher = test.create_voucher(10).await;
    let mut humans = test.tokens.clone();
    let bots = humans.split_off(40);
    let crowd = loadtest::crowd::Crowd {
        target: test.nodes.url(),
        voucher,
        stock: 10,
        humans,
        bots,
        bot_addresses: 2,
        spread: Duration::from_millis(200),
    };
    let report = loadtest::crowd::run(&crowd).await.unwrap();
    let table = report.table();

    assert_eq!(report.humans.buyers, 40, "{table}");
    assert_eq!(report.bots.buyers, 8, "{table}");
    assert_eq!(
        report.humans.units_won + report.bots.units_won,
        10,
        "{table}"
    );
    assert!(report.bots.most_won_by_one <= 1, "{table}");
    assert!(report.humans.most_won_by_one <= 1, "{table}");
    // Each buyer from an address of their own, once: never limited first.
    assert_eq!(report.humans_429_on_first_purchase, 0, "{table}");
    // The bots kept at it until the buyers were done (how many of their
    // purchases were refused 429 and how many SOLD_OUT from memory depends
    // on how soon the sale sold out).
    assert!(report.bots.requests > 8, "{table}");
    let audit = test
        .store
        .audit_voucher(VoucherId::new(voucher))
        .await
        .unwrap();
    assert_eq!(
        audit.active_orders, 10,
        "every unit told is an order: {table}"
    );
    assert!(audit.violations(10, true).is_empty(), "{audit:?}");
}

/// Two nodes behind nginx on a Redis Cluster of their own, a sale under way,
/// and one of its masters SIGKILLed: the cluster promotes that master's
/// replica, requests caught in the failover fail fast with 503 instead of
/// hanging, the nodes carry on without a restart, and the stock balances.
/// With `--fencing`, one order per user holds too: a lock lost with the
/// master cannot let a second order commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_master_killed_under_load_fails_over_and_the_sale_holds() {
    const USERS: usize = 300;
    const STOCK: i64 = 200;
    let mut redis = RedisCluster::start()
        .await
        .expect("a Redis Cluster starts (redis-server and redis-cli: scripts/services.sh)");
    let test =
        TestNodes::start_on(&redis.url(), LockMode::Reentrant, &["--fencing"], 5, USERS).await;
    let voucher = test.create_voucher(STOCK).await;
    let plan = Plan {
        concurrency: 40,
        ..test.plan(voucher, USERS, 2)
    };
    let kill_a_master = async {
        // A sale under way: a tenth of its requests answered.
        wait_until("the sale under way", Duration::from_secs(30), || async {
            plan.progress.position() >= plan.requests() / 10
        })
        .await;
        // The first servers given to `redis-cli --cluster create` are masters.
        redis.servers_mut()[0].kill();
    };
    let (report, ()) = tokio::join!(test.run(&plan, STOCK), kill_a_master);

    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.oversold, Some(0), "{report:?}");
    assert_eq!(report.duplicate_users, Some(0), "{report:?}");
    // A request caught in the failover gets its answer, 503 or success,
    // within the nodes' backend timeout (2 s) from its session check on
    // (with no lock wait), plus 200 ms of grace for the release and the
    // commit: the bound leaves room for a loaded machine, it tells a
    // budget kept from one overrun by another whole timeout.
    assert!(
        report.latency_ms.max_ms < 4_000.0,
        "{:?}",
        report.latency_ms
    );
    for outcome in report.outcomes.keys() {
        assert!(
            [
                "OK",
                "ALREADY_ORDERED",
                "DUPLICATE_REQUEST",
                "SOLD_OUT",
                "UNAVAILABLE"
            ]
            .contains(&outcome.as_str()),
            "{outcome}: {:?}",
            report.outcomes
        );
    }

    // Once the replica took over, the same nodes serve a new buyer.
    redis.wait_until_ok().await.unwrap();
    let redis_conn = hmdp::config::connect_redis(&redis.url(), Duration::from_secs(5)).unwrap();
    let login = Login::new(
        test.client.clone(),
        &test.nodes.url(),
        redis_conn,
        Keys::new(test.sandbox.redis.prefix.clone()),
    );
    // A new buyer each try, one every 200 ms.
    let attempts = AtomicUsize::new(0);
    poll_until(
        "the nodes to serve a purchase after the failover",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let attempt = attempts.fetch_add(1, Ordering::SeqCst);
            let phone = hmdp_test_support::phone(USERS + attempt);
            let Ok(token) = login.user(phone).await else {
                return Ok(false);
            };
            let answer: serde_json::Value = test
                .client
                .post(format!(
                    "{}/voucher-order/seckill/{voucher}",
                    test.nodes.url()
                ))
                .header("authorization", token)
                .send()
                .await?
                .json()
                .await?;
            Ok(answer["success"] == true || answer["errorCode"] == "SOLD_OUT")
        },
    )
    .await
    .unwrap();
}
