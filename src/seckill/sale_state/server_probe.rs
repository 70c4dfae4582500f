//! The per-second probe of the Redis servers that hold the sales: a
//! restart or a failover is noticed within a second, whether or not anyone
//! buys meanwhile, and every sale Redis holds is checked at once, each one
//! found on a server other than the one it was loaded on (`fence.rs`)
//! loaded again from MySQL under its stock row. The admission script
//! checks the same on every purchase; the probe spares the first buyers
//! after a failover their 503s, and the sales nobody buys their wait.
//!
//! One `EVALSHA` per shard in use a second, on a fixed beat: a failed probe
//! (Redis unreachable) is tried again at the next beat, never later.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::server_mark::ServerMark;
use super::SaleState;
use crate::error::Error;
use crate::metrics;
use crate::shards::Shard;

/// How often each node asks each server holding a shard who it is.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

static SERVER_MARK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/server_mark.lua")));

impl SaleState {
    /// Every node's probe, for as long as it runs (`tokio::time::interval`
    /// keeps the beat: a slow round delays no later one).
    pub async fn probe_servers_forever(&self) {
        let mut seen: HashMap<Shard, ServerMark> = HashMap::new();
        let mut beat = tokio::time::interval(PROBE_EVERY);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            beat.tick().await;
            if let Err(error) = self.probe_servers(&mut seen).await {
                tracing::debug!(?error, "Redis servers not probed this beat");
            }
        }
    }

    /// One probe of every shard in use: `seen` holds what each showed
    /// last. A shard whose server changed gets its sales checked now.
    pub async fn probe_servers(&self, seen: &mut HashMap<Shard, ServerMark>) -> Result<(), Error> {
        let shards = self.shards_in_use().await?;
        let marks: Vec<(String, String, u64)> = self
            .on_shards(shards.iter().copied(), |mut redis, keys| async move {
                SERVER_MARK
                    .key(keys.pending())
                    .invoke_async(&mut redis)
                    .await
            })
            .await?;
        let mut changed = false;
        for (shard, (run_id, replid, offset)) in shards.into_iter().zip(marks) {
            let mark = ServerMark {
                run_id,
                replid,
                offset,
            };
            if let Some(before) = seen.get(&shard) {
                if let Some(how) = mark.changed_from(before) {
                    metrics::REDIS_SERVER_CHANGES
                        .with_label_values(&[how])
                        .inc();
                    tracing::warn!(
                        shard = shard.tag(),
                        how,
                        run_id = mark.run_id,
                        replid = mark.replid,
                        offset = mark.offset,
                        "the Redis server holding a shard of the sales changed: every sale is \
                         checked and, where it cannot be trusted, loaded again from MySQL"
                    );
                    changed = true;
                }
            }
            seen.insert(shard, mark);
        }
        if changed {
            self.check_loaded_sales().await?;
        }
        Ok(())
    }

    /// Every sale Redis is meant to hold, checked as a purchase would check it
    /// (`load`): one Redis no longer holds, or holds from another server or
    /// behind MySQL, is loaded again.
    async fn check_loaded_sales(&self) -> Result<(), Error> {
        for sale in self.store.live_sales().await? {
            if let Err(error) = self.load(sale.voucher_id).await {
                let voucher_id = sale.voucher_id;
                tracing::warn!(%voucher_id, ?error, "sale not checked after a server change");
            }
        }
        Ok(())
    }
}
