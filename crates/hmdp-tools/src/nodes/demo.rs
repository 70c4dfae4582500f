//! `hmdp demo`, the main job: two nodes behind nginx, the same load test once
//! per lock mode (and purchase path), and one table that shows which locks
//! keep one order per user across nodes and which do not, and what admitting
//! in Redis and writing the orders afterwards changes; with `--report`, the
//! same as a picture (`report_html`). With `--payers`, each run goes on
//! past the sale: its orders are paid, cancelled or left to time out, and
//! the units that came back are sold again (`after_sale`). With
//! `--redis-cluster` and `--seckill-shards 1,6`, a table shows each master's
//! share of the sale and the Redis CPU per admission for each shard count
//! (`masters`). Last, a crowd of honest buyers and bots at one sale with the
//! request limits on (`crowd`).

mod after_sale;
mod crowd;
mod masters;
mod report_html;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use hmdp_lock::LockMode;
use serde::Serialize;
use serde_json::json;

use super::prometheus::{Prometheus, PrometheusSettings};
use super::{node_flags, until_signal, Nodes, NodesSpec, Sandbox, NODE_IDS};
use crate::loadtest::crowd::CrowdReport;
use crate::loadtest::{self, tokens::Login, Drain, Plan, Report};
use after_sale::{AfterSale, Percent, Sale};
use hmdp::config::{RedisSettings, SeckillMode, StoreSettings};
use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::redis_handle::RedisConnection;
use hmdp::seckill::SaleState;
use hmdp::store::Store;
use hmdp_test_support::RedisCluster;
use report_html::{LatencyCurve, Occasion};

/// `hmdp demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoSettings {
    /// Lock modes to run, in order (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [LockMode::NoLock, LockMode::Local, LockMode::RedisLua, LockMode::Reentrant])]
    pub modes: Vec<LockMode>,

    /// Purchase paths to run every lock mode with, in order (comma-separated):
    /// `sync` (the lock around the SQL transaction, inside the request),
    /// `queue` or `stream` (admitted in Redis by lua/seckill.lua, answered at
    /// once, written to MySQL afterwards). The asynchronous paths add a
    /// `seckill` column and a `drain` one: the time from the last answer
    /// until MySQL holds every order Redis admitted.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [SeckillMode::Sync])]
    pub seckill: Vec<SeckillMode>,

    /// Shard counts to run every asynchronous path with, in order
    /// (comma-separated, 1 to 64): each run's voucher splits its sale into
    /// that many shards in Redis (`--seckill-shards` of the nodes). With
    /// --redis-cluster, a table shows each master's share of the sale's
    /// scripts and the Redis CPU per admission for each count.
    #[arg(long, value_delimiter = ',', default_values_t = [1],
          value_parser = clap::value_parser!(u16).range(1..=i64::from(hmdp::shards::MAX_SHARDS)))]
    pub seckill_shards: Vec<u16>,

    /// Distinct users.
    #[arg(long, default_value_t = 1000)]
    pub users: usize,

    /// Purchases each user fires at once; nginx spreads them over both nodes.
    #[arg(long, default_value_t = 4)]
    pub per_user: usize,

    /// Stock of each mode's fresh voucher: half the users can buy, so the
    /// sale sells out while requests still race for it.
    #[arg(long, default_value_t = 500)]
    pub stock: i32,

    /// Requests in flight at most.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,

    /// Passed to every node: sleep this long inside the critical section
    /// (lock held, transaction open), standing in for a GC pause or slow SQL.
    /// It widens the window in which a user's two requests on two nodes
    /// overlap, so the local lock's failure shows in practically every run
    /// on any machine (here it showed in 70 runs of 70, and in 20 of 20 at 0 ms).
    #[arg(long, default_value_t = 20)]
    pub chaos_hold_ms: u64,

    /// Also write every mode's report and verdict as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Also write the run as a picture to this file: one self-contained
    /// HTML page (nothing fetched, open it in any browser) with every mode's
    /// verdict (HELD / BROKE), orders, users with two orders, oversell,
    /// requests/s, latency percentile curve and node1/node2 split, the
    /// settings, the date and the machine's core count.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,

    /// Go on past each run's sale: this share of the buyers told success
    /// pays (`70%` or `70`), a tenth of the rest (at least one) cancels, the
    /// others leave their orders unpaid until --pay-timeout-secs closes them;
    /// once every unpaid order is closed, the users without a unit buy the
    /// units that came back. Adds the after-sale table (and the orders'
    /// states over time to --report).
    #[arg(long, value_name = "PERCENT")]
    pub payers: Option<Percent>,

    /// With --payers: passed to every node, how long an order may stay
    /// unpaid before it is closed and its unit goes back on sale.
    #[arg(long, default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub pay_timeout_secs: u64,

    /// After the lock modes' runs: the nodes again with the request limits
    /// on, the users buying a fresh voucher (stock a quarter of them) as
    /// honest buyers while this many bots hammer it from four addresses;
    /// a table of who got the units. 0: no crowd.
    #[arg(long, default_value_t = 200)]
    pub crowd_bots: usize,

    /// Run on a Redis Cluster of the demo's own (three masters, three
    /// replicas of `redis-server` on free loopback ports, created with
    /// `redis-cli --cluster create`, removed afterwards) instead of
    /// --redis-url.
    #[arg(long)]
    pub redis_cluster: bool,

    #[command(flatten)]
    pub prometheus: PrometheusSettings,

    /// MySQL server (the demo creates and drops its own database on it) and
    /// Redis (the demo uses its own key prefix and removes its keys).
    #[command(flatten)]
    pub store: StoreSettings,
}

