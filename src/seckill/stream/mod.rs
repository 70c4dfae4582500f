//! The order stream's writer (`--seckill stream`): the course's V6 consumer,
//! made safe for many nodes.
//!
//! Every node runs one consumer in the group `order-writers` of each
//! shard's order stream (`src/shards.rs`: a one-shard sale's is
//! `{seckill}:orders`), named after the node and this process (never a
//! constant: two nodes named `c1` would share, and steal, each other's
//! pending entries). Each stream has a loop of its own, so a stream whose
//! batch is stuck (or whose master is failing over) holds up no other.
//! Each loop alternates:
//!
//! - **read** up to `--stream-batch` new entries (`XREADGROUP ... BLOCK`, on
//!   a connection of its own) and settle them as one batch;
//! - every half `--stream-claim-idle-ms`, **claim** (`XAUTOCLAIM`) entries
//!   pending longer than that with any consumer — one that died, or this one
//!   after a failed write — and settle them the same way. An entry delivered
//!   more than `--stream-max-deliveries` times goes to the dead letters.
//!
//! A batch, once read, runs to its end in a task of its own (locks, one
//! transaction, `XACK`, release): the loop only awaits it, so neither a stop
//! request nor a dropped future cuts it between its commit and its `XACK`.
//! Should the process die there anyway, the entries are claimed by another
//! consumer and found written: writes are idempotent on the order id, so a
//! redelivery is only acknowledged.
//!
//! Stopping (the node's graceful shutdown) is a flag checked between
//! batches: the read blocks for a bounded time and is never abandoned
//! half-way, since entries an abandoned read took would sit pending until
//! somebody claimed them.
//!
//! [`RoundsNow`] asks for the next rounds at once: every loop waiting out a
//! back-off or its claim interval claims now, and the shards in use are
//! looked for now — what a test drives instead of waiting for the timers.

mod batch;
mod entry;
mod group;
mod replay;
mod signals;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::writer::{Blame, OrderWriter};
use crate::redis_handle::RedisConnection;
use crate::shards::Shard;

/// A consumer with nothing pending that has not read for this many claim
/// idle times is taken for a killed process and removed from the group.
const DEAD_CONSUMER_IDLE: u32 = 10;
use crate::config::StreamSettings;
use crate::metrics;
use entry::Entry;
use group::OrderStream;
pub use group::GROUP;
pub use replay::{replay, Replay};
pub use signals::RoundsNow;
use signals::Signals;

/// Longest a read blocks, which bounds how long a stop request waits.
const MAX_BLOCK: Duration = Duration::from_secs(1);

/// How long the consumer waits after a failed round before trying again;
/// doubled for each failure in a row, up to [`MAX_RETRY`]: a MySQL stalled
/// for minutes is asked every few seconds, not hammered.
const RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(8);

/// How often the consumer looks for shards whose streams it does not read
/// yet: a voucher created since with a shard count no sale had before.
const DISCOVER_EVERY: Duration = Duration::from_secs(2);

/// This node's consumer of every shard's stream, built, not yet running.
pub struct StreamConsumer {
    name: String,
    builder: Builder,
    rounds: RoundsNow,
}

/// What it takes to read one more shard's stream.
struct Builder {
    writer: Arc<OrderWriter>,
    redis: RedisConnection,
    redis_url: String,
    timeout: Duration,
    batch: usize,
    claim_idle: Duration,
    max_deliveries: usize,
}

struct Inner {
    writer: Arc<OrderWriter>,
    stream: OrderStream,
    batch: usize,
    claim_idle: Duration,
    max_deliveries: usize,
}

