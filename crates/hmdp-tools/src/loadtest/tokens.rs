//! Logging many users in through the HTTP API (`hmdp tokens`, and the load
//! test when it is given no token file): the same two calls hmdp's front end
//! makes, with the login code read from Redis where the node left it, or a
//! session an earlier run opened for the phone, while it lives.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use futures::stream::{self, StreamExt, TryStreamExt};
use hmdp_lock::Connection as RedisConnection;
use hmdp_test_support::phone;
use redis::AsyncCommands;
use serde::Deserialize;

use hmdp::auth::SESSION_TTL;
use hmdp::config::{RedisSettings, TimeoutSettings};
use hmdp::keys::Keys;

/// A remembered session with less than this left is not reused: it could
/// expire before the run's first request renews it.
const SESSION_MARGIN: Duration = Duration::from_secs(60);

/// `hmdp tokens`: log users in and write their tokens.
#[derive(Debug, Clone, Args)]
pub struct TokensSettings {
    /// Base URL of nginx or of one node.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub target: String,

    /// How many users to log in (phones 13800000000, 13800000001, ...).
    #[arg(long)]
    pub users: usize,

    /// Index of the first user. Runs may repeat at once on the same phones:
    /// sessions they opened are kept in Redis (`load:sessions`) and reused
    /// while alive, so no second login code is asked for.
    #[arg(long, default_value_t = 0)]
    pub first_user: usize,

    /// Write the tokens here, one per line (a JMeter/wrk CSV); default stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Logins in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,

    /// Redis (URL and key prefix) of the nodes, where the login codes are.
    #[command(flatten)]
    pub redis: RedisSettings,

    #[command(flatten)]
    pub timeout: TimeoutSettings,
}

/// Logs users in through one node or nginx.
pub struct Login {
    client: reqwest::Client,
    target: String,
    redis: RedisConnection,
    keys: Keys,
}

/// The parts of hmdp's `Result` body a login needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApiBody {
    success: bool,
    data: Option<String>,
    error_msg: Option<String>,
    error_code: Option<String>,
}

impl Login {
    pub fn new(client: reqwest::Client, target: &str, redis: RedisConnection, keys: Keys) -> Self {
        Login {
            client,
            target: target.trim_end_matches('/').to_owned(),
            redis,
            keys,
        }
    }

    /// Logs in the users `first..first + count` with at most `concurrency`
    /// logins in flight; returns their tokens in user order.
    pub async fn users(
        &self,
        first: usize,
        count: usize,
        concurrency: usize,
    ) -> anyhow::Result<Vec<String>> {
        stream::iter(first..first + count)
            .map(|i| self.user(phone(i)))
            .buffered(concurrency.max(1))
            .try_collect()
            .await
    }

    /// The phone's session: one these tools opened earlier if it is still
    /// alive, else a new one (a code asked for, read from Redis, a login).
    ///
    /// Reusing sessions is what lets a load test run again at once: a phone
    /// gets one login code a minute (the nodes' limit for real users, left
    /// as it is), and a session lives 30 minutes from its last request.
    pub async fn user(&self, phone: String) -> anyhow::Result<String> {
        if let Some(token) = self.live_session(&phone).await? {
            return Ok(token);
        }
        let token = self.log_in(&phone).await?;
        self.remember(&phone, &token).await?;
        Ok(token)
    }

    /// The token remembered for `phone`, if its session has more than
    /// [`SESSION_MARGIN`] left (each purchase then renews it).
    async fn live_session(&self, phone: &str) -> anyhow::Result<Option<String>> {
        let mut redis = self.redis.clone();
        let sessions = self.keys.load_sessions();
        let token: Option<String> = redis
            .hget(&sessions, phone)
            .await
            .with_context(|| format!("reading {sessions} from Redis"))?;
        let Some(token) = token else {
            return Ok(None);
        };
        // -2: no such session (expired, logged out, Redis emptied).
        let left_ms: i64 = redis
            .pttl(self.keys.login_token(&token))
            .await
            .context("reading a session's TTL from Redis")?;
        let alive = left_ms == -1 || left_ms > SESSION_MARGIN.as_millis() as i64;
        Ok(alive.then_some(token))
    }

