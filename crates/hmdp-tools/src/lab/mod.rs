//! `hmdp lab SCENARIO`: deterministic reproductions of the failures the
//! course walks through, each run against a real Redis with the purchase's
//! own lock implementations, printed as a timeline with a one-line verdict.
//!
//! One file per scenario; `harness.rs` holds the stage they share,
//! `report.rs` what a run prints (its timeline and verdict), and
//! `late_release.rs` the story `misdelete` and `check-then-delete` both tell.
//! The asynchronous purchase's scenarios (`queue-crash`, `stream-crash`,
//! `redis-restart`) run real nodes on the stage of `sale.rs` and judge the
//! orders: each buyer told success must hold exactly one. The after-sale
//! scenarios (`pay-vs-close`, `double-close`, `lost-giveback`) set a naive
//! close of unpaid orders against the project's on the stage of
//! `after_sale.rs`, and judge the units: none sold twice, none stranded.
//! A scenario is an async function that builds its locks through the
//! `Lab`, plays its actors on the lab's clock and explains the outcome; the
//! verdict itself comes from who was seen inside the critical section
//! together.

mod after_sale;
mod check_then_delete;
mod cluster_failover;
mod double_close;
mod failover;
mod gc_pause;
mod harness;
mod late_release;
mod lease_expiry;
mod lost_giveback;
mod misdelete;
mod pay_vs_close;
mod queue_crash;
mod redis_restart;
mod reentrancy;
mod report;
mod retry;
mod sale;
mod stream_crash;

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use hmdp_lock::LockMode;

use hmdp::config::{redact_url, DatabaseSettings, RedisSettings};
use hmdp::store::Store;
use hmdp_test_support::TestDatabase;

pub use after_sale::CloseLabArgs;
pub use cluster_failover::ClusterFailoverArgs;
use harness::Lab;
pub use lost_giveback::LostGivebackArgs;
pub use redis_restart::RedisRestartArgs;
pub use report::{Actor, Event, Report};

/// Where and with what lock a scenario runs.
#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// Lock mode to put through the scenario [default: the mode whose failure
    /// the scenario shows].
    #[arg(long = "lock", value_enum)]
    pub mode: Option<LockMode>,

    /// Redis to run against. The run uses only keys under its own random
    /// namespace (under --redis-prefix) and deletes them afterwards.
    #[command(flatten)]
    pub redis: RedisSettings,

    /// Comma-separated Redis URLs of independent nodes for `multi` / `redlock`.
    #[arg(long, env = "HMDP_LOCK_NODES", value_delimiter = ',')]
    pub lock_nodes: Vec<String>,

    /// Mint a fencing token with every acquisition, checked by the purchase.
    #[arg(long, env = "HMDP_FENCING", default_value_t = false)]
    pub fencing: bool,
}

/// A scenario that runs the real purchase: a lock scenario's settings and a
/// MySQL server.
#[derive(Debug, Clone, Args)]
pub struct SaleLabArgs {
    #[command(flatten)]
    pub lab: LabArgs,

    /// MySQL server: the run creates a database of its own on it and drops
    /// it afterwards.
    #[command(flatten)]
    pub database: DatabaseSettings,
}

/// The scenarios. Each exits 0 when its promise held (mutual exclusion; each
/// buyer told success holds one order), 1 when it broke.
#[derive(Debug, Clone, Subcommand)]
pub enum Scenario {
    /// Lock v1's DEL deletes another holder's lock (误删).
    ///
    /// A takes the lock with a 400 ms lease, finishes its work, then a GC pause
    /// stalls it past its lease; the key expires and B takes the lock. When A
    /// wakes up and releases, lock v1's plain DEL deletes B's lock, and C gets
    /// in while B still works. Course stage: distributed lock v1 (SET NX EX +
    /// DEL) and its fix, v2's owner token. Default --lock: redis-naive.
    Misdelete(LabArgs),

