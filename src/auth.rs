//! Login by phone code, Redis sessions, and the two request guards:
//! [`CurrentUser`] (header `authorization: <token>`) and [`Admin`](crate::api::guards::Admin)
//! (header `x-admin-token`).

use std::sync::LazyLock;
use std::time::Duration;

use moka::future::Cache;
use rand::RngExt;
use redis::{AsyncCommands, Script};

use crate::error::{Error, Rejection};
use crate::ids::UserId;
use crate::keys::Keys;
use crate::redis_handle::RedisConnection;
use crate::store::User;

/// How long a login code stays valid (hmdp: `LOGIN_CODE_TTL`).
pub const LOGIN_CODE_TTL: Duration = Duration::from_secs(2 * 60);
/// Idle lifetime of a session, refreshed on each authenticated request.
pub const SESSION_TTL: Duration = Duration::from_secs(30 * 60);
/// Wrong guesses after which a login code is invalidated: six random digits
/// cannot be brute-forced five guesses at a time, one code per interval.
pub const MAX_CODE_FAILURES: u32 = 5;

static CHECK_CODE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/check_code.lua")));

/// A mainland-China mobile number as hmdp's `RegexUtils.isPhoneInvalid`
/// accepts it: `^1([38][0-9]|4[579]|5[0-3,5-9]|6[6]|7[0135678]|9[89])\d{8}$`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phone(String);

