//! Fault injection points: where a test or a lab scenario may stop a holder
//! at the exact moment a failure needs. Production code injects none.

use std::sync::Arc;

use futures::future::BoxFuture;

/// A pause a fault injection point runs, e.g. sleeping until a chosen moment.
pub type Pause = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Fault injection points a lock honours.
#[derive(Clone, Default)]
pub struct Faults {
    /// Runs inside a release right before the command that deletes the key:
    /// for `redis-owner` between its `GET` check and its `DEL` (lock v2's
    /// gap), for `redis-naive` before its unchecked `DEL`, for `redis-lua`
    /// before its script, whose check and delete are one step. Locks without
    /// such a command (`none`, `local`) ignore it.
    pub before_delete: Option<Pause>,
}

impl Faults {
    /// No faults: what production code runs with.
    pub fn none() -> Self {
        Faults::default()
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("before_delete", &self.before_delete.is_some())
            .finish()
    }
}