    /// Lock v2's owner check and delete are two commands; a lease can run out between them.
    ///
    /// A releases just before its 400 ms lease runs out; its GET finds its own
    /// token, then A stalls before the DEL, the lease expires and B takes the
    /// lock. A's DEL, checked too early, deletes B's lock and C gets in beside
    /// B. Course stage: distributed lock v2 (GET, compare, DEL) and its fix,
    /// v3's atomic Lua release. Default --lock: redis-owner.
    CheckThenDelete(LabArgs),

    /// A holder that outlives its lease loses the lock without noticing.
    ///
    /// A's work takes 700 ms under a 400 ms lease that nothing renews; the key
    /// expires while A still works and B enters beside it. No release, however
    /// careful, fixes this: every simple lock (v1 to v3) breaks here. Course
    /// stage: the limits of the hand-written lock, solved by Redisson's
    /// watchdog. Default --lock: redis-lua.
    LeaseExpiry(LabArgs),

    /// A holder that locks the same key again from a nested step blocks itself on a non-reentrant lock.
    ///
    /// A holds the lock and calls a step that locks the same user again as
    /// the same holder. redis-lua's SET NX sees the key taken and the nested
    /// step gives up after its 300 ms wait: A blocked itself. reentrant
    /// counts holds per holder: A enters again, the nested release leaves it
    /// held once (B stays out), the outer release frees it. Course stage:
    /// Redisson's reentrant lock (hash of holder → count). Default --lock: redis-lua.
    Reentrancy(LabArgs),

    /// A waiter gets the lock the moment the holder releases it.
    ///
    /// A holds the lock for 300 ms. C tries without waiting (hmdp's
    /// tryLock()) and is turned away at once; B waits up to 2000 ms and gets
    /// in when A releases. Prints the hand-off latency from A's release to B
    /// holding the lock; reentrant wakes B with a pub/sub release message.
    /// Course stage: Redisson's retry by subscription. Default --lock: reentrant.
    Retry(LabArgs),

    /// A lock on a replicated Redis is lost when the master dies before replicating it.
    ///
    /// Starts its own Redis servers. Single-Redis modes: a master and a
    /// replica whose replication the lab holds back; A locks on the master,
    /// the master dies, the replica is promoted, B locks on it: two holders.
    /// multi / redlock: three independent servers, one dies after A locked,
    /// and B cannot gather enough of them. Course stage: the master-replica
    /// consistency problem, solved by Redisson's MultiLock. Default --lock: reentrant.
    Failover(LabArgs),

    /// A lock on a Redis Cluster is lost when its master fails over to a replica that never got it.
    ///
    /// Starts a Redis Cluster of its own (three masters, three replicas).
    /// The replica of the lock key's master is frozen (SIGSTOP); A locks;
    /// the master is SIGKILLed; the replica thaws and the cluster promotes
    /// it; B locks the same key on it: two holders, exit 1. With
    /// --lock-sync-replicas 1 a lock is handed out only once a replica
    /// acknowledged it (WAIT): A is refused instead, and the promise holds
    /// (exit 0). Course stage: the master-replica consistency problem, on
    /// the real failover mechanism. Default --lock: reentrant.
    ClusterFailover(ClusterFailoverArgs),

    /// A holder paused past its lease commits beside the next holder, unless fencing stops it.
    ///
    /// Runs the real purchase on a database of its own. A's purchase takes
    /// the lock (400 ms lease) and pauses 1200 ms inside its transaction; B's
    /// purchase for the same user takes the expired lock 600 ms later. Without
    /// fencing both commit (two orders); with --fencing the newer token wins
    /// and A rolls back. Course stage: the limits of lease-based locks (GC
    /// pauses), fixed with fencing tokens. Default --lock: redis-lua.
    GcPause(SaleLabArgs),

    /// The in-process queue (V5) loses the orders it holds when its node dies.
    ///
    /// Starts a node of its own in --seckill queue on a database of its own,
    /// its writer holding each transaction open 300 ms. Twenty users buy at
    /// once and are told success; the node is SIGKILLed 700 ms later with
    /// most orders still queued in its memory. Counts the buyers told
    /// success against the orders in MySQL: exits 1 with the numbers.
    /// Course stage: asynchronous seckill with a blocking queue, and why the
    /// course moves on to a Redis Stream. Default --lock: reentrant.
    QueueCrash(SaleLabArgs),

