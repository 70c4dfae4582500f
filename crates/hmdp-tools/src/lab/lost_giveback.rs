//! `hmdp lab lost-giveback`: a node killed between closing an order in
//! MySQL and returning its unit to Redis strands the unit, unless the close
//! recorded what Redis is owed.
//!
//! A voucher of stock 1; A buys it and leaves the order unpaid past its 1 s
//! deadline. node1's timer closes it: status 4 and stock + 1, committed;
//! node1 is killed before its call to Redis (the lab drops the close's
//! future there, as SIGKILL ends a process). Redis still counts the unit
//! sold: B is refused. node2's closer runs (it sends again every give-back
//! owed for 2 s), then B tries again. Naive: nothing recorded the give-back,
//! node2 has nothing to send, the unit stays stranded and B is refused.
//! With `--owed-giveback` (the project's close) the close's transaction
//! recorded it in `tb_order_giveback`; node2's closer sends it
//! (`lua/giveback.lua`) and B buys the unit.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hmdp::after_sale::Closer;
use hmdp::ids::OrderId;
use hmdp::store::{CloseCause, OrderState, Store};
use hmdp_test_support::poll_until;

use super::after_sale::{Node, Stage, A, B};
use super::harness::Lab;
use super::SaleLabArgs;

/// `hmdp lab lost-giveback`.
#[derive(Debug, Clone, Args)]
pub struct LostGivebackArgs {
    #[command(flatten)]
    pub sale: SaleLabArgs,

    /// Close as the project does: the transaction that closes the order and
    /// returns the unit to MySQL's stock also records the give-back owed to
    /// Redis (`tb_order_giveback`), which any node's closer sends again.
    /// Without it, the naive close: what Redis is owed lives only in the
    /// closing node's memory.
    #[arg(long)]
    pub owed_giveback: bool,
}

/// The nodes' pay timeout: short, so that the order is due soon.
const PAY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long node1 sits between its commit and its call to Redis: the lab
/// kills it there, long before it would go on.
const STALL: Duration = Duration::from_secs(60);
/// How long node2's closer runs: it sends what has been owed for 2 s (by
/// MySQL's clock, in whole seconds), looking once a second.
const CLOSER_RUNS: Duration = Duration::from_millis(3500);
/// How much longer it may take to send a give-back owed on a busy machine.
const SEND_DEADLINE: Duration = Duration::from_secs(10);
/// node2's sweep of unpaid orders past their deadline: nothing for it to
/// find here (its first runs at its start).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

pub(super) async fn run(
    lab: &Lab,
    store: &Store,
    args: &LostGivebackArgs,
) -> anyhow::Result<String> {
    let stage = Stage::open(lab, store, PAY_TIMEOUT, STALL).await?;
    let [node1, node2] = &stage.nodes;
    let order = stage.buy(&A, node1).await?.context("A could not buy")?;
    stage.past_deadline(&A, order).await?;
    close_and_die(lab, &stage, node1, order, args.owed_giveback).await?;
    stage.show().await?;
    stage.buy(&B, node2).await?;
    run_closer(lab, &stage, node2).await?;
    stage.show().await?;

    if stage.buy(&B, node2).await?.is_none() {
        lab.fail(
            "B",
            "is refused while MySQL has the unit in stock: the unit is stranded",
        );
    }
    stage.judge().await?;
    Ok(explanation(lab.broken()))
}

/// `node`'s timer closes `order`, as the project does with
/// `owed_giveback` or else naively, and `node` is killed between the
/// close's commit and its call to Redis.
async fn close_and_die(
    lab: &Lab,
    stage: &Stage<'_>,
    node: &Node,
    order: OrderId,
    owed_giveback: bool,
) -> anyhow::Result<()> {
    if owed_giveback {
        lab.say(
            node.name,
            format!(
                "its timer closes order {order}: conditional update, stock + 1 and the \
                 give-back owed (tb_order_giveback) in one transaction"
            ),
        );
        let close = node.after_sale.close(order, None, CloseCause::Timeout);
        let close = async {
            close.await?;
            Ok(())
        };
        killed_after_commit(lab, stage, node, order, close).await
    } else {
        lab.say(
            node.name,
            format!("its timer closes order {order}: MySQL first, then Redis"),
        );
        let close = async {
            stage.naive_close_in_mysql(node, order).await?;
            tokio::time::sleep(STALL).await;
            stage.naive_give_back(node, &A).await
        };
        killed_after_commit(lab, stage, node, order, close).await
    }
}

/// `node`'s closer, run for `CLOSER_RUNS`, sends the give-backs owed.
async fn run_closer(lab: &Lab, stage: &Stage<'_>, node: &Node) -> anyhow::Result<()> {
    let owed = stage.owed().await?;
    let closer = Closer::new(node.after_sale.clone(), SWEEP_EVERY).spawn();
    let started = Instant::now();
    lab.say(
        node.name,
        format!(
            "its closer starts; {owed} give-back(s) owed, each sent once owed for 2 s \
             (it looks once a second)"
        ),
    );
    let sent = poll_until(
        "the owed give-backs sent",
        CLOSER_RUNS + SEND_DEADLINE,
        Duration::from_millis(10),
        || async { Ok(stage.owed().await? == 0) },
    )
    .await;
    if sent.is_ok() && owed > 0 {
        lab.say(
            node.name,
            "its closer sends the give-back node1 left owed (lua/giveback.lua)",
        );
    }
    // As long in both variants: the naive one gets the same chance.
    tokio::time::sleep_until((started + CLOSER_RUNS).into()).await;
    closer.stop();
    sent?;
    lab.say(
        node.name,
        format!(
            "its closer stops; give-backs owed now: {}",
            stage.owed().await?
        ),
    );
    Ok(())
}

fn explanation(broken: bool) -> String {
    if broken {
        "The close committed in MySQL (status 4, stock + 1), and what Redis was owed \
         lived only in node1, which died with it: Redis still counts the unit sold and A \
         as its buyer, so the sale is sold out while MySQL holds the unit. The project's \
         close records the give-back owed in tb_order_giveback in its own transaction \
         (--owed-giveback), and any node's closer sends it again."
            .to_owned()
    } else {
        "node1 died after its commit, but the commit had recorded the give-back owed \
         (tb_order_giveback); node2's closer found it owed and sent it (lua/giveback.lua, \
         once per order): the unit went back on sale and B bought it."
            .to_owned()
    }
}

/// Runs `close` on `node` until MySQL has `order` closed, then drops it
/// where it stands: after its commit, before its call to Redis.
async fn killed_after_commit(
    lab: &Lab,
    stage: &Stage<'_>,
    node: &Node,
    order: OrderId,
    close: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let committed = poll_until(
        "the close committed",
        SEND_DEADLINE,
        Duration::from_millis(5),
        || async {
            let order = stage.order(order, &A).await?;
            Ok(order.is_some_and(|order| order.status == OrderState::Closed as u8))
        },
    );
    tokio::select! {
        ended = close => {
            ended?;
            anyhow::bail!("{}'s close reached Redis before the lab could kill it", node.name);
        }
        committed = committed => committed?,
    }
    lab.say(
        node.name,
        "is killed after its COMMIT, before its call to Redis (the lab drops the close \
         there, as SIGKILL would end the process)",
    );
    Ok(())
}