impl DemoSettings {
    /// Whether an asynchronous purchase path runs: the table and the
    /// picture then show each run's path and drain time.
    fn with_paths(&self) -> bool {
        self.seckill.iter().any(|&s| s != SeckillMode::Sync)
    }

    /// Whether a run splits its sale: the table then shows the shard count.
    fn with_shards(&self) -> bool {
        self.seckill_shards.iter().any(|&shards| shards != 1)
    }

    /// The nodes' flags for one run; the pay timeout only with --payers,
    /// and the shard count only above one, so that without them the nodes
    /// run as they always did.
    fn node_flags(&self, mode: LockMode, seckill: SeckillMode, shards: u16) -> Vec<String> {
        let mut flags = node_flags(mode, seckill, self.chaos_hold_ms);
        if self.payers.is_some() {
            flags.push(format!("--pay-timeout-secs={}", self.pay_timeout_secs));
        }
        if shards != 1 {
            flags.push(format!("--seckill-shards={shards}"));
        }
        flags
    }

    /// Every run: each purchase path with each lock mode, the asynchronous
    /// paths with each shard count (the synchronous one keeps no sale in
    /// Redis, so it runs once).
    fn combinations(&self) -> Vec<(SeckillMode, LockMode, u16)> {
        let mut runs = Vec::new();
        for &seckill in &self.seckill {
            let shards: &[u16] = match seckill {
                SeckillMode::Sync => &[1],
                SeckillMode::Queue | SeckillMode::Stream => &self.seckill_shards,
            };
            for &count in shards {
                runs.extend(self.modes.iter().map(|&mode| (seckill, mode, count)));
            }
        }
        runs
    }
}

/// The modes whose failure on two nodes is the point of the demo: on the
/// synchronous path only, as the asynchronous ones admit one order per user
/// in Redis whatever lock guards their writer.
fn expected_to_fail(mode: LockMode, seckill: SeckillMode) -> bool {
    seckill == SeckillMode::Sync && matches!(mode, LockMode::NoLock | LockMode::Local)
}

/// How long the demo waits, after the last answer, for MySQL to hold every
/// order Redis admitted; past it the orders still missing are a violation.
const DRAIN_DEADLINE: Duration = Duration::from_secs(60);

/// One mode's outcome: the report, or why the mode could not run.
struct ModeRun {
    mode: LockMode,
    seckill: SeckillMode,
    /// How many shards the run's sale was split into.
    shards: u16,
    result: Result<Run, String>,
}

/// What one mode's run measured.
struct Run {
    report: Report,
    /// From the last answer until MySQL held every admitted order; `None`
    /// on the synchronous path, which answers after its commit, and when
    /// the orders were not all written by the deadline (a violation then).
    drain: Option<Duration>,
    /// The whole latency distribution, for the picture; the report keeps
    /// only its percentiles.
    latency: LatencyCurve,
    /// With --payers: what the orders' life after the sale did and left;
    /// its violations are in the report's too.
    after_sale: Option<AfterSale>,
    /// With --redis-cluster: what the run cost each master.
    masters: Option<masters::Spread>,
}

