//! `hmdp bench-db`: the purchase transaction (count this user's orders,
//! insert, conditional stock update), the very code the purchase runs,
//! straight on MySQL, distinct users, no HTTP and no lock: the ceiling of
//! synchronous ordering on this database.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::{timed_loop, write_json, RunShape};
use crate::latency::Latency;
use hmdp::after_sale::{PayDeadlines, DEFAULT_PAY_TIMEOUT};
use hmdp::config::connect_redis;
use hmdp::config::StoreSettings;
use hmdp::ids::{OrderId, UserId};
use hmdp::keys::Keys;
use hmdp::seckill::{Locks, Seckill};
use hmdp::store::{self, NewOrder, NewSeckillVoucher, NewVoucher, Store};
use hmdp_lock::teaching::NoLock;
use hmdp_lock::DistributedLock;

#[derive(Debug, Clone, Args)]
pub struct BenchDbArgs {
    #[command(flatten)]
    pub store: StoreSettings,

    #[command(flatten)]
    pub shape: RunShape,
}

#[derive(Debug, Serialize)]
pub struct BenchDbResult {
    pub tx_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Committed in the measured seconds.
    pub transactions: u64,
    /// Committed in the whole run, the warm-up second's included: the
    /// count to divide CPU read around the process by.
    pub all_transactions: u64,
    pub errors: u64,
    pub concurrency: usize,
    pub duration_s: u64,
}

/// Users of the benchmark: far above any real user id, so the benchmark's
/// orders never mix with a real user's.
const FIRST_BENCH_USER: u64 = 9_000_000_000_000;

pub async fn run(args: BenchDbArgs) -> anyhow::Result<BenchDbResult> {
    store::create_database_if_missing(&args.store.database.url).await?;
    let pool_size = u32::try_from(args.shape.concurrency)?.max(1);
    let db = Store::connect_lazy(
        &args.store.database.url,
        pool_size,
        args.store.backend_timeout(),
    )?;
    db.migrate().await?;
    let voucher_id = db
        .insert_seckill_voucher(&bench_voucher(), &NewSeckillVoucher::open_now(i32::MAX))
        .await?;

    let next_order_id = Arc::new(AtomicI64::new(chrono::Utc::now().timestamp_micros() << 8));
    // The purchase's own transaction, with no lock: the id worker is only
    // asked should an id be taken (the benchmark draws its own ids).
    let redis = connect_redis(&args.store.redis.url, args.store.backend_timeout())?;
    let keys = Keys::new(args.store.redis.prefix.clone());
    let seckill = Arc::new(Seckill::new(
        db.clone(),
        Arc::new(NoLock),
        redis.clone(),
        keys.clone(),
        PayDeadlines::new(redis, &keys, DEFAULT_PAY_TIMEOUT),
        Duration::ZERO,
    ));
    let measured = {
        let seckill = seckill.clone();
        timed_loop(&args.shape, move |task, i| {
            let seckill = seckill.clone();
            let id = OrderId::new(next_order_id.fetch_add(1, Ordering::Relaxed));
            let user_id = UserId::new(FIRST_BENCH_USER + ((task as u64) << 32) + i);
            async move {
                let held = NoLock.acquire("").await.ok().flatten();
                match held {
                    Some(held) => {
                        let order = NewOrder::unsequenced(id, user_id, voucher_id);
                        let locks = Locks::one(user_id, held);
                        seckill.write_alone(order, &locks, None).await.is_ok()
                    }
                    None => false,
                }
            }
        })
        .await
    };

    // Its Redis state too, should a `queue` or `stream` node have loaded it.
    seckill.sale_state().delete_voucher(voucher_id).await?;

    let Latency {
        p50_ms,
        p99_ms,
        max_ms,
        ..
    } = measured.latency;
    let result = BenchDbResult {
        tx_per_s: measured.per_second(),
        p50_ms,
        p99_ms,
        max_ms,
        transactions: measured.operations,
        all_transactions: measured.all_operations,
        errors: measured.errors,
        concurrency: args.shape.concurrency,
        duration_s: args.shape.duration,
    };
    println!(
        "bench-db: {:.0} tx/s  p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  ({} tx, {} errors, concurrency {})",
        result.tx_per_s, p50_ms, p99_ms, max_ms, result.transactions, result.errors, result.concurrency
    );
    write_json(args.shape.json.as_ref(), &result)?;
    Ok(result)
}

pub(super) fn bench_voucher() -> NewVoucher {
    // Of no shop and off the shelves (status 2): listed nowhere.
    NewVoucher {
        shop_id: 0,
        status: 2,
        ..NewVoucher::flash_sale("bench-db")
    }
}
