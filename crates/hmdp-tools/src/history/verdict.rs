//! What `hmdp check` found: counts, each check by its stable name with its
//! breaks, and the report printed from them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// The checks' names: stable, for scripts and tests to match.
pub mod names {
    /// Every success answer to a purchase is an order of that sale in
    /// MySQL under the id the buyer was told (or a loss allowed).
    pub const SUCCESS_WRITTEN: &str = "success-written";
    /// ... and MySQL files that order under the buyer who was told it.
    pub const SUCCESS_BUYER: &str = "success-buyer";
    /// No buyer told success for two orders of one sale both active.
    pub const TOLD_TWICE: &str = "told-twice";
    /// Each buyer's orders in MySQL are those their success and unknown
    /// answers explain: a definite refusal took no effect.
    pub const BUYER_ORDERS: &str = "buyer-orders";
    /// Active orders + stock = the stock the sale began with.
    pub const STOCK_BALANCE: &str = "stock-balance";
    /// The stock is never below zero.
    pub const STOCK_NONNEGATIVE: &str = "stock-nonnegative";
    /// One active order per buyer.
    pub const ONE_ORDER_PER_USER: &str = "one-order-per-user";
    /// No closed order carries a payment.
    pub const PAID_AND_CLOSED: &str = "paid-and-closed";
    /// No unit lost: stock left in MySQL after a `SOLD_OUT` answer is
    /// explained by a later give-back, a loss allowed or a purchase whose
    /// answer was lost (a dead letter's unit).
    pub const SOLD_OUT: &str = "sold-out";
    /// Every payment answered success is paid in MySQL.
    pub const PAYMENTS: &str = "payments";
    /// Every cancel answered success is closed in MySQL.
    pub const CANCELS: &str = "cancels";

    /// Every check, in the order they are reported.
    pub const ALL: [&str; 11] = [
        SUCCESS_WRITTEN,
        SUCCESS_BUYER,
        TOLD_TWICE,
        BUYER_ORDERS,
        STOCK_BALANCE,
        STOCK_NONNEGATIVE,
        ONE_ORDER_PER_USER,
        PAID_AND_CLOSED,
        SOLD_OUT,
        PAYMENTS,
        CANCELS,
    ];
}

/// What the checker found.
#[derive(Debug, Default, Serialize)]
pub struct Verdict {
    pub sales: usize,
    pub requests: usize,
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
    /// Distinct buyers named by the answers.
    pub buyers: usize,
    /// Success answers to purchases.
    pub told: usize,
    /// Active and closed orders in MySQL, over the sales.
    pub orders: i64,
    pub closed: i64,
    /// Payments and cancels answered success.
    pub paid: usize,
    pub cancelled: usize,
    /// Success answers whose order MySQL lacks, which an allowed loss
    /// explains, by loss.
    pub lost_allowed: BTreeMap<String, usize>,
    /// Each check's name and its breaks (empty: holds), in the order of
    /// [`names::ALL`].
    pub checks: Vec<(&'static str, Vec<String>)>,
}

impl Verdict {
    /// A verdict with every check holding until a break is found.
    pub fn new() -> Verdict {
        Verdict {
            checks: names::ALL.iter().map(|name| (*name, Vec::new())).collect(),
            ..Verdict::default()
        }
    }

    pub fn holds(&self) -> bool {
        self.checks.iter().all(|(_, breaks)| breaks.is_empty())
    }

    /// The names of the checks broken.
    pub fn broken(&self) -> Vec<&'static str> {
        (self.checks.iter())
            .filter(|(_, breaks)| !breaks.is_empty())
            .map(|(check, _)| *check)
            .collect()
    }

    pub(super) fn broke(&mut self, check: &'static str, what: String) {
        match self.checks.iter_mut().find(|(name, _)| *name == check) {
            Some((_, breaks)) => breaks.push(what),
            None => unreachable!("{check} is not a check"),
        }
    }

    /// The report, one fact a line, and the verdict.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "history: {} sale(s), {} request(s): {} ok, {} failed, {} unknown; {} buyer(s)",
            self.sales, self.requests, self.ok, self.failed, self.unknown, self.buyers
        );
        let _ = writeln!(out, "  success answers (purchases) {}", self.told);
        let _ = writeln!(
            out,
            "  orders in MySQL             {} active, {} closed",
            self.orders, self.closed
        );
        let _ = writeln!(
            out,
            "  paid, cancelled (told)      {}, {}",
            self.paid, self.cancelled
        );
        for (loss, count) in &self.lost_allowed {
            let _ = writeln!(out, "  lost as allowed ({loss:<15}) {count}");
        }
        for (check, breaks) in &self.checks {
            let status = if breaks.is_empty() { "holds" } else { "BROKEN" };
            let _ = writeln!(out, "  {check:<18} {status} ({} break(s))", breaks.len());
            for line in breaks.iter().take(10) {
                let _ = writeln!(out, "    - {line}");
            }
            if breaks.len() > 10 {
                let _ = writeln!(out, "    - and {} more", breaks.len() - 10);
            }
        }
        let broken = self.broken();
        if broken.is_empty() {
            let _ = writeln!(out, "verdict: every check holds");
        } else {
            let _ = writeln!(out, "verdict: BROKEN: {}", broken.join(", "));
        }
        out
    }
}
