//! A run's history as its clients saw it, and `hmdp check`, which judges it
//! from outside, the way Jepsen does: every request (invoke) and what it was
//! answered (ok; fail, a definite refusal; unknown, no answer that says:
//! Jepsen's info), with the faults injected, one JSON object a line;
//! afterwards the history is compared with MySQL, the truth. The stores' own view (`hmdp audit`)
//! cannot see a promise broken to a client whose trace the stores lost
//! with it; this can.
//!
//! What it checks, for each sale the history names:
//!
//! - `success-written`: every success answer to a purchase is an order of
//!   that voucher in MySQL under the id the buyer was told;
//! - `told-twice`: no client told success for two orders of one voucher
//!   that are both active;
//! - `mysql`: no unit sold twice (active orders + stock = the stock the sale
//!   began with, stock >= 0) and one active order per user;
//! - `sold-out`: no unit lost: a sale that answered `SOLD_OUT` sold every
//!   unit it began with (MySQL holds at least that many orders of it);
//! - `acts`: every payment and cancel as answered.
//!
//! A success answer whose order MySQL lacks breaks `success-written`
//! unless the run allows that loss (`--allow-loss`) and a fault explains
//! it: a Redis restart after the answer (Redis without persistence: any
//! order not yet written; `everysec`: one answered within
//! [`EVERYSEC_BOUND`] of the restart), or a `queue` node killed after it
//! answered. Allowed losses are counted, never hidden.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use hmdp::config::DatabaseSettings;
use hmdp::ids::VoucherId;
use hmdp::store::{OrderState, Store};

/// How far back from a Redis restart an `appendfsync everysec` AOF may
/// have lost writes: its one-second fsync interval, and as much again for
/// a busy machine's fsync.
pub const EVERYSEC_BOUND: Duration = Duration::from_secs(2);

/// What a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Buy,
    Pay,
    Cancel,
}

/// A fault injected during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// A node SIGKILLed (`node` names it).
    NodeKill,
    /// Redis killed and started again (from its AOF, or empty).
    RedisRestart,
    /// Anything that cannot lose an order by the guarantees (a MySQL
    /// stall, `read_only`, a MySQL crash, a failover).
    Other,
}

/// One line of a history. Times are Unix epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Event {
    /// A sale begins: its voucher and the stock it began with.
    Sale {
        voucher: i64,
        stock: i64,
        at_ms: i64,
    },
    /// A client sends a request (`order`: the order a pay or cancel names).
    Invoke {
        client: usize,
        voucher: i64,
        f: Call,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order: Option<i64>,
        at_ms: i64,
    },
    /// A success answer: a purchase's order, a payment or a cancel done.
    Ok {
        client: usize,
        voucher: i64,
        f: Call,
        order: i64,
        node: String,
        at_ms: i64,
    },
    /// A definite refusal (its `errorCode`): nothing was done.
    Fail(Failure),
    /// No answer that says what happened (a timeout, a 503, a connection
    /// lost): it may or may not have been done. Read as Jepsen's `info` too.
    #[serde(alias = "info")]
    Unknown(Failure),
    /// A fault injected, and what it was in words.
    Fault {
        kind: FaultKind,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        what: String,
        at_ms: i64,
    },
}

/// A request that did not succeed: what it asked, and what came back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub client: usize,
    pub voucher: i64,
    pub f: Call,
    /// The order a pay or cancel names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<i64>,
    /// The `errorCode`, or what the client saw instead of an answer.
    pub error: String,
    pub at_ms: i64,
}

impl Event {
    /// A request's failure: a definite refusal, or an unknown outcome.
    pub fn failed(definite: bool, failure: Failure) -> Event {
        match definite {
            true => Event::Fail(failure),
            false => Event::Unknown(failure),
        }
    }
}

