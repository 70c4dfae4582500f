//! A key prefix of one's own on a shared Redis (never flushed), and the one
//! clean-up of every key under a prefix.

use redis::AsyncCommands;

use crate::finish_from_drop;
use crate::redis_server::is_master;

/// A Redis key prefix of its own; every key under it is deleted when dropped
/// (a failed test's too).
pub struct RedisNamespace {
    pub redis_url: String,
    /// Put before every key written in the namespace.
    pub prefix: String,
}

impl RedisNamespace {
    /// `{label}:{random}:` on the Redis at `redis_url`.
    pub fn new(redis_url: &str, label: &str) -> RedisNamespace {
        RedisNamespace {
            redis_url: redis_url.to_owned(),
            prefix: format!("{label}:{}:", unique_id()),
        }
    }
}

impl Drop for RedisNamespace {
    fn drop(&mut self) {
        let (redis_url, prefix) = (self.redis_url.clone(), self.prefix.clone());
        let cleanup = finish_from_drop(async move {
            if let Some(nodes) = redis_url.strip_prefix("redis+cluster://") {
                return remove_keys_on_cluster(nodes, &prefix).await;
            }
            let client = redis::Client::open(redis_url)?;
            let mut redis = client.get_multiplexed_async_connection().await?;
            remove_keys_with_prefix(&mut redis, &prefix).await
        });
        if let Ok(Err(error)) = cleanup {
            tracing::warn!(%error, prefix = self.prefix, "could not remove the namespace's keys");
        }
    }
}

/// Twelve random hex digits: names that never collide between runs.
pub(crate) fn unique_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// Deletes every key starting with `prefix` (matched literally, glob
/// characters included), and every key whose hash tag starts with it
/// (`{prefix...}:fence`: keys that must share a lock key's Cluster slot wrap
/// it in `{...}`). Returns how many were deleted.
pub async fn remove_keys_with_prefix<C>(redis: &mut C, prefix: &str) -> redis::RedisResult<usize>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let keys = keys_with_prefix(redis, prefix).await?;
    for chunk in keys.chunks(1000) {
        redis.del::<_, ()>(chunk).await?;
    }
    Ok(keys.len())
}

/// The keys [`remove_keys_with_prefix`] removes.
async fn keys_with_prefix<C>(redis: &mut C, prefix: &str) -> redis::RedisResult<Vec<String>>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let escaped = glob_escape(prefix);
    let mut keys: Vec<String> = Vec::new();
    for pattern in [format!("{escaped}*"), format!("{{{escaped}*")] {
        let mut iter = redis.scan_match::<_, String>(&pattern).await?;
        while let Some(key) = iter.next_item().await {
            keys.push(key?);
        }
    }
    Ok(keys)
}

/// [`remove_keys_with_prefix`] on every reachable master of a Redis Cluster
/// (`nodes`: `host:port,host:port,...`), each holding the keys of its own
/// slots; a key at a time, as keys of different slots cannot share a `DEL`.
async fn remove_keys_on_cluster(nodes: &str, prefix: &str) -> redis::RedisResult<usize> {
    let mut removed = 0;
    for node in nodes.split(',') {
        let Ok(client) = redis::Client::open(format!("redis://{}", node.trim())) else {
            continue;
        };
        let Ok(mut redis) = client.get_multiplexed_async_connection().await else {
            continue; // a dead node holds nothing to remove
        };
        if !is_master(&mut redis).await? {
            continue;
        }
        let keys = keys_with_prefix(&mut redis, prefix).await?;
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.del(key).ignore();
        }
        pipe.query_async::<()>(&mut redis).await?;
        removed += keys.len();
    }
    Ok(removed)
}

/// Escapes Redis glob characters, so a prefix matches literally.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::glob_escape;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape(r"a*b?[c]\d:"), r"a\*b\?\[c\]\\d:");
    }
}
