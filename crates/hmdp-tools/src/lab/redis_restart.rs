//! `hmdp lab redis-restart --seckill stream [--redis-aof]`: what a Redis
//! restart costs the asynchronous purchase, without and with persistence.
//!
//! A private `redis-server` (no persistence, or `--redis-aof`: append-only
//! file, fsync on every write). node1 runs `--seckill stream` with a writer
//! that holds each transaction open 5 s; twelve users buy, node1's consumer
//! reads their orders and is SIGKILLed before writing them: the orders are
//! in the stream only. Redis is restarted, then node1. Without persistence
//! the stream, the buyers and the pending orders are gone; node1's start
//! rebuilds stock and buyers from MySQL, which never saw the orders: the
//! buyers were told success and have none. With AOF the stream comes back
//! with its pending entries, node1 claims them, every order is written.

use std::time::Duration;

use clap::Args;
use hmdp::config::{RedisSettings, SeckillMode};
use hmdp_test_support::RedisServer;

use super::harness::Lab;
use super::sale::SaleStage;
use super::SaleLabArgs;
use crate::loadtest::Drain;

/// `hmdp lab redis-restart`.
#[derive(Debug, Clone, Args)]
pub struct RedisRestartArgs {
    #[command(flatten)]
    pub sale: SaleLabArgs,

    /// The purchase path whose orders are on their way when Redis restarts
    /// (the scenario runs `stream`, the one that keeps them in Redis).
    #[arg(long, value_enum, default_value_t = SeckillMode::Stream)]
    pub seckill: SeckillMode,

    /// Run the private Redis with an append-only file fsynced on every write
    /// (`--appendonly yes --appendfsync always`).
    #[arg(long)]
    pub redis_aof: bool,
}

const BUYERS: usize = 12;
const WRITER_HOLD_MS: u64 = 5000;
const CLAIM_IDLE: &str = "--stream-claim-idle-ms=500";
const DRAIN_DEADLINE: Duration = Duration::from_secs(20);

pub(super) async fn run(lab: &Lab, args: &RedisRestartArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        args.seckill == SeckillMode::Stream,
        "redis-restart shows what --seckill stream keeps in Redis; run it with --seckill stream"
    );
    // Declared before the stage, so it outlives the nodes and the sandbox.
    let mut redis = private_redis(lab, args.redis_aof).await?;
    let mut stage = SaleStage::open(&args.sale, &RedisSettings::at(redis.url()), 1).await?;
    stage
        .start_node(lab, 0, SeckillMode::Stream, WRITER_HOLD_MS, &[CLAIM_IDLE])
        .await?;
    let told_success = stage.sell(lab, 0, BUYERS).await?;
    let (pending, streamed) = stage.on_their_way().await?;
    lab.say(
        "redis",
        format!("{streamed} order(s) in the stream, {pending} pending; none written yet"),
    );
    stage.kill_node(lab, 0).await;

    redis.restart().await?;
    say_what_redis_kept(lab, &stage).await?;
    stage
        .start_node(lab, 0, SeckillMode::Stream, 0, &[CLAIM_IDLE])
        .await?;
    if let Some(sale) = stage.sale_state.read(stage.voucher()).await? {
        lab.say(
            "redis",
            format!(
                "sale after node1's start: initial {}, stock {}, {} buyers",
                sale.initial,
                sale.stock,
                sale.buyers.len()
            ),
        );
    }
    if let Drain::Stuck(pending) = stage.drain(DRAIN_DEADLINE).await? {
        lab.say("redis", format!("{pending} order(s) still pending"));
    }
    let (lost, _) = stage.judge(lab, told_success).await?;
    Ok(explanation(lost, args.redis_aof))
}

/// The run's own `redis-server`, to restart: without persistence, or with
/// the append-only file of `--redis-aof`.
async fn private_redis(lab: &Lab, aof: bool) -> anyhow::Result<RedisServer> {
    let persistence: &[&str] = if aof {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &[]
    };
    let redis = RedisServer::start_with(persistence).await?;
    lab.say(
        "redis",
        format!(
            "private redis-server :{}, {}",
            redis.port(),
            if aof {
                "append-only file fsynced on every write"
            } else {
                "no persistence"
            }
        ),
    );
    Ok(redis)
}

async fn say_what_redis_kept(lab: &Lab, stage: &SaleStage) -> anyhow::Result<()> {
    let voucher = stage.voucher();
    let sale = stage.sale_state.read(voucher).await;
    // The first command after the restart may meet the old connection.
    let sale = match sale {
        Ok(sale) => sale,
        Err(_) => stage.sale_state.read(voucher).await?,
    };
    let (pending, streamed) = stage.on_their_way().await?;
    lab.say(
        "redis",
        match sale {
            Some(sale) => format!(
                "restarts with its data: stock {}, {} buyers, {streamed} order(s) in the \
                 stream, {pending} pending",
                sale.stock,
                sale.buyers.len()
            ),
            None => format!(
                "restarts empty: no sale, no buyers, {streamed} order(s) in the stream, \
                 {pending} pending"
            ),
        },
    );
    Ok(())
}

/// The scenario's explanation, given that `lost` buyers told success have
/// no order.
fn explanation(lost: i64, aof: bool) -> String {
    if lost > 0 {
        format!(
            "Without persistence Redis came back empty: the {lost} orders that lived only \
             in the stream are gone, and the sale was rebuilt from MySQL (stock and buyers \
             as if they had never bought), so the audit finds Redis and MySQL agreeing — \
             only the buyers' answers show the loss. Prevent it with an append-only file \
             fsynced on every write (--redis-aof: appendonly yes, appendfsync always), or \
             with WAIT for replicas after the admission, which a replica promoted on \
             failover then holds."
        )
    } else if aof {
        "The append-only file brought the stream back with its pending entries after \
         the restart; node1 claimed them and wrote every order once."
            .to_owned()
    } else {
        "Every order told success was written.".to_owned()
    }
}
