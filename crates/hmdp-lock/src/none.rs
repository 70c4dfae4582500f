//! `none`: no mutual exclusion at all (course stage V0/V1). Every
//! concurrent request of one user runs the check-then-insert at once, so
//! duplicates appear even on a single node.

use std::time::Duration;

use async_trait::async_trait;

use crate::lock::{DistributedLock, LockError, LockGuard, Release};
use crate::mode::LockMode;
use crate::owner::Holder;

/// The absent lock.
pub struct NoLock;

struct NoHold;

#[async_trait]
impl DistributedLock for NoLock {
    fn mode(&self) -> LockMode {
        LockMode::NoLock
    }

    fn wait(&self) -> Duration {
        Duration::ZERO
    }

    async fn acquire_as_within(
        &self,
        _holder: Holder,
        _key: &str,
        _wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        Ok(Some(Box::new(NoHold)))
    }
}

impl crate::lock::sealed::InKey for NoHold {}

#[async_trait]
impl LockGuard for NoHold {
    async fn release(self: Box<Self>) -> Result<Release, LockError> {
        Ok(Release::Released)
    }
}
