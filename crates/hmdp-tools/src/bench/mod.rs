//! Micro-benchmarks of the two halves of a purchase: the lock alone
//! (`bench-lock`) and the SQL transaction alone (`bench-db`). Both run a
//! fixed number of concurrent tasks for a fixed time and report throughput
//! and latency percentiles, readable or as JSON. And the `stream` nodes'
//! consumers draining a backlog (`bench-drain`).

mod db;
mod drain;
mod lock;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::latency::Latency;

pub use db::{run as bench_db, BenchDbArgs};
pub use drain::{run as bench_drain, BenchDrainArgs};
pub use lock::{run as bench_lock, BenchLockArgs};

/// How long and how wide a benchmark runs.
#[derive(Debug, Clone, Args)]
pub struct RunShape {
    /// Concurrent tasks.
    #[arg(long, default_value_t = 50)]
    pub concurrency: usize,

    /// Seconds to measure (after a one-second warm-up).
    #[arg(long, default_value_t = 5)]
    pub duration: u64,

    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What a timed loop measured.
pub struct Measured {
    pub operations: u64,
    /// The operations that succeeded from the start, the warm-up's
    /// included: what CPU read around the whole run was spent on.
    pub all_operations: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency: Latency,
}

impl Measured {
    pub fn per_second(&self) -> f64 {
        self.operations as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs `operation(task, i)` in `shape.concurrency` tasks, first for a
/// one-second warm-up (not counted), then for `shape.duration` seconds,
/// recording each operation's latency. An operation returns whether it
/// succeeded.
pub async fn timed_loop<F, Fut>(shape: &RunShape, operation: F) -> Measured
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let operation = Arc::new(operation);
    let warm_up = Duration::from_secs(1);
    let started = Instant::now();
    let measure_from = started + warm_up;
    let stop_at = measure_from + Duration::from_secs(shape.duration);
    let tasks: Vec<_> = (0..shape.concurrency)
        .map(|task| {
            let operation = operation.clone();
            tokio::spawn(async move {
                let mut histogram = new_histogram();
                let (mut ok, mut errors, mut i, mut all_ok) = (0u64, 0u64, 0u64, 0u64);
                loop {
                    let begun = Instant::now();
                    if begun >= stop_at {
                        break;
                    }
                    let succeeded = operation(task, i).await;
                    i += 1;
                    all_ok += u64::from(succeeded);
                    if begun >= measure_from {
                        let micros = begun.elapsed().as_micros() as u64;
                        histogram.saturating_record(micros.max(1));
                        if succeeded {
                            ok += 1;
                        } else {
                            errors += 1;
                        }
                    }
                }
                (histogram, ok, errors, all_ok)
            })
        })
        .collect();
    let mut histogram = new_histogram();
    let (mut operations, mut errors, mut all_operations) = (0, 0, 0);
    for task in tasks {
        let (h, ok, failed, all_ok) = task.await.expect("benchmark task panicked");
        histogram.add(h).expect("same histogram bounds");
        operations += ok;
        errors += failed;
        all_operations += all_ok;
    }
    Measured {
        operations,
        all_operations,
        errors,
        elapsed: Duration::from_secs(shape.duration),
        latency: Latency::of(&histogram),
    }
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 60 s at 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Writes `result` as pretty JSON when a path was given.
pub fn write_json<T: Serialize>(path: Option<&PathBuf>, result: &T) -> anyhow::Result<()> {
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(result)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
