//! `hmdp lab stream-crash`: the course's V6 survives a consumer dying with
//! orders in hand.
//!
//! node1 runs `--seckill stream` with a writer that holds each batch's
//! transaction open 5 s. Twenty users buy; node1's consumer reads orders and
//! holds them, unacknowledged, and is SIGKILLed mid-transaction (which MySQL
//! rolls back). node2 starts: it reads what node1 had not read yet, and
//! after `--stream-claim-idle-ms` claims what node1 held (`XAUTOCLAIM`).
//! Every order is written exactly once.

use std::time::Duration;

use hmdp::config::SeckillMode;

use super::harness::Lab;
use super::sale::SaleStage;
use super::SaleLabArgs;
use crate::loadtest::Drain;

const BUYERS: usize = 20;
const WRITER_HOLD_MS: u64 = 5000;
const CLAIM_IDLE: &str = "--stream-claim-idle-ms=1000";
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

pub(super) async fn run(lab: &Lab, args: &SaleLabArgs) -> anyhow::Result<String> {
    let mut stage = SaleStage::open(args, &args.lab.redis, 2).await?;
    stage
        .start_node(lab, 0, SeckillMode::Stream, WRITER_HOLD_MS, &[CLAIM_IDLE])
        .await?;
    let told_success = stage.sell(lab, 0, BUYERS).await?;
    let (read, entries) = wait_for_delivery(&stage).await?;
    lab.say(
        "redis",
        format!(
            "entries node1's consumer read and holds unacknowledged: {read}; not read \
             yet: {}",
            entries - read
        ),
    );
    stage.kill_node(lab, 0).await;
    let (written, _) = stage.orders().await?;
    lab.say(
        "mysql",
        format!("{written} order(s) written: node1's open transaction died with it"),
    );
    stage
        .start_node(lab, 1, SeckillMode::Stream, 0, &[CLAIM_IDLE])
        .await?;
    match stage.drain(DRAIN_DEADLINE).await? {
        Drain::Drained(took) => lab.say(
            "node2",
            format!(
                "reads the rest, claims node1's idle entries, writes them: none pending \
                 {} ms after it started",
                took.as_millis()
            ),
        ),
        Drain::Stuck(pending) => lab.say(
            "redis",
            format!(
                "{pending} order(s) still pending after {} s",
                DRAIN_DEADLINE.as_secs()
            ),
        ),
    }
    let claimed = stage.metric(1, "hmdp_stream_claimed_total").await?;
    lab.say(
        "node2",
        format!("claims made (hmdp_stream_claimed_total): {claimed}"),
    );
    if claimed < read as f64 {
        lab.fail(
            "node2",
            format!("claimed {claimed} of the {read} entries node1 held"),
        );
    }
    let (_, audit) = stage.judge(lab, told_success).await?;
    if !audit.holds() {
        lab.fail("audit", "Redis and MySQL disagree");
    }
    Ok(if lab.broken() {
        "The orders node1 held were not written exactly once after it died.".to_owned()
    } else {
        "node1 died holding entries unacknowledged; they stayed in the group's \
         pending list, node2 claimed them once idle and wrote each, skipping none and \
         none twice (the write is idempotent on the order id)."
            .to_owned()
    })
}

/// Waits until node1's consumer holds entries read and unacknowledged, at
/// most 10 s; returns them and the stream's length.
async fn wait_for_delivery(stage: &SaleStage) -> anyhow::Result<(i64, i64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (read, entries) = stage.stream_entries().await?;
        if read > 0 {
            return Ok((read, entries));
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "node1's consumer read nothing within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
