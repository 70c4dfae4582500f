//! `hmdp bench-drain`: how fast the `stream` nodes' consumers write orders
//! to MySQL when a backlog is waiting. It admits `--orders` orders of a fresh
//! voucher straight in Redis, with the nodes' own admission script and far
//! faster than HTTP could bring them, then times until MySQL holds them all:
//! the consumers' ceiling, where a sale through HTTP measures the admissions
//! whenever the consumers keep up with them. It checks that each order was
//! written once, then removes its voucher (rows, orders and Redis state), as
//! `bench-db` does. Run it on nodes with no other sale under way: the end
//! is read from the pending orders of every voucher.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::future::try_join_all;
use serde::Serialize;

use super::db::bench_voucher;
use super::write_json;
use hmdp::config::connect_redis;
use hmdp::config::StoreSettings;
use hmdp::ids::{UserId, VoucherId};
use hmdp::keys::Keys;
use hmdp::limits::Counting;
use hmdp::seckill::{Admission, SaleRef, SaleState};
use hmdp::shards::Layout;
use hmdp::store::{NewSeckillVoucher, Store};

#[derive(Debug, Clone, Args)]
pub struct BenchDrainArgs {
    /// The `stream` nodes' MySQL and Redis (with their --redis-prefix).
    #[command(flatten)]
    pub store: StoreSettings,

    /// Orders to admit, one per user.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub orders: u64,

    /// Admissions in flight at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,

    /// Give up when the orders are not all in MySQL after this long.
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,

    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct BenchDrainResult {
    /// The benchmark's voucher (its Redis state removed afterwards).
    pub voucher: VoucherId,
    pub orders: u64,
    /// Admissions per second, straight in Redis.
    pub admitted_per_s: f64,
    /// Orders already in MySQL when the last admission was answered.
    pub written_by_last_admission: i64,
    /// Orders written per second, from the first admission to the last
    /// order in MySQL.
    pub written_per_s: f64,
}

/// Users of the benchmark, far above any real user id (and bench-db's).
const FIRST_USER: u64 = 8_000_000_000_000;
/// How often the pending orders are counted.
const POLL: Duration = Duration::from_millis(10);

pub async fn run(args: BenchDrainArgs) -> anyhow::Result<BenchDrainResult> {
    let timeout = args.store.backend_timeout();
    let store = Store::connect_lazy(&args.store.database.url, 2, timeout)?;
    let redis = connect_redis(&args.store.redis.url, timeout)?;
    let keys = Keys::new(args.store.redis.prefix.clone());
    let sale = Arc::new(SaleState::new(redis, keys, store.clone()));
    let voucher = store
        .insert_seckill_voucher(&bench_voucher(), &NewSeckillVoucher::open_now(i32::MAX))
        .await
        .context("cannot create the benchmark's voucher (are the nodes' migrations applied?)")?;
    let measured = measure(&args, &store, &sale, voucher).await;
    // Removed whatever happened; a failed measurement still says why.
    let removed = sale.delete_voucher(voucher).await;
    let result = measured?;
    removed?;
    println!(
        "bench-drain: {} orders admitted in {:.2} s ({:.0}/s), {} of them in MySQL by then; \
         all in MySQL after {:.2} s: {:.0} orders/s written",
        result.orders,
        result.orders as f64 / result.admitted_per_s,
        result.admitted_per_s,
        result.written_by_last_admission,
        result.orders as f64 / result.written_per_s,
        result.written_per_s
    );
    write_json(args.json.as_ref(), &result)?;
    Ok(result)
}

/// Admits the orders, then waits until the consumers have written them
/// all. Done is read from the pending orders hash, which a consumer empties
/// of an order right after committing it (one `O(1)` read per poll, where
/// counting rows would load the MySQL being measured); then one audit
/// checks that each order was written once.
async fn measure(
    args: &BenchDrainArgs,
    store: &Store,
    sale: &Arc<SaleState>,
    voucher: VoucherId,
) -> anyhow::Result<BenchDrainResult> {
    sale.load(voucher).await?;
    let row = (store.seckill_voucher(voucher).await?).context("the benchmark's voucher is gone")?;
    let sale_ref = SaleRef {
        voucher_id: voucher,
        token: row.sale_token,
        layout: Layout::new(row.shards.into())?,
    };
    let orders = args.orders;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let admitters = (0..args.concurrency.min(orders)).map(|_| {
        let (sale, next) = (sale.clone(), next.clone());
        async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= orders {
                    return Ok::<_, anyhow::Error>(());
                }
                let user = UserId::new(FIRST_USER + n);
                let admitted = sale
                    .admit(user, &sale_ref, true, None, &mut Counting::Done)
                    .await?;
                anyhow::ensure!(
                    matches!(admitted, Admission::Admitted(..)),
                    "admission refused: {admitted:?}"
                );
            }
        }
    });
    try_join_all(admitters).await?;
    let admitted_in = started.elapsed();
    let written_by_last_admission = store.audit_voucher(voucher).await?.active_orders;

    let deadline = started + Duration::from_secs(args.timeout_secs);
    loop {
        let (pending, _) = sale.orders_on_their_way().await?;
        if pending == 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{pending} order(s) still pending after {} s: are `--seckill stream` nodes running \
             on this database and Redis prefix?",
            args.timeout_secs
        );
        tokio::time::sleep(POLL).await;
    }
    let written_in = started.elapsed();
    let expected = i64::try_from(orders)?;
    let audit = store.audit_voucher(voucher).await?;
    anyhow::ensure!(
        audit.active_orders == expected && audit.duplicate_users == 0,
        "{} orders in MySQL for {expected} admitted, {} users with two",
        audit.active_orders,
        audit.duplicate_users
    );
    Ok(BenchDrainResult {
        voucher,
        orders,
        admitted_per_s: orders as f64 / admitted_in.as_secs_f64(),
        written_by_last_admission,
        written_per_s: orders as f64 / written_in.as_secs_f64(),
    })
}
