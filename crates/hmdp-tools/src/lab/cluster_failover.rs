//! `hmdp lab cluster-failover`: the lock lost when a Redis Cluster fails a
//! master over to a replica that never received it, and `WAIT` for replicas
//! (`--lock-sync-replicas`) closing that window.
//!
//! The scenario starts a cluster of its own (three masters, three replicas).
//! The replica of the master serving the lock key's slot is frozen
//! (SIGSTOP) and its replication link cut, so the lock cannot reach it
//! (what a slow network or a long GC pause on the replica does); A locks;
//! the master is SIGKILLed; the replica thaws, the cluster promotes it (the
//! real mechanism: failure detection, election, slot takeover), the old
//! master rejoins as its replica, and B, on a connection of its own as
//! another node would be, locks the same key on the new master.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use hmdp_lock::{DistributedLock, Holder, LockError, LockGuard};
use redis::Value;

use super::failover::has_key;
use super::harness::{Lab, SYNC_REPLICAS_TIMEOUT};
use super::LabArgs;
use hmdp_test_support::RedisCluster;

const LEASE: Duration = Duration::from_millis(10_000);
/// How long B keeps trying while its connection learns the new topology.
const RETRY_DEADLINE: Duration = Duration::from_secs(10);

/// `hmdp lab cluster-failover`.
#[derive(Debug, Clone, Args)]
pub struct ClusterFailoverArgs {
    #[command(flatten)]
    pub lab: LabArgs,

    /// Hand a lock out only once this many replicas acknowledged it (`WAIT`,
    /// 1 s): with 1, A's lock, which cannot reach the frozen replica, is
    /// refused instead of being lost in the failover.
    #[arg(long, default_value_t = 0)]
    pub lock_sync_replicas: u32,
}

pub(super) async fn run(lab: &Lab, args: &ClusterFailoverArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        lab.mode().uses_main_redis(),
        "cluster-failover runs a lock kept on the cluster: redis-naive, redis-owner, \
         redis-lua or reentrant (multi and redlock: see `hmdp lab failover`)"
    );
    let mut cluster = RedisCluster::start().await?;
    let (slot, master, replica) = shard_of(&cluster, lab.key()).await?;
    lab.say(
        "redis",
        format!(
            "a Redis Cluster of 3 masters and 3 replicas; the lock key's slot {slot} is \
             served by master :{master}, replicated to :{replica}"
        ),
    );
    let (master_at, replica_at) = (cluster.position(master)?, cluster.position(replica)?);
    let lock_a = lab.lock_replicated_on(&cluster.url(), LEASE, args.lock_sync_replicas)?;
    let lock_b = lab.lock_replicated_on(&cluster.url(), LEASE, args.lock_sync_replicas)?;
    if args.lock_sync_replicas > 0 {
        lab.say(
            "redis",
            format!(
                "a lock is handed out once {} replica(s) acknowledged it (WAIT, {} ms)",
                args.lock_sync_replicas,
                SYNC_REPLICAS_TIMEOUT.as_millis()
            ),
        );
    }

    cluster.stall_replica_of(master).await?;
    lab.say(
        "redis",
        format!(
            "replica :{replica} stalls (SIGSTOP) and loses its link to the master: \
             nothing the master writes reaches it"
        ),
    );
    let a = acquire_a(lab, &*lock_a).await?;
    let on_master = has_key(&cluster.servers()[master_at], lab.key()).await?;
    lab.say(
        "redis",
        format!("the lock key is on master :{master}: {on_master}"),
    );
    fail_over(lab, &mut cluster, master, replica, replica_at).await?;
    let b = acquire_b(lab, &*lock_b).await?;
    if let Some(held) = b {
        lab.enter("B");
        lab.leave("B");
        lab.release("B", held).await?;
    }
    if let Some(held) = a {
        lab.leave("A");
        lab.release("A", held).await?;
    }

    Ok(explanation(lab.broken(), args.lock_sync_replicas))
}

