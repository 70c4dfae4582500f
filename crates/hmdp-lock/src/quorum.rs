//! `multi` and `redlock`: one lock over several independent Redis servers
//! ([`LockBuilder::nodes`](crate::LockBuilder::nodes)), not replicas of each other,
//! so losing one server (or its unreplicated writes) cannot hand the lock to
//! a second holder.
//!
//! Both take the same key on every node in parallel, under one deadline for
//! the whole round, with the reentrant hash scripts (so a holder can re-enter
//! here too) and an explicit lease. They differ in how many nodes must agree:
//! - `multi` (Redisson `MultiLock`): all of them; any refusal fails the round.
//! - `redlock`: a majority (N/2+1), and only while the validity time
//!   `lease − elapsed − drift` (drift = lease × 1% + 2 ms) is left.
//!
//! A failed round releases the key on every node it asked (a request that
//! timed out may still have landed), so no partial locks stay behind. Each
//! round's takes leave a marker beside the key, and only a marked take is
//! given back: a re-entry that never reached a node must not take away the
//! outer hold there. Every round reports which nodes agreed.

use std::time::Duration;

use crate::connection::Connection;
use async_trait::async_trait;
use futures::future::join_all;
use rand::RngExt;
use tokio::time::Instant;

use crate::connection::timed_connection;
use crate::keys::sibling;
use crate::lock::BuildError;
use crate::lock::{release_dropped, DistributedLock, LockError, LockGuard, Release};
use crate::mode::LockMode;
use crate::observer::LostReason;
use crate::owner;
use crate::owner::Holder;
use crate::scripts::{GiveBack, Take, Taken};

struct Node {
    /// `host:port`, for reports and logs.
    name: String,
    redis: Connection,
}

/// What one node said in one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// The node's `host:port`.
    pub node: String,
    /// Whether the node took the key for this round.
    pub agreed: bool,
    /// What the node answered.
    pub detail: Vote,
}

/// One node's answer in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    /// The node took the key.
    Taken,
    /// Another owner holds the key there.
    Busy,
    /// The node could not be reached.
    Unreachable,
    /// No answer before the round's deadline: the take may still land.
    TimedOut,
}

impl Vote {
    /// Whether the node took the key, or may have (no answer): a failed
    /// round's takes to undo there.
    fn may_hold(self) -> bool {
        self != Vote::Busy
    }
}

impl std::fmt::Display for Vote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Vote::Taken => "taken",
            Vote::Busy => "busy",
            Vote::Unreachable => "unreachable",
            Vote::TimedOut => "timed out",
        })
    }
}

/// A lock over independent Redis nodes: all-or-nothing or majority.
pub struct QuorumLock {
    mode: LockMode,
    nodes: Vec<Node>,
    quorum: usize,
    lease: Duration,
    wait: Duration,
    /// One round's deadline for all nodes: short against the lease, so a
    /// dead node costs little of the validity time.
    round: Duration,
}

impl QuorumLock {
    /// `multi`: every node must agree.
    pub fn multi(urls: &[String], lease: Duration, wait: Duration) -> Result<Self, BuildError> {
        Self::new(LockMode::Multi, urls, urls.len(), lease, wait)
    }

    /// `redlock`: a majority of the nodes must agree within the validity time.
    pub fn redlock(urls: &[String], lease: Duration, wait: Duration) -> Result<Self, BuildError> {
        Self::new(LockMode::Redlock, urls, urls.len() / 2 + 1, lease, wait)
    }

