//! What a hold and the watchdog renewing it share: the key, the hold's
//! field in it, the lease, and what became of the hold (renewed until
//! when, found lost, being given back). The hold owns it; the watchdog
//! keeps a weak reference, so a hold that ends ends its renewals.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// One hold's key and lease, as its guards and its renewals see them.
pub(super) struct Lease {
    pub(super) key: String,
    /// The hold's field in the key's hash.
    pub(super) owner: String,
    /// How long Redis keeps the key after each take or renewal.
    pub(super) length: Duration,
    /// Set when the last guard starts giving back the last hold: a renewal
    /// that finds the key gone from now on saw the release, not a loss.
    pub(super) releasing: AtomicBool,
    /// Set when a renewal found the key taken or gone.
    pub(super) lost: AtomicBool,
    /// Until when Redis keeps the key for us, by our clock: counted from
    /// when the command that set the lease was sent, so never too late.
    valid_until: Mutex<Instant>,
}

impl Lease {
    /// A lease of `length` on `key`, set by a command sent at `sent`.
    pub(super) fn new(key: String, owner: String, length: Duration, sent: Instant) -> Lease {
        Lease {
            key,
            owner,
            length,
            releasing: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            valid_until: Mutex::new(sent + length),
        }
    }

    /// Until when Redis keeps the key for us, by our clock.
    pub(super) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().expect("lease poisoned")
    }

    /// The lease was set again by a command sent at `sent`.
    pub(super) fn renewed(&self, sent: Instant) {
        *self.valid_until.lock().expect("lease poisoned") = sent + self.length;
    }

    /// Whether the key is surely still ours: no renewal found it gone and
    /// the lease has not run out by our (conservative) clock.
    pub(super) fn running(&self) -> bool {
        !self.lost.load(Ordering::SeqCst) && Instant::now() < self.valid_until()
    }
}