impl ModeRun {
    /// Whether the mode behaved as the course says it does.
    fn as_expected(&self) -> bool {
        match &self.result {
            Ok(Run { report, .. }) => {
                report.violations.is_empty()
                    && (expected_to_fail(self.mode, self.seckill)
                        || report.duplicate_users == Some(0))
            }
            Err(_) => false,
        }
    }

    /// The lock mode alone on the synchronous path (the demo's table as it
    /// always was), the lock mode and the path on the others.
    fn label(&self) -> String {
        match (self.seckill, self.shards) {
            (SeckillMode::Sync, _) => self.mode.to_string(),
            (seckill, 1) => format!("{} + {seckill}", self.mode),
            (seckill, shards) => format!("{} + {seckill}, {shards} shards", self.mode),
        }
    }

    fn verdict(&self) -> String {
        match &self.result {
            Ok(Run { report, drain, .. }) => {
                let duplicates = report.duplicate_users.unwrap_or(0);
                let extra = report.extra_orders.unwrap_or(0);
                match (self.seckill, drain) {
                    (SeckillMode::Sync, _) => {
                        verdict(self.mode, duplicates, extra, &report.violations)
                    }
                    (_, drain) => {
                        async_verdict(&self.label(), duplicates, *drain, &report.violations)
                    }
                }
            }
            Err(error) => format!("{}: did not run — {error}", self.label()),
        }
    }
}

/// One line saying what a run on an asynchronous path showed.
fn async_verdict(
    label: &str,
    duplicates: i64,
    drain: Option<Duration>,
    violations: &[String],
) -> String {
    let mut line = if duplicates == 0 {
        format!("{label}: one order per user, admitted in Redis by lua/seckill.lua")
    } else {
        format!(
            "{label}: {duplicates} users hold more than one active order — admission did not hold"
        )
    };
    if let Some(drain) = drain {
        let _ = write!(
            line,
            "; every order in MySQL {} ms after the last answer",
            drain.as_millis()
        );
    }
    if !violations.is_empty() {
        let _ = write!(line, "; BROKEN: {}", violations.join("; "));
    }
    line
}

/// One line saying what a mode's run showed.
fn verdict(mode: LockMode, duplicates: i64, extra: i64, violations: &[String]) -> String {
    let got = if extra == duplicates {
        format!("{duplicates} users got two vouchers")
    } else {
        format!("{duplicates} users got more than one voucher ({extra} extra orders)")
    };
    let mut line = match (mode, duplicates > 0) {
        (LockMode::NoLock, true) => {
            format!("{mode}: {got} — without a lock, check-then-insert races even on one node")
        }
        (LockMode::Local, true) => {
            format!("{mode}: {got} — a process-local lock does not work across nodes")
        }
        (LockMode::NoLock | LockMode::Local, false) => format!(
            "{mode}: no user got two vouchers this time — the race window was missed, \
             raise --chaos-hold-ms"
        ),
        (_, false) => format!("{mode}: one order per user held across two nodes"),
        (_, true) => format!("{mode}: {got} — the lock did not hold"),
    };
    if !violations.is_empty() {
        let _ = write!(line, "; BROKEN: {}", violations.join("; "));
    }
    line
}

/// `hmdp demo`: runs until done or interrupted; either way every child is
/// killed and the sandbox removed before it returns.
pub async fn run(settings: DemoSettings) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the hmdp executable")?;
    let redis_cluster = if settings.redis_cluster {
        eprintln!("starting a Redis Cluster of three masters and three replicas");
        Some(RedisCluster::start().await?)
    } else {
        None
    };
    let redis = match &redis_cluster {
        Some(cluster) => RedisSettings::at(cluster.url()),
        None => settings.store.redis.clone(),
    };
    let sandbox = Sandbox::create(&settings.store.database.url, &redis, "demo").await?;
    let outcome = until_signal(demo(&settings, exe, &sandbox, redis_cluster.as_ref()))
        .await
        .unwrap_or_else(|signal| Err(anyhow!("interrupted by {signal}: nodes and nginx stopped")));
    // The nodes went with the demo future; now the data goes too,
    // then the Redis Cluster.
    drop(sandbox);
    drop(redis_cluster);
    outcome
}

