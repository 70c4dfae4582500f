//! `hmdp lab queue-crash`: the course's V5 loses orders when its node dies.
//!
//! One node in `--seckill queue` whose writer holds each transaction open
//! 300 ms. Twenty users buy at once: Redis admits them all and each is
//! answered an order id, while the orders wait in the node's in-process
//! queue. The node is SIGKILLed a moment later: the orders still queued are
//! gone. Their buyers were told success, Redis counts them as sold (and
//! pending forever), and MySQL has no order for them.

use std::time::Duration;

use hmdp::config::SeckillMode;

use super::harness::Lab;
use super::sale::SaleStage;
use super::SaleLabArgs;

const BUYERS: usize = 20;
const WRITER_HOLD_MS: u64 = 300;
/// How long the node lives after the last answer: a couple of orders written.
const KILL_AFTER: Duration = Duration::from_millis(700);

pub(super) async fn run(lab: &Lab, args: &SaleLabArgs) -> anyhow::Result<String> {
    let mut stage = SaleStage::open(args, &args.lab.redis, 1).await?;
    stage
        .start_node(lab, 0, SeckillMode::Queue, WRITER_HOLD_MS, &[])
        .await?;
    let told_success = stage.sell(lab, 0, BUYERS).await?;
    tokio::time::sleep(KILL_AFTER).await;
    let (written, _) = stage.orders().await?;
    lab.say(
        "mysql",
        format!(
            "{written} order(s) written; {} still in node1's queue",
            told_success as i64 - written
        ),
    );
    stage.kill_node(lab, 0).await;
    // Nothing is left to write them: wait as long as the writer would have
    // needed, then count.
    tokio::time::sleep(Duration::from_millis(WRITER_HOLD_MS * 3)).await;
    let (orders, _) = stage.orders().await?;
    let (pending, _) = stage.on_their_way().await?;
    lab.say(
        "mysql",
        format!("{orders} order(s) of voucher {}", stage.voucher()),
    );
    lab.say(
        "redis",
        format!("{pending} order(s) still pending: admitted, and no process left holds them"),
    );
    let lost = told_success as i64 - orders;
    if lost > 0 {
        lab.fail(
            "buyers",
            format!("{lost} of {told_success} buyers told success have no order"),
        );
    }
    Ok(if lab.broken() {
        format!(
            "queue mode keeps admitted orders only in the node's memory: the {lost} \
             still queued died with it. --seckill stream keeps them in Redis until a \
             consumer has written them (hmdp lab stream-crash)."
        )
    } else {
        "Every admitted order was written before the node died.".to_owned()
    })
}