/// A running consumer; [`RunningConsumer::stop`] ends it gracefully.
pub struct RunningConsumer {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl StreamConsumer {
    /// A consumer named `<node_id>:<random uuid>` in the group of the
    /// stream of each shard the sales use (the one-shard sale's always),
    /// reading each on a connection of its own to `redis_url` (replies
    /// awaited up to `timeout` beyond the read's block) and writing through
    /// `writer`.
    pub fn new(
        writer: Arc<OrderWriter>,
        redis: RedisConnection,
        redis_url: &str,
        timeout: Duration,
        settings: &StreamSettings,
        node_id: &str,
    ) -> anyhow::Result<StreamConsumer> {
        // A URL that makes no connection is refused now, not in the task.
        crate::config::connect_redis(redis_url, timeout)?;
        Ok(StreamConsumer {
            name: format!("{node_id}:{}", uuid::Uuid::new_v4().simple()),
            rounds: RoundsNow(Arc::new(watch::Sender::new(0))),
            builder: Builder {
                writer,
                redis,
                redis_url: redis_url.to_owned(),
                timeout,
                batch: settings.batch(),
                claim_idle: settings.claim_idle(),
                max_deliveries: settings.stream_max_deliveries as usize,
            },
        })
    }

    /// The consumer's name in each group.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What asks the consumer, once running, for a round now.
    pub fn rounds_now(&self) -> RoundsNow {
        self.rounds.clone()
    }

    /// Starts consuming: a task per stream, and one that starts a task for
    /// each shard the sales begin to use.
    pub fn spawn(self) -> RunningConsumer {
        metrics::init_stream(batch::OUTCOMES, batch::DEAD_LETTER_REASONS);
        let (stop, stopped) = watch::channel(false);
        let signals = Signals {
            stopped,
            rounds: self.rounds.0.subscribe(),
        };
        let span = tracing::info_span!("stream_consumer", consumer = %self.name);
        let task = tokio::spawn(self.supervise(signals).instrument(span));
        RunningConsumer { stop, task }
    }

    async fn supervise(self, mut signals: Signals) {
        let mut running: BTreeMap<Shard, JoinHandle<()>> = BTreeMap::new();
        loop {
            let mut shards = vec![Shard::SINGLE];
            match self.builder.writer.sale_state().shards_in_use().await {
                Ok(in_use) => shards.extend(in_use),
                Err(error) => {
                    tracing::warn!(error = %error, "shards in use not read; looking again shortly")
                }
            }
            for shard in shards {
                if running.contains_key(&shard) {
                    continue;
                }
                match self.builder.stream(shard, &self.name) {
                    Ok(inner) => {
                        let span = tracing::info_span!("stream", shard = shard.tag());
                        let task = tokio::spawn(inner.run(signals.clone()).instrument(span));
                        running.insert(shard, task);
                    }
                    Err(error) => {
                        tracing::warn!(error = %error, shard = shard.tag(),
                            "cannot read the shard's order stream yet; trying again")
                    }
                }
            }
            if signals.pause(DISCOVER_EVERY).await {
                break;
            }
        }
        for (_, task) in running {
            if let Err(failed) = task.await {
                tracing::error!(error = %failed, "the stream consumer task failed");
            }
        }
    }
}

impl Builder {
    /// The loop reading `shard`'s stream as the consumer `name`.
    fn stream(&self, shard: Shard, name: &str) -> anyhow::Result<Arc<Inner>> {
        let reader = crate::config::connect_redis(&self.redis_url, self.timeout + MAX_BLOCK)?;
        let keys = self.writer.keys().shard(shard);
        Ok(Arc::new(Inner {
            stream: OrderStream::new(self.redis.clone(), reader, keys, name.to_owned()),
            writer: self.writer.clone(),
            batch: self.batch,
            claim_idle: self.claim_idle,
            max_deliveries: self.max_deliveries,
        }))
    }
}

impl RunningConsumer {
    /// Stops reading, lets the batches in hand be written and acknowledged,
    /// and returns once every stream's loop has ended.
    pub async fn stop(self) {
        // An error means the consumer has already ended.
        let _ = self.stop.send(true);
        if let Err(failed) = self.task.await {
            tracing::error!(error = %failed, "the stream consumer task failed");
        }
    }
}

impl Inner {
    async fn run(self: Arc<Self>, mut signals: Signals) {
        // Half the idle time: an entry is claimed at most 1.5 idle times
        // after its consumer stopped touching it.
        let claim_every = (self.claim_idle / 2).max(Duration::from_millis(5));
        let block = claim_every.min(MAX_BLOCK);
        while let Err(error) = self.stream.join_group().await {
            tracing::warn!(error = %error, "cannot join the consumer group; retrying");
            if signals.pause(RETRY).await {
                return;
            }
        }
        tracing::info!(group = GROUP, "stream consumer started");
        // Claim at once: entries of a consumer that died before this one
        // started are not left waiting for the first interval.
        let mut next_claim = Instant::now();
        let mut failures_in_a_row = 0;
        while !signals.stopping() {
            let round = if signals.round_asked() || Instant::now() >= next_claim {
                next_claim = Instant::now() + claim_every;
                self.claim_round(&signals).await
            } else {
                self.read_round(block, &signals).await
            };
            match round {
                Ok(()) => failures_in_a_row = 0,
                Err(error) => {
                    failures_in_a_row += 1;
                    metrics::STREAM_ROUND_FAILURES.inc();
                    tracing::warn!(error = ?error, failures_in_a_row,
                        "stream consumer round failed; entries stay pending");
                    if self.recover(&error, failures_in_a_row, &mut signals).await {
                        break;
                    }
                }
            }
        }
        match self.stream.leave().await {
            Ok(true) => tracing::info!("stream consumer stopped and left the group"),
            Ok(false) => tracing::info!(
                "stream consumer stopped; its pending entries stay for others to claim"
            ),
            Err(error) => {
                tracing::warn!(error = %error, "stream consumer stopped; could not leave the group")
            }
        }
    }

