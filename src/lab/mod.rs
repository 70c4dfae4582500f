//! `hmdp lab SCENARIO`: deterministic reproductions of the failures the
//! course walks through, each run against a real Redis with the purchase's
//! own lock implementations, printed as a timeline with a one-line verdict.
//!
//! One file per scenario; [`harness`] holds what they share. A scenario is an
//! async function that builds its locks through the [`Lab`], plays its actors
//! on the lab's clock and explains the outcome; the verdict itself comes from
//! who was seen inside the critical section together.

mod check_then_delete;
mod harness;
mod lease_expiry;
mod misdelete;

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use uuid::Uuid;

use crate::config::LockMode;
use crate::startup;

use harness::Lab;
pub use harness::{Actor, Event, Report};

/// Where and with what lock a scenario runs.
#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// Lock mode to put through the scenario [default: the mode whose failure
    /// the scenario shows].
    #[arg(long = "lock", value_enum)]
    pub mode: Option<LockMode>,

    /// Redis to run against. The run uses only keys under its own random
    /// prefix and deletes them afterwards.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/0")]
    pub redis_url: String,

    /// Prefix put before the run's own key namespace.
    #[arg(long, env = "HMDP_REDIS_PREFIX", default_value = "")]
    pub redis_prefix: String,

    /// Comma-separated Redis URLs of independent nodes for `multi` / `redlock`.
    #[arg(long, env = "HMDP_LOCK_NODES", value_delimiter = ',')]
    pub lock_nodes: Vec<String>,
}

/// The scenarios. Each exits 0 when mutual exclusion held, 1 when it broke.
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
}

impl Scenario {
    /// The name as typed on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Misdelete(_) => "misdelete",
            Scenario::CheckThenDelete(_) => "check-then-delete",
            Scenario::LeaseExpiry(_) => "lease-expiry",
        }
    }

    /// The mode whose failure the scenario shows.
    fn default_mode(&self) -> LockMode {
        match self {
            Scenario::Misdelete(_) => LockMode::RedisNaive,
            Scenario::CheckThenDelete(_) => LockMode::RedisOwner,
            Scenario::LeaseExpiry(_) => LockMode::RedisLua,
        }
    }

    fn args(&self) -> &LabArgs {
        match self {
            Scenario::Misdelete(args)
            | Scenario::CheckThenDelete(args)
            | Scenario::LeaseExpiry(args) => args,
        }
    }
}

/// Bound on one Redis call of the lab, so a dead Redis fails the run quickly.
const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `scenario` in a fresh key namespace, deletes its keys, and reports.
pub async fn run(scenario: &Scenario) -> anyhow::Result<Report> {
    let args = scenario.args();
    let mode = args.mode.unwrap_or_else(|| scenario.default_mode());
    let redis = startup::connect_redis(&args.redis_url, REDIS_TIMEOUT)?;
    // Connect before the clock starts, so the first step is not late.
    let _: String = redis::cmd("PING")
        .query_async(&mut redis.clone())
        .await
        .with_context(|| format!("cannot reach Redis at {}", args.redis_url))?;
    let namespace = format!("{}lab:{}:", args.redis_prefix, Uuid::new_v4());
    let lab = Lab::new(
        mode,
        redis,
        args.redis_url.clone(),
        args.lock_nodes.clone(),
        namespace,
    );
    let explanation = match scenario {
        Scenario::Misdelete(_) => misdelete::run(&lab).await,
        Scenario::CheckThenDelete(_) => check_then_delete::run(&lab).await,
        Scenario::LeaseExpiry(_) => lease_expiry::run(&lab).await,
    };
    let cleaned = lab.clean_up().await;
    let mut explanation = explanation?;
    cleaned?;
    if mode == LockMode::None {
        explanation = "--lock none takes no lock at all.".to_owned();
    }
    Ok(lab.report(scenario.name(), explanation))
}
