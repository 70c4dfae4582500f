//! A run's history as its clients saw it, and `hmdp check`, which judges it
//! from outside, the way Jepsen does: every request (invoke) and what it was
//! answered (ok; fail, a definite refusal; unknown, no answer that says:
//! Jepsen's info), each naming the buyer by user id, with the faults
//! injected, one JSON object a line; afterwards the history is compared with
//! MySQL, the truth (`check.rs`). The stores' own view (`hmdp audit`) cannot
//! see a promise broken to a client whose trace the stores lost with it;
//! this can.

mod buyers;
mod check;
mod loss;
mod rows;
mod verdict;

pub use check::{check, run, CheckSettings, DEFAULT_WRITERS_LAG};
pub use loss::{Loss, EVERYSEC_BOUND};
pub use verdict::{names, Verdict};

use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::{Deserialize, Serialize};

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
        /// The buyer's user id (absent from histories written before it
        /// was recorded, which `hmdp check` refuses).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<i64>,
        voucher: i64,
        f: Call,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order: Option<i64>,
        at_ms: i64,
    },
    /// A success answer: a purchase's order, a payment or a cancel done.
    Ok {
        client: usize,
        /// The buyer's user id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<i64>,
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
    /// The buyer's user id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<i64>,
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
    /// The client, user and voucher of a request or its answer; `None` for
    /// a sale or a fault.
    pub fn asked_by(&self) -> Option<(usize, Option<i64>, i64)> {
        match self {
            Event::Invoke {
                client,
                user,
                voucher,
                ..
            }
            | Event::Ok {
                client,
                user,
                voucher,
                ..
            }
            | Event::Fail(Failure {
                client,
                user,
                voucher,
                ..
            })
            | Event::Unknown(Failure {
                client,
                user,
                voucher,
                ..
            }) => Some((*client, *user, *voucher)),
            Event::Sale { .. } | Event::Fault { .. } => None,
        }
    }

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
                user: Some(1010),
                voucher: 7,
                f: Call::Buy,
                order: None,
                at_ms: 2,
            },
            Event::Ok {
                client: 0,
                user: Some(1010),
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
                user: Some(1011),
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
            r#"{"op":"ok","client":0,"user":1010,"voucher":7,"f":"buy","order":42,"node":"node1","at_ms":3}"#
        );
        assert_eq!(
            serde_json::to_string(&events[4]).unwrap(),
            r#"{"op":"fail","client":1,"user":1011,"voucher":7,"f":"buy","error":"SOLD_OUT","at_ms":5}"#
        );
        // A history written before user ids were recorded still reads.
        let old = r#"{"op":"ok","client":0,"voucher":7,"f":"buy","order":42,"node":"n","at_ms":3}"#;
        let event: Event = serde_json::from_str(old).unwrap();
        assert_eq!(event.asked_by(), Some((0, None, 7)));
    }

    #[test]
    fn only_business_refusals_are_definite() {
        assert!(definite_refusal("SOLD_OUT"));
        assert!(!definite_refusal("UNAVAILABLE"));
        assert!(!definite_refusal("TIMEOUT"));
    }
}