/// The purchase refusals that say nothing was done; any other answer that
/// is not a success leaves the purchase's fate unknown.
const DEFINITE_REFUSALS: [&str; 6] = [
    "SOLD_OUT",
    "ALREADY_ORDERED",
    "DUPLICATE_REQUEST",
    "NOT_STARTED",
    "ENDED",
    "VOUCHER_NOT_FOUND",
];

/// Whether a purchase answered `outcome` (an `errorCode`, or the load
/// generator's name for a failed request) was certainly not done.
pub fn definite_refusal(outcome: &str) -> bool {
    DEFINITE_REFUSALS.contains(&outcome)
}

/// Unix epoch milliseconds of `at`, a moment of this process's clock.
pub fn unix_ms(at: Instant) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970");
    let ago = Instant::now().saturating_duration_since(at);
    now.saturating_sub(ago).as_millis() as i64
}

/// Writes a history, one event a line, as the run goes.
pub struct Recorder {
    out: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
}

impl Recorder {
    pub fn create(path: &Path) -> anyhow::Result<Recorder> {
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the history {}", path.display()))?;
        Ok(Recorder {
            out: std::io::BufWriter::new(file),
            path: path.to_owned(),
        })
    }

    pub fn record(&mut self, event: &Event) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, event).expect("an event serializes");
        writeln!(self.out).with_context(|| format!("writing {}", self.path.display()))
    }

    pub fn record_all<'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> anyhow::Result<()> {
        for event in events {
            self.record(event)?;
        }
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Reads a history written by a [`Recorder`].
pub fn read(path: &Path) -> anyhow::Result<Vec<Event>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening the history {}", path.display()))?;
    let mut events = Vec::new();
    for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        events.push(
            serde_json::from_str(&line)
                .with_context(|| format!("{}:{}: not an event", path.display(), number + 1))?,
        );
    }
    Ok(events)
}

/// A loss the guarantees allow for some configurations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Loss {
    /// Orders answered and not yet written when Redis restarted without
    /// persistence.
    RedisRestart,
    /// Orders answered within the `everysec` bound before a Redis restart
    /// from an `appendfsync everysec` AOF.
    Everysec,
    /// Orders a `queue` node held in memory when it was SIGKILLed.
    QueueNodeKill,
}

/// `hmdp check`.
#[derive(Debug, Clone, Args)]
pub struct CheckSettings {
    /// The history to check (JSON lines, as `loadtest --history` and
    /// `soak --history` write them).
    #[arg(long)]
    pub history: PathBuf,

    /// Losses the run's configuration allows (docs/guarantees.md); each is
    /// counted, and only a loss a fault of that kind explains passes.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub allow_loss: Vec<Loss>,

    /// MySQL, the truth the history is checked against.
    #[command(flatten)]
    pub database: DatabaseSettings,
}

/// What the checker found.
#[derive(Debug, Default, Serialize)]
pub struct Verdict {
    pub sales: usize,
    pub requests: usize,
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
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
    /// Each check's name and its breaks (empty: holds).
    pub checks: BTreeMap<&'static str, Vec<String>>,
}

impl Verdict {
    pub fn holds(&self) -> bool {
        self.checks.values().all(Vec::is_empty)
    }

    fn broke(&mut self, check: &'static str, what: String) {
        self.checks.entry(check).or_default().push(what);
    }

    /// The report, one fact a line, and the verdict.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "history: {} sale(s), {} request(s): {} ok, {} failed, {} unknown",
            self.sales, self.requests, self.ok, self.failed, self.unknown
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
            let _ = writeln!(out, "  {check:<16} {status} ({} break(s))", breaks.len());
            for line in breaks.iter().take(10) {
                let _ = writeln!(out, "    - {line}");
            }
            if breaks.len() > 10 {
                let _ = writeln!(out, "    - and {} more", breaks.len() - 10);
            }
        }
        let broken: Vec<&str> = (self.checks.iter())
            .filter(|(_, breaks)| !breaks.is_empty())
            .map(|(check, _)| *check)
            .collect();
        if broken.is_empty() {
            let _ = writeln!(out, "verdict: every check holds");
        } else {
            let _ = writeln!(out, "verdict: BROKEN: {}", broken.join(", "));
        }
        out
    }
}

