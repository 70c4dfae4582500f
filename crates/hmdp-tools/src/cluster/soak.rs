//! `hmdp soak`: the two-node cluster under mixed load for minutes on end,
//! with a fault every interval — a node SIGKILLed and restarted, Redis
//! killed and restarted (empty, or from its AOF), the voucher's stock row
//! held by another MySQL session for longer than the stream's claim time,
//! MySQL read-only, MySQL SIGKILLed and restarted — and every sale judged
//! by what its buyers were told: each success answer's order in MySQL
//! exactly once after the drain, nobody told success for two active orders,
//! no user with two active orders, no unit sold twice. After each sale its
//! buyers pay, cancel (and buy again) or leave their orders to time out:
//! each payment told success is paid, each cancel told success is closed,
//! nobody paid for a closed order, active orders + stock = initial. Orders that
//! Redis's persistence setting lost (admitted before a restart, never
//! written) are counted apart, and must be none with `appendfsync always`;
//! so are the orders a SIGKILLed `queue` node took with it.
//!
//! Redis and MySQL are a private `redis-server` and `mariadbd` of the soak's
//! own, so that restarting them disturbs nothing else on the machine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use hmdp_lock::LockMode;
use tokio::sync::Mutex;

use super::{node_flags, until_signal};
use super::{Cluster, ClusterSpec, Sandbox, NODE_IDS};
use crate::loadtest::{self, tokens::Login, Plan, Told};
use crate::payers::{self, Act, Acted, Answered};
use hmdp::config::{RedisSettings, SeckillMode};
use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::seckill::SaleState;
use hmdp::store::{OrderState, Store};
use hmdp_test_support::{MariaDbServer, RedisServer};

/// `hmdp soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakSettings {
    /// How long to run, in minutes.
    #[arg(long, default_value_t = 10)]
    pub minutes: u64,

    /// Seconds between two faults; they take turns: node 1 killed (and
    /// restarted 3 s later), Redis restarted, the sale's stock row held,
    /// MySQL read-only, MySQL killed and restarted, node 2 killed.
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

    /// After the load: how long to wait for every admitted order to reach
    /// MySQL before judging.
    #[arg(long, default_value_t = 120)]
    pub drain_timeout_secs: u64,
}

/// One sale: its voucher, what its buyers were told, and what they did with
/// their orders (and were told then).
struct Sale {
    voucher: i64,
    told: Vec<Told>,
    acted: Vec<Acted>,
}

/// Everything the load side saw, summed over the sales.
#[derive(Default)]
struct Tally {
    sales: Vec<Sale>,
    /// The sale running now: the one a MySQL stall holds.
    current: Option<i64>,
    requests: u64,
    outcomes: BTreeMap<String, u64>,
    served_by: BTreeMap<String, u64>,
    /// Rounds that could not run (a login or a voucher creation failed
    /// during a fault); they are retried, not hidden.
    failed_rounds: Vec<String>,
}

pub async fn run(settings: SoakSettings) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the hmdp executable")?;
    let redis = match &settings.redis_appendfsync {
        Some(every) => {
            RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", every]).await?
        }
        None => RedisServer::start().await?,
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
    redis: RedisServer,
    mysql: MariaDbServer,
}

