//! `hmdp soak`: the two-node cluster under mixed load for minutes on end,
//! with a fault every interval — a node SIGKILLed and restarted, or Redis
//! killed and restarted empty — and the invariants verified for every sale.
//!
//! Redis is a private `redis-server` of the soak's own, so that restarting
//! it disturbs nothing else on the machine.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use hmdp_lock::LockMode;
use tokio::sync::Mutex;

use super::{node_flags, until_signal};
use super::{Cluster, ClusterSpec, Sandbox, NODE_IDS};
use crate::loadtest::{self, tokens::Login, Plan};
use hmdp::config::{DatabaseSettings, RedisSettings, SeckillMode};
use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::store::{Store, VoucherAudit};
use hmdp_test_support::RedisServer;

/// `hmdp soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakSettings {
    /// How long to run, in minutes.
    #[arg(long, default_value_t = 10)]
    pub minutes: u64,

    /// Seconds between two faults; faults alternate between killing a node
    /// (restarted a few seconds later) and restarting Redis.
    #[arg(long, default_value_t = 60)]
    pub fault_every_secs: u64,

    /// Lock mode of the nodes.
    #[arg(long, value_enum, default_value_t = LockMode::Reentrant)]
    pub lock: LockMode,

    /// Check fencing tokens in the purchase transaction: a lock lost with a
    /// Redis restart then cannot let a stale holder commit.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub fencing: bool,

    /// Users per sale; each sale is a fresh voucher.
    #[arg(long, default_value_t = 300)]
    pub users: usize,

    /// Purchases each user fires at once.
    #[arg(long, default_value_t = 3)]
    pub per_user: usize,

    /// Stock of each sale.
    #[arg(long, default_value_t = 150)]
    pub stock: i32,

    /// Requests in flight at most.
    #[arg(long, default_value_t = 100)]
    pub concurrency: usize,

    /// Sleep inside the critical section of every purchase, in ms, so that
    /// faults land while locks are held and transactions are open.
    #[arg(long, default_value_t = 5)]
    pub chaos_hold_ms: u64,

    /// MySQL server (the soak creates and drops its own database on it; it
    /// runs a Redis server of its own, to restart it).
    #[command(flatten)]
    pub database: DatabaseSettings,
}

/// Everything the load side saw, summed over the sales.
#[derive(Default)]
struct Tally {
    sales: Vec<(i64, VoucherAudit)>,
    requests: u64,
    outcomes: BTreeMap<String, u64>,
    served_by: BTreeMap<String, u64>,
    /// Rounds that could not run (a login or a voucher creation failed
    /// during a fault); they are retried, not hidden.
    failed_rounds: Vec<String>,
}

pub async fn run(settings: SoakSettings) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the hmdp executable")?;
    let redis = RedisServer::start().await?;
    let sandbox = Sandbox::create(
        &settings.database.url,
        &RedisSettings::at(redis.url()),
        "soak",
    )
    .await?;
    let outcome = until_signal(soak(&settings, exe, &sandbox, redis))
        .await
        .unwrap_or_else(|signal| {
            Err(anyhow!(
                "interrupted by {signal}: nodes, nginx and Redis stopped"
            ))
        });
    drop(sandbox);
    outcome
}

async fn soak(
    settings: &SoakSettings,
    exe: PathBuf,
    sandbox: &Sandbox,
    mut redis: RedisServer,
) -> anyhow::Result<()> {
    let mut flags = node_flags(settings.lock, SeckillMode::Sync, settings.chaos_hold_ms);
    // Every round logs its users in again: Redis restarts drop the sessions.
    flags.push("--code-interval-secs=0".into());
    if settings.fencing {
        flags.push("--fencing".into());
    }
    let spec = ClusterSpec::in_sandbox(exe, sandbox);
    let mut cluster = Cluster::start(spec, &flags).await?;
    let started = Instant::now();
    let until = started + Duration::from_secs(settings.minutes * 60);
    eprintln!(
        "soak: {} min, a fault every {} s, lock {}{}, database {}",
        settings.minutes,
        settings.fault_every_secs,
        settings.lock,
        if settings.fencing {
            " with fencing"
        } else {
            ""
        },
        sandbox.database.url
    );

    let tally = Arc::new(Mutex::new(Tally::default()));
    let front_door = FrontDoor {
        url: cluster.url(),
        admin_token: cluster.spec().admin_token.clone(),
        redis_url: sandbox.redis.redis_url.clone(),
        keys: Keys::new(sandbox.redis.prefix.clone()),
    };
    let load = tokio::spawn(load_loop(
        settings.clone(),
        front_door,
        sandbox.store(4)?,
        until,
        tally.clone(),
    ));

    let mut faults = Vec::new();
    let every = Duration::from_secs(settings.fault_every_secs.max(1));
    let mut next = started + every;
    while next + Duration::from_secs(5) < until {
        tokio::time::sleep_until(next.into()).await;
        let at = started.elapsed().as_secs();
        let fault = match faults.len() % 3 {
            // Two node kills for every Redis restart: node 1, Redis, node 2.
            0 | 2 => {
                let index = if faults.len() % 3 == 0 { 0 } else { 1 };
                cluster.kill_node(index).await;
                tokio::time::sleep(Duration::from_secs(3)).await;
                cluster.start_node(index, &flags).await?;
                format!("t={at}s SIGKILL {} (restarted 3 s later)", NODE_IDS[index])
            }
            _ => {
                redis.restart().await?;
                format!("t={at}s Redis killed and restarted empty")
            }
        };
        eprintln!("soak: {fault}");
        faults.push(fault);
        next += every;
    }
    load.await.context("the load loop panicked")??;

    let tally = tally.lock().await;
    report(settings, &tally, &faults, started.elapsed())
}

