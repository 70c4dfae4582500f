//! `hmdp soak`: two nodes behind nginx under mixed load for minutes on end,
//! with a fault every interval — a node SIGKILLed and restarted, Redis
//! SIGKILLed and restarted (empty, or from its AOF), the voucher's stock
//! row held by another MySQL session for longer than the stream's claim
//! time, MySQL read-only, MySQL SIGKILLed and restarted. After each sale its
//! buyers pay, cancel (and buy again) or leave their orders to time out.
//! Every request, its answer and every fault go into the run's history,
//! which the history checker (`history/check.rs`, `hmdp check`) judges against
//! MySQL once the orders on their way are written: each success answer its
//! buyer's order, each buyer's orders those their answers explain, nobody
//! told success for two active orders, no unit sold twice or lost, each
//! payment and cancel as answered. The orders the configuration may lose by
//! docs/guarantees.md (Redis's persistence setting, a SIGKILLed `queue`
//! node) are counted apart, each against the fault within the writers' lag
//! after it that explains it.
//!
//! Redis and MySQL are a private `redis-server` and `mariadbd` of the soak's
//! own, so that restarting them disturbs nothing else on the machine.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use hmdp_lock::LockMode;
use tokio::sync::Mutex;

use super::{node_flags, until_signal};
use super::{Nodes, NodesSpec, Sandbox, NODE_IDS};
use crate::history::{self, Event, Failure, FaultKind, Loss, Verdict};
use crate::loadtest::{self, tokens::Login, Measured, Plan};
use crate::payers::{self, Act, Acted, Answered};
use hmdp::config::{RedisSettings, SeckillMode};
use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::seckill::SaleState;
use hmdp::shards::{slot, Layout};
use hmdp::store::Store;
use hmdp_test_support::{MariaDbServer, RedisCluster, RedisServer};

/// `hmdp soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakSettings {
    /// How long to run, in minutes.
    #[arg(long, default_value_t = 10)]
    pub minutes: u64,

    /// Seconds between two faults; they take turns: node 1 killed (and
    /// restarted 3 s later), Redis SIGKILLed and restarted (on a Redis Cluster: a
    /// master's replica that missed its last writes promoted with `CLUSTER
    /// FAILOVER TAKEOVER`), the
    /// sale's stock row held, MySQL read-only, MySQL killed and restarted,
    /// node 2 killed, and with --seckill-shards above 1, one shard of the
    /// sale running forgotten by Redis while stock moves between shards.
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

    /// How purchases are placed (`sync`, `queue`, `stream`).
    #[arg(long, value_enum, default_value_t = SeckillMode::Sync)]
    pub seckill: SeckillMode,

    /// How many shards each sale is split into in Redis (`queue`, `stream`;
    /// passed to the nodes as `--seckill-shards`): the faults then hit sales
    /// that move stock between shards.
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(hmdp::shards::MAX_SHARDS)))]
    pub seckill_shards: u16,

    /// Run Redis as a cluster of three masters, each with a replica (a
    /// sharded sale's shards spread over the masters); its Redis fault is
    /// then a master failing over to a replica that missed its last writes.
    #[arg(long)]
    pub redis_cluster: bool,

    /// Run Redis with an append-only file synced this often (`always`,
    /// `everysec`), so that a restart reloads it; without it, Redis
    /// restarts empty.
    #[arg(long, value_parser = ["always", "everysec"])]
    pub redis_appendfsync: Option<String>,

    /// How long a MySQL stall holds the current voucher's stock row, in
    /// seconds: longer than the stream's claim time (2 s in the soak).
    #[arg(long, default_value_t = 8)]
    pub stall_secs: u64,

    /// Share of each sale's buyers who pay their order, in percent.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub payers: u8,

    /// Share of each sale's buyers who cancel their order and buy again, in
    /// percent; the rest leave it unpaid to time out.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub cancellers: u8,

    /// The nodes' payment deadline (`--pay-timeout-secs`): unpaid orders
    /// close, and their units go back on sale, this long after the sale.
    #[arg(long, default_value_t = 10)]
    pub pay_timeout_secs: u64,

    /// Also write the run's history (every request, its answer, every
    /// fault; JSON lines) to this file: `hmdp check --history FILE` judges
    /// it again.
    #[arg(long)]
    pub history: Option<PathBuf>,

    /// After the load: how long to wait for every admitted order to reach
    /// MySQL before judging.
    #[arg(long, default_value_t = 120)]
    pub drain_timeout_secs: u64,

    /// The writers' lag the checker allows, in milliseconds: a loss the
    /// configuration allows covers only orders answered at most this long
    /// before the fault that explains it (`hmdp check --writers-lag-ms`).
    #[arg(long, default_value_t = history::DEFAULT_WRITERS_LAG.as_millis() as u64)]
    pub writers_lag_ms: u64,
}

