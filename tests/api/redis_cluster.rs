//! A node on a real Redis Cluster (three masters, three replicas, private
//! servers): login and sessions, the id worker, every single-Redis lock mode
//! with and without fencing, the asynchronous purchase and its limits. Each of their Lua
//! scripts touches several keys, which a cluster accepts only when they share
//! one slot (`CROSSSLOT` otherwise): running them all here checks the hash
//! tags.

use std::time::Duration;

use hmdp::config::SeckillMode;
use hmdp::limits::Rule;
use hmdp_lock::LockMode;
use hmdp_test_support::{phone, wait_until, RedisCluster};

use crate::helpers::{limits_enforcing_only, serve_refusal, spawn_app};

/// One node setup on the cluster, named as its flags would read.
struct Setup {
    name: &'static str,
    mode: LockMode,
    fencing: bool,
    seckill: SeckillMode,
    /// `--lock-wait-ms`: above 0, a busy lock is waited for, and `reentrant`
    /// hears of its release through pub/sub.
    wait_ms: u64,
    /// `--lock-sync-replicas`: a lock is handed out once this many replicas
    /// acknowledged it.
    sync_replicas: u32,
}

const SETUPS: [Setup; 8] = [
    Setup {
        name: "--lock=redis-naive",
        mode: LockMode::RedisNaive,
        fencing: false,
        seckill: SeckillMode::Sync,
        wait_ms: 0,
        sync_replicas: 0,
    },
    Setup {
        name: "--lock=redis-owner",
        mode: LockMode::RedisOwner,
        fencing: false,
        seckill: SeckillMode::Sync,
        wait_ms: 0,
        sync_replicas: 0,
    },
    Setup {
        name: "--lock=redis-lua",
        mode: LockMode::RedisLua,
        fencing: false,
        seckill: SeckillMode::Sync,
        wait_ms: 0,
        sync_replicas: 0,
    },
    Setup {
        name: "--lock=redis-lua --fencing",
        mode: LockMode::RedisLua,
        fencing: true,
        seckill: SeckillMode::Sync,
        wait_ms: 0,
        sync_replicas: 0,
    },
    Setup {
        name: "--lock=reentrant --lock-wait-ms=3000",
        mode: LockMode::Reentrant,
        fencing: false,
        seckill: SeckillMode::Sync,
        wait_ms: 3000,
        sync_replicas: 0,
    },
    Setup {
        name: "--lock=reentrant --fencing",
        mode: LockMode::Reentrant,
        fencing: true,
        seckill: SeckillMode::Sync,
        wait_ms: 0,
        sync_replicas: 0,
    },
    Setup {
        name: "--lock=reentrant --fencing --lock-sync-replicas=1",
        mode: LockMode::Reentrant,
        fencing: true,
        seckill: SeckillMode::Sync,
        wait_ms: 0,
        sync_replicas: 1,
    },
    Setup {
        name: "--lock=reentrant --seckill=stream",
        mode: LockMode::Reentrant,
        fencing: false,
        seckill: SeckillMode::Stream,
        wait_ms: 0,
        sync_replicas: 0,
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_mode_and_purchase_path_runs_on_a_redis_cluster() {
    let cluster = RedisCluster::start()
        .await
        .expect("a Redis Cluster starts (redis-server and redis-cli: scripts/services.sh)");
    for setup in &SETUPS {
        let app = spawn_app(|s| {
            s.store.redis.url = cluster.url();
            s.lock.mode = setup.mode;
            s.lock.fencing = setup.fencing;
            s.lock.lock_wait_ms = setup.wait_ms;
            s.lock.lock_sync_replicas = setup.sync_replicas;
            s.seckill = setup.seckill;
        })
        .await;
        const STOCK: i64 = 2;
        let voucher = app.create_open_seckill(STOCK).await;
        let tokens = app.login_many(3).await;
        let name = setup.name;

        // The first user twice at once: with a wait, the second purchase
        // waits for the first one's release and then finds its order.
        let (first, again) = tokio::join!(
            app.purchase(voucher, &tokens[0]),
            app.purchase(voucher, &tokens[0])
        );
        let outcomes = [&first, &again].map(|body| {
            body["errorCode"]
                .as_str()
                .unwrap_or(if body["success"] == true { "OK" } else { "?" })
                .to_owned()
        });
        assert!(outcomes.contains(&"OK".to_owned()), "{name}: {outcomes:?}");
        let refused = outcomes.iter().find(|o| *o != "OK").expect("one refused");
        if setup.wait_ms > 0 || setup.seckill == SeckillMode::Stream {
            assert_eq!(refused, "ALREADY_ORDERED", "{name}");
        } else {
            assert!(
                ["ALREADY_ORDERED", "DUPLICATE_REQUEST"].contains(&refused.as_str()),
                "{name}: {refused}"
            );
        }
        let second = app.purchase(voucher, &tokens[1]).await;
        assert_eq!(second["success"], true, "{name}: {second}");
        let third = app.purchase(voucher, &tokens[2]).await;
        assert_eq!(third["errorCode"], "SOLD_OUT", "{name}: {third}");

        // Every order in MySQL (the stream's consumer writes them afterwards).
        wait_until("the orders written", Duration::from_secs(20), || async {
            app.audit(voucher).await.active_orders == STOCK
        })
        .await;
        let audit = app.audit(voucher).await;
        assert_eq!(audit.duplicate_users, 0, "{name}");
        assert!(audit.stock_balances(STOCK), "{name}: {audit:?}");
        let me = app.get_json("/user/me", Some(&tokens[2])).await;
        assert_eq!(
            me["success"], true,
            "{name}: a session on the cluster: {me}"
        );
    }
}

/// `WAIT` runs on the node's Redis connection: a wait for replicas longer
/// than a reply may take is refused at start, not turned into timeouts.
#[tokio::test]
async fn serve_refuses_a_replica_wait_longer_than_a_reply_may_take() {
    let flags = [
        "--lock-sync-replicas=1",
        "--lock-sync-timeout-ms=3000",
        "--backend-timeout-ms=2000",
    ];
    let stderr = serve_refusal(&flags, &[], "a replica wait beyond its backend timeout").await;
    assert!(
        stderr.contains(
            "--lock-sync-timeout-ms (3000) must be shorter than --backend-timeout-ms (2000)"
        ),
        "{stderr}"
    );
}

/// `/ready` on a cluster asks whether every slot is served: with a master
/// and its replica both gone, a range of keys has nowhere to go, and the
/// node says so instead of answering ready while their requests fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_fails_while_the_cluster_leaves_a_slot_range_unserved() {
    let mut cluster = RedisCluster::start().await.expect("a Redis Cluster starts");
    let app = spawn_app(|s| s.store.redis.url = cluster.url()).await;
    assert_eq!(app.get("/ready", None).await.status(), 200);

    let master = cluster.servers()[0].port();
    let replica = cluster.replica_of(master).await.unwrap();
    for server in cluster.servers_mut() {
        if [master, replica].contains(&server.port()) {
            server.kill();
        }
    }
    wait_until("/ready to fail", Duration::from_secs(20), || async {
        app.get("/ready", None).await.status() == 503
    })
    .await;
    let body: serde_json::Value = app.get("/ready", None).await.json().await.unwrap();
    assert_eq!(body["errorCode"], "UNAVAILABLE", "{body}");
    assert!(app.get("/health", None).await.status().is_success());
}

/// On a Redis Cluster, whose slots part a purchase's limit keys from its
/// sale's, an admitted purchase's limits are counted in calls of their own
/// before the admission script runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_purchase_is_limited_on_a_redis_cluster() {
    let cluster = RedisCluster::start().await.expect("a Redis Cluster starts");
    let limits = limits_enforcing_only(&[(Rule::PurchaseByUser, "1/1m")]);
    let app = spawn_app(|s| {
        s.store.redis.url = cluster.url();
        s.seckill = SeckillMode::Stream;
        s.limits = limits;
    })
    .await;
    let voucher = app.create_open_seckill(2).await;
    let token = app.login(&phone(1)).await;
    let bought = app.purchase(voucher, &token).await;
    assert_eq!(bought["success"], true, "{bought}");
    let refused = app.purchase(voucher, &token).await;
    assert_eq!(refused["errorCode"], "RATE_LIMITED", "{refused}");
}
