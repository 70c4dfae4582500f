//! `hmdp lab pay-vs-close`: a close that reads the order's status and
//! writes later closes an order paid in between; the project's close, one
//! conditional update, has no in between.
//!
//! A voucher of stock 1; A buys it through node1 and leaves the order
//! unpaid. A cancels it on node1 and pays it on node2 (two devices): node1
//! takes the cancel and a GC pause holds its write back 200 ms; A's payment
//! lands on node2 100 ms in; node1 writes at 200 ms; B buys through node2 at
//! 300 ms. The naive close SELECTed the order unpaid before the payment, so
//! it closes the paid order and gives its unit back, and B buys it: A paid
//! for nothing and one unit is sold twice. The conditional close (`… AND
//! status = 1`) finds the order paid and changes nothing; B is refused.

use std::time::Duration;

use anyhow::Context;
use hmdp::after_sale::DEFAULT_PAY_TIMEOUT;
use hmdp::store::{CloseCause, OrderState, Store};

use super::after_sale::{Close, CloseLabArgs, Stage, A, B};
use super::harness::Lab;

/// How long node1's write is held back after it took the cancel.
const STALL_MS: u64 = 200;
/// When A's payment lands, after node1 took the cancel: inside the stall.
const PAY_AFTER_MS: u64 = 100;
/// When B buys, once node1's close wrote.
const B_AFTER_MS: u64 = 300;

pub(super) async fn run(lab: &Lab, store: &Store, args: &CloseLabArgs) -> anyhow::Result<String> {
    let close = Close::of(args.conditional_close);
    let stage = Stage::open(lab, store, DEFAULT_PAY_TIMEOUT, Duration::ZERO).await?;
    let [node1, node2] = &stage.nodes;
    let order = stage.buy(&A, node1).await?.context("A could not buy")?;

    let start = lab.soon();
    let cancel = async {
        lab.at(start).await;
        lab.say(
            node1.name,
            format!(
                "takes A's cancel of order {order}; a GC pause will hold its write back \
                 {STALL_MS} ms"
            ),
        );
        stage
            .close_at(
                close,
                node1,
                &A,
                order,
                CloseCause::Cancel,
                start + STALL_MS,
            )
            .await
    };
    let pay = async {
        lab.at(start + PAY_AFTER_MS).await;
        stage.pay(&A, node2, order).await
    };
    tokio::try_join!(cancel, pay)?;
    lab.at(start + B_AFTER_MS).await;
    let resold = stage.buy(&B, node2).await?.is_some();

    let ended = stage.order(order, &A).await?.context("A's order is gone")?;
    let paid = ended.pay_time.is_some();
    if paid && ended.status == OrderState::Closed as u8 {
        let sold_again = if resold {
            ", and its unit was sold again to B"
        } else {
            ""
        };
        lab.fail(
            "A",
            format!("paid for order {order}, which is closed{sold_again}"),
        );
    }
    stage.judge().await?;
    Ok(if lab.broken() {
        format!(
            "node1 checked the status with a SELECT and wrote {STALL_MS} ms later with \
             `UPDATE … WHERE id = ?`; the payment landed in between, so the close undid a \
             paid order and put its unit back on sale. The check has to be the write's own \
             condition: `UPDATE … SET status = 4 WHERE id = ? AND status = 1` \
             (--conditional-close), of which InnoDB's row lock lets exactly one of a payment \
             and a close win."
        )
    } else if paid {
        "node1's close is one conditional update (`… AND status = 1`): after the payment it \
         changed no row and gave nothing back. Before the payment it would have closed the \
         order, and the payment's own `… AND status = 1` would have found it closed: either \
         way exactly one wins."
            .to_owned()
    } else {
        "The close won and the payment was refused: nothing paid was closed.".to_owned()
    })
}
