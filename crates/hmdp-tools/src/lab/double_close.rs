//! `hmdp lab double-close`: two nodes' timers closing one unpaid order
//! each give its unit back, and the unit is sold twice; the project's
//! conditional close lets one of them close it.
//!
//! A voucher of stock 1; A buys it and leaves the order unpaid past its 1 s
//! deadline. Both nodes' timers fire for it at the same moment, and 100 ms
//! later both close it. The naive closers each SELECT it unpaid, then each
//! `UPDATE … SET status = 4 WHERE id = ?`, put the unit back in MySQL's
//! stock and HINCRBY the Redis stock: two units for one. B and C then buy,
//! and both get one. Two `AfterSale`s closing at once (`--conditional-close`)
//! race for the row: one update changes it, the other changes nothing and
//! gives nothing back; B buys the unit and C is refused.

use std::time::Duration;

use anyhow::Context;
use hmdp::store::{CloseCause, Store};

use super::after_sale::{Close, CloseLabArgs, Stage, A, B, C};
use super::harness::Lab;

/// The nodes' pay timeout: short, so that the order is due soon.
const PAY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long after their timers fired the nodes write their close.
const WRITE_AFTER_MS: u64 = 100;

pub(super) async fn run(lab: &Lab, store: &Store, args: &CloseLabArgs) -> anyhow::Result<String> {
    let close = Close::of(args.conditional_close);
    let stage = Stage::open(lab, store, PAY_TIMEOUT, Duration::ZERO).await?;
    let [node1, node2] = &stage.nodes;
    let order = stage.buy(&A, node1).await?.context("A could not buy")?;
    stage.past_deadline(&A, order).await?;

    let start = lab.soon();
    let stage = &stage;
    let timers = stage.nodes.iter().map(|node| async move {
        lab.at(start).await;
        lab.say(node.name, format!("its timer fires for order {order}"));
        let write_at = start + WRITE_AFTER_MS;
        stage
            .close_at(close, node, &A, order, CloseCause::Timeout, write_at)
            .await
    });
    futures::future::try_join_all(timers).await?;
    stage.show().await?;

    let b = stage.buy(&B, node1).await?;
    let c = stage.buy(&C, node2).await?;
    if b.is_some() && c.is_some() {
        lab.fail("buyers", "B and C both bought the voucher's one unit");
    }
    stage.judge().await?;
    Ok(if lab.broken() {
        "Both timers saw the order unpaid and each closed it with `UPDATE … WHERE id = ?`; \
         each returned the unit, to MySQL and to Redis, so the one unit was sold twice. \
         The project's close (--conditional-close) changes the row only while it is \
         unpaid, so the second closer changes nothing and gives nothing back; its \
         give-back to Redis is moreover keyed by the order id (lua/giveback.lua), so one \
         sent twice counts once."
            .to_owned()
    } else {
        "The two conditional updates raced for the order's row: one closed it and gave \
         the unit back, the other changed no row and gave nothing. One unit, sold once."
            .to_owned()
    })
}
