//! hmdp's Redis id worker: globally unique, roughly time-ordered 64-bit ids.
//!
//! Layout: `(seconds since 2022-01-01 UTC) << 32 | INCR icr:{business}:{yyyy:MM:dd}`.
//! The per-day counter gives ids across all nodes sharing one Redis,
//! without coordination between the nodes. Its low word keeps the top bit
//! clear: ids with that bit set are drawn by the admission script
//! (`lua/seckill.lua`) from a sequence of its own, so the two never meet.

use chrono::{DateTime, Utc};

use crate::keys::Keys;
use crate::redis_handle::RedisConnection;

/// 2022-01-01T00:00:00Z, hmdp's `BEGIN_TIMESTAMP`.
pub const EPOCH_SECONDS: i64 = 1_640_995_200;
const COUNT_BITS: u32 = 32;
const COUNTER_TTL_SECS: i64 = 2 * 24 * 60 * 60;

/// Mints ids from a Redis counter.
#[derive(Clone)]
pub struct IdWorker {
    redis: RedisConnection,
    keys: Keys,
}

impl IdWorker {
    pub fn new(redis: RedisConnection, keys: Keys) -> Self {
        IdWorker { redis, keys }
    }

    /// The next id for `business` (hmdp uses `order`).
    pub async fn next_id(&self, business: &str) -> redis::RedisResult<i64> {
        let now = Utc::now();
        let key = self
            .keys
            .id_counter(business, &now.format("%Y:%m:%d").to_string());
        // One round trip: the counter and its expiry. A day's counter is
        // only needed during that day; two days leave room for clock skew.
        let (count,): (i64,) = redis::pipe()
            .incr(&key, 1)
            .expire(&key, COUNTER_TTL_SECS)
            .ignore()
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(compose(now, count))
    }
}

/// Puts the timestamp in the high 32 bits and the counter in the low 31
/// (a second would need 2^31 ids to repeat one).
pub fn compose(now: DateTime<Utc>, count: i64) -> i64 {
    ((now.timestamp() - EPOCH_SECONDS) << COUNT_BITS) | (count & 0x7FFF_FFFF)
}

/// The second an id was minted in (by the id worker or the admission
/// script, which share the layout); `None` for an id of no such layout.
pub fn minted_at(id: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp((id >> COUNT_BITS) + EPOCH_SECONDS, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn an_id_tells_the_second_it_was_minted_in() {
        let at = Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).unwrap();
        assert_eq!(minted_at(compose(at, 7)), Some(at));
        assert_eq!(minted_at(compose(at, (1 << 31) | 5)), Some(at));
    }

    #[test]
    fn layout_is_timestamp_then_counter() {
        let at = Utc.with_ymd_and_hms(2022, 1, 1, 0, 0, 10).unwrap();
        assert_eq!(compose(at, 7), (10 << 32) | 7);
    }

    #[test]
    fn the_counter_keeps_the_low_words_top_bit_clear() {
        let at = Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).unwrap();
        assert_eq!(compose(at, (1 << 31) + 7), compose(at, 7));
        assert_eq!(compose(at, 7) & (1 << 31), 0);
    }

    #[test]
    fn later_second_gives_larger_id() {
        let a = Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).unwrap();
        let b = Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 1).unwrap();
        assert!(compose(b, 1) > compose(a, u32::MAX as i64));
    }
}
