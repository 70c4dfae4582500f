//! What a running consumer's loops are told: to stop (the node's graceful
//! shutdown), or to run a round now ([`RoundsNow`], what a test drives
//! instead of waiting for the consumer's timers).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Asks a consumer's loops for a round now ([`RoundsNow::ask`]).
#[derive(Clone)]
pub struct RoundsNow(pub(super) Arc<watch::Sender<u64>>);

impl RoundsNow {
    /// Every stream's loop ends the pause it is in (a back-off, the wait
    /// for MySQL) and claims at its next round, and the consumer looks for
    /// new shards; a loop in a read or a batch does so once that ends.
    pub fn ask(&self) {
        self.0.send_modify(|asked| *asked += 1);
    }
}

/// What a loop of the consumer is told while it runs: to stop, or to run
/// a round now.
#[derive(Clone)]
pub(super) struct Signals {
    pub(super) stopped: watch::Receiver<bool>,
    /// Marked changed while a round asked for has not run yet.
    pub(super) rounds: watch::Receiver<u64>,
}

impl Signals {
    pub(super) fn stopping(&self) -> bool {
        *self.stopped.borrow()
    }

    /// Whether a round was asked for since the last look.
    pub(super) fn round_asked(&mut self) -> bool {
        let asked = self.rounds.has_changed().unwrap_or(false);
        self.rounds.mark_unchanged();
        asked
    }

    /// Sleeps `how_long` unless told to stop or asked for a round first;
    /// `true` when told to stop (or when the `RunningConsumer` is gone,
    /// which can no longer tell).
    pub(super) async fn pause(&mut self, how_long: Duration) -> bool {
        // Cancel-safe: dropping `wait_for` or `changed` loses nothing, the
        // flag stays set and the round stays asked for.
        let told = tokio::select! {
            _ = self.stopped.wait_for(|stop| *stop) => true,
            Ok(()) = self.rounds.changed() => {
                // `changed` marked the ask seen: it stays asked for the
                // loop's next round.
                self.rounds.mark_changed();
                false
            }
            () = tokio::time::sleep(how_long) => false,
        };
        told || self.stopping()
    }
}
