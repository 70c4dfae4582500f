//! Waiting for replicas: a layer around a single-Redis lock that, once the
//! lock is taken, waits until enough replicas acknowledged the write
//! (`WAIT numreplicas timeout`) before handing the hold out.
//!
//! Redis replicates asynchronously: a master can acknowledge a lock and die
//! before any replica has it, and the replica promoted in its place hands the
//! same lock to the next holder (the `failover` and `cluster-failover` labs
//! show it). Waiting for `replicas` acknowledgements closes that window for
//! every failover that promotes one of the replicas that acknowledged
//! (Redisson offers the same as `syncSlaves`). It does not make Redis
//! strongly consistent: a replica that acknowledged may still lose a
//! promotion race to one that did not. Its cost is one replication round
//! trip per acquisition, and an acquisition fails (cleanly: the hold is given
//! back) while fewer replicas than asked for answer within the timeout.
//!
//! On a Redis Cluster `WAIT` goes to every master and the smallest count is
//! the answer, so the key's own master is among those asked.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::connection::Connection;
use crate::lock::{refuse, DistributedLock, LockError, LockGuard};
use crate::mode::LockMode;
use crate::owner::Holder;

/// Any single-Redis lock whose holds are replicated before they are handed out.
pub struct SyncReplicas {
    inner: Arc<dyn DistributedLock>,
    redis: Connection,
    replicas: u32,
    timeout: Duration,
}

impl SyncReplicas {
    /// Wraps `inner`, whose keys live on `redis`: a hold is handed out once
    /// `replicas` replicas acknowledged it, waiting at most `timeout`.
    pub fn new(
        inner: Arc<dyn DistributedLock>,
        redis: impl Into<Connection>,
        replicas: u32,
        timeout: Duration,
    ) -> Self {
        SyncReplicas {
            inner,
            redis: redis.into(),
            replicas,
            timeout,
        }
    }

    /// How many replicas acknowledged every write sent on the connection
    /// so far (the lock's among them), waiting at most the timeout.
    async fn acknowledged(&self) -> Result<u32, LockError> {
        // `WAIT 0` would wait forever: at least one millisecond.
        let timeout_ms = self.timeout.as_millis().max(1) as u64;
        Ok(redis::cmd("WAIT")
            .arg(self.replicas)
            .arg(timeout_ms)
            .query_async(&mut self.redis.clone())
            .await?)
    }
}

#[async_trait]
impl DistributedLock for SyncReplicas {
    fn mode(&self) -> LockMode {
        self.inner.mode()
    }

    fn wait(&self) -> Duration {
        self.inner.wait()
    }

    async fn acquire_as_within(
        &self,
        holder: Holder,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        let Some(held) = self.inner.acquire_as_within(holder, key, wait).await? else {
            return Ok(None);
        };
        let failure = match self.acknowledged().await {
            Ok(acked) if acked >= self.replicas => return Ok(Some(held)),
            Ok(acked) => LockError::NotReplicated {
                acked,
                wanted: self.replicas,
            },
            Err(error) => error,
        };
        // A hold that a failover could lose is not handed out.
        Err(refuse(held, failure).await)
    }
}