    /// A stream consumer that dies before XACK loses nothing: another node claims its entries.
    ///
    /// Two nodes of its own in --seckill stream, claim idle time 1 s. node1's
    /// writer holds each transaction open 3 s; twenty users buy, node1's
    /// consumer reads their orders, node2 starts, node1 is SIGKILLed before
    /// its commit and XACK. node2 claims the idle entries (XAUTOCLAIM) and
    /// writes them: every order exactly once, and the audit holds (exit 0).
    /// Course stage: the Redis Stream consumer group (V6) and its pending
    /// list. Default --lock: reentrant.
    StreamCrash(SaleLabArgs),

    /// Redis restarted empty loses the orders still in the stream; AOF keeps them.
    ///
    /// A private redis-server and a node of its own in --seckill stream whose
    /// writer holds each transaction open 5 s. Twelve users buy and are told
    /// success; the node is SIGKILLed with their orders unwritten, Redis and
    /// then the node restart. Without persistence the orders are lost, exit
    /// status 1, and the node rebuilds stock and buyers from MySQL; with
    /// --redis-aof (appendonly yes, appendfsync always) the stream survives
    /// and every order is written, exit status 0. Course stage: what the
    /// asynchronous seckill trusts Redis with. Default --lock: reentrant.
    RedisRestart(RedisRestartArgs),

    /// A close that reads the order's status, then writes, closes an order paid in between.
    ///
    /// Runs two nodes' purchase (--seckill queue) and after-sale service
    /// in-process on a database of its own, a voucher of stock 1. A buys,
    /// then cancels on node1 and pays on node2: node1 takes the cancel and a
    /// GC pause holds its write back 200 ms; the payment lands 100 ms in.
    /// The naive close SELECTed the order unpaid, writes status 4 with
    /// `UPDATE … WHERE id = ?` and gives the unit back; B buys it: A paid
    /// for a closed order and the unit is sold twice, exit 1. With
    /// --conditional-close node1 closes with the project's one conditional
    /// update (`… AND status = 1`), which finds the order paid and changes
    /// nothing; B is refused, exit 0. Course stage: after the course (its
    /// orders are never paid or closed), check-then-act on an order's
    /// status. Default --lock: reentrant.
    PayVsClose(CloseLabArgs),

    /// Two nodes' timers closing one unpaid order give its unit back twice.
    ///
    /// A voucher of stock 1 on two in-process nodes; A leaves the order
    /// unpaid past its 1 s deadline and both nodes' timers fire for it at
    /// once. The naive closers each SELECT it unpaid, then each run `UPDATE
    /// … SET status = 4 WHERE id = ?`, stock + 1 in MySQL and HINCRBY stock
    /// 1 in Redis: B and C both buy the one unit, exit 1. With
    /// --conditional-close two `AfterSale`s close it at once: one update
    /// closes it, the other changes no row and gives nothing back; B buys,
    /// C is refused, exit 0. Course stage: after the course (its orders are
    /// never paid or closed), a state change made idempotent. Default
    /// --lock: reentrant.
    DoubleClose(CloseLabArgs),

    /// A node killed between closing an order in MySQL and returning its unit to Redis strands the unit.
    ///
    /// A voucher of stock 1 on two in-process nodes; A leaves the order
    /// unpaid past its 1 s deadline; node1's timer closes it in MySQL
    /// (status 4, stock + 1) and is killed before its call to Redis (the
    /// lab drops the close there). Redis says sold out, MySQL has the unit.
    /// Naive: nothing recorded the give-back, node2's closer has nothing to
    /// send, B is refused, exit 1. With --owed-giveback the close's
    /// transaction recorded it in tb_order_giveback; node2's closer sends it
    /// once owed for 2 s (lua/giveback.lua, once per order) and B buys the
    /// unit, exit 0. Course stage: after the course (its orders are never
    /// paid or closed), a write to two stores made whole by an owed record.
    /// Default --lock: reentrant.
    LostGiveback(LostGivebackArgs),
}

