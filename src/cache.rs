//! The course's Redis cache in front of MySQL for shops and shop categories
//! (hmdp's `CacheClient`): read Redis first, MySQL only on a miss.
//!
//! - A shop is cached as JSON for 30 minutes plus a random jitter of up to 5,
//!   so that entries cached together (after a restart, a deploy) do not all
//!   expire in the same second and send their readers to MySQL together.
//! - An id MySQL does not have is cached as `""` for 2 minutes: requests for
//!   made-up ids (a scanner, a stale link) are answered from Redis instead of
//!   reaching MySQL every time (the course's "cache penetration").
//! - On a miss, one reader rebuilds the entry, holding `lock:shop:{id}`
//!   (`SET NX` with a 10 s lease, owner-checked release: the lock crate's
//!   `redis-lua` lock); the others re-read Redis every 20 ms until the entry
//!   appears, for at most the backend timeout, then answer 503. A hot shop
//!   whose entry expires therefore costs MySQL one query, not one per
//!   waiting reader (the course's "cache breakdown"); the course's version
//!   of the wait has no deadline.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use hmdp_lock::{DistributedLock, Release};
use rand::RngExt;
use redis::AsyncCommands;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::error::Error;
use crate::ids::ShopId;
use crate::keys::Keys;
use crate::metrics::CACHE_READS;
use crate::redis_handle::RedisConnection;
use crate::store::{Shop, ShopType, Store};

/// How long an entry stays cached, before the jitter.
pub const ENTRY_TTL: Duration = Duration::from_secs(30 * 60);
/// At most this much is added to [`ENTRY_TTL`], at random, per entry.
pub const ENTRY_TTL_JITTER: Duration = Duration::from_secs(5 * 60);
/// How long "MySQL has no such shop" is remembered.
pub const MISSING_TTL: Duration = Duration::from_secs(2 * 60);
/// How often a reader waiting for another's rebuild looks at Redis again.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// What Redis holds under a cache key.
enum Cached<T> {
    /// Nothing: read MySQL.
    Absent,
    /// The marker of an id MySQL does not have.
    Missing,
    Present(T),
}

/// Shops and shop categories read through Redis.
pub struct ShopCache {
    redis: RedisConnection,
    keys: Keys,
    store: Store,
    /// Taken on `lock:shop:{id}` (or `lock:type`) by the reader rebuilding
    /// an entry, so a hot entry is rebuilt once, not by every reader.
    rebuild_lock: Arc<dyn DistributedLock>,
    /// How long a reader waits for another reader's rebuild.
    wait: Duration,
    /// Entries this cache read from MySQL: what the rebuild lock saves is
    /// counted here for this instance, as well as in `cache_reads_total`
    /// for the whole process.
    rebuilds: AtomicU64,
}

impl ShopCache {
    /// A cache on `redis` under `keys`' prefix, reading `store` on a miss;
    /// a reader waits at most `wait` for another's rebuild.
    pub fn new(
        redis: RedisConnection,
        redis_url: &str,
        keys: Keys,
        store: Store,
        wait: Duration,
    ) -> anyhow::Result<Self> {
        // hmdp's `tryLock`: `SET NX` with a 10 s lease (the default one),
        // no waiting; the release checks the owner, which hmdp's `DEL` does not.
        let rebuild_lock = hmdp_lock::LockBuilder::redis_lua()
            .sharing(redis.clone())
            .build(hmdp_lock::RedisSource::from_url(redis_url)?)?;
        Ok(ShopCache {
            redis,
            keys,
            store,
            rebuild_lock,
            wait,
            rebuilds: AtomicU64::new(0),
        })
    }

    /// A shop, `None` when MySQL has no such id.
    pub async fn shop(&self, id: ShopId) -> Result<Option<Shop>, Error> {
        self.read_through(
            "shop",
            &self.keys.cached_shop(id),
            &self.keys.shop_rebuild_lock(id),
            || self.store.shop(id),
        )
        .await
    }

