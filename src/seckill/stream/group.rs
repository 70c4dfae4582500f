//! The consumer group's Redis side: creating the group, reading, claiming,
//! delivery counts, acknowledging and dead-lettering entries, and the
//! stream's gauges, for one shard's stream. Every command names keys of
//! the shard's hash tag only, so the `MULTI` blocks below stay in one Redis
//! Cluster slot.

use std::time::Duration;

use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamInfoConsumersReply,
    StreamPendingCountReply, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, RedisResult};

use super::entry::Entry;
use crate::keys::ShardKeys;
use crate::metrics;
use crate::redis_handle::RedisConnection;
use crate::shards::Shard;
use crate::store::NewOrder;

/// The one consumer group of the order stream: every node's consumer joins
/// it, so each entry goes to one of them.
pub const GROUP: &str = "order-writers";

/// This process's consumer in the group.
pub(super) struct OrderStream {
    /// The node's connection, for the short commands.
    redis: RedisConnection,
    /// A connection of its own for `XREADGROUP ... BLOCK`: a blocking read
    /// on the node's connection would hold up every command queued behind
    /// it (sessions, locks, ids) for as long as it blocks.
    reader: RedisConnection,
    pub stream: String,
    /// Whose stream it is: the label of its gauges.
    shard: Shard,
    dead_letters: String,
    pending_orders: String,
    /// `<node id>:<process uuid>`: unique per process, so a restarted node
    /// never inherits (or mistakes for its own) a dead process's entries;
    /// those are claimed like any other consumer's.
    pub consumer: String,
}

/// Entries claimed from an idle consumer, and where the next page starts.
pub(super) struct Claimed {
    pub entries: Vec<Entry>,
    /// `0-0` once the whole pending list has been scanned.
    pub next: String,
}

impl OrderStream {
    pub fn new(
        redis: RedisConnection,
        reader: RedisConnection,
        keys: ShardKeys<'_>,
        consumer: String,
    ) -> OrderStream {
        OrderStream {
            redis,
            reader,
            stream: keys.orders(),
            shard: keys.shard(),
            dead_letters: keys.dead_letters(),
            pending_orders: keys.pending(),
            consumer,
        }
    }

    /// Creates the group (and the stream) unless it exists, and joins it.
    /// It starts at `0`, not `$`: entries the admission script added before
    /// any consumer created the group (a node admitting orders before the
    /// first writer started, or after Redis lost the group) are delivered
    /// instead of skipped for ever. The price, entries delivered again if
    /// the group is recreated while they are still in the stream, is
    /// nothing: writes are idempotent on the order id, and written entries
    /// are deleted.
    pub async fn join_group(&self) -> RedisResult<()> {
        let mut redis = self.redis.clone();
        let created: RedisResult<()> = redis.xgroup_create_mkstream(&self.stream, GROUP, "0").await;
        match created {
            Err(error) if error.code() == Some("BUSYGROUP") => {}
            other => other?,
        }
        // Redis 7 creates a consumer only once something is delivered to
        // it; created now, a live consumer shows in `XINFO CONSUMERS` from
        // its start.
        redis
            .xgroup_createconsumer::<_, _, _, ()>(&self.stream, GROUP, &self.consumer)
            .await
    }

    /// Up to `count` entries never delivered before, waiting up to `block`
    /// for the first one. An entry read here is pending for this consumer
    /// until acknowledged, whatever becomes of the reply.
    pub async fn read(&self, count: usize, block: Duration) -> RedisResult<Vec<Entry>> {
        let options = StreamReadOptions::default()
            .group(GROUP, &self.consumer)
            .count(count)
            .block(block.as_millis().max(1) as usize);
        let reply: Option<StreamReadReply> = self
            .reader
            .clone()
            .xread_options(&[&self.stream], &[">"], &options)
            .await?;
        Ok(reply
            .into_iter()
            .flat_map(|reply| reply.keys)
            .flat_map(|key| key.ids)
            .map(|entry| Entry::new(entry, 1))
            .collect())
    }

    /// Claims up to `count` entries, from `start` on, that have been pending
    /// longer than `min_idle` with any consumer (this one included: an
    /// entry whose write failed is retried this way), with their delivery
    /// counts, this claim included. Claiming resets an entry's idle time,
    /// so two consumers claiming at once never both get it.
    pub async fn claim(
        &self,
        start: &str,
        min_idle: Duration,
        count: usize,
    ) -> RedisResult<Claimed> {
        let mut redis = self.redis.clone();
        let reply: StreamAutoClaimReply = redis
            .xautoclaim_options(
                &self.stream,
                GROUP,
                &self.consumer,
                min_idle.as_millis() as u64,
                start,
                StreamAutoClaimOptions::default().count(count),
            )
            .await?;
        let mut entries = Vec::with_capacity(reply.claimed.len());
        if let (Some(first), Some(last)) = (reply.claimed.first(), reply.claimed.last()) {
            // XAUTOCLAIM does not tell the delivery counts; XPENDING over
            // the claimed range, for this consumer, does.
            let pending: StreamPendingCountReply = redis
                .xpending_consumer_count(
                    &self.stream,
                    GROUP,
                    &first.id,
                    &last.id,
                    reply.claimed.len(),
                    &self.consumer,
                )
                .await?;
            for entry in reply.claimed {
                let deliveries = pending
                    .ids
                    .iter()
                    .find(|pending| pending.id == entry.id)
                    .map_or(1, |pending| pending.times_delivered);
                entries.push(Entry::new(entry, deliveries));
            }
        }
        Ok(Claimed {
            entries,
            next: reply.next_stream_id,
        })
    }