impl Scenario {
    /// The name as typed on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Misdelete(_) => "misdelete",
            Scenario::CheckThenDelete(_) => "check-then-delete",
            Scenario::LeaseExpiry(_) => "lease-expiry",
            Scenario::Reentrancy(_) => "reentrancy",
            Scenario::Retry(_) => "retry",
            Scenario::Failover(_) => "failover",
            Scenario::ClusterFailover(_) => "cluster-failover",
            Scenario::GcPause(_) => "gc-pause",
            Scenario::QueueCrash(_) => "queue-crash",
            Scenario::StreamCrash(_) => "stream-crash",
            Scenario::RedisRestart(_) => "redis-restart",
            Scenario::PayVsClose(_) => "pay-vs-close",
            Scenario::DoubleClose(_) => "double-close",
            Scenario::LostGiveback(_) => "lost-giveback",
        }
    }

    /// The mode whose failure the scenario shows.
    fn default_mode(&self) -> LockMode {
        match self {
            Scenario::Misdelete(_) => LockMode::RedisNaive,
            Scenario::CheckThenDelete(_) => LockMode::RedisOwner,
            Scenario::LeaseExpiry(_) => LockMode::RedisLua,
            Scenario::Reentrancy(_) => LockMode::RedisLua,
            Scenario::Retry(_) => LockMode::Reentrant,
            Scenario::Failover(_) | Scenario::ClusterFailover(_) => LockMode::Reentrant,
            Scenario::GcPause(_) => LockMode::RedisLua,
            Scenario::QueueCrash(_)
            | Scenario::StreamCrash(_)
            | Scenario::RedisRestart(_)
            | Scenario::PayVsClose(_)
            | Scenario::DoubleClose(_)
            | Scenario::LostGiveback(_) => LockMode::Reentrant,
        }
    }

    /// What the verdict judges: the lock's promise, or the asynchronous
    /// purchase's.
    fn promise(&self) -> &'static str {
        match self {
            Scenario::QueueCrash(_) | Scenario::StreamCrash(_) | Scenario::RedisRestart(_) => {
                "every buyer told success holds exactly one order"
            }
            Scenario::PayVsClose(_) => "a paid order is never closed, and no unit sold twice",
            Scenario::DoubleClose(_) => "a closed order's unit goes back on sale once",
            Scenario::LostGiveback(_) => "a closed order's unit goes back on sale",
            _ => "mutual exclusion held",
        }
    }

    /// How the scenario's header describes its setup, when not by the lock
    /// key and lease.
    fn setup(&self, mode: LockMode) -> Option<String> {
        match self {
            Scenario::QueueCrash(_) => Some(format!("--seckill queue --lock {mode}")),
            Scenario::StreamCrash(_) => Some(format!("--seckill stream --lock {mode}")),
            Scenario::RedisRestart(args) => Some(format!(
                "--seckill {} --lock {mode}{}",
                args.seckill,
                if args.redis_aof { " --redis-aof" } else { "" }
            )),
            Scenario::PayVsClose(args) | Scenario::DoubleClose(args) => Some(after_sale_setup(
                mode,
                args.conditional_close.then_some("--conditional-close"),
            )),
            Scenario::LostGiveback(args) => Some(after_sale_setup(
                mode,
                args.owed_giveback.then_some("--owed-giveback"),
            )),
            _ => None,
        }
    }

    fn args(&self) -> &LabArgs {
        match self {
            Scenario::Misdelete(args)
            | Scenario::CheckThenDelete(args)
            | Scenario::LeaseExpiry(args)
            | Scenario::Reentrancy(args)
            | Scenario::Retry(args)
            | Scenario::Failover(args) => args,
            Scenario::ClusterFailover(args) => &args.lab,
            Scenario::GcPause(args) | Scenario::QueueCrash(args) | Scenario::StreamCrash(args) => {
                &args.lab
            }
            Scenario::RedisRestart(args) => &args.sale.lab,
            Scenario::PayVsClose(args) | Scenario::DoubleClose(args) => &args.sale.lab,
            Scenario::LostGiveback(args) => &args.sale.lab,
        }
    }

    /// Where the scenarios that run the purchase in-process get a database
    /// of their own.
    fn own_database(&self) -> Option<&DatabaseSettings> {
        match self {
            Scenario::GcPause(args) => Some(&args.database),
            Scenario::PayVsClose(args) | Scenario::DoubleClose(args) => Some(&args.sale.database),
            Scenario::LostGiveback(args) => Some(&args.sale.database),
            _ => None,
        }
    }
}