    fn new(
        mode: LockMode,
        urls: &[String],
        quorum: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Self, BuildError> {
        if urls.is_empty() {
            return Err(BuildError::NoNodes(mode));
        }
        // At least 50 ms: a round may have to open a node's connection and
        // load the script before it can answer.
        let round = (lease / 4).clamp(Duration::from_millis(50), Duration::from_millis(500));
        let nodes = urls
            .iter()
            .map(|url| {
                let client = redis::Client::open(url.as_str())?;
                Ok(Node {
                    // `host:port`, without the URL's credentials.
                    name: client.get_connection_info().addr().to_string(),
                    redis: timed_connection(client, round, 0)?.into(),
                })
            })
            .collect::<Result<Vec<_>, BuildError>>()?;
        Ok(QuorumLock {
            mode,
            nodes,
            quorum,
            lease,
            wait,
            round,
        })
    }

    /// Nodes that must agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Like [`DistributedLock::acquire_as_within`], also telling what each
    /// node said in the last round.
    pub async fn acquire_reported(
        &self,
        holder: Holder,
        key: &str,
        wait: Duration,
    ) -> Result<(Option<Box<dyn LockGuard>>, Vec<NodeReport>), LockError> {
        let owner = holder.owner();
        let deadline = Instant::now() + wait;
        loop {
            let start = Instant::now();
            let round_end = start + self.round;
            let marker = sibling(key, &format!("take:{}", owner::unique_name(&owner)));
            let votes = join_all(self.nodes.iter().map(|node| async {
                let take = Take {
                    key,
                    owner: &owner,
                    lease: self.lease,
                    marker: Some(&marker),
                };
                let taken =
                    tokio::time::timeout_at(round_end, take.run(&mut node.redis.clone())).await;
                let vote = match taken {
                    Ok(Ok(Taken::Yes { .. })) => Vote::Taken,
                    Ok(Ok(Taken::Busy { .. })) => Vote::Busy,
                    Ok(Err(_)) => Vote::Unreachable,
                    Err(_) => Vote::TimedOut,
                };
                NodeReport {
                    node: node.name.clone(),
                    agreed: vote == Vote::Taken,
                    detail: vote,
                }
            }))
            .await;
            let agreed = votes.iter().filter(|vote| vote.agreed).count();
            let drift = self.lease / 100 + Duration::from_millis(2);
            let validity = self
                .lease
                .checked_sub(start.elapsed() + drift)
                .filter(|left| !left.is_zero());
            tracing::debug!(mode = %self.mode, key, agreed, quorum = self.quorum, ?votes, "lock round");
            // Nodes that took the key, or may have (no answer): the ones to undo.
            let asked: Vec<(String, Connection)> = votes
                .iter()
                .zip(&self.nodes)
                .filter(|(vote, _)| vote.detail.may_hold())
                .map(|(_, node)| (node.name.clone(), node.redis.clone()))
                .collect();
            match validity {
                Some(validity) if agreed >= self.quorum => {
                    let hold = QuorumHold {
                        nodes: asked,
                        key: key.to_owned(),
                        owner,
                        marker,
                        lease: self.lease,
                        quorum: self.quorum,
                        valid_until: start + validity,
                    };
                    return Ok((Some(Box::new(hold)), votes));
                }
                _ => {
                    release_on(&asked, key, &owner, &marker, self.lease).await;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok((None, votes));
            }
            // A random pause keeps contenders from retrying in lockstep.
            let pause = Duration::from_millis(rand::rng().random_range(10..50));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }
}

/// A hold on a quorum of nodes, valid until its validity time runs out.
struct QuorumHold {
    /// The nodes that took the key (or may have), to release on; emptied
    /// once a release has started.
    nodes: Vec<(String, Connection)>,
    key: String,
    owner: String,
    /// The round's take marker: where it is missing, the take never landed.
    marker: String,
    lease: Duration,
    quorum: usize,
    valid_until: Instant,
}

impl crate::lock::sealed::InKey for QuorumHold {}

#[async_trait]
impl LockGuard for QuorumHold {
    async fn release(mut self: Box<Self>) -> Result<Release, LockError> {
        let nodes = std::mem::take(&mut self.nodes);
        let outcomes = release_on(&nodes, &self.key, &self.owner, &self.marker, self.lease).await;
        Ok(overall(&outcomes, self.quorum))
    }

    async fn ensure_held(&self) -> Result<(), LockError> {
        if Instant::now() >= self.valid_until {
            return Err(LockError::Lost(LostReason::LeaseExpired));
        }
        Ok(())
    }
}

impl Drop for QuorumHold {
    fn drop(&mut self) {
        if self.nodes.is_empty() {
            return;
        }
        let nodes = std::mem::take(&mut self.nodes);
        let (key, owner, marker) = (self.key.clone(), self.owner.clone(), self.marker.clone());
        let lease = self.lease;
        let quorum = self.quorum;
        release_dropped(self.key.clone(), async move {
            let outcomes = release_on(&nodes, &key, &owner, &marker, lease).await;
            Ok(overall(&outcomes, quorum))
        });
    }
}

#[async_trait]
impl DistributedLock for QuorumLock {
    fn mode(&self) -> LockMode {
        self.mode
    }

    fn wait(&self) -> Duration {
        self.wait
    }

    async fn acquire_as_within(
        &self,
        holder: Holder,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Box<dyn LockGuard>>, LockError> {
        Ok(self.acquire_reported(holder, key, wait).await?.0)
    }
}

/// What a release on several nodes did, as one answer: clean when a quorum
/// of them gave the hold back.
fn overall(outcomes: &[Release], quorum: usize) -> Release {
    let clean = outcomes.iter().filter(|outcome| outcome.is_clean()).count();
    if clean >= quorum {
        outcomes
            .iter()
            .find_map(|outcome| match outcome {
                Release::StillHeld(left) => Some(Release::StillHeld(*left)),
                _ => None,
            })
            .unwrap_or(Release::Released)
    } else if outcomes.contains(&Release::NotOwner) {
        Release::NotOwner
    } else {
        Release::Expired
    }
}

/// Gives back one round's take (the one that left `marker`) on each node in
/// parallel; a node it never reached, or cannot reach now, counts as expired
/// (its copy will be, within the lease).
async fn release_on(
    nodes: &[(String, Connection)],
    key: &str,
    owner: &str,
    marker: &str,
    lease: Duration,
) -> Vec<Release> {
    let release_id = owner::unique_name(owner);
    let give_back = GiveBack {
        key,
        owner,
        lease,
        release_id: &release_id,
        attempt: 1,
        take_marker: Some(marker),
    };
    join_all(nodes.iter().map(|(name, redis)| {
        let give_back = &give_back;
        async move {
            match give_back.run(&mut redis.clone()).await {
                Ok(given_back) => given_back.release(false),
                Err(error) => {
                    tracing::warn!(node = %name, %error, "cannot release the lock on a node");
                    Release::Expired
                }
            }
        }
    }))
    .await
}