    /// Every shop category, by `sort`.
    pub async fn shop_types(&self) -> Result<Vec<ShopType>, Error> {
        let types = self
            .read_through(
                "shop_type",
                &self.keys.cached_shop_types(),
                &self.keys.shop_types_rebuild_lock(),
                // No categories yet is cached as missing, for minutes, not
                // as an empty list for half an hour: a home page opened
                // before `hmdp seed` must not hide the seeded categories.
                || async {
                    let types = self.store.shop_types().await?;
                    Ok((!types.is_empty()).then_some(types))
                },
            )
            .await?;
        Ok(types.unwrap_or_default())
    }

    /// How many entries this cache has read from MySQL.
    pub fn rebuilds(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    /// The entry at `key`, from Redis, else from `load` by the one reader
    /// holding `lock_key` while the others wait for it.
    async fn read_through<T, F, Fut>(
        &self,
        cache: &'static str,
        key: &str,
        lock_key: &str,
        load: F,
    ) -> Result<Option<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Option<T>, sqlx::Error>>,
    {
        let deadline = Instant::now() + self.wait;
        loop {
            match self.get(key).await? {
                Cached::Present(value) => {
                    CACHE_READS.with_label_values(&[cache, "hit"]).inc();
                    return Ok(Some(value));
                }
                Cached::Missing => {
                    CACHE_READS.with_label_values(&[cache, "missing"]).inc();
                    return Ok(None);
                }
                Cached::Absent => {}
            }
            if let Some(held) = self.rebuild_lock.acquire(lock_key).await? {
                let rebuilt = self.rebuild(cache, key, &load).await;
                match held.release().await {
                    Ok(Release::Released) => {}
                    // An expired lease only means a slow rebuild; the entry
                    // is written either way.
                    Ok(other) => tracing::warn!(key, ?other, "cache rebuild lock was not ours"),
                    Err(error) => tracing::warn!(key, ?error, "cache rebuild lock not released"),
                }
                return rebuilt;
            }
            if Instant::now() + WAIT_POLL > deadline {
                CACHE_READS.with_label_values(&[cache, "timeout"]).inc();
                return Err(Error::Unavailable(anyhow!(
                    "{key} still being rebuilt by another reader after {:?}",
                    self.wait
                )));
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }

    /// Reads MySQL and caches what it found, with the rebuild lock held.
    async fn rebuild<T, F, Fut>(
        &self,
        cache: &'static str,
        key: &str,
        load: F,
    ) -> Result<Option<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Option<T>, sqlx::Error>>,
    {
        // Another reader may have rebuilt it between our miss and our lock.
        match self.get(key).await? {
            Cached::Present(value) => return Ok(Some(value)),
            Cached::Missing => return Ok(None),
            Cached::Absent => {}
        }
        CACHE_READS.with_label_values(&[cache, "rebuild"]).inc();
        self.rebuilds.fetch_add(1, Ordering::Relaxed);
        let value = load().await?;
        let mut redis = self.redis.clone();
        match &value {
            Some(value) => {
                let json =
                    serde_json::to_string(value).map_err(|error| Error::Internal(error.into()))?;
                let jitter = rand::rng().random_range(0..=ENTRY_TTL_JITTER.as_secs());
                let _: () = redis
                    .set_ex(key, json, ENTRY_TTL.as_secs() + jitter)
                    .await?;
            }
            None => {
                let _: () = redis.set_ex(key, "", MISSING_TTL.as_secs()).await?;
            }
        }
        Ok(value)
    }

    async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Cached<T>, Error> {
        let raw: Option<String> = self.redis.clone().get(key).await?;
        Ok(match raw.as_deref() {
            None => Cached::Absent,
            Some("") => Cached::Missing,
            Some(json) => match serde_json::from_str(json) {
                Ok(value) => Cached::Present(value),
                // An entry of another shape (written before an upgrade):
                // rebuilt as if absent.
                Err(error) => {
                    tracing::warn!(key, %error, "unreadable cache entry, rebuilding it");
                    Cached::Absent
                }
            },
        })
    }
}
