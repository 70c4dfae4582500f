//! The stage of the after-sale scenarios (`pay-vs-close`, `double-close`,
//! `lost-giveback`): two nodes run in-process on the run's own database and
//! key namespace, each with the purchase (`--seckill queue`: admitted in
//! Redis, written to MySQL by the node's queue) and the after-sale service;
//! a voucher of stock 1 on sale in Redis, so that a unit sold twice shows
//! at once; the naive close the scenarios set against the project's; and
//! the sale's end judged by `hmdp audit`, which reconciles Redis with MySQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hmdp::after_sale::{AfterSale, PayDeadlines};
use hmdp::config::SeckillMode;
use hmdp::error::Error;
use hmdp::ids::{OrderId, UserId, VoucherId};
use hmdp::keys::Keys;
use hmdp::seckill::{RedisSale, Seckill};
use hmdp::store::{CloseCause, Closing, OrderState, Store, VoucherOrder};
use hmdp_test_support::poll_until;

use super::harness::{open_voucher, Lab};
use super::report::Actor;
use super::SaleLabArgs;
use crate::audit::{self, AuditOptions, Status};

/// `hmdp lab pay-vs-close` and `hmdp lab double-close`.
#[derive(Debug, Clone, Args)]
pub struct CloseLabArgs {
    #[command(flatten)]
    pub sale: SaleLabArgs,

    /// Close as the project does: ONE conditional update (`UPDATE
    /// tb_voucher_order SET status = 4 WHERE id = ? AND status = 1`) in the
    /// transaction that returns the unit to the stock and records the
    /// give-back owed to Redis, which `lua/giveback.lua` applies once per
    /// order. Without it, the naive close: SELECT the status, then `UPDATE …
    /// WHERE id = ?`, stock + 1, and HINCRBY stock 1 in Redis.
    #[arg(long)]
    pub conditional_close: bool,
}

/// How the nodes close an unpaid order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    /// Read the status with a SELECT; if unpaid, later, `UPDATE … SET
    /// status = 4 WHERE id = ?`, stock + 1, then the unit back in Redis.
    Naive,
    /// `AfterSale::close`: the check is the update's own `AND status = 1`.
    Conditional,
}

impl Close {
    pub fn of(conditional: bool) -> Close {
        if conditional {
            Close::Conditional
        } else {
            Close::Naive
        }
    }
}

/// A user of the sale, named on the timeline.
pub(super) struct Buyer {
    pub who: Actor,
    pub user: UserId,
}

pub(super) const A: Buyer = Buyer {
    who: "A",
    user: UserId::new(1),
};
pub(super) const B: Buyer = Buyer {
    who: "B",
    user: UserId::new(2),
};
pub(super) const C: Buyer = Buyer {
    who: "C",
    user: UserId::new(3),
};

/// The voucher's stock: one unit, so that selling it twice is overselling.
const STOCK: i32 = 1;
/// The nodes' per-user locks, taken by their queues' writers.
const LOCK_LEASE: Duration = Duration::from_secs(2);
const LOCK_WAIT: Duration = Duration::from_millis(500);
/// How long the stage waits for MySQL to show what it waits for.
const DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(5);

/// One node: its purchase and its after-sale service.
pub(super) struct Node {
    pub name: Actor,
    seckill: Arc<Seckill>,
    pub after_sale: Arc<AfterSale>,
}

/// The nodes and the voucher of one run.
pub(super) struct Stage<'a> {
    lab: &'a Lab,
    store: Store,
    keys: Keys,
    voucher: VoucherId,
    pub nodes: [Node; 2],
}

