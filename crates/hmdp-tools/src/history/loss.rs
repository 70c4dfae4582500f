//! The losses docs/guarantees.md allows some configurations, and which
//! fault of a history explains a success answer whose order MySQL lacks.

use std::time::Duration;

use clap::ValueEnum;

use super::{Event, FaultKind};

/// How far back from a Redis restart an `appendfsync everysec` AOF may
/// have lost writes: its one-second fsync interval, and as much again for
/// a busy machine's fsync.
pub const EVERYSEC_BOUND: Duration = Duration::from_secs(2);

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

impl Loss {
    /// Its name on the command line and in the report.
    pub fn name(self) -> String {
        self.to_possible_value()
            .expect("every loss has a name")
            .get_name()
            .to_owned()
    }
}

/// A fault of the history, as the losses read it.
#[derive(Debug, Clone, Copy)]
pub struct Fault<'a> {
    pub kind: FaultKind,
    /// The node killed, for a kill.
    pub node: Option<&'a str>,
    pub at_ms: i64,
}

impl<'a> Fault<'a> {
    /// The faults of `events`, in their order.
    pub fn all(events: &'a [Event]) -> Vec<Fault<'a>> {
        (events.iter())
            .filter_map(|event| match event {
                Event::Fault {
                    kind, node, at_ms, ..
                } => Some(Fault {
                    kind: *kind,
                    node: node.as_deref(),
                    at_ms: *at_ms,
                }),
                _ => None,
            })
            .collect()
    }
}

/// The allowed loss, if any, that explains an order answered at `at_ms` by
/// `node` and missing from MySQL: of the faults of its kind that came after
/// the answer, and soon enough after it, the earliest. Soon enough: within
/// the writers' lag (`writers_lag`: an order answered longer before the
/// fault had been written by then, or never would be), and within
/// [`EVERYSEC_BOUND`] for what an `everysec` AOF forgets.
pub fn allowed_loss(
    at_ms: i64,
    node: &str,
    faults: &[Fault<'_>],
    allowed: &[Loss],
    writers_lag: Duration,
) -> Option<Loss> {
    let explains = |loss: Loss, fault: &Fault<'_>| {
        let after = fault.at_ms - at_ms;
        let within = |bound: Duration| after <= bound.as_millis() as i64;
        match loss {
            Loss::RedisRestart => fault.kind == FaultKind::RedisRestart && within(writers_lag),
            Loss::Everysec => {
                fault.kind == FaultKind::RedisRestart && within(EVERYSEC_BOUND.min(writers_lag))
            }
            Loss::QueueNodeKill => {
                fault.kind == FaultKind::NodeKill && fault.node == Some(node) && within(writers_lag)
            }
        }
    };
    (faults.iter())
        .filter(|fault| fault.at_ms >= at_ms)
        .flat_map(|fault| {
            (allowed.iter())
                .filter(move |loss| explains(**loss, fault))
                .map(move |loss| (fault.at_ms, *loss))
        })
        .min_by_key(|(fault_ms, _)| *fault_ms)
        .map(|(_, loss)| loss)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: Duration = Duration::from_secs(10);

    fn fault(kind: FaultKind, node: Option<&str>, at_ms: i64) -> Fault<'_> {
        Fault { kind, node, at_ms }
    }

    #[test]
    fn a_loss_passes_only_when_a_fault_of_its_kind_follows_it_within_the_bound() {
        let faults = [
            fault(FaultKind::RedisRestart, None, 10_000),
            fault(FaultKind::NodeKill, Some("node2"), 20_000),
        ];
        let any = [Loss::RedisRestart];
        assert_eq!(
            allowed_loss(9_000, "node1", &faults, &any, LAG),
            Some(Loss::RedisRestart)
        );
        assert!(allowed_loss(11_000, "node1", &faults, &any, LAG).is_none());
        // Answered long before the restart: written by then, or never.
        assert!(allowed_loss(-5_000, "node1", &faults, &any, LAG).is_none());
        let everysec = [Loss::Everysec];
        assert!(allowed_loss(1_000, "node1", &faults, &everysec, LAG).is_none());
        assert!(allowed_loss(9_000, "node1", &faults, &everysec, LAG).is_some());
        let queue = [Loss::QueueNodeKill];
        assert!(allowed_loss(15_000, "node2", &faults, &queue, LAG).is_some());
        assert!(allowed_loss(15_000, "node1", &faults, &queue, LAG).is_none());
        assert!(allowed_loss(5_000, "node2", &faults, &queue, LAG).is_none());
        // Both allowed: the earliest fault after the answer names it.
        let both = [Loss::RedisRestart, Loss::QueueNodeKill];
        let kill_first = [
            fault(FaultKind::NodeKill, Some("node1"), 10_000),
            fault(FaultKind::RedisRestart, None, 12_000),
        ];
        assert_eq!(
            allowed_loss(9_000, "node1", &kill_first, &both, LAG),
            Some(Loss::QueueNodeKill)
        );
        assert_eq!(
            allowed_loss(9_000, "node2", &kill_first, &both, LAG),
            Some(Loss::RedisRestart)
        );
        assert!(allowed_loss(9_000, "node1", &faults, &[], LAG).is_none());
        assert_eq!(Loss::QueueNodeKill.name(), "queue-node-kill");
    }
}
