//! `Idempotency-Key` on purchase requests, with the IETF httpapi draft's
//! semantics: the first request with a key is answered and its answer kept
//! for 24 hours under the user and the key; the same key from the same user
//! again gets that answer (the same order id), even when the first answer
//! never reached the client. The same key while the first request is still
//! running answers 409, with another voucher 422.
//!
//! Kept: the order id. Not kept: a refusal (`SOLD_OUT`, `ALREADY_ORDERED`,
//! …) or an error (503, 500), which changed nothing: the same key asks
//! again. The synchronous purchase keeps its answers here, claiming the key
//! in the same write as its lock (no round trip of its own) and settling it
//! once the lock is released; the admission script (`queue`, `stream`) keeps its own in
//! the same key, in the same call that admits.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, Script};

use crate::error::Error;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::keys::Keys;
use crate::redis_handle::RedisConnection;
use crate::shards::Shard;

/// How long an answer is kept.
pub const ANSWER_KEPT: Duration = Duration::from_secs(24 * 3600);
/// How long a request in progress holds its key: longer than any purchase
/// takes. A node killed mid-request frees the key after this.
const IN_PROGRESS_FOR: Duration = Duration::from_secs(60);
/// The longest key accepted.
const MAX_KEY_CHARS: usize = 255;

/// A validated `Idempotency-Key` header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as MySQL keeps it beside the order it placed: the first 8
    /// bytes of its SHA-256 (the same key of one buyer and voucher meets
    /// another's digest with odds of 2^-64).
    pub fn digest(&self) -> u64 {
        use sha2::Digest;
        let hash = sha2::Sha256::digest(self.0.as_bytes());
        u64::from_be_bytes(hash[..8].try_into().expect("a SHA-256 has 32 bytes"))
    }

    /// The header's value: a structured-field string (`"…"`) or the bare
    /// token most clients send; 1 to 255 visible ASCII characters.
    pub fn parse(raw: &[u8]) -> Result<IdempotencyKey, Error> {
        let raw = std::str::from_utf8(raw).unwrap_or_default().trim();
        let key = raw
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or(raw);
        if key.is_empty()
            || key.len() > MAX_KEY_CHARS
            || !key.bytes().all(|b| b.is_ascii_graphic() && b != b'"')
        {
            return Err(Error::BadRequest(format!(
                "Idempotency-Key must be 1 to {MAX_KEY_CHARS} visible ASCII characters"
            )));
        }
        Ok(IdempotencyKey(key.to_owned()))
    }
}

/// The answers to purchase requests sent with an `Idempotency-Key`, for
/// the synchronous purchase (the admission script keeps its own:
/// `seckill/sale_state/admission.rs`).
#[derive(Clone)]
pub struct Idempotency {
    redis: RedisConnection,
    keys: Keys,
}

/// What a key's entry in Redis holds: `running:<voucherId>:<claim id>`
/// while the first request runs, then `<voucherId>:<orderId>` (the
/// admission script's layout).
fn kept_entry(voucher_id: VoucherId, order_id: OrderId) -> String {
    format!("{voucher_id}:{order_id}")
}

/// A synchronous purchase's claim of a key: the entry it set, which only
/// it may free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimId(String);

impl ClaimId {
    /// A fresh claim of a key for a purchase of `voucher_id`.
    pub fn new(voucher_id: VoucherId) -> ClaimId {
        ClaimId(format!(
            "running:{voucher_id}:{:016x}",
            rand::random::<u64>()
        ))
    }
}

static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/idempotency_release.lua")));

/// The order an entry holds for `voucher_id`: `None` while its request
/// runs.
fn order_in(entry: &str, voucher_id: VoucherId) -> Result<Option<OrderId>, Error> {
    let (voucher, order) = match entry.strip_prefix("running:") {
        Some(claim) => (
            claim.split_once(':').map_or(claim, |(voucher, _)| voucher),
            None,
        ),
        None => {
            let (voucher, order) = entry.split_once(':').unwrap_or((entry, ""));
            (voucher, Some(order))
        }
    };
    if voucher != voucher_id.to_string() {
        return Err(Error::IdempotencyKeyReused);
    }
    order
        .map(|order| {
            order.parse().map_err(|_| {
                Error::Internal(anyhow::anyhow!("unreadable idempotency entry `{entry}`"))
            })
        })
        .transpose()
}

impl Idempotency {
    pub fn new(redis: RedisConnection, keys: Keys) -> Self {
        Idempotency { redis, keys }
    }