/// Everything the load side saw, summed over the sales.
#[derive(Default)]
struct Tally {
    /// Sales completed.
    sales: usize,
    /// Every request and its answer, and every fault: what the run is
    /// judged by (`history/check.rs`).
    history: Vec<Event>,
    /// The sale running now: the one a MySQL stall holds.
    current: Option<i64>,
    requests: u64,
    outcomes: BTreeMap<String, u64>,
    served_by: BTreeMap<String, u64>,
    /// Rounds that could not run (a login or a voucher creation failed
    /// during a fault); they are retried, not hidden.
    failed_rounds: Vec<String>,
}

impl Tally {
    /// A completed sale, summed into the run's.
    fn add(&mut self, measured: Measured, events: Vec<Event>) {
        self.requests += measured.requests;
        add_counts(&mut self.outcomes, measured.outcomes);
        add_counts(&mut self.served_by, measured.served_by);
        self.sales += 1;
        self.history.extend(events);
    }
}

pub async fn run(settings: SoakSettings) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the hmdp executable")?;
    let aof = match &settings.redis_appendfsync {
        Some(every) => vec!["--appendonly", "yes", "--appendfsync", every.as_str()],
        None => Vec::new(),
    };
    let redis = match settings.redis_cluster {
        true => SoakRedis::Cluster {
            cluster: RedisCluster::start_with(&aof).await?,
            failovers: 0,
        },
        false => SoakRedis::Server(RedisServer::start_with(&aof).await?),
    };
    let mysql = MariaDbServer::start_with(&[]).await?;
    let sandbox = Sandbox::create(&mysql.url(), &RedisSettings::at(redis.url()), "soak").await?;
    let mut servers = Servers { redis, mysql };
    let outcome = until_signal(soak(&settings, exe, &sandbox, &mut servers))
        .await
        .unwrap_or_else(|signal| {
            Err(anyhow!(
                "interrupted by {signal}: nodes, nginx, Redis and MySQL stopped"
            ))
        });
    drop(sandbox);
    outcome
}

/// The soak's own servers, to restart.
struct Servers {
    redis: SoakRedis,
    mysql: MariaDbServer,
}

/// The soak's Redis: one server, or a Redis Cluster.
enum SoakRedis {
    Server(RedisServer),
    Cluster {
        cluster: RedisCluster,
        /// Failovers so far: each takes the master of the next shard.
        failovers: u16,
    },
}

impl SoakRedis {
    fn url(&self) -> String {
        match self {
            SoakRedis::Server(server) => server.url(),
            SoakRedis::Cluster { cluster, .. } => cluster.url(),
        }
    }

    /// Redis loses what it was told last: one server is SIGKILLed and
    /// restarted (from its AOF, or empty); on a Redis Cluster, the replica of the
    /// master serving one shard of the sales is frozen while the load goes
    /// on for `missed`, then promoted with `CLUSTER FAILOVER TAKEOVER`
    /// without what it missed, and the old master becomes its replica.
    /// What happened, in words, and when Redis forgot (the restart, or the
    /// promotion).
    async fn forget(&mut self, shards: u16, missed: Duration) -> anyhow::Result<(String, Instant)> {
        match self {
            SoakRedis::Server(server) => {
                server.restart().await?;
                Ok(("Redis SIGKILLed and restarted".to_owned(), Instant::now()))
            }
            SoakRedis::Cluster { cluster, failovers } => {
                let layout = Layout::new(shards.into())?;
                let shard = layout.shard(*failovers % layout.count());
                *failovers += 1;
                let master = cluster.master_of_slot(slot(shard.tag())).await?;
                let (replica, promoted) = cluster.take_over_after(master, missed).await?;
                let what = format!(
                    "Redis master :{master} (shard {}) taken over by its replica :{replica} \
                     (CLUSTER FAILOVER TAKEOVER), which missed its last {missed:?} of writes",
                    shard.tag()
                );
                Ok((what, promoted))
            }
        }
    }
}

