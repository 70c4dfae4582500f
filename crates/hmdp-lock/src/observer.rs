//! What a lock reports while it runs, for the caller's metrics or logs: the
//! lock itself depends on no metrics library.

use std::sync::Arc;

/// Something a lock noticed that its caller may want to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockEvent {
    /// A watchdog extended a hold's lease.
    LeaseRenewed,
    /// A hold was found lost while its holder still held it.
    HoldLost(LostReason),
    /// A holder stepped aside because a newer holder has a later fencing token.
    FencingRejected,
}

/// How a hold was found lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// A lease renewal found the key gone or held by another owner.
    TakenOrGone,
    /// Redis could not be reached to renew before the lease ran out.
    RedisUnreachable,
    /// The lease (or a quorum's validity time) ran out while held.
    LeaseExpired,
    /// A newer holder has a later fencing token.
    FencedOut,
}

impl LostReason {
    /// Every reason, e.g. to register a metric series for each up front.
    pub const ALL: [LostReason; 4] = [
        LostReason::TakenOrGone,
        LostReason::RedisUnreachable,
        LostReason::LeaseExpired,
        LostReason::FencedOut,
    ];

    /// A short name fit for a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::TakenOrGone => "taken_or_gone",
            LostReason::RedisUnreachable => "redis_unreachable",
            LostReason::LeaseExpired => "lease_expired",
            LostReason::FencedOut => "fenced_out",
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::TakenOrGone => "a lease renewal found the lock taken or gone",
            LostReason::RedisUnreachable => "Redis could not be reached to renew the lease",
            LostReason::LeaseExpired => "the lease ran out while held",
            LostReason::FencedOut => "a newer holder has a later fencing token",
        })
    }
}

/// Receives a lock's [`LockEvent`]s. Called inline on the lock's tasks: keep
/// it cheap (incrementing a counter is the intended use). Any
/// `Fn(LockEvent)` is one:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// use hmdp_lock::{LockBuilder, LockEvent};
///
/// let lost = Arc::new(AtomicU64::new(0));
/// let counted = lost.clone();
/// let builder = LockBuilder::reentrant().observer(Arc::new(move |event| {
///     if let LockEvent::HoldLost(reason) = event {
///         eprintln!("lock lost: {}", reason.as_str());
///         counted.fetch_add(1, Ordering::Relaxed);
///     }
/// }));
/// # let _ = builder;
/// ```
pub trait Observer: Send + Sync {
    /// Called once per event.
    fn observe(&self, event: LockEvent);
}

/// Any `Fn(LockEvent)` observes.
impl<F: Fn(LockEvent) + Send + Sync> Observer for F {
    fn observe(&self, event: LockEvent) {
        self(event)
    }
}

/// The observer of a lock nobody watches: ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl Observer for Unobserved {
    fn observe(&self, _event: LockEvent) {}
}

impl Unobserved {
    /// As the shared observer a lock keeps.
    pub(crate) fn shared() -> Arc<dyn Observer> {
        Arc::new(Unobserved)
    }
}
