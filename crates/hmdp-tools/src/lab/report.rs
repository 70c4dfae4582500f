//! The outcome of a lab run as it is printed: the header, the timeline of
//! what each actor did, and the verdict on the scenario's promise.

use std::fmt;
use std::time::Duration;

use hmdp_lock::{LockMode, Release};

/// A participant of a scenario: "A", "B", "C".
pub type Actor = &'static str;

/// One line of the timeline.
#[derive(Debug, Clone)]
pub struct Event {
    pub at: Duration,
    pub who: &'static str,
    pub what: String,
}

/// The outcome of one run: the timeline, who overlapped, what each release
/// reported, and the verdict.
#[derive(Debug, Clone)]
pub struct Report {
    pub scenario: &'static str,
    /// The header's description of the run, instead of the lock key and
    /// lease (the asynchronous purchase's scenarios).
    pub setup: Option<String>,
    /// What the verdict judges: "mutual exclusion held", ...
    pub promise: &'static str,
    pub mode: LockMode,
    pub key: String,
    pub lease: Option<Duration>,
    pub events: Vec<Event>,
    /// Each moment two or more actors were inside the critical section: who.
    pub overlaps: Vec<Vec<Actor>>,
    /// Other breaks of the lock's promise, in the scenario's words.
    pub failures: Vec<String>,
    pub fencing: bool,
    /// Each release, in order, with what it reported.
    pub releases: Vec<(Actor, Release)>,
    /// Why mutual exclusion held or broke, in the scenario's words.
    pub explanation: String,
}

impl Report {
    /// Whether no two actors were ever inside the critical section at once
    /// and the lock broke no other promise.
    pub fn kept(&self) -> bool {
        self.overlaps.is_empty() && self.failures.is_empty()
    }

    /// 0 when the promise held, 1 when it broke.
    pub fn exit_code(&self) -> i32 {
        if self.kept() {
            0
        } else {
            1
        }
    }

    /// What `who`'s release reported, if it released.
    pub fn release_of(&self, who: Actor) -> Option<Release> {
        self.releases
            .iter()
            .find(|(actor, _)| *actor == who)
            .map(|(_, release)| *release)
    }

    /// The one-line verdict.
    pub fn verdict(&self) -> String {
        if self.kept() {
            format!("KEPT: {}. {}", self.promise, self.explanation)
        } else if self.overlaps.is_empty() {
            format!("BROKEN: {}. {}", self.failures.join("; "), self.explanation)
        } else {
            let who: Vec<String> = self.overlaps.iter().map(|set| set.join("+")).collect();
            format!(
                "BROKEN: {} inside the critical section at once. {}",
                who.join(", "),
                self.explanation
            )
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(setup) = &self.setup {
            writeln!(f, "lab {} {setup}", self.scenario)?;
            return self.timeline_and_verdict(f);
        }
        write!(
            f,
            "lab {} --lock {}{} (key {}",
            self.scenario,
            self.mode,
            if self.fencing { " --fencing" } else { "" },
            self.key
        )?;
        // The in-process modes ignore the lease.
        let leased = !matches!(self.mode, LockMode::NoLock | LockMode::Local);
        if let (Some(lease), true) = (self.lease, leased) {
            let renewed = if self.mode == LockMode::Reentrant {
                ", renewed by the watchdog"
            } else {
                ""
            };
            write!(f, ", lease {} ms{renewed}", lease.as_millis())?;
        }
        writeln!(f, ")")?;
        self.timeline_and_verdict(f)
    }
}

impl Report {
    fn timeline_and_verdict(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for event in &self.events {
            let at = format!("t={}ms", event.at.as_millis());
            writeln!(f, "  {at:<9} {:<6} {}", event.who, event.what)?;
        }
        writeln!(f, "verdict: {}", self.verdict())
    }
}