/// Each fault of the cycle, in turn.
#[derive(Debug, Clone, Copy)]
enum Fault {
    KillNode(usize),
    ForgetRedis,
    HoldStockRow,
    ReadOnly,
    CrashMySql,
    /// One shard of the running sale gone from Redis (its part of the sale
    /// deleted) while stock moves between its shards: the sale is loaded
    /// again under the movers' feet.
    ForgetShard,
}

/// The faults the soak takes turns with.
fn fault_cycle(settings: &SoakSettings) -> Vec<Fault> {
    let mut cycle = vec![
        Fault::KillNode(0),
        Fault::ForgetRedis,
        Fault::HoldStockRow,
        Fault::ReadOnly,
        Fault::CrashMySql,
        Fault::KillNode(1),
    ];
    if settings.seckill_shards > 1 && settings.seckill != SeckillMode::Sync {
        cycle.push(Fault::ForgetShard);
    }
    cycle
}

async fn soak(
    settings: &SoakSettings,
    exe: PathBuf,
    sandbox: &Sandbox,
    servers: &mut Servers,
) -> anyhow::Result<()> {
    let flags = soak_flags(settings);
    let (mut nodes, node_user) = stage(settings, exe, sandbox, &flags).await?;
    let started = Instant::now();
    let until = started + Duration::from_secs(settings.minutes * 60);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let front_door = FrontDoor::of(&nodes, sandbox)?;
    let load = tokio::spawn(load_loop(
        settings.clone(),
        front_door,
        until,
        tally.clone(),
    ));
    let faults = Injector {
        settings,
        sandbox,
        flags: &flags,
        stall: Duration::from_secs(settings.stall_secs),
        nodes: &mut nodes,
        servers,
        tally: &tally,
    }
    .take_turns(started, until)
    .await?;
    load.await.context("the load loop panicked")??;
    let tally = tally.lock().await;
    let (verdict, drained) = judge(settings, sandbox, &tally).await?;
    drop(nodes);
    node_user.drop_user(&sandbox.database.url).await?;
    report(
        settings,
        &tally,
        &faults,
        &verdict,
        drained,
        started.elapsed(),
    )
}

/// Starts the nodes with `flags` and nginx in front of them.
async fn stage(
    settings: &SoakSettings,
    exe: PathBuf,
    sandbox: &Sandbox,
    flags: &[String],
) -> anyhow::Result<(Nodes, NodeUser)> {
    // The nodes connect as a user of their own, without READ ONLY ADMIN,
    // so that `read_only` stops their writes as it stops an application's.
    let node_user = NodeUser::create(&sandbox.database.url).await?;
    let spec = NodesSpec {
        database_url: node_user.url.clone(),
        ..NodesSpec::in_sandbox(exe, sandbox)
    };
    let nodes = Nodes::start(spec, flags).await?;
    eprintln!(
        "soak: {} min, --seckill {}, a fault every {} s, lock {}{}, database {}",
        settings.minutes,
        settings.seckill,
        settings.fault_every_secs,
        settings.lock,
        if settings.fencing {
            " with fencing"
        } else {
            ""
        },
        sandbox.database.url
    );
    Ok((nodes, node_user))
}