/// The checks, in the order they are reported.
const CHECKS: [&str; 5] = ["success-written", "told-twice", "mysql", "sold-out", "acts"];

/// An order's row as the checker reads it.
struct Row {
    voucher: i64,
    status: u8,
}

/// Checks `events` against MySQL (`store`).
pub async fn check(store: &Store, events: &[Event], allowed: &[Loss]) -> anyhow::Result<Verdict> {
    let mut verdict = Verdict::default();
    for check in CHECKS {
        verdict.checks.insert(check, Vec::new());
    }
    let mut stock: BTreeMap<i64, i64> = BTreeMap::new();
    let faults: Vec<(FaultKind, Option<&str>, i64)> = (events.iter())
        .filter_map(|event| match event {
            Event::Fault {
                kind, node, at_ms, ..
            } => Some((*kind, node.as_deref(), *at_ms)),
            _ => None,
        })
        .collect();
    for event in events {
        match event {
            Event::Sale {
                voucher, stock: s, ..
            } => {
                stock.insert(*voucher, *s);
            }
            Event::Invoke { .. } => verdict.requests += 1,
            Event::Ok { .. } => verdict.ok += 1,
            Event::Fail(_) => verdict.failed += 1,
            Event::Unknown(_) => verdict.unknown += 1,
            Event::Fault { .. } => {}
        }
    }
    verdict.sales = stock.len();
    for (&voucher, &initial) in &stock {
        let rows: BTreeMap<i64, Row> = (store.order_statuses_of(VoucherId::new(voucher)).await)
            .with_context(|| format!("reading voucher {voucher}'s orders"))?
            .into_iter()
            .map(|(id, status)| (id.get(), Row { voucher, status }))
            .collect();
        let of_sale = |event: &&Event| match event {
            Event::Ok { voucher: v, .. }
            | Event::Fail(Failure { voucher: v, .. })
            | Event::Unknown(Failure { voucher: v, .. }) => *v == voucher,
            _ => false,
        };
        let answers: Vec<&Event> = events.iter().filter(of_sale).collect();
        let lost_as_allowed =
            check_purchases(&mut verdict, voucher, &answers, &rows, &faults, allowed);
        check_acts(&mut verdict, voucher, &answers, &rows);
        let audit = store.audit_voucher(VoucherId::new(voucher)).await?;
        verdict.orders += audit.active_orders;
        verdict.closed += audit.closed_orders;
        for broken in audit.violations(initial, true) {
            verdict.broke("mysql", format!("voucher {voucher}: {broken}"));
        }
        let sold_out = answers.iter().any(
            |event| matches!(event, Event::Fail(Failure { f: Call::Buy, error, .. }) if error == "SOLD_OUT"),
        );
        // An order lost as allowed took its unit out of the sale in Redis
        // until a reload gave it back, perhaps after the last buyer left.
        let sold = rows.len() as i64 + lost_as_allowed;
        if sold_out && sold < initial {
            verdict.broke(
                "sold-out",
                format!(
                    "voucher {voucher}: buyers were told SOLD_OUT, yet only {} of its {initial} \
                     unit(s) were ever sold ({lost_as_allowed} more lost as allowed; MySQL \
                     stock {}): {} unit(s) lost",
                    rows.len(),
                    audit.stock_left,
                    initial - sold
                ),
            );
        }
    }
    Ok(verdict)
}

