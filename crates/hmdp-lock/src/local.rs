//! `local`: a per-user async mutex inside this process, the Rust
//! analogue of hmdp's `synchronized(userId.toString().intern())`.
//!
//! Correct on one node; behind nginx with two nodes each process has its own
//! map, so one user's two requests landing on different nodes both enter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::lock::{DistributedLock, LockError, LockGuard, Release};
use crate::mode::LockMode;
use crate::owner::Holder;

type KeyMutex = AsyncMutex<()>;

/// Per-key mutexes, interned like `String.intern()` but without leaking: the
/// map holds only weak references, so a key's mutex lives exactly as long as
/// somebody holds or waits for it, and dead entries are swept as the map grows.
pub struct LocalLock {
    wait: Duration,
    /// `std` mutex: held only for a map lookup, never across an `.await`.
    mutexes: Mutex<Interned>,
}

struct Interned {
    map: HashMap<String, Weak<KeyMutex>>,
    /// Sweep dead entries once the map reaches this size, then double it
    /// relative to what survived, so sweeping stays amortised O(1).
    sweep_at: usize,
}

const MIN_SWEEP_AT: usize = 1024;

impl LocalLock {
    /// A lock whose acquisitions wait up to `wait` for a busy key.
    pub fn new(wait: Duration) -> Self {
        LocalLock {
            wait,
            mutexes: Mutex::new(Interned {
                map: HashMap::new(),
                sweep_at: MIN_SWEEP_AT,
            }),
        }
    }

    fn intern(&self, key: &str) -> Arc<KeyMutex> {
        let mut interned = self.mutexes.lock().expect("lock map poisoned");
        if let Some(existing) = interned.map.get(key).and_then(Weak::upgrade) {
            return existing;
        }
        if interned.map.len() >= interned.sweep_at {
            interned.map.retain(|_, weak| weak.strong_count() > 0);
            interned.sweep_at = (interned.map.len() * 2).max(MIN_SWEEP_AT);
        }
        let mutex = Arc::new(AsyncMutex::new(()));
        interned.map.insert(key.to_owned(), Arc::downgrade(&mutex));
        mutex
    }

    /// Number of keys currently interned (live or not yet swept).
    #[cfg(test)]
    fn interned_keys(&self) -> usize {
        self.mutexes.lock().expect("lock map poisoned").map.len()
    }
}

struct LocalHold {
    _guard: OwnedMutexGuard<()>,
}

#[async_trait]
impl DistributedLock for LocalLock {
    fn mode(&self) -> LockMode {
        LockMode::Local
    }

    fn wait(&self) -> Duration {
        self.wait
    }

    async fn acquire_as_within(
        &self,
        _holder: Holder,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        let mutex = self.intern(key);
        let guard = if wait.is_zero() {
            mutex.try_lock_owned().ok()
        } else {
            tokio::time::timeout(wait, mutex.lock_owned()).await.ok()
        };
        Ok(guard.map(|guard| Box::new(LocalHold { _guard: guard }) as Box<dyn LockGuard>))
    }
}

impl crate::lock::sealed::InKey for LocalHold {}

#[async_trait]
impl LockGuard for LocalHold {
    async fn release(self: Box<Self>) -> Result<Release, LockError> {
        // Dropping the guard unlocks the mutex.
        Ok(Release::Released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn second_holder_is_refused_until_release() {
        let lock = LocalLock::new(Duration::ZERO);
        let first = lock.acquire("k").await.unwrap().expect("free key");
        assert!(lock.acquire("k").await.unwrap().is_none());
        assert!(lock.acquire("other").await.unwrap().is_some());
        assert_eq!(first.release().await.unwrap(), Release::Released);
        assert!(lock.acquire("k").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn waiting_holder_enters_after_release() {
        let lock = Arc::new(LocalLock::new(Duration::from_secs(5)));
        let first = lock.acquire("k").await.unwrap().unwrap();
        let waiter = tokio::spawn({
            let lock = lock.clone();
            async move { lock.acquire("k").await.unwrap().is_some() }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        first.release().await.unwrap();
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn map_does_not_grow_without_bound() {
        let lock = LocalLock::new(Duration::ZERO);
        for user in 0..100_000 {
            let hold = lock.acquire(&format!("lock:order:{user}")).await.unwrap();
            hold.unwrap().release().await.unwrap();
        }
        assert!(lock.interned_keys() <= 2 * MIN_SWEEP_AT);
    }
}