    /// Claims `user_id`'s `key` for a purchase of `voucher_id`: `Ours`,
    /// to run it and [`Idempotency::settle`] it; `Kept`, the order an
    /// earlier request with the key got. 409 while that request still runs,
    /// 422 when it was for another voucher. Without a key: `None`, and no
    /// command sent.
    pub async fn claim(
        &self,
        user_id: UserId,
        key: Option<&IdempotencyKey>,
        voucher_id: VoucherId,
        claim: &ClaimId,
    ) -> Result<Option<Claim>, Error> {
        let Some(key) = key else {
            return Ok(None);
        };
        let redis_key = self.keys.single().idempotency(user_id, key.as_str());
        let mut redis = self.redis.clone();
        let claimed: bool = redis::cmd("SET")
            .arg(&redis_key)
            .arg(&claim.0)
            .arg("NX")
            .arg("PX")
            .arg(IN_PROGRESS_FOR.as_millis() as u64)
            .query_async::<Option<String>>(&mut redis)
            .await?
            .is_some();
        if claimed {
            return Ok(Some(Claim::Ours));
        }
        let entry: Option<String> = redis.get(&redis_key).await?;
        // An entry gone between the two reads expired: the caller may send
        // the key again.
        let entry = entry.ok_or(Error::IdempotencyKeyInUse)?;
        match order_in(&entry, voucher_id)? {
            Some(order_id) => Ok(Some(Claim::Kept(order_id))),
            None => Err(Error::IdempotencyKeyInUse),
        }
    }

    /// The order an earlier request with `user_id`'s `key` got, as kept in
    /// one of `shards` (the synchronous purchase keeps its answers in the
    /// one-shard keys, the admission script in the buyer's shard of the
    /// sale, which depends on the sale's shard count): `None` for a key
    /// never answered with an order, or whose request still runs; 422 when
    /// it was first sent for another voucher, whatever its shard count.
    /// Read before any refusal: a buyer who lost the answer to one of the
    /// last units is owed the order, not the `SOLD_OUT` or `ENDED` the sale
    /// gives everybody after.
    pub async fn kept(
        &self,
        user_id: UserId,
        key: &IdempotencyKey,
        voucher_id: VoucherId,
        shards: impl IntoIterator<Item = Shard>,
    ) -> Result<Option<OrderId>, Error> {
        for shard in shards {
            let redis_key = self.keys.shard(shard).idempotency(user_id, key.as_str());
            let entry: Option<String> = self.redis.clone().get(&redis_key).await?;
            if let Some(entry) = entry {
                return order_in(&entry, voucher_id);
            }
        }
        Ok(None)
    }

    /// Ends a claim of ours: keeps the order the purchase placed
    /// (`Some`), or frees the key after a purchase that placed none (`None`:
    /// a refusal or an error that changed nothing; the same key may ask
    /// again). Run it where a client hanging up cannot cancel it (the
    /// purchase's own task).
    pub async fn settle(
        &self,
        user_id: UserId,
        key: &IdempotencyKey,
        claim: &ClaimId,
        placed: Option<(VoucherId, OrderId)>,
    ) {
        let redis_key = self.keys.single().idempotency(user_id, key.as_str());
        let mut redis = self.redis.clone();
        let settled: redis::RedisResult<()> = match placed {
            Some((voucher_id, order_id)) => {
                let kept = redis::SetOptions::default()
                    .with_expiration(redis::SetExpiry::PX(ANSWER_KEPT.as_millis() as u64));
                redis
                    .set_options(&redis_key, kept_entry(voucher_id, order_id), kept)
                    .await
            }
            None => RELEASE
                .key(&redis_key)
                .arg(&claim.0)
                .invoke_async::<i64>(&mut redis)
                .await
                .map(drop),
        };
        if let Err(error) = settled {
            tracing::warn!(%error, "idempotency key not settled; it frees itself within a minute");
        }
    }
}

/// What a claim of an Idempotency-Key found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Claimed: this request runs the purchase.
    Ours,
    /// An earlier request with the key got this order.
    Kept(OrderId),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_bare_or_quoted() {
        assert_eq!(
            IdempotencyKey::parse(b"\"8e03978e-40d5\"").unwrap(),
            IdempotencyKey("8e03978e-40d5".into())
        );
        assert!(IdempotencyKey::parse(b"abc").is_ok());
        for bad in [&b""[..], b"\"\"", b"a b", "键".as_bytes(), &[b'a'; 256]] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_entry_answers_its_own_voucher_only() {
        let voucher = VoucherId::new(7);
        let entry = kept_entry(voucher, OrderId::new(42));
        assert_eq!(order_in(&entry, voucher).unwrap(), Some(OrderId::new(42)));
        assert!(matches!(
            order_in(&entry, VoucherId::new(8)),
            Err(Error::IdempotencyKeyReused)
        ));
        assert_eq!(order_in("running:7", voucher).unwrap(), None);
        let claim = ClaimId::new(voucher);
        assert_eq!(order_in(&claim.0, voucher).unwrap(), None);
        assert!(matches!(
            order_in(&claim.0, VoucherId::new(8)),
            Err(Error::IdempotencyKeyReused)
        ));
    }
}