/// Each success answer to a purchase against MySQL; who was told twice.
/// Returns how many orders of the sale were lost as allowed.
fn check_purchases(
    verdict: &mut Verdict,
    voucher: i64,
    answers: &[&Event],
    rows: &BTreeMap<i64, Row>,
    faults: &[(FaultKind, Option<&str>, i64)],
    allowed: &[Loss],
) -> i64 {
    let mut lost_as_allowed = 0;
    let mut active_by_client: BTreeMap<usize, BTreeSet<i64>> = BTreeMap::new();
    for event in answers {
        let Event::Ok {
            client,
            f: Call::Buy,
            order,
            node,
            at_ms,
            ..
        } = event
        else {
            continue;
        };
        verdict.told += 1;
        match rows.get(order) {
            Some(row) if row.voucher == voucher => {
                if row.status != OrderState::Closed as u8 {
                    active_by_client.entry(*client).or_default().insert(*order);
                }
            }
            Some(row) => verdict.broke(
                "success-written",
                format!(
                    "voucher {voucher}: client #{client} was told order {order}, which MySQL \
                     holds for voucher {}",
                    row.voucher
                ),
            ),
            None => match allowed_loss(*at_ms, node, faults, allowed) {
                Some(loss) => {
                    *verdict.lost_allowed.entry(loss).or_default() += 1;
                    lost_as_allowed += 1;
                }
                None => verdict.broke(
                    "success-written",
                    format!(
                        "voucher {voucher}: order {order} told to client #{client} by {node} is \
                         not in MySQL"
                    ),
                ),
            },
        }
    }
    for (client, orders) in active_by_client {
        if orders.len() > 1 {
            verdict.broke(
                "told-twice",
                format!(
                    "voucher {voucher}: client #{client} told success for active orders \
                     {orders:?}"
                ),
            );
        }
    }
    lost_as_allowed
}

/// The allowed loss, if any, that explains an order answered at `at_ms` by
/// `node` and missing from MySQL: of the faults after the answer that an
/// allowed loss explains, the earliest.
fn allowed_loss(
    at_ms: i64,
    node: &str,
    faults: &[(FaultKind, Option<&str>, i64)],
    allowed: &[Loss],
) -> Option<String> {
    let explains = |loss: &Loss, kind: FaultKind, killed: Option<&str>, fault_ms: i64| match loss {
        Loss::RedisRestart => kind == FaultKind::RedisRestart,
        Loss::Everysec => {
            kind == FaultKind::RedisRestart && fault_ms - at_ms <= EVERYSEC_BOUND.as_millis() as i64
        }
        Loss::QueueNodeKill => kind == FaultKind::NodeKill && killed == Some(node),
    };
    (faults.iter())
        .filter(|(_, _, fault_ms)| *fault_ms >= at_ms)
        .flat_map(|(kind, killed, fault_ms)| {
            (allowed.iter())
                .filter(move |loss| explains(loss, *kind, *killed, *fault_ms))
                .map(move |loss| (*fault_ms, *loss))
        })
        .min_by_key(|(fault_ms, _)| *fault_ms)
        .map(|(_, loss)| {
            loss.to_possible_value()
                .expect("every loss has a name")
                .get_name()
                .to_owned()
        })
}

/// Each payment and cancel answered success (or refused as closed)
/// against its order's status in MySQL.
fn check_acts(verdict: &mut Verdict, voucher: i64, answers: &[&Event], rows: &BTreeMap<i64, Row>) {
    for event in answers {
        let (f, order, answer) = match event {
            Event::Ok { f, order, .. } => (*f, *order, None),
            Event::Fail(Failure {
                f,
                order: Some(order),
                error,
                ..
            }) => (*f, *order, Some(error.as_str())),
            _ => continue,
        };
        let state = rows
            .get(&order)
            .and_then(|row| OrderState::from_status(row.status));
        let holds = match (f, answer) {
            (Call::Buy, _) => continue,
            (Call::Pay, None) => {
                verdict.paid += 1;
                matches!(state, Some(OrderState::Paid | OrderState::Used))
            }
            (Call::Cancel, None) => {
                verdict.cancelled += 1;
                state == Some(OrderState::Closed)
            }
            (Call::Pay, Some("ORDER_CLOSED")) => state == Some(OrderState::Closed),
            (_, Some(_)) => continue,
        };
        if !holds {
            verdict.broke(
                "acts",
                format!(
                    "voucher {voucher}: order {order}: {f:?} answered {}, status in MySQL {:?}",
                    answer.unwrap_or("success"),
                    state.map(OrderState::label)
                ),
            );
        }
    }
}