/// What every run of the demo shares: two nodes and nginx, the users
/// logged in, the database and the sales' Redis side.
struct Stage {
    nodes: Nodes,
    /// Scrapes the nodes, which keep their ports through every restart.
    prometheus: Option<Prometheus>,
    client: reqwest::Client,
    tokens: Vec<String>,
    store: Store,
    sales: SaleState,
    /// Where more users are logged in (the crowd's bots).
    redis: RedisConnection,
    keys: Keys,
}

async fn demo(
    settings: &DemoSettings,
    exe: PathBuf,
    sandbox: &Sandbox,
    redis_cluster: Option<&RedisCluster>,
) -> anyhow::Result<()> {
    // Every lock mode on each purchase path (and shard count) in turn,
    // grouped by path.
    let combinations = settings.combinations();
    let Some(&(first_seckill, first_mode, first_shards)) = combinations.first() else {
        bail!("no lock modes or no purchase paths given");
    };
    let first = settings.node_flags(first_mode, first_seckill, first_shards);
    let mut stage = stage(settings, exe, sandbox, &first).await?;
    let mut runs = Vec::new();
    for (i, &(seckill, mode, shards)) in combinations.iter().enumerate() {
        let flags = settings.node_flags(mode, seckill, shards);
        let result = async {
            if i > 0 {
                stage.nodes.restart_nodes(&flags).await?;
            }
            sale(&stage, settings, redis_cluster, (seckill, mode, shards)).await
        }
        .await
        .map_err(|error| format!("{error:#}"));
        runs.push(ModeRun {
            mode,
            seckill,
            shards,
            result,
        });
    }

    // The synchronous path's orders/s with its purchases' commits shared
    // (the runs above) against each in a transaction of its own, with the
    // last lock mode that ran on it.
    let sync_run =
        (runs.iter().rev()).find(|run| run.seckill == SeckillMode::Sync && run.result.is_ok());
    let unshared = match sync_run {
        Some(run) => {
            let flags = settings.node_flags(run.mode, SeckillMode::Sync, 1);
            let (nodes, client, tokens) = (&mut stage.nodes, &stage.client, &stage.tokens);
            Some(unshared_orders_per_s(nodes, &flags, settings, client, tokens).await)
        }
        None => None,
    };
    let crowd = match (settings.crowd_bots, runs.last()) {
        (0, _) | (_, None) => None,
        (_, Some(last)) => {
            let flags = settings.node_flags(last.mode, SeckillMode::Sync, 1);
            Some(crowd::run(&mut stage, settings, &flags).await)
        }
    };
    report(settings, &runs, sync_run.zip(unshared), crowd.as_ref())?;
    if let Some(prometheus) = &stage.prometheus {
        match prometheus.api().summary(chrono::Utc::now()).await {
            Ok(summary) => print!("\n{summary}"),
            Err(error) => println!("\nPrometheus not read: {error:#}"),
        }
    }
    judge(&runs)
}

/// Starts the nodes and nginx with `flags`, logs the users in and seeds
/// hmdp's sample shops.
async fn stage(
    settings: &DemoSettings,
    exe: PathBuf,
    sandbox: &Sandbox,
    flags: &[String],
) -> anyhow::Result<Stage> {
    let spec = NodesSpec::in_sandbox(exe, sandbox);
    eprintln!(
        "starting two nodes and nginx (database {}, Redis prefix {})",
        sandbox.database.url, sandbox.redis.prefix
    );
    let nodes = Nodes::start(spec.clone(), flags).await?;
    let prometheus = settings.prometheus.start(&nodes).await?;
    if let Some(prometheus) = &prometheus {
        eprintln!("Prometheus at {} scrapes both nodes", prometheus.url());
    }
    let client = loadtest::http_client(settings.concurrency)?;
    let redis =
        hmdp::config::connect_redis(&sandbox.redis.redis_url, settings.store.backend_timeout())?;
    let keys = Keys::new(sandbox.redis.prefix.clone());
    // Sessions live in Redis, so one login serves every mode's nodes.
    eprintln!("logging {} users in through nginx", settings.users);
    let tokens = Login::new(client.clone(), &nodes.url(), redis.clone(), keys.clone())
        .users(0, settings.users, 32)
        .await?;
    // The after-sale phase samples the orders' states while it audits.
    let store = sandbox.store(4)?;
    // hmdp's sample shops: each run's voucher is sold by shop 1, which then
    // exists, and the front end pointed at the demo shows a real shop.
    crate::seed::seed(&store).await?;
    let sales = SaleState::new(redis.clone(), keys.clone(), store.clone());
    Ok(Stage {
        nodes,
        prometheus,
        client,
        tokens,
        store,
        sales,
        redis,
        keys,
    })
}