/// Once the orders on their way are written (or stuck), the run's history
/// judged against MySQL; how long that wait took, `None` past
/// `--drain-timeout-secs`.
async fn judge(
    settings: &SoakSettings,
    sandbox: &Sandbox,
    tally: &Tally,
) -> anyhow::Result<(Verdict, Option<Duration>)> {
    let sale_state = sale_state_of(
        &sandbox.redis.redis_url,
        Keys::new(sandbox.redis.prefix.clone()),
        sandbox.store(1)?,
    )?;
    let drain = Duration::from_secs(settings.drain_timeout_secs);
    // Quiet for longer than a lock's lease: a writer may wait that long for
    // the lock a SIGKILLed node's purchase held (`queue` writes one order at
    // a time, so its whole queue waits behind it).
    let drained = settle_down(&sale_state, QUIET_BEFORE_JUDGING, drain).await;
    if let Some(path) = &settings.history {
        history::Recorder::create(path)?.record_all(&tally.history)?;
    }
    let store = sandbox.store(2)?;
    let lag = Duration::from_millis(settings.writers_lag_ms);
    let verdict = history::check(&store, &tally.history, &allowed_losses(settings), lag).await?;
    Ok((verdict, drained))
}

/// The nodes' flags in a soak.
fn soak_flags(settings: &SoakSettings) -> Vec<String> {
    let mut flags = node_flags(settings.lock, settings.seckill, settings.chaos_hold_ms);
    // Every round logs its users in again: Redis restarts drop the sessions.
    flags.push("--code-interval-secs=0".into());
    // A stall outlasts the claim time and the delivery limit many times.
    flags.push("--stream-claim-idle-ms=2000".into());
    flags.push("--stream-max-deliveries=3".into());
    flags.push(format!("--pay-timeout-secs={}", settings.pay_timeout_secs));
    flags.push("--pay-sweep-secs=5".into());
    flags.push(format!("--seckill-shards={}", settings.seckill_shards));
    if settings.fencing {
        flags.push("--fencing".into());
    }
    flags
}

/// What a fault is made with: the soak's settings and servers, the nodes.
struct Injector<'a> {
    settings: &'a SoakSettings,
    sandbox: &'a Sandbox,
    flags: &'a [String],
    stall: Duration,
    nodes: &'a mut Nodes,
    servers: &'a mut Servers,
    tally: &'a Mutex<Tally>,
}