/// `master` dies and the cluster promotes `replica` (at `replica_at` among
/// its servers), which A's lock never reached; the old master then comes
/// back as the new master's replica.
async fn fail_over(
    lab: &Lab,
    cluster: &mut RedisCluster,
    master: u16,
    replica: u16,
    replica_at: usize,
) -> anyhow::Result<()> {
    cluster.fail_over(master, replica).await?;
    lab.say(
        "redis",
        format!(
            "master :{master} dies (SIGKILL); replica :{replica} wakes up (SIGCONT) and \
             finds its master gone"
        ),
    );
    let kept = has_key(&cluster.servers()[replica_at], lab.key()).await?;
    lab.say(
        "redis",
        format!("the cluster promoted :{replica} to master; the lock key is on it: {kept}"),
    );

    // The old master comes back (empty: nothing is kept on disk) and the
    // cluster makes it the new master's replica, as an operator's restart
    // would: a replica to acknowledge B's lock, should B wait for one.
    cluster.rejoin(master, replica).await?;
    lab.say(
        "redis",
        format!(":{master} restarts empty and rejoins as the replica of :{replica}"),
    );
    Ok(())
}

fn explanation(broken: bool, lock_sync_replicas: u32) -> String {
    if broken {
        "Replication is asynchronous: master and client called A's lock taken before the \
         replica had it, and the failover promoted that replica, so B got the same lock. \
         --lock-sync-replicas 1 waits for a replica's acknowledgement (WAIT) before \
         handing a lock out."
    } else if lock_sync_replicas > 0 {
        "A's lock could not reach a replica, so WAIT refused it and A never held a lock \
         the failover could lose; B locked on the promoted replica alone. The price: \
         every acquisition waits a replication round trip, and fails while too few \
         replicas answer."
    } else {
        "B was refused after the failover."
    }
    .to_owned()
}

/// A takes the lock; a refusal for want of replicas goes on the timeline.
async fn acquire_a(
    lab: &Lab,
    lock: &dyn DistributedLock,
) -> anyhow::Result<Option<Box<dyn LockGuard>>> {
    match lock.acquire_as(Holder::new(), lab.key()).await {
        Ok(Some(held)) => {
            lab.say("A", "acquires the lock");
            lab.enter("A");
            Ok(Some(held))
        }
        Ok(None) => bail!("A found the key busy"),
        Err(LockError::NotReplicated { acked, wanted }) => {
            lab.say(
                "A",
                format!(
                    "is refused: its lock reached {acked} of the {wanted} replica(s) asked \
                     for; the hold was given back"
                ),
            );
            Ok(None)
        }
        Err(error) => Err(error).context("A could not reach the lock"),
    }
}

/// B takes the lock, retrying while its connection finds the new master.
async fn acquire_b(
    lab: &Lab,
    lock: &dyn DistributedLock,
) -> anyhow::Result<Option<Box<dyn LockGuard>>> {
    let deadline = tokio::time::Instant::now() + RETRY_DEADLINE;
    loop {
        match lock.acquire_as(Holder::new(), lab.key()).await {
            Ok(Some(held)) => {
                lab.say("B", "acquires the lock");
                return Ok(Some(held));
            }
            Ok(None) => {
                lab.say("B", "is refused: the lock is busy");
                return Ok(None);
            }
            Err(error) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(%error, "B retries while the cluster settles");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(error).context("B could not reach the lock"),
        }
    }
}

/// The key's slot, the port of the master serving it (`CLUSTER SLOTS`) and
/// of its replica.
async fn shard_of(cluster: &RedisCluster, key: &str) -> anyhow::Result<(u16, u16, u16)> {
    let mut redis = cluster.servers()[0].connect().await?;
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(&mut redis)
        .await?;
    let ranges: Vec<Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut redis)
        .await?;
    let master = ranges
        .iter()
        .find_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let (start, end) = (int(fields.first())?, int(fields.get(1))?);
            if !(start..=end).contains(&i64::from(slot)) {
                return None;
            }
            match fields.get(2) {
                Some(Value::Array(node)) => int(node.get(1)).and_then(|p| u16::try_from(p).ok()),
                _ => None,
            }
        })
        .with_context(|| format!("CLUSTER SLOTS names no master for slot {slot}"))?;
    let replica = cluster.replica_of(master).await?;
    Ok((slot, master, replica))
}

fn int(value: Option<&Value>) -> Option<i64> {
    match value {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    }
}