/// One sale on the nodes as they run: the load, the drain, the audit and,
/// when asked, the order's life after the sale.
async fn sale(
    stage: &Stage,
    settings: &DemoSettings,
    redis_cluster: Option<&RedisCluster>,
    (seckill, mode, shards): (SeckillMode, LockMode, u16),
) -> anyhow::Result<Run> {
    eprintln!(
        "{mode}, {seckill}, {shards} shard(s): {} users x {} purchases",
        stage.tokens.len(),
        settings.per_user
    );
    let plan = sale_plan(&stage.nodes, settings, &stage.client, &stage.tokens).await?;
    let voucher = plan.voucher;
    let before = match redis_cluster {
        Some(redis) => Some(masters::sample_idle(redis, &stage.nodes.node_urls()).await?),
        None => None,
    };
    let measured = loadtest::run(&plan).await?;
    let voucher = VoucherId::new(voucher);
    let drained = match seckill {
        SeckillMode::Sync => None,
        SeckillMode::Queue | SeckillMode::Stream => {
            Some(loadtest::drain(&stage.sales, voucher, DRAIN_DEADLINE).await?)
        }
    };
    let masters = match (redis_cluster, &before) {
        (Some(redis), Some(before)) if seckill != SeckillMode::Sync => {
            let after = masters::sample(redis, &stage.nodes.node_urls()).await?;
            Some(masters::spread(before, &after))
        }
        _ => None,
    };
    let audit = stage.store.audit_voucher(voucher).await?;
    let mut report = Report::new(&plan, &measured);
    report.add_audit(settings.stock.into(), &audit, false);
    let drain = match drained {
        Some(drain) => {
            report.add_drain(&drain, DRAIN_DEADLINE);
            match drain {
                Drain::Drained(took) => Some(took),
                Drain::Stuck(_) => None,
            }
        }
        None => None,
    };
    let after_sale = match settings.payers {
        Some(payers) => {
            let sale = Sale {
                client: &stage.client,
                target: &plan.target,
                tokens: &stage.tokens,
                voucher,
                seckill,
                store: &stage.store,
                sales: &stage.sales,
                initial_stock: settings.stock.into(),
                one_order_per_user: !expected_to_fail(mode, seckill),
                per_user: settings.per_user,
                concurrency: settings.concurrency,
                pay_timeout: Duration::from_secs(settings.pay_timeout_secs),
            };
            let after = after_sale::run(&sale, &measured.told, payers).await?;
            report.violations.extend(
                after
                    .violations
                    .iter()
                    .map(|broken| format!("after the sale: {broken}")),
            );
            Some(after)
        }
        None => None,
    };
    Ok(Run {
        report,
        drain,
        latency: LatencyCurve::of(&measured.latency_us),
        after_sale,
        masters,
    })
}

