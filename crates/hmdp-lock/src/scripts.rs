//! Every Lua script of the crate, each wrapped once: keys and arguments go in
//! as Rust values, the reply comes out as an enum, so no other module reads a
//! script's numeric codes.
//!
//! Each script is hashed once; a call is one `EVALSHA` with that hash, and
//! the script is loaded only when Redis answers `NOSCRIPT`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::connection::Connection;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind};

use crate::keys::sibling;
use crate::keys::sibling_of;
use crate::lock::{LockError, Release};

static COMPARE_AND_DELETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/unlock.lua")));
static MINT_FENCING_TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/fence.lua")));
static TAKE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/reentrant_lock.lua")));
static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/reentrant_renew.lua")));
static GIVE_BACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/reentrant_unlock.lua")));

/// A call of `script` on `keys`, written straight into one `EVALSHA`
/// command, sized up front for `args` more arguments of `args_len` bytes in
/// all, which the caller appends. redis-rs's `ScriptInvocation` first copies
/// every key and argument into a buffer of its own, then into the command;
/// and a command grown one argument at a time reallocates as it goes. For
/// the scripts that run on every acquisition and release, both showed in
/// the client's instruction counts.
fn evalsha(script: &Script, keys: &[&str], args: usize, args_len: usize) -> Cmd {
    let hash = script.get_hash();
    let keys_len: usize = keys.iter().map(|key| key.len()).sum();
    let mut cmd = Cmd::with_capacity(3 + keys.len() + args, 16 + hash.len() + keys_len + args_len);
    cmd.arg("EVALSHA").arg(hash).arg(keys.len()).arg(keys);
    cmd
}

/// Sends `call` (from [`evalsha`]); if Redis does not know `script` (a fresh
/// or restarted server), loads it and sends `call` again.
async fn run<T: FromRedisValue>(
    script: &Script,
    call: &Cmd,
    redis: &mut impl ConnectionLike,
) -> RedisResult<T> {
    match call.query_async(redis).await {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(redis).await?;
            call.query_async(redis).await
        }
        answer => answer,
    }
}

/// Whole milliseconds, as the scripts take durations.
fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

/// What `lua/unlock.lua` did with a `SET NX` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompareAndDelete {
    /// The key held the caller's token and is deleted.
    Deleted,
    /// The key was gone.
    Gone,
    /// Another token holds the key; it was left alone.
    OtherOwner,
}

/// Deletes `key` only if it still holds `token` (lock v3's release).
pub(crate) async fn compare_and_delete(
    redis: &mut Connection,
    key: &str,
    token: &str,
) -> Result<CompareAndDelete, LockError> {
    let mut call = evalsha(&COMPARE_AND_DELETE, &[key], 1, token.len());
    call.arg(token);
    let code: i64 = run(&COMPARE_AND_DELETE, &call, redis).await?;
    match code {
        1 => Ok(CompareAndDelete::Deleted),
        0 => Ok(CompareAndDelete::Gone),
        -1 => Ok(CompareAndDelete::OtherOwner),
        other => Err(LockError::UnexpectedReply(other)),
    }
}

/// One call of `lua/fence.lua`.
pub(crate) struct MintFencingToken<'a> {
    /// The counter hash beside the lock key.
    pub counter: &'a str,
    pub lock_key: &'a str,
    /// The acquisition's owner, recorded in the counter.
    pub owner: &'a str,
    /// How long the counter outlives its last use.
    pub retention: Duration,
    /// How the acquisition appears in the lock key; empty when it cannot be
    /// checked there.
    pub owner_in_key: &'a str,
}

/// What minting a fencing token gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Minted {
    Token(u64),
    /// The lock key no longer holds the acquisition: no token.
    NotHeld,
}

impl MintFencingToken<'_> {
    pub(crate) async fn run(&self, redis: &mut Connection) -> Result<Minted, LockError> {
        let mut call = evalsha(
            &MINT_FENCING_TOKEN,
            &[self.counter, self.lock_key],
            3,
            self.owner.len() + 20 + self.owner_in_key.len(),
        );
        call.arg(self.owner)
            .arg(millis(self.retention))
            .arg(self.owner_in_key);
        let token: i64 = run(&MINT_FENCING_TOKEN, &call, redis).await?;
        match token {
            -1 => Ok(Minted::NotHeld),
            token => u64::try_from(token)
                .map(Minted::Token)
                .map_err(|_| LockError::UnexpectedReply(token)),
        }
    }
}