    /// New entries, settled as one batch.
    async fn read_round(
        self: &Arc<Self>,
        block: Duration,
        signals: &Signals,
    ) -> anyhow::Result<()> {
        let entries = self
            .stream
            .read(self.batch, block)
            .await
            .context("XREADGROUP")?;
        self.settle(entries, signals).await
    }

    /// Every entry pending too long, a page (one batch) at a time, then the
    /// stream's gauges: read whether the entries were written or not, so
    /// that a stalled writer's lag shows.
    async fn claim_round(self: &Arc<Self>, signals: &Signals) -> anyhow::Result<()> {
        let claimed = self.claim_pending(signals).await;
        let gauges = self.stream.record_gauges().await.context("stream gauges");
        claimed.and(gauges)
    }

    async fn claim_pending(self: &Arc<Self>, signals: &Signals) -> anyhow::Result<()> {
        let mut start = "0-0".to_owned();
        loop {
            let claimed = self
                .stream
                .claim(&start, self.claim_idle, self.batch)
                .await
                .context("XAUTOCLAIM")?;
            if !claimed.entries.is_empty() {
                metrics::STREAM_CLAIMED.inc_by(claimed.entries.len() as u64);
                tracing::info!(
                    entries = claimed.entries.len(),
                    "claimed entries pending too long"
                );
                self.settle(claimed.entries, signals).await?;
            }
            if claimed.next == "0-0" || signals.stopping() {
                break;
            }
            start = claimed.next;
        }
        let forgotten = self
            .stream
            .forget_dead_consumers(self.claim_idle * DEAD_CONSUMER_IDLE)
            .await
            .context("XINFO CONSUMERS")?;
        if forgotten > 0 {
            tracing::info!(
                consumers = forgotten,
                "removed dead consumers from the group"
            );
        }
        Ok(())
    }