impl Injector<'_> {
    /// The faults of the cycle in turn, one every `--fault-every-secs`
    /// from `started`, the last one at least 5 s before `until`.
    async fn take_turns(mut self, started: Instant, until: Instant) -> anyhow::Result<Faults> {
        let mut faults = Faults::default();
        let cycle = fault_cycle(self.settings);
        let every = Duration::from_secs(self.settings.fault_every_secs.max(1));
        let mut next = started + every;
        while next + Duration::from_secs(5) < until {
            tokio::time::sleep_until(next.into()).await;
            let at = started.elapsed().as_secs();
            let fault = cycle[faults.log.len() % cycle.len()];
            let fault = self.inject(fault, at).await?;
            eprintln!("soak: {fault}");
            faults.log.push(fault);
            next += every;
        }
        Ok(faults)
    }

    /// Makes `fault` happen, `at` seconds into the soak; says what it did.
    async fn inject(&mut self, fault: Fault, at: u64) -> anyhow::Result<String> {
        match fault {
            Fault::KillNode(index) => self.kill_node(index, at).await,
            Fault::ForgetRedis => self.forget_redis(at).await,
            Fault::ReadOnly => self.read_only(at).await,
            Fault::CrashMySql => self.crash_mysql(at).await,
            Fault::HoldStockRow => self.stall_stock_row(at).await,
            Fault::ForgetShard => self.forget_shard(at).await,
        }
    }

    async fn kill_node(&mut self, index: usize, at: u64) -> anyhow::Result<String> {
        self.nodes.kill_node(index).await;
        let killed = Instant::now();
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.nodes.start_node(index, self.flags).await?;
        let what = format!("t={at}s SIGKILL {} (restarted 3 s later)", NODE_IDS[index]);
        let node = Some(NODE_IDS[index].to_owned());
        self.record(FaultKind::NodeKill, node, &what, killed).await;
        Ok(what)
    }

    async fn forget_redis(&mut self, at: u64) -> anyhow::Result<String> {
        let (forgot, when) = self
            .servers
            .redis
            .forget(self.settings.seckill_shards, Duration::from_secs(2))
            .await?;
        let what = match &self.settings.redis_appendfsync {
            Some(every) => format!("t={at}s {forgot} (AOF, appendfsync {every})"),
            None => format!("t={at}s {forgot} (no persistence)"),
        };
        self.record(FaultKind::RedisRestart, None, &what, when)
            .await;
        Ok(what)
    }

    /// Into the history, for the checker to explain the losses `what` may
    /// cause.
    async fn record(&self, kind: FaultKind, node: Option<String>, what: &str, when: Instant) {
        self.tally.lock().await.history.push(Event::Fault {
            kind,
            node,
            what: what.to_owned(),
            at_ms: history::unix_ms(when),
        });
    }

    async fn read_only(&self, at: u64) -> anyhow::Result<String> {
        let read_only = ReadOnly::on(&self.sandbox.database.url).await?;
        tokio::time::sleep(self.stall).await;
        drop(read_only);
        Ok(format!(
            "t={at}s MySQL read_only for {:?} (a failover's old primary)",
            self.stall
        ))
    }

    async fn crash_mysql(&mut self, at: u64) -> anyhow::Result<String> {
        let down = Instant::now();
        self.servers.mysql.crash_and_restart().await?;
        Ok(format!(
            "t={at}s MySQL SIGKILLed and restarted (back after {:.1?})",
            down.elapsed()
        ))
    }

    async fn stall_stock_row(&self, at: u64) -> anyhow::Result<String> {
        let voucher = self.tally.lock().await.current;
        let Some(voucher) = voucher else {
            return Ok(format!("t={at}s no sale running: no MySQL stall"));
        };
        hold_stock_row(&self.sandbox.database.url, voucher, self.stall).await?;
        Ok(format!(
            "t={at}s voucher {voucher}'s stock row held by another session for {:?}",
            self.stall
        ))
    }

    async fn forget_shard(&self, at: u64) -> anyhow::Result<String> {
        let voucher = self.tally.lock().await.current;
        let Some(voucher) = voucher else {
            return Ok(format!("t={at}s no sale running: no shard forgotten"));
        };
        let layout = Layout::new(self.settings.seckill_shards.into())?;
        let keys = Keys::new(self.sandbox.redis.prefix.clone());
        let shard = keys.shard(layout.shard(0)).voucher(VoucherId::new(voucher));
        let mut redis =
            hmdp::config::connect_redis(&self.sandbox.redis.redis_url, Duration::from_secs(2))?;
        let _: () = redis::AsyncCommands::del(&mut redis, &shard).await?;
        Ok(format!(
            "t={at}s voucher {voucher}'s shard {} forgotten by Redis while stock moves",
            layout.shard(0).tag()
        ))
    }
}

/// How long the orders on their way must stay as they are before the rest
/// is judged lost: beyond the default watchdog lease (30 s) of a lock that
/// a SIGKILLed node held.
const QUIET_BEFORE_JUDGING: Duration = Duration::from_secs(40);

/// The faults injected, in words.
#[derive(Default)]
struct Faults {
    log: Vec<String>,
}

/// A MySQL user for the nodes, with every privilege on the soak's database
/// and none on the server: `read_only` applies to it.
struct NodeUser {
    name: String,
    /// The soak's database URL, as this user.
    url: String,
}