async fn soak(
    settings: &SoakSettings,
    exe: PathBuf,
    sandbox: &Sandbox,
    servers: &mut Servers,
) -> anyhow::Result<()> {
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
    // The nodes connect as a user of their own, without READ ONLY ADMIN,
    // so that `read_only` stops their writes as it stops an application's.
    let node_user = NodeUser::create(&sandbox.database.url).await?;
    let spec = ClusterSpec {
        database_url: node_user.url.clone(),
        ..ClusterSpec::in_sandbox(exe, sandbox)
    };
    let mut cluster = Cluster::start(spec, &flags).await?;
    let started = Instant::now();
    let until = started + Duration::from_secs(settings.minutes * 60);
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

    let tally = Arc::new(Mutex::new(Tally::default()));
    let front_door = FrontDoor {
        url: cluster.url(),
        admin_token: cluster.spec().admin_token.clone(),
        redis_url: sandbox.redis.redis_url.clone(),
        keys: Keys::new(sandbox.redis.prefix.clone()),
        store: sandbox.store(1)?,
    };
    let load = tokio::spawn(load_loop(
        settings.clone(),
        front_door,
        until,
        tally.clone(),
    ));

    let mut faults = Faults::default();
    let every = Duration::from_secs(settings.fault_every_secs.max(1));
    let mut next = started + every;
    let stall = Duration::from_secs(settings.stall_secs);
    while next + Duration::from_secs(5) < until {
        tokio::time::sleep_until(next.into()).await;
        let at = started.elapsed().as_secs();
        let fault = match faults.log.len() % 6 {
            // node 1, Redis, the stock row held, read_only, MySQL, node 2.
            kill @ (0 | 5) => {
                let index = usize::from(kill == 5);
                cluster.kill_node(index).await;
                faults
                    .node_kills
                    .push((NODE_IDS[index].to_owned(), Instant::now()));
                tokio::time::sleep(Duration::from_secs(3)).await;
                cluster.start_node(index, &flags).await?;
                format!("t={at}s SIGKILL {} (restarted 3 s later)", NODE_IDS[index])
            }
            1 => {
                servers.redis.restart().await?;
                faults.redis_restarts.push(Instant::now());
                match &settings.redis_appendfsync {
                    Some(every) => {
                        format!("t={at}s Redis killed, restarted from its AOF ({every})")
                    }
                    None => format!("t={at}s Redis killed and restarted empty"),
                }
            }
            3 => {
                let read_only = ReadOnly::on(&sandbox.database.url).await?;
                tokio::time::sleep(stall).await;
                drop(read_only);
                format!("t={at}s MySQL read_only for {stall:?} (a failover's old primary)")
            }
            4 => {
                let down = Instant::now();
                servers.mysql.crash_and_restart().await?;
                format!(
                    "t={at}s MySQL SIGKILLed and restarted (back after {:.1?})",
                    down.elapsed()
                )
            }
            _ => {
                let voucher = tally.lock().await.current;
                match voucher {
                    Some(voucher) => {
                        hold_stock_row(&sandbox.database.url, voucher, stall).await?;
                        format!("t={at}s voucher {voucher}'s stock row held by another session for {stall:?}")
                    }
                    None => format!("t={at}s no sale running: no MySQL stall"),
                }
            }
        };
        eprintln!("soak: {fault}");
        faults.log.push(fault);
        next += every;
    }
    load.await.context("the load loop panicked")??;

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
    let tally = tally.lock().await;
    let store = sandbox.store(2)?;
    let verdict = judge(settings, &store, &tally, &faults).await?;
    drop(cluster);
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

/// How long the orders on their way must stay as they are before the rest
/// is judged lost: beyond the default watchdog lease (30 s) of a lock that
/// a SIGKILLed node held.
const QUIET_BEFORE_JUDGING: Duration = Duration::from_secs(40);

/// The faults injected, and when the ones that can lose orders happened.
#[derive(Default)]
struct Faults {
    log: Vec<String>,
    /// `(node id, when)` of each SIGKILL.
    node_kills: Vec<(String, Instant)>,
    redis_restarts: Vec<Instant>,
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

/// What the sales came to, judged by what their buyers were told.
#[derive(Default)]
struct Verdict {
    told: usize,
    orders: i64,
    /// Success answers whose order is not in MySQL, admitted before a
    /// Redis restart that lost them (no AOF, or AOF not synced).
    lost_by_persistence: usize,
    /// `queue`: success answers whose order was queued in a node that was
    /// SIGKILLed after answering.
    lost_with_a_node: usize,
    /// Success answers whose order is not in MySQL, and nothing explains it.
    lost: Vec<String>,
    /// Users told success for two orders of one voucher both active.
    told_twice: Vec<String>,
    /// Payments and cancels told success, and payments refused as closed.
    paid: usize,
    cancelled: usize,
    /// Orders closed in MySQL (cancelled, or timed out).
    closed: i64,
    /// Payments or cancels whose answer the order's status contradicts.
    acts_broken: Vec<String>,
    /// MySQL's own invariants broken: oversold, stock not balancing, a user
    /// with two orders.
    mysql_broken: Vec<String>,
}

impl Verdict {
    fn kept(&self, settings: &SoakSettings) -> bool {
        let persistence_allowed = settings.redis_appendfsync.as_deref() != Some("always");
        self.lost.is_empty()
            && self.told_twice.is_empty()
            && self.acts_broken.is_empty()
            && self.mysql_broken.is_empty()
            && (persistence_allowed || self.lost_by_persistence == 0)
            && (settings.seckill == SeckillMode::Queue || self.lost_with_a_node == 0)
    }
}

/// Judges every sale: each success answer against MySQL, then MySQL's own
/// invariants.
async fn judge(
    settings: &SoakSettings,
    store: &Store,
    tally: &Tally,
    faults: &Faults,
) -> anyhow::Result<Verdict> {
    let initial = i64::from(settings.stock);
    let mut verdict = Verdict::default();
    for sale in &tally.sales {
        let voucher = VoucherId::new(sale.voucher);
        let audit = store.audit_voucher(voucher).await?;
        verdict.orders += audit.orders();
        verdict.told += sale.told.len();
        for broken in audit.violations(initial, true) {
            verdict
                .mysql_broken
                .push(format!("voucher {}: {broken}", sale.voucher));
        }
        verdict.closed += audit.closed_orders;
        let statuses: BTreeMap<i64, u8> =
            sqlx::query_as("SELECT id, status FROM tb_voucher_order WHERE voucher_id = ?")
                .bind(voucher)
                .fetch_all(store.pool())
                .await?
                .into_iter()
                .collect();
        judge_acts(sale, &statuses, &mut verdict);
        let mut by_user: BTreeMap<usize, BTreeSet<i64>> = BTreeMap::new();
        for told in &sale.told {
            if statuses.get(&told.order_id) != Some(&(OrderState::Closed as u8)) {
                by_user.entry(told.user).or_default().insert(told.order_id);
            }
            if statuses.contains_key(&told.order_id) {
                continue;
            }
            let redis_lost_it = faults.redis_restarts.iter().any(|at| *at > told.at);
            let node_took_it = faults
                .node_kills
                .iter()
                .any(|(node, at)| *node == told.node && *at > told.at);
            // A `queue` node's orders live in its memory: a kill loses them
            // whatever Redis keeps. Any other order lives in Redis until
            // written: only a Redis restart can lose it.
            if settings.seckill == SeckillMode::Queue && node_took_it {
                verdict.lost_with_a_node += 1;
            } else if redis_lost_it {
                verdict.lost_by_persistence += 1;
            } else {
                verdict.lost.push(format!(
                    "voucher {}: order {} told to user #{} by {} is not in MySQL",
                    sale.voucher, told.order_id, told.user, told.node
                ));
            }
        }
        for (user, ids) in by_user.iter().filter(|(_, ids)| ids.len() > 1) {
            verdict.told_twice.push(format!(
                "voucher {}: user #{user} told success for orders {ids:?}, none closed",
                sale.voucher
            ));
        }
    }
    Ok(verdict)
}

/// Each payment or cancel against the status MySQL ended with: paid told
/// success is paid (or used), cancelled told success and payments refused
/// as closed are closed.
fn judge_acts(sale: &Sale, statuses: &BTreeMap<i64, u8>, verdict: &mut Verdict) {
    for acted in &sale.acted {
        let status = statuses.get(&acted.order_id).copied();
        let state = status.and_then(OrderState::from_status);
        let expected = match (&acted.act, &acted.answered) {
            (Act::Pay, Answered::Done) => {
                verdict.paid += 1;
                matches!(state, Some(OrderState::Paid | OrderState::Used))
            }
            (Act::Cancel, Answered::Done) => {
                verdict.cancelled += 1;
                state == Some(OrderState::Closed)
            }
            (Act::Pay, Answered::Refused(code)) if code == "ORDER_CLOSED" => {
                state == Some(OrderState::Closed)
            }
            _ => true,
        };
        if !expected {
            verdict.acts_broken.push(format!(
                "voucher {}: order {} of user #{}: {:?} answered {:?}, status in MySQL {status:?}",
                sale.voucher, acted.order_id, acted.user, acted.act, acted.answered
            ));
        }
    }
}

/// How the load side reaches the cluster: as a user and an admin would,
/// through nginx, reading login codes from Redis.
struct FrontDoor {
    url: String,
    admin_token: String,
    redis_url: String,
    keys: Keys,
    /// The database, to read the orders on their way with.
    store: Store,
}

/// Runs sales back to back until `until`: log the users in, create a
/// voucher, fire the purchases, audit the voucher.
async fn load_loop(
    settings: SoakSettings,
    door: FrontDoor,
    until: Instant,
    tally: Arc<Mutex<Tally>>,
) -> anyhow::Result<()> {
    let client = loadtest::http_client(settings.concurrency)?;
    let redis = hmdp::config::connect_redis(&door.redis_url, Duration::from_secs(2))?;
    let login = Login::new(client.clone(), &door.url, redis, door.keys.clone());
    let sale_state = sale_state_of(&door.redis_url, door.keys, door.store)?;
    let target = door.url;
    while Instant::now() < until {
        let round = async {
            let tokens = login.users(0, settings.users, 32).await?;
            let voucher =
                loadtest::create_voucher(&client, &target, &door.admin_token, settings.stock)
                    .await?;
            tally.lock().await.current = Some(voucher);
            let plan = Plan {
                target: target.clone(),
                voucher,
                tokens,
                per_user: settings.per_user,
                concurrency: settings.concurrency,
                progress: loadtest::progress_bar(0),
            };
            let mut measured = loadtest::run(&plan).await?;
            // The buyers' second half; those who cancelled buy again, each
            // once, for the units their cancels gave back.
            let shares = (settings.payers, settings.cancellers);
            let acted = payers::act_all(
                &client,
                &target,
                &plan.tokens,
                &measured.told,
                shares,
                settings.concurrency,
            )
            .await;
            let again = Plan {
                tokens: plan.tokens.clone(),
                per_user: 1,
                ..plan
            };
            let rebuys: Vec<usize> = acted
                .iter()
                .filter(|acted| acted.act == Act::Cancel && acted.answered == Answered::Done)
                .map(|acted| acted.user)
                .collect();
            let second = loadtest::run(&Plan {
                tokens: rebuys
                    .iter()
                    .map(|user| again.tokens[*user].clone())
                    .collect(),
                ..again
            })
            .await?;
            measured.requests += second.requests;
            for (outcome, count) in second.outcomes {
                *measured.outcomes.entry(outcome).or_default() += count;
            }
            measured
                .told
                .extend(second.told.into_iter().map(|told| Told {
                    user: rebuys[told.user],
                    ..told
                }));
            // The next sale once this one's orders are written (or stuck):
            // a `queue` node writes one order at a time, far slower than
            // Redis admits them, and an unpaced soak would judge a backlog.
            if settings.seckill != SeckillMode::Sync {
                settle_down(&sale_state, Duration::from_secs(1), Duration::from_secs(30)).await;
            }
            anyhow::Ok((voucher, measured, acted))
        };
        match round.await {
            Ok((voucher, measured, acted)) => {
                let mut tally = tally.lock().await;
                tally.requests += measured.requests;
                for (outcome, count) in measured.outcomes {
                    *tally.outcomes.entry(outcome).or_default() += count;
                }
                for (node, count) in measured.served_by {
                    *tally.served_by.entry(node).or_default() += count;
                }
                tally.sales.push(Sale {
                    voucher,
                    told: measured.told,
                    acted,
                });
            }
            Err(error) => {
                tally.lock().await.failed_rounds.push(format!("{error:#}"));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    Ok(())
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
        "soak: --seckill {} ({} shard(s)), {:.1} min, Redis {persistence}, lock {}",
        settings.seckill,
        settings.seckill_shards,
        elapsed.as_secs_f64() / 60.0,
        settings.lock
    );
    println!("  faults                  {}", faults.log.len());
    for fault in &faults.log {
        println!("    {fault}");
    }
    println!("  sales                   {}", tally.sales.len());
    println!("  requests                {}", tally.requests);
    println!("  success answers         {}", verdict.told);
    println!("  orders in MySQL         {}", verdict.orders);
    println!("  paid (told success)     {}", verdict.paid);
    println!("  cancelled (told)        {}", verdict.cancelled);
    println!(
        "  closed in MySQL         {} (cancelled or timed out)",
        verdict.closed
    );
    println!("  pay/cancel contradicted {}", verdict.acts_broken.len());
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
    println!("  lost by persistence     {}", verdict.lost_by_persistence);
    if settings.seckill == SeckillMode::Queue {
        println!("  lost with a killed node {}", verdict.lost_with_a_node);
    }
    println!("  lost otherwise          {}", verdict.lost.len());
    println!("  told success twice      {}", verdict.told_twice.len());
    println!("  MySQL broken            {}", verdict.mysql_broken.len());
    println!("  rounds failed in faults {}", tally.failed_rounds.len());
    println!("  outcomes                {:?}", tally.outcomes);
    println!("  served by               {:?}", tally.served_by);
    if tally.sales.is_empty() {
        bail!("no sale completed");
    }
    for line in verdict
        .lost
        .iter()
        .chain(&verdict.told_twice)
        .chain(&verdict.acts_broken)
        .chain(&verdict.mysql_broken)
        .take(20)
    {
        println!("    {line}");
    }
    if !verdict.kept(settings) {
        println!("verdict: BROKEN");
        bail!("the promise broke: see the table above");
    }
    println!(
        "verdict: KEPT — every success answer is one order in MySQL{}, nobody told success \
         for two active orders, one active order per user, every payment and cancel as \
         answered, nobody paid for a closed order, no oversell in {} sales",
        if verdict.lost_by_persistence + verdict.lost_with_a_node > 0 {
            " (but those lost as counted above)"
        } else {
            ""
        },
        tally.sales.len()
    );
    Ok(())
}