    /// Acknowledges `entries`, which are settled in MySQL, deletes them from
    /// the stream (the group is its only reader, so the stream's length is
    /// the backlog) and their `orders` from the pending hash, in one
    /// `MULTI`. Should the reply be lost, the entries stay pending, are
    /// claimed again and found written: acknowledging twice is harmless.
    pub async fn acknowledge(&self, entries: &[&Entry], orders: &[NewOrder]) -> RedisResult<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = entries.iter().map(|entry| entry.id.as_str()).collect();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .xack(&self.stream, GROUP, &ids)
            .ignore()
            .xdel(&self.stream, &ids)
            .ignore();
        if !orders.is_empty() {
            let order_ids: Vec<i64> = orders.iter().map(|order| order.id.get()).collect();
            pipe.hdel(&self.pending_orders, order_ids).ignore();
        }
        pipe.query_async(&mut self.redis.clone()).await
    }

    /// Moves `entry` to the dead-letter stream with its fields plus
    /// `entry`, `deliveries` and `reason`, acknowledged and deleted in the
    /// same `MULTI`, so it is never tried again nor lost. Its order stays in
    /// the pending hash: admitted and not written, as the dead letter says.
    pub async fn dead_letter(&self, entry: &Entry, reason: &str) -> RedisResult<()> {
        let mut fields = entry.raw_fields();
        fields.push(("entry".into(), entry.id.clone().into_bytes()));
        fields.push((
            "deliveries".into(),
            entry.deliveries.to_string().into_bytes(),
        ));
        fields.push(("reason".into(), reason.as_bytes().to_vec()));
        redis::pipe()
            .atomic()
            .xadd(&self.dead_letters, "*", &fields)
            .ignore()
            .xack(&self.stream, GROUP, &[&entry.id])
            .ignore()
            .xdel(&self.stream, &[&entry.id])
            .ignore()
            .query_async(&mut self.redis.clone())
            .await
    }

    /// Reads the stream's length, its pending count and the age of its
    /// oldest pending entry (by Redis's own clock, which stamped the entry
    /// id) into the metrics.
    pub async fn record_gauges(&self) -> RedisResult<()> {
        let (length, pending, (now_secs, now_micros)): (i64, PendingSummary, (u64, u64)) =
            redis::pipe()
                .xlen(&self.stream)
                .cmd("XPENDING")
                .arg(&self.stream)
                .arg(GROUP)
                .cmd("TIME")
                .query_async(&mut self.redis.clone())
                .await?;
        let shard = [self.shard.tag()];
        metrics::STREAM_LENGTH.with_label_values(&shard).set(length);
        metrics::STREAM_PENDING
            .with_label_values(&shard)
            .set(pending.count);
        let now_ms = now_secs * 1000 + now_micros / 1000;
        let oldest_ms = pending
            .oldest
            .as_deref()
            .and_then(|id| id.split('-').next())
            .and_then(|ms| ms.parse::<u64>().ok());
        let age_ms = oldest_ms.map_or(0, |ms| now_ms.saturating_sub(ms));
        (metrics::STREAM_OLDEST_PENDING.with_label_values(&shard)).set(age_ms as f64 / 1000.0);
        Ok(())
    }

    /// Removes from the group the consumers with nothing pending that have
    /// not read for `idle`: processes killed without leaving (a clean stop
    /// leaves by itself). One wrongly taken for dead costs nothing: its
    /// next read recreates it. Returns how many were removed.
    pub async fn forget_dead_consumers(&self, idle: Duration) -> RedisResult<usize> {
        let mut redis = self.redis.clone();
        let consumers: StreamInfoConsumersReply =
            redis.xinfo_consumers(&self.stream, GROUP).await?;
        let mut forgotten = 0;
        for dead in consumers.consumers.iter().filter(|consumer| {
            consumer.pending == 0
                && consumer.idle as u128 > idle.as_millis()
                && consumer.name != self.consumer
        }) {
            redis
                .xgroup_delconsumer::<_, _, _, ()>(&self.stream, GROUP, &dead.name)
                .await?;
            forgotten += 1;
        }
        Ok(forgotten)
    }

    /// Leaves the group if nothing is pending for this consumer, so that
    /// stopped processes do not pile up in `XINFO CONSUMERS`. A consumer
    /// with entries pending stays: deleting it would drop them from the
    /// pending list, and nobody would ever claim them.
    pub async fn leave(&self) -> RedisResult<bool> {
        let mut redis = self.redis.clone();
        let pending: StreamPendingCountReply = redis
            .xpending_consumer_count(&self.stream, GROUP, "-", "+", 1, &self.consumer)
            .await?;
        if !pending.ids.is_empty() {
            return Ok(false);
        }
        redis
            .xgroup_delconsumer::<_, _, _, ()>(&self.stream, GROUP, &self.consumer)
            .await?;
        Ok(true)
    }
}

/// The summary form of `XPENDING key group`: count, smallest and greatest
/// pending id, and per-consumer counts (not needed here).
struct PendingSummary {
    count: i64,
    oldest: Option<String>,
}

impl redis::FromRedisValue for PendingSummary {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        let (count, oldest, _newest, _consumers): (
            i64,
            Option<String>,
            redis::Value,
            redis::Value,
        ) = redis::from_redis_value(value)?;
        Ok(PendingSummary { count, oldest })
    }
}