    /// Settles `entries` in a task of its own and waits for it: whatever
    /// happens to this future, the batch ends as a whole. A batch that
    /// fails for a reason not its orders' own (MySQL or Redis failing, a
    /// lock lost) is tried again from memory, backing off, until it is
    /// settled or the consumer is stopped: Redis may have lost its entries
    /// (restarted empty), and then nothing else would ever write them. For
    /// the same reason, entries the batch left pending (a user's lock busy)
    /// whose orders Redis no longer holds are tried again from memory.
    async fn settle(
        self: &Arc<Self>,
        mut entries: Vec<Entry>,
        signals: &Signals,
    ) -> anyhow::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut signals = signals.clone();
        let mut failures_in_a_row = 0;
        loop {
            let (inner, batch) = (self.clone(), entries.clone());
            let span = batch::span(&batch);
            let batch = tokio::spawn(
                async move {
                    batch::settle(&inner.writer, &inner.stream, batch, inner.max_deliveries).await
                }
                .instrument(span),
            );
            let error = match batch.await.context("the batch task failed")? {
                Ok(waiting) => {
                    // Entries left for a claim to retry: unless Redis lost
                    // them meanwhile, and no claim ever will.
                    let orders: Vec<_> = waiting.iter().filter_map(|e| e.order().ok()).collect();
                    match self.writer.sale_state().not_pending(&orders).await {
                        Ok(lost) if lost.is_empty() => return Ok(()),
                        Ok(lost) => {
                            entries = (waiting.into_iter())
                                .filter(|entry| entry.order().is_ok_and(|o| lost.contains(&o)))
                                .collect();
                            anyhow::anyhow!(
                                "{} order(s) Redis lost are still to be written",
                                lost.len()
                            )
                        }
                        // Redis did not answer (down, or restarting empty):
                        // whether it still holds them is unknown, and if it
                        // lost them nothing else would write them. Kept.
                        Err(unknown) => {
                            entries = waiting;
                            anyhow::Error::from(unknown).context(
                                "Redis not asked whether it still holds the orders left waiting",
                            )
                        }
                    }
                }
                Err(error) if Blame::of(error.as_ref()) == Blame::Surroundings => error,
                Err(error) => return Err(error),
            };
            failures_in_a_row += 1;
            metrics::STREAM_ROUND_FAILURES.inc();
            tracing::warn!(error = ?error, failures_in_a_row,
                "batch not written; trying its entries again");
            // No claim round runs meanwhile: the lag shows from here.
            if let Err(gauges) = self.stream.record_gauges().await {
                tracing::debug!(error = %gauges, "stream gauges not read");
            }
            if self.recover(&error, failures_in_a_row, &mut signals).await {
                return Err(error);
            }
        }
    }

    /// After the `failures_in_a_row`th failed round: waits (longer after
    /// each failure in a row), and while MySQL does not answer, waits on.
    /// The entries stay pending whatever their delivery count: a failure
    /// that is not an order's own never dead-letters it (`batch.rs`).
    /// `true` when asked to stop meanwhile.
    async fn recover(
        &self,
        error: &anyhow::Error,
        failures_in_a_row: u32,
        signals: &mut Signals,
    ) -> bool {
        let no_group = error
            .chain()
            .filter_map(|cause| cause.downcast_ref::<redis::RedisError>())
            .any(|error| error.code() == Some("NOGROUP"));
        if no_group {
            // The stream or its group is gone (Redis restarted empty, or
            // the key was deleted): create it again.
            if let Err(error) = self.stream.join_group().await {
                tracing::warn!(error = %error, "cannot join the consumer group again");
            }
        }
        let backoff = RETRY
            .saturating_mul(1 << failures_in_a_row.saturating_sub(1).min(8))
            .min(MAX_RETRY);
        loop {
            if signals.pause(backoff).await {
                return true;
            }
            match self.writer.store().ping().await {
                Ok(()) => return false,
                Err(error) => tracing::warn!(error = %error, "MySQL unreachable; not claiming"),
            }
        }
    }
}
