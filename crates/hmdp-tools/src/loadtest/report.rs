//! The result of a load run: printed as a table, written as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::{Drain, Measured, Plan};
use crate::audit::Audit;
use crate::latency::Latency;
use hmdp::store::VoucherAudit;

/// One run's numbers. The audit fields are `null` unless the database was read.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub target: String,
    pub voucher: i64,
    pub users: usize,
    pub per_user: usize,
    pub concurrency: usize,
    pub requests: u64,
    pub elapsed_s: f64,
    pub rps: f64,
    /// Purchases answered with an order id, per second: committed orders/s.
    pub orders_per_s: f64,
    pub latency_ms: Latency,
    /// The latency of the purchases answered with an order alone: what a
    /// node that sheds load keeps low, while it turns the rest away fast.
    pub ordered_latency_ms: Latency,
    /// Answers by outcome: `OK`, an `errorCode`, `HTTP_<status>`, or a
    /// transport failure.
    pub outcomes: BTreeMap<String, u64>,
    /// Answers by the node that served them (`x-served-by`).
    pub served_by: BTreeMap<String, u64>,
    pub initial_stock: Option<i64>,
    pub orders: Option<i64>,
    pub duplicate_users: Option<i64>,
    pub extra_orders: Option<i64>,
    pub oversold: Option<i64>,
    pub stock_left: Option<i64>,
    /// Stock invariants the audit found broken (duplicates are reported in
    /// their own fields: some lock modes are expected to let them through).
    pub violations: Vec<String>,
    /// Asynchronous sales: seconds from the last answer until no order was
    /// pending any more (`null` when the deadline passed first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_s: Option<Option<f64>>,
    /// Asynchronous sales: `hmdp audit` after the drain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<Audit>,
}

impl Report {
    pub fn new(plan: &Plan, measured: &Measured) -> Report {
        let elapsed_s = measured.elapsed.as_secs_f64();
        Report {
            target: plan.target.clone(),
            voucher: plan.voucher,
            users: plan.tokens.len(),
            per_user: plan.per_user,
            concurrency: plan.concurrency,
            requests: measured.requests,
            elapsed_s,
            rps: measured.requests as f64 / elapsed_s.max(1e-9),
            orders_per_s: measured.outcomes.get("OK").copied().unwrap_or(0) as f64
                / elapsed_s.max(1e-9),
            latency_ms: Latency::of(&measured.latency_us),
            ordered_latency_ms: Latency::of(&measured.ordered_latency_us),
            outcomes: measured.outcomes.clone(),
            served_by: measured.served_by.clone(),
            initial_stock: None,
            orders: None,
            duplicate_users: None,
            extra_orders: None,
            oversold: None,
            stock_left: None,
            violations: Vec::new(),
            drain_s: None,
            audit: None,
        }
    }

    /// Adds how the admitted orders drained; orders still pending at the
    /// deadline are a violation.
    pub fn add_drain(&mut self, drain: &Drain, deadline: std::time::Duration) {
        match drain {
            Drain::Drained(took) => self.drain_s = Some(Some(took.as_secs_f64())),
            Drain::Stuck(pending) => {
                self.drain_s = Some(None);
                self.violations.push(format!(
                    "{pending} admitted orders still not written {} s after the last answer",
                    deadline.as_secs()
                ));
            }
        }
    }

    /// Adds the reconciliation of Redis and MySQL; its broken checks are
    /// violations, and so are the checks it could not make unless the audit
    /// allows that.
    pub fn add_reconciliation(&mut self, audit: Audit) {
        self.violations.extend(audit.failures());
        self.audit = Some(audit);
    }

    /// Adds the audit read after the run, against the stock before it.
    /// `one_order_per_user`: whether a user holding two orders breaks the
    /// run (every lock a load test verifies promises it; the demo also
    /// runs the modes that show it broken, and counts them instead).
    pub fn add_audit(
        &mut self,
        initial_stock: i64,
        audit: &VoucherAudit,
        one_order_per_user: bool,
    ) {
        self.initial_stock = Some(initial_stock);
        self.orders = Some(audit.active_orders);
        self.duplicate_users = Some(audit.duplicate_users);
        self.extra_orders = Some(audit.extra_orders);
        self.oversold = Some(audit.oversold(initial_stock));
        self.stock_left = Some(audit.stock_left);
        self.violations
            .extend(audit.violations(initial_stock, one_order_per_user));
    }

    /// Answers that came back with this outcome.
    pub fn outcome(&self, outcome: &str) -> u64 {
        self.outcomes.get(outcome).copied().unwrap_or(0)
    }

    /// A human-readable summary, one fact per line.
    pub fn table(&self) -> String {
        let joined = |counts: &BTreeMap<String, u64>| {
            let mut by_count: Vec<_> = counts.iter().collect();
            by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            by_count
                .iter()
                .map(|(name, n)| format!("{name} {n}"))
                .collect::<Vec<_>>()
                .join(" · ")
        };
        let mut out = String::new();
        let l = &self.latency_ms;
        let _ = writeln!(
            out,
            "requests     {} ({} users x {}) in {:.2} s: {:.0} req/s",
            self.requests, self.users, self.per_user, self.elapsed_s, self.rps
        );
        let _ = writeln!(out, "ordered      {:.0} orders/s", self.orders_per_s);
        let _ = writeln!(
            out,
            "latency ms   p50 {:.1} · p90 {:.1} · p99 {:.1} · max {:.1}",
            l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
        );
        let o = &self.ordered_latency_ms;
        let _ = writeln!(
            out,
            "  ordered    p50 {:.1} · p90 {:.1} · p99 {:.1} · max {:.1}",
            o.p50_ms, o.p90_ms, o.p99_ms, o.max_ms
        );
        let _ = writeln!(out, "outcomes     {}", joined(&self.outcomes));
        let _ = writeln!(out, "served by    {}", joined(&self.served_by));
        if let (Some(initial), Some(orders), Some(left), Some(dups), Some(extra), Some(over)) = (
            self.initial_stock,
            self.orders,
            self.stock_left,
            self.duplicate_users,
            self.extra_orders,
            self.oversold,
        ) {
            let _ = writeln!(
                out,
                "orders       {orders} of initial stock {initial}, {left} left"
            );
            let _ = writeln!(
                out,
                "duplicates   {dups} users hold more than one active order ({extra} extra orders)"
            );
            let _ = writeln!(out, "oversold     {over}");
            let verdict = if self.violations.is_empty() {
                "stock balances".to_owned()
            } else {
                format!("BROKEN: {}", self.violations.join("; "))
            };
            let _ = writeln!(out, "invariants   {verdict}");
        }
        match self.drain_s {
            Some(Some(drain_s)) => {
                let _ = writeln!(out, "drained      {drain_s:.2} s after the last answer");
            }
            Some(None) => {
                let _ = writeln!(out, "drained      NO: orders still pending at the deadline");
            }
            None => {}
        }
        if let Some(audit) = &self.audit {
            out.push_str(&audit.to_string());
        }
        out
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self).expect("a report serializes");
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))
    }
}
