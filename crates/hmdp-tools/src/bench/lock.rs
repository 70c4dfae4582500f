//! `hmdp bench-lock`: acquire+release pairs per second and pair latency for
//! one lock mode against the configured Redis, on distinct keys (no
//! contention) or one hot key (hand-off between holders).
//!
//! On one hot key (with a lock wait) it then measures the hand-off alone: a
//! holder releases while one waiter is blocked on the key, and the time from
//! the release returning to the waiter's acquisition returning is counted in
//! milliseconds and in Redis round trips. The unit is the median acquisition
//! of a free key, measured in the same rounds: one round trip of the lock's
//! own command, client work included (a `PING` is reported too). A waiter
//! woken by a release message needs the message's way plus one round trip;
//! one that polls sleeps first.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use hmdp_lock::{Connection, DistributedLock};
use redis::Script;
use serde::Serialize;

use super::{new_histogram, timed_loop, write_json, Measured, RunShape};
use hmdp::config::connect_redis;
use hmdp::config::{LockSettings, RedisSettings, TimeoutSettings};

/// Hand-offs measured after a hot-key run.
const HANDOFF_ROUNDS: usize = 500;
/// How long the holder keeps the key once the waiter has started waiting:
/// long enough for the waiter to have tried once and gone to sleep.
const HANDOFF_HOLD: Duration = Duration::from_millis(3);

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
    pub redis: RedisSettings,

    #[command(flatten)]
    pub timeout: TimeoutSettings,

    #[command(flatten)]
    pub lock: LockSettings,

    #[command(flatten)]
    pub shape: RunShape,

    /// Which keys the tasks lock.
    #[arg(long, value_enum, default_value_t = KeySpread::Distinct)]
    pub keys: KeySpread,

    /// Run the same loop without the lock crate, as bare redis-rs commands
    /// on the same connection: per pair `SET key token NX PX`, then
    /// `EVALSHA` of a compare-and-delete (what `redis-lua` sends). The
    /// client library's own cost: the lock's figures divided by these say
    /// what the lock adds. `--lock` is then ignored.
    #[arg(long, default_value_t = false)]
    pub baseline: bool,

    /// The one Redis connection every task shares: `reconnecting`, redis-rs's
    /// `ConnectionManager`, as each thread of a node runs one (it reconnects
    /// by itself, for a little work per command), or `multiplexed`, a plain
    /// `MultiplexedConnection`. On a Redis Cluster URL (`redis+cluster://`):
    /// `reconnecting`, which is then redis-rs's cluster connection.
    #[arg(long, value_enum, default_value_t = ConnectionKind::Reconnecting)]
    pub connection: ConnectionKind,
}

/// Which redis-rs connection the benchmark shares between its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionKind {
    /// `ConnectionManager`, with the nodes' timeouts.
    Reconnecting,
    /// A plain `MultiplexedConnection`, with the same timeouts.
    Multiplexed,
}

#[derive(Debug, Serialize)]
pub struct BenchLockResult {
    pub mode: String,
    pub keys: KeySpread,
    pub connection: ConnectionKind,
    pub pairs_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub pairs: u64,
    /// Acquisitions that found the key busy past the wait (hot key only).
    pub busy: u64,
    pub concurrency: usize,
    pub duration_s: u64,
    /// Hot key with a lock wait only: median time from a release returning
    /// to the waiting next holder's acquisition returning.
    pub handoff_p50_ms: Option<f64>,
    /// Hot key with a lock wait only: median acquisition of a free key, the
    /// unit of `handoff_round_trips`.
    pub acquire_p50_ms: Option<f64>,
    /// Hot key with a lock wait only: median `PING` on the same connection.
    pub ping_p50_ms: Option<f64>,
    /// Hot key with a lock wait only: the median hand-off in round trips.
    pub handoff_round_trips: Option<f64>,
}

/// Median hand-off and round trips, in milliseconds.
struct Handoff {
    gap_p50_ms: f64,
    /// Acquiring a free key: one round trip of the lock's command.
    acquire_p50_ms: f64,
    ping_p50_ms: f64,
}