/// `hmdp check`: prints the verdict; returns the exit status (0 when every
/// check holds, 1 otherwise).
pub async fn run(settings: &CheckSettings) -> anyhow::Result<i32> {
    let events = read(&settings.history)?;
    let store = Store::connect_lazy(&settings.database.url, 2, Duration::from_secs(10))?;
    let verdict = check(&store, &events, &settings.allow_loss).await?;
    print!("{}", verdict.report());
    Ok(if verdict.holds() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_back_as_written() {
        let events = [
            Event::Sale {
                voucher: 7,
                stock: 2,
                at_ms: 1,
            },
            Event::Invoke {
                client: 0,
                voucher: 7,
                f: Call::Buy,
                order: None,
                at_ms: 2,
            },
            Event::Ok {
                client: 0,
                voucher: 7,
                f: Call::Buy,
                order: 42,
                node: "node1".into(),
                at_ms: 3,
            },
            Event::Fault {
                kind: FaultKind::RedisRestart,
                node: None,
                what: "Redis restarted empty".into(),
                at_ms: 4,
            },
            Event::Fail(Failure {
                client: 1,
                voucher: 7,
                f: Call::Buy,
                order: None,
                error: "SOLD_OUT".into(),
                at_ms: 5,
            }),
        ];
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut recorder = Recorder::create(file.path()).unwrap();
        recorder.record_all(&events).unwrap();
        assert_eq!(read(file.path()).unwrap(), events);
        let line = serde_json::to_string(&events[2]).unwrap();
        assert_eq!(
            line,
            r#"{"op":"ok","client":0,"voucher":7,"f":"buy","order":42,"node":"node1","at_ms":3}"#
        );
        assert_eq!(
            serde_json::to_string(&events[4]).unwrap(),
            r#"{"op":"fail","client":1,"voucher":7,"f":"buy","error":"SOLD_OUT","at_ms":5}"#
        );
    }

    #[test]
    fn a_loss_passes_only_when_an_allowed_fault_of_its_kind_follows_it() {
        let faults = [
            (FaultKind::RedisRestart, None, 10_000),
            (FaultKind::NodeKill, Some("node2"), 20_000),
        ];
        let any = [Loss::RedisRestart];
        assert!(allowed_loss(9_000, "node1", &faults, &any).is_some());
        assert!(allowed_loss(11_000, "node1", &faults, &any).is_none());
        assert!(allowed_loss(1_000, "node1", &faults, &[Loss::Everysec]).is_none());
        assert!(allowed_loss(9_000, "node1", &faults, &[Loss::Everysec]).is_some());
        let queue = [Loss::QueueNodeKill];
        assert!(allowed_loss(15_000, "node2", &faults, &queue).is_some());
        assert!(allowed_loss(15_000, "node1", &faults, &queue).is_none());
        // Both allowed: the earliest fault after the answer names it.
        let both = [Loss::RedisRestart, Loss::QueueNodeKill];
        let kill_first = [
            (FaultKind::NodeKill, Some("node1"), 10_000),
            (FaultKind::RedisRestart, None, 20_000),
        ];
        assert_eq!(
            allowed_loss(9_000, "node1", &kill_first, &both).as_deref(),
            Some("queue-node-kill")
        );
        assert_eq!(
            allowed_loss(9_000, "node2", &kill_first, &both).as_deref(),
            Some("redis-restart")
        );
        assert!(allowed_loss(9_000, "node1", &faults, &[]).is_none());
    }

    #[test]
    fn only_business_refusals_are_definite() {
        assert!(definite_refusal("SOLD_OUT"));
        assert!(!definite_refusal("UNAVAILABLE"));
        assert!(!definite_refusal("TIMEOUT"));
    }
}
