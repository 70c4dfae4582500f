//! The ways a run is corrupted, each as the broken promise it stands for:
//! what it changes in the history and in MySQL, the check of `hmdp check`
//! that must name it (with words its break must say), and the check of
//! `hmdp audit` that must see it, where the stores' own view can.

use hmdp_tools::history::{names, Call, Event, Failure, FaultKind};

use crate::fixture::Run;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corruption {
    OrderDeleted,
    OrderWrittenTwice,
    RefusalTookEffect,
    UnitLost,
    UnitCreated,
    StockBelowZero,
    AnotherBuyersOrder,
    ToldTwice,
    PaymentNotRecorded,
    CancelGaveNothingBack,
    CancelNotRecorded,
    LossExcusedByALateFault,
}

/// What a corruption must be named by.
pub struct Expected {
    /// The check of `hmdp check`, and words of its break.
    pub check: &'static str,
    pub says: &'static str,
    /// The check of `hmdp audit` that sees it; `None`: the audit cannot
    /// (the break is in what a client was told), and holds.
    pub audit: Option<&'static str>,
}

impl Corruption {
    pub const ALL: [Corruption; 12] = [
        Corruption::OrderDeleted,
        Corruption::OrderWrittenTwice,
        Corruption::RefusalTookEffect,
        Corruption::UnitLost,
        Corruption::UnitCreated,
        Corruption::StockBelowZero,
        Corruption::AnotherBuyersOrder,
        Corruption::ToldTwice,
        Corruption::PaymentNotRecorded,
        Corruption::CancelGaveNothingBack,
        Corruption::CancelNotRecorded,
        Corruption::LossExcusedByALateFault,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            Corruption::OrderDeleted => "an order deleted",
            Corruption::OrderWrittenTwice => "an order written twice",
            Corruption::RefusalTookEffect => "a refusal that took effect",
            Corruption::UnitLost => "a unit lost (SOLD_OUT, stock left)",
            Corruption::UnitCreated => "a unit created",
            Corruption::StockBelowZero => "stock below zero",
            Corruption::AnotherBuyersOrder => "a success answered with another buyer's order",
            Corruption::ToldTwice => "a buyer told success twice",
            Corruption::PaymentNotRecorded => "a payment answered and not recorded",
            Corruption::CancelGaveNothingBack => "a cancel that gave nothing back",
            Corruption::CancelNotRecorded => "a cancel answered and not recorded",
            Corruption::LossExcusedByALateFault => "a loss 60 s before a Redis restart",
        }
    }

    pub fn expected(self) -> Expected {
        let (check, says, audit) = match self {
            Corruption::OrderDeleted => (
                names::SUCCESS_WRITTEN,
                "is not in MySQL",
                Some("mysql-stock"),
            ),
            Corruption::OrderWrittenTwice => (
                names::BUYER_ORDERS,
                "order(s) no answer explains",
                Some("one-active-order-per-user"),
            ),
            Corruption::RefusalTookEffect => (
                names::BUYER_ORDERS,
                "told {}, 0 unknown answer(s), refused [",
                Some("buyers"),
            ),
            Corruption::UnitLost => (names::SOLD_OUT, "1 unit(s) lost", Some("buyers")),
            Corruption::UnitCreated => (
                names::STOCK_BALANCE,
                "!= initial stock 10",
                Some("mysql-stock"),
            ),
            Corruption::StockBelowZero => {
                (names::STOCK_NONNEGATIVE, "stock is -1", Some("mysql-stock"))
            }
            Corruption::AnotherBuyersOrder => (names::SUCCESS_BUYER, "'s order in MySQL", None),
            Corruption::ToldTwice => (
                names::TOLD_TWICE,
                "told success for active orders",
                Some("one-active-order-per-user"),
            ),
            Corruption::PaymentNotRecorded => (
                names::PAYMENTS,
                "Pay answered success, status in MySQL Some(\"unpaid\")",
                None,
            ),
            Corruption::CancelGaveNothingBack => (
                names::STOCK_BALANCE,
                "!= initial stock 10",
                Some("mysql-stock"),
            ),
            Corruption::CancelNotRecorded => (
                names::CANCELS,
                "Cancel answered success, status in MySQL Some(\"unpaid\")",
                Some("buyers"),
            ),
            Corruption::LossExcusedByALateFault => (
                names::SUCCESS_WRITTEN,
                "no allowed fault within 10000 ms after the answer",
                Some("buyers"),
            ),
        };
        Expected { check, says, audit }
    }

    /// Arguments `hmdp check` is given for this run.
    pub fn check_args(self) -> &'static [&'static str] {
        match self {
            Corruption::LossExcusedByALateFault => &["--allow-loss=redis-restart"],
            _ => &[],
        }
    }

    /// The corruption made: `events` (the untouched history) changed, and
    /// MySQL.
    pub async fn apply(self, run: &Run, events: &mut Vec<Event>) {
        let (voucher, tables) = (run.voucher, run.tables());
        let victim = run.unpaid[0];
        match self {
            Corruption::OrderDeleted => tables.delete_order(victim.order).await.unwrap(),
            Corruption::OrderWrittenTwice => {
                // The whole purchase written again under another id.
                let id = run.fresh_order_id().await;
                tables
                    .insert_order(id, victim.user as u64, voucher)
                    .await
                    .unwrap();
                tables.add_stock(voucher, -1).await.unwrap();
            }
            Corruption::RefusalTookEffect => {
                let id = run.fresh_order_id().await;
                let refused = run.refused[0] as u64;
                tables.insert_order(id, refused, voucher).await.unwrap();
                tables.add_stock(voucher, -1).await.unwrap();
            }
            Corruption::UnitLost => {
                // The buyer told SOLD_OUT instead, their unit never sold.
                let answer = success_of(events, victim.order);
                let Event::Ok {
                    client,
                    user,
                    voucher,
                    at_ms,
                    ..
                } = events[answer].clone()
                else {
                    unreachable!()
                };
                events[answer] = Event::Fail(Failure {
                    client,
                    user,
                    voucher,
                    f: Call::Buy,
                    order: None,
                    error: "SOLD_OUT".to_owned(),
                    at_ms,
                });
                tables.delete_order(victim.order).await.unwrap();
                tables.add_stock(voucher, 1).await.unwrap();
            }
            Corruption::UnitCreated => tables.add_stock(voucher, 1).await.unwrap(),
            Corruption::StockBelowZero => tables.set_stock(voucher, -1).await.unwrap(),
            Corruption::AnotherBuyersOrder => {
                let answer = success_of(events, victim.order);
                if let Event::Ok { order, .. } = &mut events[answer] {
                    *order = run.unpaid[1].order;
                }
            }
            Corruption::ToldTwice => {
                let id = run.fresh_order_id().await;
                let mut again = events[success_of(events, victim.order)].clone();
                if let Event::Ok { order, .. } = &mut again {
                    *order = id;
                }
                events.push(again);
                tables
                    .insert_order(id, victim.user as u64, voucher)
                    .await
                    .unwrap();
                tables.add_stock(voucher, -1).await.unwrap();
            }
            Corruption::PaymentNotRecorded => {
                sqlx::query("UPDATE tb_voucher_order SET status = 1, pay_time = NULL WHERE id = ?")
                    .bind(run.paid[0].order)
                    .execute(&run.pool)
                    .await
                    .unwrap();
            }
            Corruption::CancelGaveNothingBack => tables.add_stock(voucher, -1).await.unwrap(),
            Corruption::CancelNotRecorded => {
                // The cancel's transaction undone whole: the order active,
                // its unit out of the stock again.
                sqlx::query("UPDATE tb_voucher_order SET status = 1 WHERE id = ?")
                    .bind(run.cancelled[0].order)
                    .execute(&run.pool)
                    .await
                    .unwrap();
                tables.add_stock(voucher, -1).await.unwrap();
            }
            Corruption::LossExcusedByALateFault => {
                lose_before_a_restart(run, events, 60_000).await;
            }
        }
    }
}

/// The victim's order gone from MySQL (its unit back in the stock, as a
/// reload from MySQL leaves it), and a Redis restart recorded `after_ms`
/// after its success answer.
pub async fn lose_before_a_restart(run: &Run, events: &mut Vec<Event>, after_ms: i64) {
    let victim = run.unpaid[0];
    let Event::Ok { at_ms, .. } = events[success_of(events, victim.order)] else {
        unreachable!()
    };
    events.push(Event::Fault {
        kind: FaultKind::RedisRestart,
        node: None,
        what: "Redis restarted empty".to_owned(),
        at_ms: at_ms + after_ms,
    });
    run.tables().delete_order(victim.order).await.unwrap();
    run.tables().add_stock(run.voucher, 1).await.unwrap();
}

/// The index of the purchase's success answer naming `order`.
fn success_of(events: &[Event], order: i64) -> usize {
    (events.iter())
        .position(|event| matches!(event, Event::Ok { f: Call::Buy, order: o, .. } if *o == order))
        .expect("the order was told")
}
