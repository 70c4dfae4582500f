//! `hmdp bench-lock`: acquire+release pairs per second and pair latency for
//! one lock mode against the configured Redis, on distinct keys (no
//! contention) or one hot key (hand-off between holders).

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::{timed_loop, write_json, RunShape};
use crate::config::{LockSettings, StoreSettings};
use crate::lock::Faults;
use crate::startup::connect_redis;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeySpread {
    /// One key per task: measures the lock's own cost.
    Distinct,
    /// Every task on one key: measures hand-off (use --lock-wait-ms).
    One,
}

#[derive(Debug, Clone, Args)]
pub struct BenchLockArgs {
    #[command(flatten)]
    pub store: StoreSettings,

    #[command(flatten)]
    pub lock: LockSettings,

    #[command(flatten)]
    pub shape: RunShape,

    /// Which keys the tasks lock.
    #[arg(long, value_enum, default_value_t = KeySpread::Distinct)]
    pub keys: KeySpread,
}

#[derive(Debug, Serialize)]
pub struct BenchLockResult {
    pub mode: String,
    pub keys: KeySpread,
    pub pairs_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub pairs: u64,
    /// Acquisitions that found the key busy past the wait (hot key only).
    pub busy: u64,
    pub concurrency: usize,
    pub duration_s: u64,
}

pub async fn run(args: BenchLockArgs) -> anyhow::Result<BenchLockResult> {
    let redis = connect_redis(&args.store.redis_url, args.store.backend_timeout())?;
    let lock = crate::lock::build(&args.lock, &redis, &args.store.redis_url, Faults::none())?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("{}bench:lock:{run_id}", args.store.redis_prefix);
    let spread = args.keys;
    let measured = timed_loop(&args.shape, move |task, _| {
        let lock = lock.clone();
        let key = match spread {
            KeySpread::Distinct => format!("{prefix}:{task}"),
            KeySpread::One => format!("{prefix}:hot"),
        };
        async move {
            match lock.acquire(&key).await {
                Ok(Some(held)) => held.release().await.is_ok(),
                Ok(None) | Err(_) => false,
            }
        }
    })
    .await;
    let result = BenchLockResult {
        mode: args.lock.mode.to_string(),
        keys: spread,
        pairs_per_s: measured.per_second(),
        p50_ms: measured.latency.p50_ms,
        p99_ms: measured.latency.p99_ms,
        max_ms: measured.latency.max_ms,
        pairs: measured.operations,
        busy: measured.errors,
        concurrency: args.shape.concurrency,
        duration_s: args.shape.duration,
    };
    println!(
        "bench-lock {} ({:?} keys): {:.0} pairs/s  p50 {:.3} ms  p99 {:.3} ms  max {:.2} ms  ({} pairs, {} busy, concurrency {})",
        result.mode, spread, result.pairs_per_s, result.p50_ms, result.p99_ms, result.max_ms,
        result.pairs, result.busy, result.concurrency
    );
    write_json(args.shape.json.as_ref(), &result)?;
    Ok(result)
}