/// The after-sale scenarios' header: their nodes' purchase path and lock,
/// and the flag of the project's close when it runs.
fn after_sale_setup(mode: LockMode, project: Option<&str>) -> String {
    let project = project.map(|flag| format!(" {flag}")).unwrap_or_default();
    format!("--seckill queue --lock {mode}{project}")
}

/// Bound on one Redis call of the lab, so a dead Redis fails the run quickly.
const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `scenario` in a fresh key namespace, deletes its keys, and reports.
pub async fn run(scenario: &Scenario) -> anyhow::Result<Report> {
    let args = scenario.args();
    let mode = args.mode.unwrap_or_else(|| scenario.default_mode());
    let redis = hmdp::config::connect_redis(&args.redis.url, REDIS_TIMEOUT)?;
    // Connect before the clock starts, so the first step is not late.
    let _: String = redis::cmd("PING")
        .query_async(&mut redis.clone())
        .await
        .with_context(|| format!("cannot reach Redis at {}", redact_url(&args.redis.url)))?;
    // The purchase's database too (the in-process scenarios), one of the
    // run's own next to the configured one: creating it takes a while.
    let database = match scenario.own_database() {
        Some(settings) => {
            let database = TestDatabase::create(&settings.url, "lab").await?;
            let store = Store::connect_lazy(&database.url, 8, Duration::from_secs(10))?;
            store.migrate().await?;
            Some((database, store))
        }
        None => None,
    };
    let store = database.as_ref().map(|(_, store)| store);
    let lab = Lab::new(mode, redis, args);
    let explanation = match scenario {
        Scenario::Misdelete(_) => misdelete::run(&lab).await,
        Scenario::CheckThenDelete(_) => check_then_delete::run(&lab).await,
        Scenario::LeaseExpiry(_) => lease_expiry::run(&lab).await,
        Scenario::Reentrancy(_) => reentrancy::run(&lab).await,
        Scenario::Retry(_) => retry::run(&lab).await,
        Scenario::Failover(_) => failover::run(&lab).await,
        Scenario::ClusterFailover(args) => cluster_failover::run(&lab, args).await,
        Scenario::GcPause(_) => gc_pause::run(&lab, own(store)).await,
        Scenario::QueueCrash(args) => queue_crash::run(&lab, args).await,
        Scenario::StreamCrash(args) => stream_crash::run(&lab, args).await,
        Scenario::RedisRestart(args) => redis_restart::run(&lab, args).await,
        Scenario::PayVsClose(args) => pay_vs_close::run(&lab, own(store), args).await,
        Scenario::DoubleClose(args) => double_close::run(&lab, own(store), args).await,
        Scenario::LostGiveback(args) => lost_giveback::run(&lab, own(store), args).await,
    };
    if let Some((database, store)) = database {
        // Its connections closed first, then the database is dropped.
        store.disconnect().await;
        drop(database);
    }
    let cleaned = lab.clean_up().await;
    let mut explanation = explanation?;
    cleaned?;
    if mode == LockMode::NoLock {
        explanation = "--lock none takes no lock at all.".to_owned();
    }
    Ok(lab.report(
        scenario.name(),
        scenario.setup(mode),
        scenario.promise(),
        explanation,
    ))
}

/// The database `run` set up for a scenario that names one in
/// [`Scenario::own_database`].
fn own(store: Option<&Store>) -> &Store {
    store.expect("run sets up the database of the scenarios that have one")
}