impl<'a> Stage<'a> {
    /// node1 and node2 on `store`, orders unpaid for `pay_timeout` closed
    /// by their timers, node1 sleeping `node1_stall` between a close's
    /// commit and its give-back (the point `lost-giveback` kills it at);
    /// the voucher created and its sale loaded into Redis.
    pub async fn open(
        lab: &'a Lab,
        store: &Store,
        pay_timeout: Duration,
        node1_stall: Duration,
    ) -> anyhow::Result<Stage<'a>> {
        let keys = Keys::new(lab.namespace());
        let node1 = start_node(lab, store, &keys, "node1", pay_timeout, node1_stall).await?;
        let node2 = start_node(lab, store, &keys, "node2", pay_timeout, Duration::ZERO).await?;
        let voucher = open_voucher(store, "after-sale", STOCK).await?;
        node1.seckill.voucher_created(voucher).await;
        let stage = Stage {
            lab,
            store: store.clone(),
            keys,
            voucher,
            nodes: [node1, node2],
        };
        lab.say(
            "nodes",
            format!(
                "node1 and node2 run the purchase (--seckill queue) and the after-sale \
                 service; unpaid orders close after {} s",
                pay_timeout.as_secs()
            ),
        );
        stage.show().await?;
        Ok(stage)
    }

    /// `buyer` buys a unit through `node`: the order once MySQL has it (the
    /// node's queue writes it just after the answer), or `None` when
    /// refused.
    pub async fn buy(&self, buyer: &Buyer, node: &Node) -> anyhow::Result<Option<OrderId>> {
        let bought = node
            .seckill
            .purchase(buyer.user, self.voucher, Instant::now())
            .await;
        let order = match bought {
            Ok(order) => order,
            Err(Error::Rejected(rejection)) => {
                self.lab.say(
                    buyer.who,
                    format!("buys through {}: refused, {}", node.name, rejection.code()),
                );
                return Ok(None);
            }
            Err(error) => {
                return Err(error).with_context(|| format!("{}'s purchase failed", buyer.who))
            }
        };
        poll_until("the order written to MySQL", DEADLINE, POLL, || async {
            Ok(self.order(order, buyer).await?.is_some())
        })
        .await?;
        self.lab.say(
            buyer.who,
            format!("buys through {}: order {order}, unpaid", node.name),
        );
        Ok(Some(order))
    }

    /// `buyer` pays `order` through `node`.
    pub async fn pay(&self, buyer: &Buyer, node: &Node, order: OrderId) -> anyhow::Result<()> {
        let what = match node.after_sale.pay(order, buyer.user, 1).await {
            Ok(view) => format!(
                "pays order {order} through {}: {}",
                node.name,
                status_of(&view.order)
            ),
            Err(Error::Rejected(rejection)) => format!(
                "pays order {order} through {}: refused, {}",
                node.name,
                rejection.code()
            ),
            Err(error) => {
                return Err(error).with_context(|| format!("{}'s payment failed", buyer.who))
            }
        };
        self.lab.say(buyer.who, what);
        Ok(())
    }

    /// `buyer`'s order as MySQL has it.
    pub async fn order(
        &self,
        order: OrderId,
        buyer: &Buyer,
    ) -> anyhow::Result<Option<VoucherOrder>> {
        Ok(self.store.order_of_user(order, buyer.user).await?)
    }

    /// Waits until MySQL's clock, which the close's deadline check reads in
    /// whole seconds, puts `order` past its deadline.
    pub async fn past_deadline(&self, buyer: &Buyer, order: OrderId) -> anyhow::Result<()> {
        let timeout = self.nodes[0].after_sale.deadlines().pay_timeout();
        poll_until("the order past its deadline", DEADLINE, POLL, || async {
            let overdue = self
                .store
                .overdue_unpaid(timeout, Duration::ZERO, 100)
                .await?;
            Ok(overdue.contains(&order))
        })
        .await?;
        self.lab.say(
            buyer.who,
            format!(
                "leaves order {order} unpaid past its deadline: {} s, by MySQL's clock in \
                 whole seconds",
                timeout.as_secs()
            ),
        );
        Ok(())
    }

    /// `node` closes `buyer`'s `order` as `close` says: the naive close
    /// reads the status now and writes at `write_at` on the clock; the
    /// conditional one does both in its update at `write_at`. A cancel
    /// closes the buyer's own order only; a timeout, whoever's.
    pub async fn close_at(
        &self,
        close: Close,
        node: &Node,
        buyer: &Buyer,
        order: OrderId,
        cause: CloseCause,
        write_at: u64,
    ) -> anyhow::Result<()> {
        if close == Close::Conditional {
            self.lab.at(write_at).await;
            let own = (cause == CloseCause::Cancel).then_some(buyer.user);
            let closing = node.after_sale.close(order, own, cause).await?;
            self.lab.say(node.name, closed(order, &closing));
            return Ok(());
        }
        let status = self
            .order(order, buyer)
            .await?
            .context("the order to close is gone")?;
        self.lab.say(
            node.name,
            format!("SELECTs order {order}: {}", status_of(&status)),
        );
        if status.status != OrderState::Unpaid as u8 {
            return Ok(());
        }
        self.lab.at(write_at).await;
        self.naive_close_in_mysql(node, order).await?;
        self.naive_give_back(node, buyer).await
    }

    /// The naive close's MySQL half: the order closed with no condition on
    /// its status, the unit back in the stock, and nothing recorded of what
    /// Redis is owed.
    pub async fn naive_close_in_mysql(&self, node: &Node, order: OrderId) -> anyhow::Result<()> {
        let mut tx = self.store.begin().await?;
        sqlx::query("UPDATE tb_voucher_order SET status = 4 WHERE id = ?")
            .bind(order)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE tb_seckill_voucher SET stock = stock + 1 WHERE voucher_id = ?")
            .bind(self.voucher)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.lab.say(
            node.name,
            format!(
                "UPDATE … SET status = 4 WHERE id = {order} (no status in the WHERE), \
                 stock + 1: committed"
            ),
        );
        Ok(())
    }

    /// The naive close's Redis half: the unit and the buyer's turn back in
    /// the sale, however often it was given back before.
    pub async fn naive_give_back(&self, node: &Node, buyer: &Buyer) -> anyhow::Result<()> {
        // The buyer count beside the set follows it (lua/sale_fence.lua),
        // as the project's give-back keeps it: the lab's fault is the unit
        // given twice, not a set the fence would take for a lost one.
        let () = redis::Script::new(
            "redis.call('HINCRBY', KEYS[1], 'stock', 1) \
             if redis.call('SREM', KEYS[2], ARGV[1]) == 1 then \
               redis.call('HINCRBY', KEYS[1], 'buyers', -1) end",
        )
        .key(self.keys.single().voucher(self.voucher))
        .key(self.keys.single().buyers(self.voucher))
        .arg(buyer.user.get())
        .invoke_async(&mut self.lab.redis())
        .await
        .context("the naive give-back to Redis")?;
        // As the project's give-back does: the node forgets it saw the
        // sale sell out.
        node.seckill.stock_returned(self.voucher);
        self.lab.say(
            node.name,
            format!(
                "HINCRBY stock 1, SREM {} in Redis: the unit is back on sale",
                buyer.who
            ),
        );
        Ok(())
    }

    /// Give-backs of the voucher still owed to Redis.
    pub async fn owed(&self) -> anyhow::Result<usize> {
        Ok(self.store.givebacks_owed_of(self.voucher).await?.len())
    }

    /// The sale as MySQL and Redis have it, on the timeline.
    pub async fn show(&self) -> anyhow::Result<()> {
        let mysql = self.store.audit_voucher(self.voucher).await?;
        let owed = self.owed().await?;
        self.lab.say(
            "mysql",
            format!(
                "{} active order(s), {} closed ({} of them paid), stock {}, {owed} \
                 give-back(s) owed to Redis",
                mysql.active_orders, mysql.closed_orders, mysql.paid_and_closed, mysql.stock_left
            ),
        );
        let sale = self.sale().await?;
        let buyers: Vec<String> = sale.buyers.iter().map(|user| name_of(*user)).collect();
        self.lab.say(
            "redis",
            format!("sale: stock {}, buyers [{}]", sale.stock, buyers.join(", ")),
        );
        Ok(())
    }

    async fn sale(&self) -> anyhow::Result<RedisSale> {
        self.nodes[0]
            .seckill
            .sale_state()
            .read(self.voucher)
            .await?
            .context("Redis lost the lab's sale")
    }

    /// The sale's end: shown, then reconciled by `hmdp audit`; each
    /// difference it finds breaks the promise.
    pub async fn judge(&self) -> anyhow::Result<()> {
        self.show().await?;
        let audit = audit::audit(
            &self.store,
            self.nodes[0].seckill.sale_state(),
            self.voucher,
            AuditOptions::strict(),
        )
        .await?;
        self.lab.say("audit", audit.verdict());
        for check in audit.checks.iter().filter(|c| c.status == Status::Broken) {
            for difference in &check.differences {
                self.lab
                    .fail("audit", format!("{}: {difference}", check.name));
            }
        }
        Ok(())
    }
}

