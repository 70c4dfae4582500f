//! The sale's Redis side: each seckill voucher's sale (stock, initial
//! stock, window), its buyers and the orders admitted but not yet written,
//! in each of the sale's shards (`src/shards.rs`; the keys in `keys.rs`).
//! MySQL is the truth; Redis is a cache of the sale that may forget.
//!
//! - `load`: a sale loaded from MySQL as a whole;
//! - `read`: a sale read back, its shards summed;
//! - `admission`: a `queue` or `stream` purchase admitted in one script;
//! - `stock_moves`: units moved between a sale's shards;
//! - `transit`: the units on their way, and the sweep that delivers a dead mover's;
//! - `readmit`: an order Redis lost, counted again before its commit;
//! - `in_flight`: the orders between admission and MySQL;
//! - `reconcile`: Redis compared with MySQL, and the sale healed;
//! - `fence`: what tells a node that Redis forgot, before it admits;
//! - `order_ids`: the admissions' order ids, leased from MySQL;
//! - `server_probe`: a Redis restart or failover noticed within a second.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::try_join_all;

use crate::error::Error;
use crate::ids::{OrderId, VoucherId};
use crate::keys::{Keys, ShardKeys};
use crate::redis_handle::RedisConnection;
use crate::shards::{Layout, Shard};
use crate::store::Store;

mod admission;
mod fence;
mod in_flight;
mod load;
mod order_ids;
mod read;
mod readmit;
mod reconcile;
mod server_mark;
mod server_probe;
mod stock_moves;
mod transit;

pub use admission::Admission;
pub use fence::{Fences, Suspicion};
pub use in_flight::{DeadLetter, PendingOrder};
pub use order_ids::{OrderIds, ID_BLOCK};
pub use read::{RedisSale, RedisShard};
pub use readmit::Readmit;
pub use reconcile::RECONCILE_EVERY;
pub use stock_moves::SaleRef;
use stock_moves::Seen;
pub use transit::{InTransit, STALE_AFTER, SWEEP_EVERY};

/// What a sale in Redis holds that MySQL says it should not: the
/// reconciler's finding (`reconcile.rs`), in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift(pub String);

/// Sales, buyers and pending orders in Redis.
pub struct SaleState {
    redis: RedisConnection,
    keys: Keys,
    store: Store,
    /// Loads of one voucher run one at a time: after a Redis restart every
    /// purchase of a hot voucher finds it missing at once, and only the
    /// first should read its buyers from MySQL; the others find it loaded.
    /// Other vouchers' loads do not wait for it. One entry per voucher that
    /// exists in MySQL (a load is asked for no other).
    loading: Mutex<HashMap<VoucherId, Arc<tokio::sync::Mutex<()>>>>,
    /// Fault injection: milliseconds a move of stock between shards pauses
    /// after its lend (`stock_moves.rs`); 0 in production.
    move_pause_ms: AtomicU64,
    /// What this node saw of each sharded sale's shards a moment ago
    /// (`stock_moves.rs`).
    seen_shards: Mutex<HashMap<VoucherId, Seen>>,
    /// Each sale shard's fence as this node knows MySQL's (`fence.rs`).
    fences: Fences,
    /// The admissions' order ids (`order_ids.rs`).
    order_ids: OrderIds,
}

impl SaleState {
    pub fn new(redis: RedisConnection, keys: Keys, store: Store) -> Self {
        SaleState {
            redis,
            keys,
            loading: Mutex::new(HashMap::new()),
            move_pause_ms: AtomicU64::new(0),
            seen_shards: Mutex::new(HashMap::new()),
            fences: Fences::default(),
            order_ids: OrderIds::new(store.clone()),
            store,
        }
    }

    /// Each sale shard's fence as this node knows MySQL's: what its
    /// writers and its reads of MySQL tell it.
    pub fn fences(&self) -> &Fences {
        &self.fences
    }

    /// Fault injection: every move of stock between shards pauses `pause`
    /// between its lend and its receive.
    pub fn pause_moves(&self, pause: Duration) {
        (self.move_pause_ms).store(pause.as_millis() as u64, Ordering::Relaxed);
    }

    /// Runs `call` on each of `shards` at once, with a connection and the
    /// shard's keys, and answers in their order: a cluster runs a pipeline
    /// on one node, and a sale's shards live on several.
    async fn on_shards<'a, T, F, Fut>(
        &'a self,
        shards: impl IntoIterator<Item = Shard>,
        call: F,
    ) -> Result<Vec<T>, Error>
    where
        F: Fn(RedisConnection, ShardKeys<'a>) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let calls = shards
            .into_iter()
            .map(|shard| call(self.redis.clone(), self.keys.shard(shard)));
        Ok(try_join_all(calls).await?)
    }

    /// The pending orders hash of the shard that drew `order_id`.
    fn pending_of(&self, order_id: OrderId) -> String {
        self.keys.shard(Shard::of_order(order_id)).pending()
    }
}

/// Order ids grouped by the shard that drew them.
fn by_shard(order_ids: impl Iterator<Item = OrderId>) -> HashMap<Shard, Vec<i64>> {
    let mut shards: HashMap<Shard, Vec<i64>> = HashMap::new();
    for id in order_ids {
        shards
            .entry(Shard::of_order(id))
            .or_default()
            .push(id.get());
    }
    shards
}

/// A stored shard count as a layout.
pub(super) fn layout_of(count: u16) -> Result<Layout, Error> {
    Layout::new(count.into()).map_err(|bad| Error::Internal(anyhow::Error::new(bad)))
}