/// One call of `lua/reentrant_lock.lua`: take one hold of a hash lock.
pub(crate) struct Take<'a> {
    pub key: &'a str,
    pub owner: &'a str,
    pub lease: Duration,
    /// `multi`/`redlock`: the round's marker, set where the take lands.
    pub marker: Option<&'a str>,
}

/// What a take found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Taken; the owner now has `count` holds, this one included.
    Yes { count: u32 },
    /// Another owner holds the key, for this much longer (`None`: no lease).
    Busy { expires_in: Option<Duration> },
}

impl Take<'_> {
    pub(crate) async fn run(&self, redis: &mut Connection) -> redis::RedisResult<Taken> {
        let mut call = match self.marker {
            Some(marker) => evalsha(&TAKE, &[self.key, marker], 2, 20 + self.owner.len()),
            None => evalsha(&TAKE, &[self.key], 2, 20 + self.owner.len()),
        };
        call.arg(millis(self.lease)).arg(self.owner);
        let (taken, value): (i64, i64) = run(&TAKE, &call, redis).await?;
        Ok(if taken == 1 {
            Taken::Yes {
                count: u32::try_from(value).unwrap_or(u32::MAX),
            }
        } else {
            Taken::Busy {
                expires_in: u64::try_from(value).ok().map(Duration::from_millis),
            }
        })
    }
}

/// Extends `owner`'s lease on the hash lock `key` (`lua/reentrant_renew.lua`);
/// `false` when the owner no longer holds it.
pub(crate) async fn renew(
    redis: &mut Connection,
    key: &str,
    owner: &str,
    lease: Duration,
) -> redis::RedisResult<bool> {
    let mut call = evalsha(&RENEW, &[key], 2, 20 + owner.len());
    call.arg(millis(lease)).arg(owner);
    let renewed: i64 = run(&RENEW, &call, redis).await?;
    Ok(renewed == 1)
}

/// One call of `lua/reentrant_unlock.lua`: give back one hold of a hash lock.
pub(crate) struct GiveBack<'a> {
    pub key: &'a str,
    pub owner: &'a str,
    /// Reset on the key while holds remain.
    pub lease: Duration,
    /// Names this release for its idempotency latch; unique per key.
    pub release_id: &'a str,
    /// 1 for the first attempt; a later one may find the first one's latch.
    pub attempt: u32,
    /// `multi`/`redlock`: the marker the take left; without it on a node,
    /// nothing of this take is given back there.
    pub take_marker: Option<&'a str>,
}

/// How long a release's answer is remembered for retries; retries stop well
/// before it is forgotten.
pub(crate) const RELEASE_LATCH: Duration = Duration::from_secs(10);

/// What giving back one hold found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GaveBack {
    /// Given back; the owner still has this many holds (0: key deleted and
    /// the release published).
    Remaining(u32),
    /// The key was gone: the lease expired.
    Gone,
    /// Another owner holds the key.
    OtherOwner,
    /// `multi`/`redlock`: no take marker, yet the owner holds the key: those
    /// are other takes' holds, this one never landed here. Nothing changed.
    NotTakenHere,
}

impl GiveBack<'_> {
    pub(crate) async fn run(&self, redis: &mut Connection) -> Result<GaveBack, LockError> {
        let released = sibling(self.key, "released");
        let latch = sibling_of(self.key, &["release:", self.release_id]);
        let args_len = self.owner.len() + 3 * 20 + "spublish".len();
        let mut call = match self.take_marker {
            Some(marker) => evalsha(
                &GIVE_BACK,
                &[self.key, &released, &latch, marker],
                5,
                args_len,
            ),
            None => evalsha(&GIVE_BACK, &[self.key, &released, &latch], 5, args_len),
        };
        // Sharded on a cluster: a classic PUBLISH there is broadcast to
        // every node over the cluster bus.
        let announce = match redis {
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => "spublish",
            _ => "publish",
        };
        call.arg(self.owner)
            .arg(millis(self.lease))
            .arg(millis(RELEASE_LATCH))
            .arg(self.attempt)
            .arg(announce);
        let code: i64 = run(&GIVE_BACK, &call, redis).await?;
        GaveBack::parse(code)
    }
}