/// How the load side reaches the cluster: as a user and an admin would,
/// through nginx, reading login codes from Redis.
struct FrontDoor {
    url: String,
    admin_token: String,
    redis_url: String,
    keys: Keys,
}

/// Runs sales back to back until `until`: log the users in, create a
/// voucher, fire the purchases, audit the voucher.
async fn load_loop(
    settings: SoakSettings,
    door: FrontDoor,
    store: Store,
    until: Instant,
    tally: Arc<Mutex<Tally>>,
) -> anyhow::Result<()> {
    let client = loadtest::http_client(settings.concurrency)?;
    let redis = hmdp::startup::connect_redis(&door.redis_url, Duration::from_secs(2))?;
    let login = Login::new(client.clone(), &door.url, redis, door.keys);
    let target = door.url;
    while Instant::now() < until {
        let round = async {
            let tokens = login.users(0, settings.users, 32).await?;
            let voucher =
                loadtest::create_voucher(&client, &target, &door.admin_token, settings.stock)
                    .await?;
            let plan = Plan {
                target: target.clone(),
                voucher,
                tokens,
                per_user: settings.per_user,
                concurrency: settings.concurrency,
                progress: loadtest::progress_bar(0),
            };
            let measured = loadtest::run(&plan).await?;
            anyhow::Ok((voucher, measured))
        };
        match round.await {
            Ok((voucher, measured)) => {
                let audit = store.audit_voucher(VoucherId::new(voucher)).await?;
                let mut tally = tally.lock().await;
                tally.sales.push((voucher, audit));
                tally.requests += measured.requests;
                for (outcome, count) in measured.outcomes {
                    *tally.outcomes.entry(outcome).or_default() += count;
                }
                for (node, count) in measured.served_by {
                    *tally.served_by.entry(node).or_default() += count;
                }
            }
            Err(error) => {
                tally.lock().await.failed_rounds.push(format!("{error:#}"));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    Ok(())
}

/// Prints the summary; fails when any sale broke an invariant.
fn report(
    settings: &SoakSettings,
    tally: &Tally,
    faults: &[String],
    elapsed: Duration,
) -> anyhow::Result<()> {
    let initial = i64::from(settings.stock);
    let broken: Vec<String> = tally
        .sales
        .iter()
        .filter(|(_, audit)| {
            !audit.stock_balances(initial)
                || audit.oversold(initial) > 0
                || audit.duplicate_users > 0
        })
        .map(|(voucher, audit)| format!("voucher {voucher}: {audit:?}"))
        .collect();
    let orders: i64 = tally.sales.iter().map(|(_, audit)| audit.orders).sum();
    println!();
    println!(
        "soak: {:.1} min, {} sales, {} requests, {} orders, {} faults, {} rounds failed during faults",
        elapsed.as_secs_f64() / 60.0,
        tally.sales.len(),
        tally.requests,
        orders,
        faults.len(),
        tally.failed_rounds.len()
    );
    for fault in faults {
        println!("  fault {fault}");
    }
    println!("  outcomes {:?}", tally.outcomes);
    println!("  served by {:?}", tally.served_by);
    if tally.sales.is_empty() {
        bail!("no sale completed");
    }
    if !broken.is_empty() {
        println!(
            "verdict: BROKEN in {} of {} sales",
            broken.len(),
            tally.sales.len()
        );
        for line in &broken {
            println!("  {line}");
        }
        bail!("invariants broken");
    }
    println!(
        "verdict: KEPT — in all {} sales one order per user, orders + stock == {}, no oversell",
        tally.sales.len(),
        initial
    );
    Ok(())
}