impl Phone {
    pub fn parse(raw: &str) -> Result<Phone, Rejection> {
        let bytes = raw.as_bytes();
        let valid = bytes.len() == 11
            && bytes.iter().all(u8::is_ascii_digit)
            && bytes[0] == b'1'
            && match bytes[1] {
                b'3' | b'8' => true,
                b'4' => matches!(bytes[2], b'5' | b'7' | b'9'),
                b'5' => bytes[2] != b'4',
                b'6' => bytes[2] == b'6',
                b'7' => matches!(bytes[2], b'0' | b'1' | b'3' | b'5' | b'6' | b'7' | b'8'),
                b'9' => matches!(bytes[2], b'8' | b'9'),
                _ => false,
            };
        if valid {
            Ok(Phone(raw.to_owned()))
        } else {
            Err(Rejection::PhoneInvalid)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Phone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Login codes and sessions in Redis.
#[derive(Clone)]
pub struct Sessions {
    redis: RedisConnection,
    keys: Keys,
    /// Minimum time between two codes for one phone (an SMS costs money).
    code_interval: Duration,
    /// Sessions read lately (`None`: Redis is read every time).
    memory: Option<SessionMemory>,
}

/// What a node remembers of the sessions it read.
#[derive(Clone)]
struct SessionMemory {
    /// Users of the sessions read from Redis within the keeping time.
    recent: Cache<String, User>,
    /// Tokens closed on this node. A read already under way when the
    /// session was closed would put it back among the recent ones; these
    /// are refused whatever a read brought.
    closed: Cache<String, ()>,
}

/// The most sessions remembered, read or closed: far more than a node
/// serves distinct users within a keeping time.
const REMEMBERED_SESSIONS: u64 = 100_000;
/// How much longer than the keeping time a closed token is remembered:
/// longer than any read under way at the close can still take.
const CLOSED_LONGER_BY: Duration = Duration::from_secs(60);

/// Why a session read for [`Sessions::touch`] found no user.
#[derive(Debug)]
enum NoUser {
    /// No such session (never opened, expired or closed).
    Closed,
    /// Redis did not answer; every request that waited for this read is
    /// answered with it.
    Unreadable(redis::RedisError),
}

impl Sessions {
    /// Sessions in Redis, each kept in this node's memory for `keep` once
    /// read (zero: never kept, Redis read on every request).
    pub fn new(
        redis: RedisConnection,
        keys: Keys,
        code_interval: Duration,
        keep: Duration,
    ) -> Self {
        let memory = (!keep.is_zero()).then(|| SessionMemory {
            recent: Cache::builder()
                .max_capacity(REMEMBERED_SESSIONS)
                .time_to_live(keep)
                .build(),
            closed: Cache::builder()
                .max_capacity(REMEMBERED_SESSIONS)
                .time_to_live(keep + CLOSED_LONGER_BY)
                .build(),
        });
        Sessions {
            redis,
            keys,
            code_interval,
            memory,
        }
    }

    /// Stores a fresh 6-digit code for the phone, at most one per interval,
    /// and returns it (hmdp logs it instead of sending an SMS).
    pub async fn issue_code(&self, phone: &Phone) -> Result<String, Error> {
        let mut redis = self.redis.clone();
        if !self.code_interval.is_zero() {
            let allowed: bool = redis::cmd("SET")
                .arg(self.keys.login_code_limit(phone.as_str()))
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(self.code_interval.as_millis() as u64)
                .query_async::<Option<String>>(&mut redis)
                .await?
                .is_some();
            if !allowed {
                return Err(Rejection::CodeTooFrequent.into());
            }
        }
        let code = format!("{:06}", rand::rng().random_range(0..1_000_000));
        let stored: redis::RedisResult<()> = redis::pipe()
            .set_ex(
                self.keys.login_code(phone.as_str()),
                &code,
                LOGIN_CODE_TTL.as_secs(),
            )
            .ignore()
            .del(self.keys.login_code_failures(phone.as_str()))
            .ignore()
            .query_async(&mut redis)
            .await;
        if let Err(error) = stored {
            // No code was stored: do not make the phone wait for a code it
            // never got (best effort: Redis may be the thing that failed).
            let _: redis::RedisResult<()> =
                redis.del(self.keys.login_code_limit(phone.as_str())).await;
            return Err(error.into());
        }
        Ok(code)
    }

    /// Consumes the phone's code if `code` matches it; counts a wrong guess
    /// otherwise, invalidating the code at [`MAX_CODE_FAILURES`].
    pub async fn check_code(&self, phone: &Phone, code: &str) -> Result<(), Error> {
        let matched: i32 = CHECK_CODE
            .key(self.keys.login_code(phone.as_str()))
            .key(self.keys.login_code_failures(phone.as_str()))
            .arg(code)
            .arg(MAX_CODE_FAILURES)
            .invoke_async(&mut self.redis.clone())
            .await?;
        if matched == 1 {
            Ok(())
        } else {
            Err(Rejection::CodeInvalid.into())
        }
    }

    /// Opens a session for the user; returns its token (128 random bits, hex).
    pub async fn open(&self, user: &User) -> Result<String, Error> {
        let token = format!("{:032x}", rand::rng().random::<u128>());
        let key = self.keys.login_token(&token);
        let _: () = redis::pipe()
            .atomic()
            .hset_multiple(
                &key,
                &[
                    ("id", user.id.to_string()),
                    ("nickName", user.nick_name.clone()),
                    ("icon", user.icon.clone()),
                ],
            )
            .ignore()
            .expire(&key, SESSION_TTL.as_secs() as i64)
            .ignore()
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(token)
    }

    /// The session's user. Read from Redis, refreshing the session's TTL
    /// in the same round trip, unless this node read it within its keeping
    /// time: then Redis is not asked at all. Requests of one user arriving
    /// together (a storm's, a page's) share one read.
    pub async fn touch(&self, token: &str) -> Result<Option<User>, Error> {
        let Some(memory) = &self.memory else {
            return Ok(self.read(token).await?);
        };
        if memory.closed.contains_key(token) {
            return Ok(None);
        }
        let read = async {
            match self.read(token).await {
                Ok(Some(user)) => Ok(user),
                Ok(None) => Err(NoUser::Closed),
                Err(error) => Err(NoUser::Unreadable(error)),
            }
        };
        match memory.recent.try_get_with_by_ref(token, read).await {
            // Closed on this node while the read was under way.
            Ok(_) if memory.closed.contains_key(token) => {
                memory.recent.invalidate(token).await;
                Ok(None)
            }
            Ok(user) => Ok(Some(user)),
            Err(no_user) => match &*no_user {
                NoUser::Closed => Ok(None),
                NoUser::Unreadable(error) => Err(error.clone().into()),
            },
        }
    }

    /// The session's user from Redis, its TTL refreshed.
    async fn read(&self, token: &str) -> redis::RedisResult<Option<User>> {
        let key = self.keys.login_token(token);
        let (fields,): (std::collections::HashMap<String, String>,) = redis::pipe()
            .hgetall(&key)
            .expire(&key, SESSION_TTL.as_secs() as i64)
            .ignore()
            .query_async(&mut self.redis.clone())
            .await?;
        let user = (|| {
            Some(User {
                id: UserId::new(fields.get("id")?.parse().ok()?),
                nick_name: fields.get("nickName").cloned().unwrap_or_default(),
                icon: fields.get("icon").cloned().unwrap_or_default(),
            })
        })();
        Ok(user)
    }

    /// Ends the session: deleted in Redis, forgotten here at once. Another
    /// node that read it lately still knows it until its keeping time ends.
    pub async fn close(&self, token: &str) -> Result<(), Error> {
        if let Some(memory) = &self.memory {
            // Before the delete: from here on no read may bring it back.
            memory.closed.insert(token.to_owned(), ()).await;
            memory.recent.invalidate(token).await;
        }
        let _: () = self.redis.clone().del(self.keys.login_token(token)).await?;
        Ok(())
    }
}

/// The logged-in user of a request, with the token that proved it.
#[derive(Debug, Clone)]
pub struct CurrentUser {
    pub user: User,
    pub token: String,
    /// When the request's session check began: a purchase's time budget
    /// counts from here.
    pub since: std::time::Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phone_accepts_hmdp_patterns() {
        for ok in [
            "13812345678",
            "14512345678",
            "15012345678",
            "16612345678",
            "17012345678",
            "19812345678",
            "18800001111",
        ] {
            assert!(Phone::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn phone_refuses_bad_input() {
        for bad in [
            "",
            "1381234567",
            "138123456789",
            "23812345678",
            "15412345678",
            "16012345678",
            "1381234567a",
            "12012345678",
            "１３８１２３４５６７８",
        ] {
            assert_eq!(Phone::parse(bad), Err(Rejection::PhoneInvalid), "{bad}");
        }
    }
}
