//! Load shedding: a node admits only as many purchases at once as it can
//! finish within its latency target, and answers the rest at once — 503
//! `OVERLOADED` with `Retry-After` — instead of queueing them until the
//! backend timeout answers them anyway, having slowed every other purchase
//! on the way.
//!
//! The bound adapts, once per target's time: when purchases of that time
//! finished late, it becomes what the node finished in that time scaled to
//! the target (Little's law: at that pace, that many at once finish within
//! the target), never under its floor; when none was late, it doubles, up
//! to its ceiling. A healthy node sits at the ceiling and sheds nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;

use crate::error::Error;
use crate::metrics;

/// How the node sheds purchases it could not finish in time.
#[derive(Debug, Clone, Args)]
pub struct ShedSettings {
    /// Latency target of a purchase, in ms: past it the node admits fewer
    /// purchases at once, and answers the others 503 OVERLOADED at once.
    /// 0: never shed.
    #[arg(long, env = "HMDP_SHED_LATENCY_MS", default_value_t = 250)]
    pub shed_latency_ms: u64,

    /// The fewest purchases admitted at once, however slow they are.
    #[arg(long, env = "HMDP_SHED_MIN_IN_FLIGHT", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub shed_min_in_flight: u64,

    /// The most purchases admitted at once, however fast they are.
    #[arg(long, env = "HMDP_SHED_MAX_IN_FLIGHT", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub shed_max_in_flight: u64,
}

/// The node's purchases in flight, and how many it admits.
#[derive(Clone)]
pub struct Overload {
    shared: Option<Arc<Shared>>,
}

struct Shared {
    target: Duration,
    floor: f64,
    ceiling: f64,
    in_flight: AtomicUsize,
    bound: Mutex<Bound>,
}

struct Bound {
    /// Purchases admitted at once.
    most: f64,
    /// Since when the purchases finished are counted.
    since: Instant,
    finished: u32,
    late: u32,
}

/// A purchase admitted: counted in flight until dropped, its latency then
/// adjusting the bound.
pub struct Admitted {
    shared: Option<Arc<Shared>>,
    since: Instant,
}

impl Overload {
    pub fn new(settings: &ShedSettings) -> Overload {
        let shared = (settings.shed_latency_ms > 0).then(|| {
            let floor = settings.shed_min_in_flight as f64;
            let ceiling = (settings.shed_max_in_flight as f64).max(floor);
            metrics::PURCHASE_BOUND.set(ceiling as i64);
            Arc::new(Shared {
                target: Duration::from_millis(settings.shed_latency_ms),
                floor,
                ceiling,
                in_flight: AtomicUsize::new(0),
                bound: Mutex::new(Bound {
                    most: ceiling,
                    since: Instant::now(),
                    finished: 0,
                    late: 0,
                }),
            })
        });
        Overload { shared }
    }

    /// Admits one purchase, or refuses it at once: 503 `OVERLOADED`.
    pub fn admit(&self) -> Result<Admitted, Error> {
        let since = Instant::now();
        let Some(shared) = &self.shared else {
            return Ok(Admitted {
                shared: None,
                since,
            });
        };
        let most = shared.bound.lock().expect("overload poisoned").most as usize;
        let admitted = (shared.in_flight)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < most).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            metrics::PURCHASES_SHED.inc();
            return Err(Error::Overloaded);
        }
        Ok(Admitted {
            shared: Some(shared.clone()),
            since,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let Some(shared) = &self.shared else {
            return;
        };
        shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        let late = self.since.elapsed() > shared.target;
        let mut bound = shared.bound.lock().expect("overload poisoned");
        bound.finished += 1;
        bound.late += u32::from(late);
        let counted_for = bound.since.elapsed();
        if counted_for < shared.target {
            return;
        }
        let most = if bound.late > 0 {
            let at_once =
                f64::from(bound.finished) * shared.target.as_secs_f64() / counted_for.as_secs_f64();
            at_once.clamp(shared.floor, shared.ceiling)
        } else {
            (bound.most * 2.0).min(shared.ceiling)
        };
        metrics::PURCHASE_BOUND.set(most as i64);
        *bound = Bound {
            most,
            since: Instant::now(),
            finished: 0,
            late: 0,
        };
    }
}