impl NodeUser {
    async fn create(database_url: &str) -> anyhow::Result<NodeUser> {
        use sqlx::{Connection, MySqlConnection};
        let mut url = url::Url::parse(database_url).context("invalid MySQL URL")?;
        let database = url.path().trim_start_matches('/').to_owned();
        let name = format!("soak_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let password = uuid::Uuid::new_v4().simple().to_string();
        let mut root = MySqlConnection::connect(database_url).await?;
        for host in ["%", "localhost", "127.0.0.1"] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE USER '{name}'@'{host}' IDENTIFIED BY '{password}'; \
                 GRANT ALL PRIVILEGES ON `{database}`.* TO '{name}'@'{host}'"
            )))
            .execute(&mut root)
            .await
            .with_context(|| format!("creating the nodes' MySQL user {name}@{host}"))?;
        }
        url.set_username(&name)
            .and_then(|()| url.set_password(Some(&password)))
            .map_err(|()| anyhow!("cannot put a user in the MySQL URL"))?;
        Ok(NodeUser {
            name,
            url: url.to_string(),
        })
    }

    async fn drop_user(&self, database_url: &str) -> anyhow::Result<()> {
        use sqlx::{Connection, MySqlConnection};
        let mut root = MySqlConnection::connect(database_url).await?;
        for host in ["%", "localhost", "127.0.0.1"] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP USER IF EXISTS '{}'@'{host}'",
                self.name
            )))
            .execute(&mut root)
            .await?;
        }
        Ok(())
    }
}

/// MySQL's `read_only` on, as on a primary demoted in a failover: every
/// write of a user without READ ONLY ADMIN fails (1290). Turned off again
/// when dropped, whatever ended the fault (an error, Ctrl-C).
struct ReadOnly {
    database_url: String,
}

impl ReadOnly {
    async fn on(database_url: &str) -> anyhow::Result<ReadOnly> {
        set_read_only(database_url, true).await?;
        Ok(ReadOnly {
            database_url: database_url.to_owned(),
        })
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let url = self.database_url.clone();
        // A runtime of its own on a thread of its own: a `Drop` cannot
        // await, and this one must finish before the soak goes on.
        let turned_off = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|runtime| runtime.block_on(set_read_only(&url, false)))
        })
        .join();
        if !matches!(turned_off, Ok(Ok(()))) {
            eprintln!("soak: could not turn MySQL's read_only off again: SET GLOBAL read_only = OFF by hand");
        }
    }
}

async fn set_read_only(database_url: &str, on: bool) -> anyhow::Result<()> {
    use sqlx::{Connection, MySqlConnection};
    let mut root = MySqlConnection::connect(database_url).await?;
    let statement = if on {
        "SET GLOBAL read_only = ON"
    } else {
        "SET GLOBAL read_only = OFF"
    };
    sqlx::raw_sql(statement).execute(&mut root).await?;
    Ok(())
}

/// Holds `voucher`'s stock row `FOR UPDATE` from a session of its own for
/// `how_long`, as a report, a backup or an admin's open transaction would:
/// MySQL answers, and every write of the voucher waits, then times out.
async fn hold_stock_row(
    database_url: &str,
    voucher: i64,
    how_long: Duration,
) -> anyhow::Result<()> {
    use sqlx::{Connection, MySqlConnection};
    let mut session = MySqlConnection::connect(database_url).await?;
    let mut tx = session.begin().await?;
    sqlx::query("SELECT stock FROM tb_seckill_voucher WHERE voucher_id = ? FOR UPDATE")
        .bind(voucher)
        .execute(&mut *tx)
        .await?;
    tokio::time::sleep(how_long).await;
    tx.rollback().await?;
    Ok(())
}