async fn start_node(
    lab: &Lab,
    store: &Store,
    keys: &Keys,
    name: Actor,
    pay_timeout: Duration,
    stall: Duration,
) -> anyhow::Result<Node> {
    let deadlines = || PayDeadlines::new(lab.redis(), keys, pay_timeout);
    let seckill = Seckill::new(
        store.clone(),
        lab.lock(LOCK_LEASE, LOCK_WAIT)?,
        lab.redis(),
        keys.clone(),
        deadlines(),
        Duration::ZERO,
    )
    .start(SeckillMode::Queue)
    .await;
    let returned = seckill.clone();
    let after_sale = Arc::new(AfterSale::new(
        store.clone(),
        lab.redis(),
        keys.clone(),
        deadlines(),
        Arc::new(move |voucher| returned.stock_returned(voucher)),
        stall,
    ));
    Ok(Node {
        name,
        seckill,
        after_sale,
    })
}

/// What a conditional close found, in words.
fn closed(order: OrderId, closing: &Closing) -> String {
    match closing {
        Closing::Closed(_) => format!(
            "closes order {order}: UPDATE … WHERE id = ? AND status = 1 changes 1 row; \
             stock + 1 and the give-back owed in the same transaction, then \
             lua/giveback.lua puts the unit back in Redis"
        ),
        Closing::Settled(settled) => format!(
            "UPDATE … WHERE id = {order} AND status = 1 changes no row: the order is {}; \
             nothing closed, nothing given back",
            status_of(settled)
        ),
        Closing::NotDue => format!("order {order} is not past its deadline: left open"),
        Closing::NotFound => format!("order {order} is not found"),
    }
}

/// `paid (status 2)`.
fn status_of(order: &VoucherOrder) -> String {
    let label = OrderState::from_status(order.status).map_or("unknown", OrderState::label);
    format!("{label} (status {})", order.status)
}

/// A buyer's name on the timeline, else the user id.
fn name_of(user: UserId) -> String {
    [A, B, C]
        .into_iter()
        .find(|buyer| buyer.user == user)
        .map_or_else(|| user.to_string(), |buyer| buyer.who.to_owned())
}
