//! `Idempotency-Key` on purchase requests, with the IETF httpapi draft's
//! semantics: the first request with a key is answered and its answer kept
//! for 24 hours under the user and the key; the same key from the same user
//! again gets that answer (the same order id), even when the first answer
//! never reached the client. The same key while the first request is still
//! running answers 409, with another voucher 422.
//!
//! Kept: an order id and a business refusal (`SOLD_OUT`, …). Not kept: an
//! error that means nothing happened (503, 500): the same key may try again.
//! The answer is recorded by a task of its own, so a client that hangs up
//! does not keep it from being recorded.

use std::future::Future;
use std::time::Duration;

use hmdp_lock::Connection as RedisConnection;
use redis::AsyncCommands;

use crate::error::{Error, Rejection};
use crate::ids::{OrderId, UserId, VoucherId};
use crate::keys::Keys;

/// How long an answer is kept.
const ANSWER_KEPT: Duration = Duration::from_secs(24 * 3600);
/// How long a request in progress holds its key: longer than any purchase
/// takes. A node killed mid-request frees the key after this.
const IN_PROGRESS_FOR: Duration = Duration::from_secs(60);
/// The longest key accepted.
const MAX_KEY_CHARS: usize = 255;

/// A validated `Idempotency-Key` header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
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

/// A purchase's answer, as kept.
pub type Answer = Result<OrderId, Rejection>;

/// The answers to purchase requests sent with an `Idempotency-Key`.
#[derive(Clone)]
pub struct Idempotency {
    redis: RedisConnection,
    keys: Keys,
}

/// What a key's entry in Redis holds: `running:<voucherId>` while the first
/// request runs, then `<voucherId>:ok:<orderId>` or `<voucherId>:no:<CODE>`.
fn entry_of(voucher_id: VoucherId, answer: &Answer) -> String {
    match answer {
        Ok(order_id) => format!("{voucher_id}:ok:{order_id}"),
        Err(rejection) => format!("{voucher_id}:no:{}", rejection.code()),
    }
}

/// The answer an entry holds for `voucher_id`: `None` while it runs.
fn answer_in(entry: &str, voucher_id: VoucherId) -> Result<Option<Answer>, Error> {
    let (voucher, rest) = match entry.strip_prefix("running:") {
        Some(voucher) => (voucher, None),
        None => {
            let (voucher, rest) = entry.split_once(':').unwrap_or((entry, ""));
            (voucher, Some(rest))
        }
    };
    if voucher != voucher_id.to_string() {
        return Err(Error::IdempotencyKeyReused);
    }
    let Some(rest) = rest else {
        return Ok(None);
    };
    let unreadable = || Error::Internal(anyhow::anyhow!("unreadable idempotency entry `{entry}`"));
    Ok(Some(match rest.split_once(':') {
        Some(("ok", id)) => Ok(id.parse().map_err(|_| unreadable())?),
        Some(("no", code)) => Err(Rejection::from_code(code).ok_or_else(unreadable)?),
        _ => return Err(unreadable()),
    }))
}

impl Idempotency {
    pub fn new(redis: RedisConnection, keys: Keys) -> Self {
        Idempotency { redis, keys }
    }

    /// Answers `purchase` of `voucher_id` once for `user_id`'s `key`: the
    /// first time by running it (its answer kept), later with the kept
    /// answer (`true`: replayed).
    pub async fn once<F>(
        &self,
        user_id: UserId,
        key: IdempotencyKey,
        voucher_id: VoucherId,
        purchase: F,
    ) -> Result<(Answer, bool), Error>
    where
        F: Future<Output = Result<OrderId, Error>> + Send + 'static,
    {
        let redis_key = self.keys.idempotency(user_id, &key.0);
        let mut redis = self.redis.clone();
        // Twice at most: a kept entry that expires between the SET and the
        // GET is gone, and the key is free for this request.
        for _ in 0..2 {
            let claimed: bool = redis::cmd("SET")
                .arg(&redis_key)
                .arg(format!("running:{voucher_id}"))
                .arg("NX")
                .arg("PX")
                .arg(IN_PROGRESS_FOR.as_millis() as u64)
                .query_async::<Option<String>>(&mut redis)
                .await?
                .is_some();
            if claimed {
                let answered = tokio::spawn(record(redis, redis_key, voucher_id, purchase));
                let answer = answered.await.map_err(|failed| {
                    Error::Internal(anyhow::Error::new(failed).context("the purchase task failed"))
                })??;
                return Ok((answer, false));
            }
            let entry: Option<String> = redis.get(&redis_key).await?;
            if let Some(entry) = entry {
                return match answer_in(&entry, voucher_id)? {
                    Some(answer) => Ok((answer, true)),
                    None => Err(Error::IdempotencyKeyInUse),
                };
            }
        }
        Err(Error::IdempotencyKeyInUse)
    }
}

/// Runs the purchase and keeps its answer under `redis_key`; an error that
/// means nothing happened frees the key instead.
async fn record<F>(
    mut redis: RedisConnection,
    redis_key: String,
    voucher_id: VoucherId,
    purchase: F,
) -> Result<Answer, Error>
where
    F: Future<Output = Result<OrderId, Error>>,
{
    let answer = match purchase.await {
        Ok(order_id) => Ok(order_id),
        Err(Error::Rejected(rejection)) => Err(rejection),
        Err(error) => {
            if let Err(freed) = redis.del::<_, ()>(&redis_key).await {
                tracing::warn!(%freed, "idempotency key not freed; it frees itself within a minute");
            }
            return Err(error);
        }
    };
    let kept: redis::RedisResult<()> = redis
        .set_options(
            &redis_key,
            entry_of(voucher_id, &answer),
            redis::SetOptions::default()
                .with_expiration(redis::SetExpiry::PX(ANSWER_KEPT.as_millis() as u64)),
        )
        .await;
    if let Err(error) = kept {
        tracing::warn!(%error, "purchase answer not kept for its idempotency key");
    }
    Ok(answer)
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
        for answer in [Ok(OrderId::new(42)), Err(Rejection::SoldOut)] {
            let entry = entry_of(voucher, &answer);
            assert_eq!(answer_in(&entry, voucher).unwrap(), Some(answer));
            assert!(matches!(
                answer_in(&entry, VoucherId::new(8)),
                Err(Error::IdempotencyKeyReused)
            ));
        }
        assert_eq!(answer_in("running:7", voucher).unwrap(), None);
    }
}