/// Waits until no admitted order is left on its way to MySQL (the pending
/// hash and the order stream empty), or until their count has not moved
/// for `quiet` (what is left then is lost: a killed `queue` node's orders
/// stay pending for ever), or `deadline`; `Some(took)` unless the deadline
/// came first.
async fn settle_down(
    sale_state: &SaleState,
    quiet: Duration,
    deadline: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut last = None;
    let mut unchanged_since = started;
    while started.elapsed() < deadline {
        let now = sale_state.orders_on_their_way().await.ok();
        if now == Some((0, 0)) {
            return Some(started.elapsed());
        }
        if now != last {
            last = now;
            unchanged_since = Instant::now();
        } else if now.is_some() && unchanged_since.elapsed() >= quiet {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// The sale state of the soak's Redis, read by the load side.
fn sale_state_of(sandbox_redis_url: &str, keys: Keys, store: Store) -> anyhow::Result<SaleState> {
    let redis = hmdp::config::connect_redis(sandbox_redis_url, Duration::from_secs(2))?;
    Ok(SaleState::new(redis, keys, store))
}

/// The losses docs/guarantees.md allows the soak's configuration: orders
/// not yet written when Redis restarts without persistence, or within the
/// `everysec` bound of the restart; the orders a SIGKILLed `queue` node
/// held. `sync` answers after the commit: it loses nothing.
fn allowed_losses(settings: &SoakSettings) -> Vec<Loss> {
    let mut allowed = Vec::new();
    if settings.seckill != SeckillMode::Sync {
        match settings.redis_appendfsync.as_deref() {
            None => allowed.push(Loss::RedisRestart),
            Some("everysec") => allowed.push(Loss::Everysec),
            Some(_) => {}
        }
    }
    if settings.seckill == SeckillMode::Queue {
        allowed.push(Loss::QueueNodeKill);
    }
    allowed
}

/// How the load side reaches the nodes: as a user and an admin would,
/// through nginx, reading login codes from Redis.
struct FrontDoor {
    url: String,
    admin_token: String,
    redis_url: String,
    keys: Keys,
    /// The database, to read the orders on their way with.
    store: Store,
}

impl FrontDoor {
    fn of(nodes: &Nodes, sandbox: &Sandbox) -> anyhow::Result<FrontDoor> {
        Ok(FrontDoor {
            url: nodes.url(),
            admin_token: nodes.spec().admin_token.clone(),
            redis_url: sandbox.redis.redis_url.clone(),
            keys: Keys::new(sandbox.redis.prefix.clone()),
            store: sandbox.store(1)?,
        })
    }
}

/// Runs sales back to back until `until`: log the users in, create a
/// voucher, fire the purchases, audit the voucher.
async fn load_loop(
    settings: SoakSettings,
    door: FrontDoor,
    until: Instant,
    tally: Arc<Mutex<Tally>>,
) -> anyhow::Result<()> {
    let load = LoadSide::connect(settings, door)?;
    while Instant::now() < until {
        match load.sale(&tally).await {
            Ok((measured, events)) => tally.lock().await.add(measured, events),
            Err(error) => {
                tally.lock().await.failed_rounds.push(format!("{error:#}"));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    Ok(())
}

/// The load side, connected through the front door.
struct LoadSide {
    settings: SoakSettings,
    client: reqwest::Client,
    /// nginx.
    target: String,
    admin_token: String,
    login: Login,
    sale_state: SaleState,
}

impl LoadSide {
    fn connect(settings: SoakSettings, door: FrontDoor) -> anyhow::Result<LoadSide> {
        let client = loadtest::http_client(settings.concurrency)?;
        let redis = hmdp::config::connect_redis(&door.redis_url, Duration::from_secs(2))?;
        let login = Login::new(client.clone(), &door.url, redis, door.keys.clone());
        let sale_state = sale_state_of(&door.redis_url, door.keys, door.store)?;
        Ok(LoadSide {
            settings,
            client,
            target: door.url,
            admin_token: door.admin_token,
            login,
            sale_state,
        })
    }

    /// One sale on a fresh voucher, with its buyers' second half: what it
    /// measured and its history.
    async fn sale(&self, tally: &Mutex<Tally>) -> anyhow::Result<(Measured, Vec<Event>)> {
        let settings = &self.settings;
        let tokens = self.login.users(0, settings.users, 32).await?;
        let voucher = loadtest::create_voucher(
            &self.client,
            &self.target,
            &self.admin_token,
            settings.stock,
        )
        .await?;
        tally.lock().await.current = Some(voucher);
        let mut events = vec![Event::Sale {
            voucher,
            stock: settings.stock.into(),
            at_ms: history::unix_ms(Instant::now()),
        }];
        let plan = Plan {
            target: self.target.clone(),
            voucher,
            tokens,
            per_user: settings.per_user,
            concurrency: settings.concurrency,
            addresses: 1,
            progress: loadtest::progress_bar(0),
        };
        let mut measured = loadtest::run(&plan).await?;
        events.append(&mut measured.history);
        // The buyers' second half; those who cancelled buy again, each
        // once, for the units their cancels gave back.
        let shares = (settings.payers, settings.cancellers);
        let acted = payers::act_all(
            &self.client,
            &self.target,
            &plan.tokens,
            &measured.told,
            shares,
            settings.concurrency,
        )
        .await;
        events.extend(acted.iter().flat_map(|acted| acted.history(voucher)));
        rebuy(plan, &acted, &mut measured, &mut events).await?;
        // The next sale once this one's orders are written (or stuck):
        // a `queue` node writes one order at a time, far slower than
        // Redis admits them, and an unpaced soak would judge a backlog.
        if settings.seckill != SeckillMode::Sync {
            settle_down(
                &self.sale_state,
                Duration::from_secs(1),
                Duration::from_secs(30),
            )
            .await;
        }
        Ok((measured, events))
    }
}

/// The buyers of `plan` whose cancel went through buy once more; their
/// requests count with the sale's, their events go into its history.
async fn rebuy(
    plan: Plan,
    acted: &[Acted],
    measured: &mut Measured,
    events: &mut Vec<Event>,
) -> anyhow::Result<()> {
    let rebuys: Vec<usize> = acted
        .iter()
        .filter(|acted| acted.act == Act::Cancel && acted.answered == Answered::Done)
        .map(|acted| acted.user)
        .collect();
    let second = loadtest::run(&Plan {
        tokens: rebuys
            .iter()
            .map(|user| plan.tokens[*user].clone())
            .collect(),
        per_user: 1,
        ..plan
    })
    .await?;
    measured.requests += second.requests;
    add_counts(&mut measured.outcomes, second.outcomes);
    // The second run's clients are the rebuyers: back to the sale's own.
    events.extend(second.history.into_iter().map(|mut event| {
        if let Event::Invoke { client, .. }
        | Event::Ok { client, .. }
        | Event::Fail(Failure { client, .. })
        | Event::Unknown(Failure { client, .. }) = &mut event
        {
            *client = rebuys[*client];
        }
        event
    }));
    Ok(())
}

fn add_counts(into: &mut BTreeMap<String, u64>, counts: BTreeMap<String, u64>) {
    for (name, count) in counts {
        *into.entry(name).or_default() += count;
    }
}

/// Prints the summary table; fails when the promise broke.
fn report(
    settings: &SoakSettings,
    tally: &Tally,
    faults: &Faults,
    verdict: &Verdict,
    drained: Option<Duration>,
    elapsed: Duration,
) -> anyhow::Result<()> {
    let persistence = match &settings.redis_appendfsync {
        Some(every) => format!("AOF, appendfsync {every}"),
        None => "no persistence".to_owned(),
    };
    println!();
    println!(
        "soak: --seckill {} ({} shard(s)), {:.1} min, Redis {}{persistence}, lock {}",
        settings.seckill,
        settings.seckill_shards,
        elapsed.as_secs_f64() / 60.0,
        if settings.redis_cluster {
            "cluster (3 masters, 3 replicas), "
        } else {
            ""
        },
        settings.lock
    );
    println!(
        "  losses allowed          {:?}, within {} ms before their fault",
        allowed_losses(settings),
        settings.writers_lag_ms
    );
    println!("  faults                  {}", faults.log.len());
    for fault in &faults.log {
        println!("    {fault}");
    }
    println!("  sales                   {}", tally.sales);
    println!("  requests                {}", tally.requests);
    match drained {
        Some(took) => println!(
            "  drained                 {:.1} s after the load",
            took.as_secs_f64()
        ),
        None => println!(
            "  drained                 NO: orders still on their way after {} s",
            settings.drain_timeout_secs
        ),
    }
    println!("  rounds failed in faults {}", tally.failed_rounds.len());
    println!("  outcomes                {:?}", tally.outcomes);
    println!("  served by               {:?}", tally.served_by);
    print!("{}", verdict.report());
    if tally.sales == 0 {
        bail!("no sale completed");
    }
    if !verdict.holds() {
        bail!("the promise broke: see the checks above");
    }
    Ok(())
}