/// Prints the runs' table, the line of the synchronous path's orders/s
/// with its commits shared and not (`sync`: that run and the unshared
/// rate), the masters' shares and the after-sale table, then the verdicts;
/// writes the JSON and HTML reports asked for.
fn report(
    settings: &DemoSettings,
    runs: &[ModeRun],
    sync: Option<(&ModeRun, anyhow::Result<f64>)>,
    crowd: Option<&anyhow::Result<CrowdReport>>,
) -> anyhow::Result<()> {
    println!();
    println!(
        "two nodes behind nginx{} · {} users x {} purchases at once · stock {} · chaos hold {} ms",
        if settings.redis_cluster {
            " on a Redis Cluster (3 masters, 3 replicas)"
        } else {
            ""
        },
        settings.users,
        settings.per_user,
        settings.stock,
        settings.chaos_hold_ms
    );
    println!();
    print!(
        "{}",
        table(runs, settings.with_paths(), settings.with_shards())
    );
    if let Some((run, unshared)) = sync {
        if let Ok(shared) = &run.result {
            println!(
                "{} + sync orders/s: {:.0} with shared commits (--sync-batch-max {}), {} with \
                 each purchase in a transaction of its own (--sync-batch-max 1)",
                run.mode,
                shared.report.orders_per_s,
                SYNC_BATCH_MAX_DEFAULT,
                match unshared {
                    Ok(rate) => format!("{rate:.0}"),
                    Err(error) => format!("not measured ({error:#})"),
                }
            );
        }
    }
    println!();
    let spreads: Vec<(String, &masters::Spread)> = (runs.iter())
        .filter_map(|run| {
            let spread = run.result.as_ref().ok()?.masters.as_ref()?;
            Some((run.label(), spread))
        })
        .collect();
    if let Some((_, first)) = spreads.first() {
        println!(
            "each master's share of the sale's scripts (INFO commandstats: admissions and \
             moves between shards) and the masters' CPU per admission (INFO cpu, less their idle CPU)"
        );
        let ports: Vec<u16> = first.masters.iter().map(|master| master.port).collect();
        println!("{}", masters::heading(&ports));
        for (label, spread) in &spreads {
            println!("{}", masters::row(label, spread));
        }
        println!();
    }
    if let Some(payers) = settings.payers {
        println!(
            "after the sale: {payers} of the buyers pay, a tenth of the rest cancel, \
             the others time out after {} s; then the users without a unit buy the units \
             that came back",
            settings.pay_timeout_secs
        );
        println!();
        print!("{}", after_sale_table(runs));
        println!();
    }
    match crowd {
        Some(Ok(crowd)) => println!("{}", crowd.table()),
        Some(Err(error)) => println!("crowd: did not run ({error:#})\n"),
        None => {}
    }
    for run in runs {
        println!("{}", run.verdict());
    }
    let crowd = crowd.and_then(|crowd| crowd.as_ref().ok());
    if let Some(path) = &settings.json {
        write_json(path, settings, runs, crowd)?;
    }
    if let Some(path) = &settings.report {
        let page = report_html::render(settings, runs, crowd, &Occasion::now());
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Fails the demo when a run did not show what its lock mode should.
fn judge(runs: &[ModeRun]) -> anyhow::Result<()> {
    let unexpected: Vec<String> = runs
        .iter()
        .filter(|run| !run.as_expected())
        .map(ModeRun::label)
        .collect();
    if !unexpected.is_empty() {
        bail!("not as expected: {}", unexpected.join(", "));
    }
    Ok(())
}

/// The nodes' `--sync-batch-max` unless told otherwise.
const SYNC_BATCH_MAX_DEFAULT: u16 = 128;

/// One more synchronous sale on nodes started with `flags`, each purchase
/// in a transaction of its own (`--sync-batch-max 1`): its orders/s.
async fn unshared_orders_per_s(
    nodes: &mut Nodes,
    flags: &[String],
    settings: &DemoSettings,
    client: &reqwest::Client,
    tokens: &[String],
) -> anyhow::Result<f64> {
    let mut flags = flags.to_vec();
    flags.push("--sync-batch-max=1".to_owned());
    nodes.restart_nodes(&flags).await?;
    eprintln!(
        "sync, each purchase in a transaction of its own: {} users x {} purchases",
        tokens.len(),
        settings.per_user
    );
    let plan = sale_plan(nodes, settings, client, tokens).await?;
    let measured = loadtest::run(&plan).await?;
    Ok(Report::new(&plan, &measured).orders_per_s)
}

/// A fresh voucher of `settings.stock` on the nodes, and the plan of its
/// sale: every one of `tokens` sends `settings.per_user` purchases at once.
async fn sale_plan(
    nodes: &Nodes,
    settings: &DemoSettings,
    client: &reqwest::Client,
    tokens: &[String],
) -> anyhow::Result<Plan> {
    let voucher = loadtest::create_voucher(
        client,
        &nodes.url(),
        &nodes.spec().admin_token,
        settings.stock,
    )
    .await?;
    Ok(Plan {
        target: nodes.url(),
        voucher,
        tokens: tokens.to_vec(),
        per_user: settings.per_user,
        concurrency: settings.concurrency,
        addresses: 1,
        progress: loadtest::progress_bar((tokens.len() * settings.per_user) as u64),
    })
}

/// The side-by-side table, one row per run; `with_paths` adds the purchase
/// path and the drain time (the synchronous path's rows show `-` there).
fn table(runs: &[ModeRun], with_paths: bool, with_shards: bool) -> String {
    let mut out = String::new();
    let path = |text: &str| match (with_paths, with_shards) {
        (false, _) => String::new(),
        (true, false) => format!(" {text:<7}"),
        (true, true) => format!(" {text:<14}"),
    };
    let drain = |text: &str| {
        if with_paths {
            format!(" {text:>9}")
        } else {
            String::new()
        }
    };
    let _ = writeln!(
        out,
        "{:<10}{} {:>8} {:>7} {:>22} {:>9} {:>11} {:>15} {:>17}{}",
        "mode",
        path("seckill"),
        "requests",
        "orders",
        "users with two orders",
        "oversold",
        "requests/s",
        "p50/p99 ms",
        "node1/node2",
        drain("drain ms"),
    );
    for run in runs {
        let mode = run.mode.to_string();
        let seckill = path(&match run.shards {
            1 => run.seckill.to_string(),
            shards => format!("{} x{shards}", run.seckill),
        });
        match &run.result {
            Ok(Run {
                report: r,
                drain: d,
                ..
            }) => {
                let served = |node: &str| r.served_by.get(node).copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "{:<10}{} {:>8} {:>7} {:>22} {:>9} {:>11.0} {:>15} {:>17}{}",
                    mode,
                    seckill,
                    r.requests,
                    r.orders.unwrap_or(0),
                    r.duplicate_users.unwrap_or(0),
                    r.oversold.unwrap_or(0),
                    r.rps,
                    format!("{:.1}/{:.1}", r.latency_ms.p50_ms, r.latency_ms.p99_ms),
                    format!("{}/{}", served(NODE_IDS[0]), served(NODE_IDS[1])),
                    drain(&drain_ms(run.seckill, *d)),
                );
            }
            Err(_) => {
                let _ = writeln!(out, "{mode:<10}{seckill} (did not run, see below)");
            }
        }
    }
    out
}

/// With --payers, one row per run: what its buyers did after the sale, what
/// the second wave sold of the units that came back, and the final balance
/// (paid + used + unpaid + stock = initial, no user with two active orders,
/// no closed order paid).
fn after_sale_table(runs: &[ModeRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:<7} {:>5} {:>9} {:>9} {:>11}   {:>9} {:>6} {:>5} {:>7} {:>10} {:>11}  balance",
        "mode",
        "seckill",
        "paid",
        "cancelled",
        "timed out",
        "second wave",
        "paid+used",
        "unpaid",
        "stock",
        "initial",
        "two active",
        "paid+closed",
    );
    for run in runs {
        let (mode, seckill) = (run.mode.to_string(), run.seckill.to_string());
        let Ok(Run {
            after_sale: Some(after),
            ..
        }) = &run.result
        else {
            let _ = writeln!(out, "{mode:<10} {seckill:<7} (did not run, see below)");
            continue;
        };
        let _ = writeln!(
            out,
            "{:<10} {:<7} {:>5} {:>9} {:>9} {:>11}   {:>9} {:>6} {:>5} {:>7} {:>10} {:>11}  {}",
            mode,
            seckill,
            after.paid,
            after.cancelled,
            after.timed_out,
            format!("{} of {}", after.second_wave, after.returned),
            after.end.paid + after.end.used,
            after.end.unpaid,
            after.audit.stock_left,
            after.initial_stock,
            after.audit.duplicate_users,
            after.audit.paid_and_closed,
            if after.held() { "HELD" } else { "BROKE" },
        );
    }
    out
}