impl GaveBack {
    /// What giving back one hold did, as the caller's [`Release`].
    /// `retried_in_lease`: this was a retry, and the lease was still running
    /// when the first attempt was sent. Then nobody else could have removed
    /// our hold (short of Redis losing the key), so a key found gone or
    /// someone else's means the first attempt released it and only its
    /// reply was lost.
    pub(crate) fn release(self, retried_in_lease: bool) -> Release {
        match self {
            GaveBack::Gone | GaveBack::OtherOwner if retried_in_lease => Release::Released,
            GaveBack::Gone => Release::Expired,
            GaveBack::OtherOwner => Release::NotOwner,
            // Ours is not on this node (it never landed), though other holds
            // of the same owner are.
            GaveBack::NotTakenHere => Release::Expired,
            GaveBack::Remaining(0) => Release::Released,
            GaveBack::Remaining(left) => Release::StillHeld(left),
        }
    }

    fn parse(code: i64) -> Result<GaveBack, LockError> {
        match code {
            -1 => Ok(GaveBack::Gone),
            -2 => Ok(GaveBack::OtherOwner),
            -3 => Ok(GaveBack::NotTakenHere),
            left if left >= 0 => Ok(GaveBack::Remaining(u32::try_from(left).unwrap_or(u32::MAX))),
            other => Err(LockError::UnexpectedReply(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn give_back_codes_parse_at_once() {
        assert_eq!(GaveBack::parse(2).unwrap(), GaveBack::Remaining(2));
        assert_eq!(GaveBack::parse(0).unwrap(), GaveBack::Remaining(0));
        assert_eq!(GaveBack::parse(-1).unwrap(), GaveBack::Gone);
        assert_eq!(GaveBack::parse(-2).unwrap(), GaveBack::OtherOwner);
        assert_eq!(GaveBack::parse(-3).unwrap(), GaveBack::NotTakenHere);
        assert!(GaveBack::parse(-4).is_err());
    }

    #[test]
    fn a_retry_within_the_lease_that_finds_the_key_gone_or_taken_was_released() {
        assert_eq!(GaveBack::OtherOwner.release(true), Release::Released);
        assert_eq!(GaveBack::Gone.release(true), Release::Released);
        assert_eq!(GaveBack::OtherOwner.release(false), Release::NotOwner);
        assert_eq!(GaveBack::Gone.release(false), Release::Expired);
        assert_eq!(GaveBack::Remaining(2).release(true), Release::StillHeld(2));
        assert_eq!(GaveBack::NotTakenHere.release(false), Release::Expired);
    }

    async fn unlock(
        redis: &mut Connection,
        key: &str,
        owner: &str,
        id: &str,
        attempt: u32,
    ) -> GaveBack {
        GiveBack {
            key,
            owner,
            lease: Duration::from_secs(10),
            release_id: id,
            attempt,
            take_marker: None,
        }
        .run(redis)
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_retried_release_of_a_reentered_hold_does_not_take_a_second_hold() {
        let client = redis::Client::open(hmdp_test_support::redis_url()).unwrap();
        let mut redis = Connection::from(redis::aio::ConnectionManager::new(client).await.unwrap());
        let key = format!("test:{}:lock:retried", uuid::Uuid::new_v4().simple());
        async fn take(redis: &mut Connection, key: &str, owner: &str) -> bool {
            let take = Take {
                key,
                owner,
                lease: Duration::from_secs(10),
                marker: None,
            };
            matches!(take.run(redis).await.unwrap(), Taken::Yes { .. })
        }

        assert!(take(&mut redis, &key, "a:1").await);
        assert!(take(&mut redis, &key, "a:1").await, "re-entered");
        assert_eq!(
            unlock(&mut redis, &key, "a:1", "r1", 1).await,
            GaveBack::Remaining(1)
        );
        // A's reply was lost, so A sends the same release again.
        assert_eq!(
            unlock(&mut redis, &key, "a:1", "r1", 2).await,
            GaveBack::Remaining(1),
            "the first answer, not a second hold taken away"
        );
        assert_eq!(
            unlock(&mut redis, &key, "a:1", "r2", 1).await,
            GaveBack::Remaining(0),
            "the last hold"
        );
        assert!(take(&mut redis, &key, "b:1").await, "the key is free");
        assert_eq!(
            unlock(&mut redis, &key, "a:1", "r2", 2).await,
            GaveBack::OtherOwner,
            "a retry of the last hold's release finds B's key"
        );

        let _: () = redis::cmd("DEL")
            .arg(&key)
            .arg(sibling(&key, "release:r1"))
            .arg(sibling(&key, "release:r2"))
            .query_async(&mut redis)
            .await
            .unwrap();
    }
}