/// One holder, one waiter, `HANDOFF_ROUNDS` times: the waiter starts waiting,
/// the holder releases, and the gap from the release returning to the
/// waiter's acquisition returning is recorded, next to a `PING` round trip.
async fn measure_handoffs(
    lock: Arc<dyn DistributedLock>,
    mut redis: Connection,
    key: &str,
) -> anyhow::Result<Handoff> {
    let (mut gaps, mut acquires, mut pings) = (new_histogram(), new_histogram(), new_histogram());
    let micros = |since: Instant| (since.elapsed().as_micros() as u64).max(1);
    let free_key = format!("{key}:free");
    for _ in 0..HANDOFF_ROUNDS {
        let sent = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut redis).await?;
        pings.saturating_record(micros(sent));
        let sent = Instant::now();
        let free = lock
            .acquire(&free_key)
            .await?
            .context("the free key is busy")?;
        acquires.saturating_record(micros(sent));
        free.release().await?;

        let holder = lock
            .acquire(key)
            .await?
            .context("the hand-off key is busy")?;
        let waiter = {
            let (lock, key) = (lock.clone(), key.to_owned());
            tokio::spawn(async move {
                let held = lock.acquire(&key).await;
                (Instant::now(), held)
            })
        };
        tokio::time::sleep(HANDOFF_HOLD).await;
        holder.release().await?;
        let released = Instant::now();
        let (acquired, held) = waiter.await?;
        let held = held?.context("the waiter gave up: raise --lock-wait-ms")?;
        gaps.saturating_record(
            (acquired.saturating_duration_since(released).as_micros() as u64).max(1),
        );
        held.release().await?;
    }
    let p50 =
        |histogram: &hdrhistogram::Histogram<u64>| histogram.value_at_quantile(0.5) as f64 / 1000.0;
    Ok(Handoff {
        gap_p50_ms: p50(&gaps),
        acquire_p50_ms: p50(&acquires),
        ping_p50_ms: p50(&pings),
    })
}

/// The compare-and-delete of the baseline loop: the textbook script, as
/// short as such a release can be.
static COMPARE_AND_DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0",
    )
});

/// One pair of the baseline: take the key with a token, give it back if
/// still ours.
async fn bare_pair(mut redis: Connection, key: &str, token: &str) -> bool {
    let taken: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut redis)
        .await;
    if !matches!(taken, Ok(Some(_))) {
        return false;
    }
    let released: redis::RedisResult<i64> = COMPARE_AND_DELETE
        .key(key)
        .arg(token)
        .invoke_async(&mut redis)
        .await;
    matches!(released, Ok(1))
}

pub async fn run(args: BenchLockArgs) -> anyhow::Result<BenchLockResult> {
    args.lock.ensure_fits(&args.timeout)?;
    let redis = connect_redis(&args.redis.url, args.timeout.backend_timeout())?;
    let shared = shared_connection(&args, &redis).await?;
    let lock = hmdp::startup::build_lock(&args.lock, shared.clone(), &args.redis.url)?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("{}bench:lock:{run_id}", args.redis.prefix);
    let keys = task_keys(&prefix, args.keys, args.shape.concurrency);
    let measured = if args.baseline {
        measure_bare(&args.shape, shared, keys, run_id).await
    } else {
        measure_lock(&args.shape, lock.clone(), keys).await
    };
    let handoff = if !args.baseline && args.keys == KeySpread::One && !args.lock.wait().is_zero() {
        Some(measure_handoffs(lock, redis, &format!("{prefix}:handoff")).await?)
    } else {
        None
    };
    let result = BenchLockResult::of(&args, &measured, handoff.as_ref());
    report(&result, handoff.as_ref());
    write_json(args.shape.json.as_ref(), &result)?;
    Ok(result)
}