    /// Keeps `token` as `phone`'s session for the next run, for as long as
    /// the session itself lives unused.
    async fn remember(&self, phone: &str, token: &str) -> anyhow::Result<()> {
        let sessions = self.keys.load_sessions();
        redis::pipe()
            .atomic()
            .hset(&sessions, phone, token)
            .ignore()
            .expire(&sessions, SESSION_TTL.as_secs() as i64)
            .ignore()
            .query_async::<()>(&mut self.redis.clone())
            .await
            .with_context(|| format!("writing {sessions} to Redis"))
    }

    /// Asks for a code, reads it from Redis, logs in; returns the token.
    async fn log_in(&self, phone: &str) -> anyhow::Result<String> {
        let body = self
            .call(
                self.client
                    .post(format!("{}/user/code", self.target))
                    .query(&[("phone", phone)]),
            )
            .await
            .with_context(|| format!("asking for a login code for {phone}"))?;
        if !body.success {
            bail!(
                "no login code for {phone}: {} ({}); a phone gets one code a minute, and \
                 no live session of an earlier run was found for it: wait, or log in \
                 other phones (--first-user)",
                body.error_msg.unwrap_or_default(),
                body.error_code.unwrap_or_default()
            );
        }
        let key = self.keys.login_code(phone);
        let code: Option<String> = self
            .redis
            .clone()
            .get(&key)
            .await
            .with_context(|| format!("reading {key} from Redis"))?;
        let code = code.with_context(|| {
            format!(
                "no code at Redis key {key}: do --redis-url and --redis-prefix match the nodes'?"
            )
        })?;
        let body = self
            .call(
                self.client
                    .post(format!("{}/user/login", self.target))
                    .json(&serde_json::json!({ "phone": phone, "code": code })),
            )
            .await
            .with_context(|| format!("logging {phone} in"))?;
        match body {
            ApiBody {
                success: true,
                data: Some(token),
                ..
            } => Ok(token),
            other => bail!(
                "login of {phone} refused: {} ({})",
                other.error_msg.unwrap_or_default(),
                other.error_code.unwrap_or_default()
            ),
        }
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> anyhow::Result<ApiBody> {
        let response = request.send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "HTTP {status} with a body that is not hmdp's Result: {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    }
}

/// `hmdp tokens`.
pub async fn run(settings: TokensSettings) -> anyhow::Result<()> {
    let redis =
        hmdp::config::connect_redis(&settings.redis.url, settings.timeout.backend_timeout())?;
    let login = Login::new(
        super::http_client(settings.concurrency)?,
        &settings.target,
        redis,
        Keys::new(settings.redis.prefix.clone()),
    );
    let tokens = login
        .users(settings.first_user, settings.users, settings.concurrency)
        .await?;
    let mut lines = tokens.join("\n");
    lines.push('\n');
    match &settings.out {
        Some(path) => {
            std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
            tracing::info!(users = tokens.len(), file = %path.display(), "tokens written");
        }
        None => print!("{lines}"),
    }
    Ok(())
}

/// Sends of `GET /user/me` for one token before giving up: a node may be
/// restarting under a soak's faults.
const ME_SENDS: usize = 5;
const ME_PAUSE: Duration = Duration::from_millis(200);

/// The user id behind each of `tokens`, in order, read from `GET /user/me`
/// at `target`: the history names each buyer by the id MySQL files their
/// orders under, which a token does not say.
pub async fn user_ids(
    client: &reqwest::Client,
    target: &str,
    tokens: &[String],
    concurrency: usize,
) -> anyhow::Result<Vec<i64>> {
    let url = format!("{}/user/me", target.trim_end_matches('/'));
    // Each lookup owns what it sends: the stream of them is `Send` as a
    // whole, as a spawned load needs.
    let lookups = (tokens.iter()).map(|token| user_id(client.clone(), url.clone(), token.clone()));
    stream::iter(lookups.collect::<Vec<_>>())
        .buffered(concurrency.max(1))
        .try_collect()
        .await
}

/// One token's user id, asked again while the answer is not a user.
async fn user_id(client: reqwest::Client, url: String, token: String) -> anyhow::Result<i64> {
    let mut last = String::new();
    for _ in 0..ME_SENDS {
        let answer = client
            .get(&url)
            .header("authorization", &token)
            .send()
            .await;
        match answer {
            Ok(response) => {
                let body: serde_json::Value = response.json().await.unwrap_or_default();
                if let Some(id) = body["data"]["id"].as_i64() {
                    return Ok(id);
                }
                last = body.to_string();
            }
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(ME_PAUSE).await;
    }
    bail!("GET {url} named no user for a token after {ME_SENDS} sends: {last}")
}