/// The drain time as the table and the picture show it: milliseconds, `-`
/// on the synchronous path (nothing to drain), `timeout` past the deadline.
fn drain_ms(seckill: SeckillMode, drain: Option<Duration>) -> String {
    match (seckill, drain) {
        (_, Some(took)) => took.as_millis().to_string(),
        (SeckillMode::Sync, None) => "-".to_owned(),
        (_, None) => "timeout".to_owned(),
    }
}

#[derive(Serialize)]
struct ModeJson<'a> {
    mode: String,
    seckill: String,
    verdict: String,
    as_expected: bool,
    report: Option<&'a Report>,
    /// Milliseconds from the last answer until every admitted order was in
    /// MySQL (asynchronous paths that drained by the deadline).
    drain_ms: Option<f64>,
    /// With --payers: the orders' life after the sale.
    after_sale: Option<&'a AfterSale>,
    /// How many shards the run's sale was split into.
    shards: u16,
    /// With --redis-cluster: each master's share and the CPU per admission.
    masters: Option<&'a masters::Spread>,
    error: Option<&'a str>,
}

fn write_json(
    path: &PathBuf,
    settings: &DemoSettings,
    runs: &[ModeRun],
    crowd: Option<&CrowdReport>,
) -> anyhow::Result<()> {
    let modes: Vec<ModeJson> = runs
        .iter()
        .map(|run| ModeJson {
            mode: run.mode.to_string(),
            seckill: run.seckill.to_string(),
            verdict: run.verdict(),
            as_expected: run.as_expected(),
            report: run.result.as_ref().ok().map(|run| &run.report),
            drain_ms: run
                .result
                .as_ref()
                .ok()
                .and_then(|run| run.drain)
                .map(|took| took.as_secs_f64() * 1000.0),
            after_sale: run
                .result
                .as_ref()
                .ok()
                .and_then(|run| run.after_sale.as_ref()),
            shards: run.shards,
            masters: (run.result.as_ref().ok()).and_then(|run| run.masters.as_ref()),
            error: run.result.as_ref().err().map(String::as_str),
        })
        .collect();
    let json = json!({
        "users": settings.users,
        "per_user": settings.per_user,
        "stock": settings.stock,
        "concurrency": settings.concurrency,
        "chaos_hold_ms": settings.chaos_hold_ms,
        "seckill": settings.seckill.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "seckill_shards": settings.seckill_shards,
        "payers": settings.payers.map(|payers| payers.to_string()),
        "pay_timeout_secs": settings.payers.map(|_| settings.pay_timeout_secs),
        "modes": modes,
        "crowd": crowd,
    });
    std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_name_the_failure_or_the_fix() {
        assert_eq!(
            verdict(LockMode::Local, 37, 37, &[]),
            "local: 37 users got two vouchers — a process-local lock does not work across nodes"
        );
        assert_eq!(
            verdict(LockMode::Reentrant, 0, 0, &[]),
            "reentrant: one order per user held across two nodes"
        );
        assert!(verdict(LockMode::NoLock, 5, 9, &[])
            .contains("5 users got more than one voucher (9 extra orders)"));
        assert!(verdict(LockMode::RedisNaive, 2, 2, &[]).ends_with("the lock did not hold"));
        assert!(verdict(LockMode::Local, 0, 0, &[]).contains("raise --chaos-hold-ms"));
        let broken = verdict(LockMode::RedisLua, 0, 0, &["1 units oversold".into()]);
        assert!(broken.ends_with("; BROKEN: 1 units oversold"), "{broken}");
    }

    #[test]
    fn asynchronous_verdicts_give_the_drain_or_what_broke() {
        assert_eq!(
            async_verdict("local + stream", 0, Some(Duration::from_millis(412)), &[]),
            "local + stream: one order per user, admitted in Redis by lua/seckill.lua; \
             every order in MySQL 412 ms after the last answer"
        );
        let stuck = async_verdict(
            "reentrant + queue",
            0,
            None,
            &["3 admitted orders not in MySQL 60 s after the last answer".into()],
        );
        assert!(
            stuck.ends_with("; BROKEN: 3 admitted orders not in MySQL 60 s after the last answer"),
            "{stuck}"
        );
        assert!(async_verdict("none + stream", 2, None, &[]).contains("admission did not hold"));
    }

    #[test]
    fn the_synchronous_table_is_unchanged_and_the_paths_add_two_columns() {
        let run = |seckill| ModeRun {
            mode: LockMode::Reentrant,
            seckill,
            shards: 1,
            result: Err("no nginx".into()),
        };
        let sync_only = table(&[run(SeckillMode::Sync)], false, false);
        assert!(sync_only.starts_with("mode       requests"), "{sync_only}");
        assert!(sync_only.lines().next().unwrap().ends_with("node1/node2"));
        let both = table(
            &[run(SeckillMode::Sync), run(SeckillMode::Stream)],
            true,
            false,
        );
        let mut lines = both.lines();
        assert!(lines
            .next()
            .unwrap()
            .starts_with("mode       seckill requests"));
        assert!(lines
            .next()
            .unwrap()
            .starts_with("reentrant  sync    (did not run"));
        assert!(lines
            .next()
            .unwrap()
            .starts_with("reentrant  stream  (did not run"));
    }
}