/// The one connection every task shares, of the kind `--connection` asks
/// for.
async fn shared_connection(args: &BenchLockArgs, redis: &Connection) -> anyhow::Result<Connection> {
    Ok(match args.connection {
        ConnectionKind::Reconnecting => redis.clone(),
        ConnectionKind::Multiplexed => {
            anyhow::ensure!(
                hmdp_lock::connection::cluster_nodes(&args.redis.url).is_none(),
                "--connection multiplexed takes one server's URL; on a Redis Cluster the \
                 cluster connection is the one there is (--connection reconnecting)"
            );
            // The nodes' timeouts, as the reconnecting connection has them.
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(args.timeout.backend_timeout()))
                .set_response_timeout(Some(args.timeout.backend_timeout()));
            redis::Client::open(args.redis.url.as_str())?
                .get_multiplexed_async_connection_with_config(&config)
                .await?
                .into()
        }
    })
}

/// Each task's key, built once per task, not per pair: the benchmark
/// measures the lock, not string formatting.
fn task_keys(prefix: &str, spread: KeySpread, tasks: usize) -> Arc<Vec<String>> {
    Arc::new(
        (0..tasks)
            .map(|task| match spread {
                KeySpread::Distinct => format!("{prefix}:{task}"),
                KeySpread::One => format!("{prefix}:hot"),
            })
            .collect(),
    )
}

/// The pairs of `--baseline`: bare redis-rs commands, the run's id as
/// every task's token.
async fn measure_bare(
    shape: &RunShape,
    bare: Connection,
    keys: Arc<Vec<String>>,
    run_id: String,
) -> Measured {
    let token = Arc::new(run_id);
    timed_loop(shape, move |task, _| {
        let (bare, keys, token) = (bare.clone(), keys.clone(), token.clone());
        async move { bare_pair(bare, &keys[task], &token).await }
    })
    .await
}

/// The lock's own pairs: acquire, then release what was acquired.
async fn measure_lock(
    shape: &RunShape,
    lock: Arc<dyn DistributedLock>,
    keys: Arc<Vec<String>>,
) -> Measured {
    timed_loop(shape, move |task, _| {
        let (lock, keys) = (lock.clone(), keys.clone());
        async move {
            match lock.acquire(&keys[task]).await {
                Ok(Some(held)) => held.release().await.is_ok(),
                Ok(None) | Err(_) => false,
            }
        }
    })
    .await
}

impl BenchLockResult {
    fn of(args: &BenchLockArgs, measured: &Measured, handoff: Option<&Handoff>) -> BenchLockResult {
        BenchLockResult {
            mode: if args.baseline {
                "bare redis-rs".to_owned()
            } else {
                args.lock.mode.to_string()
            },
            keys: args.keys,
            connection: args.connection,
            pairs_per_s: measured.per_second(),
            p50_ms: measured.latency.p50_ms,
            p99_ms: measured.latency.p99_ms,
            max_ms: measured.latency.max_ms,
            pairs: measured.operations,
            busy: measured.errors,
            concurrency: args.shape.concurrency,
            duration_s: args.shape.duration,
            handoff_p50_ms: handoff.map(|h| h.gap_p50_ms),
            acquire_p50_ms: handoff.map(|h| h.acquire_p50_ms),
            ping_p50_ms: handoff.map(|h| h.ping_p50_ms),
            handoff_round_trips: handoff.map(|h| h.gap_p50_ms / h.acquire_p50_ms),
        }
    }
}

/// The result on one line; the hand-off, when measured, on a second.
fn report(result: &BenchLockResult, handoff: Option<&Handoff>) {
    println!(
        "bench-lock {} ({:?} keys, {:?} connection): {:.0} pairs/s  p50 {:.3} ms  p99 {:.3} ms  max {:.2} ms  ({} pairs, {} busy, concurrency {})",
        result.mode, result.keys, result.connection, result.pairs_per_s, result.p50_ms, result.p99_ms, result.max_ms,
        result.pairs, result.busy, result.concurrency
    );
    if let Some(&Handoff {
        gap_p50_ms,
        acquire_p50_ms,
        ping_p50_ms,
    }) = handoff
    {
        println!(
            "hand-off: p50 {gap_p50_ms:.3} ms from a release to the waiting next holder = {:.2} round trips \
             (free-key acquisition p50 {acquire_p50_ms:.3} ms; PING p50 {ping_p50_ms:.3} ms; {HANDOFF_ROUNDS} rounds)",
            gap_p50_ms / acquire_p50_ms
        );
    }
}
