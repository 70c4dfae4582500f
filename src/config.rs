//! Settings shared by the commands: flags, then environment, then defaults (docs/design.md).

use std::ffi::OsStr;
use std::time::Duration;

use anyhow::Context;
use clap::builder::TypedValueParser;
use clap::error::ErrorKind;
use clap::Args;
use hmdp_lock::LockMode;
use rand::RngExt;
use subtle::ConstantTimeEq;

use crate::redis_handle::RedisConnection;

/// MySQL: users, vouchers and orders.
#[derive(Debug, Clone, Args)]
pub struct DatabaseSettings {
    /// MySQL/MariaDB connection URL; the database is created if it is missing.
    #[arg(
        id = "database_url",
        value_name = "DATABASE_URL",
        long = "database-url",
        env = "DATABASE_URL",
        default_value = "mysql://root@127.0.0.1:3306/hmdp"
    )]
    pub url: String,
}

/// Redis: sessions, login codes, the id worker, the single-node locks and
/// the sales admitted in Redis.
#[derive(Debug, Clone, Args)]
pub struct RedisSettings {
    /// Redis URL: one server, `redis://host:port/db`, or a Redis Cluster,
    /// `redis+cluster://host:port,host:port,...` (any of its nodes; the rest
    /// is discovered).
    #[arg(
        id = "redis_url",
        value_name = "REDIS_URL",
        long = "redis-url",
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379/0"
    )]
    pub url: String,

    /// Prefix put before every Redis key this process writes, so several
    /// deployments (or test runs) can share one Redis without seeing each other.
    #[arg(
        id = "redis_prefix",
        value_name = "REDIS_PREFIX",
        long = "redis-prefix",
        env = "HMDP_REDIS_PREFIX",
        default_value = ""
    )]
    pub prefix: String,
}

impl RedisSettings {
    /// The Redis at `url`, keys unprefixed.
    pub fn at(url: impl Into<String>) -> Self {
        RedisSettings {
            url: url.into(),
            prefix: String::new(),
        }
    }
}

/// How long a backend call may take before it fails instead of hanging.
#[derive(Debug, Clone, Copy, Args)]
pub struct TimeoutSettings {
    /// How long a Redis call, a Redis or MySQL connection attempt, a wait
    /// for a free MySQL connection, or (on a node) a MySQL statement's wait
    /// for a row or table lock, in whole seconds rounded up, may take before the
    /// request fails with 503 UNAVAILABLE instead of hanging. A purchase's
    /// statements before COMMIT, once it has a connection, get this long in
    /// all (a frozen MySQL is given up on, the transaction dropped
    /// uncommitted); the COMMIT itself is waited for, as its outcome decides
    /// when the user's lock is free. A synchronous purchase answers within
    /// this plus --lock-wait-ms from its session check on, its COMMIT aside.
    #[arg(long, env = "HMDP_BACKEND_TIMEOUT_MS", default_value_t = 2000)]
    pub backend_timeout_ms: u64,
}

impl TimeoutSettings {
    pub fn backend_timeout(&self) -> Duration {
        Duration::from_millis(self.backend_timeout_ms)
    }
}

/// Where the data lives: MySQL for orders, Redis for sessions, ids and
/// locks, and how long a call to either may take. A command that uses only
/// part of it takes only that group, so that its `--help` lists no setting
/// it ignores.
#[derive(Debug, Clone, Args)]
pub struct StoreSettings {
    #[command(flatten)]
    pub database: DatabaseSettings,

    #[command(flatten)]
    pub redis: RedisSettings,

    #[command(flatten)]
    pub timeout: TimeoutSettings,
}

impl StoreSettings {
    pub fn backend_timeout(&self) -> Duration {
        self.timeout.backend_timeout()
    }
}

/// A Redis connection that reconnects by itself and never waits longer than
/// `timeout` for a reply, so a dead Redis turns into fast 503s, not hangs.
pub fn connect_redis(url: &str, timeout: Duration) -> anyhow::Result<RedisConnection> {
    hmdp_lock::connection::connect(url, timeout)
        .with_context(|| format!("invalid REDIS_URL `{}`", redact_url(url)))
}

/// `mysql://root:secret@host/db` → `mysql://root:***@host/db`: a database or
/// Redis URL as it may be shown in a message or a log.
///
/// Works on the text, not on a parse, so that a URL too malformed to parse
/// is masked too. Taken for a password: whatever follows the user name's `:`
/// up to the last `@`; without an `@`, a "port" that is not a number (a
/// forgotten `@host`); the value of a `pass` or `password` query parameter
/// (redis-rs reads `redis+unix:///socket?pass=`).
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_at(url.find("://").map_or(0, |at| at + 3));
    let secret = match rest.rfind('@') {
        Some(at) => rest[..at].find(':').map(|colon| colon + 1..at),
        None => {
            let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
            let port = authority
                .rfind(':')
                .filter(|&colon| !authority[colon..].contains(']'));
            port.map(|colon| colon + 1..authority.len())
                .filter(|port| !authority[port.clone()].bytes().all(|b| b.is_ascii_digit()))
        }
    };
    let rest = match secret {
        Some(secret) => format!("{}***{}", &rest[..secret.start], &rest[secret.end..]),
        None => rest.to_owned(),
    };
    let Some((path, query)) = rest.split_once('?') else {
        return format!("{scheme}{rest}");
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if ["pass", "password"].contains(&key.to_ascii_lowercase().as_str()) => {
                format!("{key}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{scheme}{path}?{}", query.join("&"))
}

/// Upper bounds of the lock durations: far beyond any sane setting, and far
/// from where `Instant + Duration` could overflow.
const DAY_MS: u64 = 24 * 60 * 60 * 1000;
const HOUR_MS: u64 = 60 * 60 * 1000;

/// How purchases are locked.
#[derive(Debug, Clone, Args)]
pub struct LockSettings {
    /// Lock mode guarding each user's purchase.
    #[arg(long = "lock", env = "HMDP_LOCK", value_enum, default_value_t = LockMode::Reentrant)]
    pub mode: LockMode,

    /// Comma-separated Redis URLs of independent nodes for `multi` / `redlock`.
    #[arg(long, env = "HMDP_LOCK_NODES", value_delimiter = ',')]
    pub lock_nodes: Vec<String>,

    /// Lease of a lock in milliseconds (simple Redis locks: 10000). For
    /// `reentrant` an explicit lease turns the watchdog off.
    #[arg(long, env = "HMDP_LOCK_LEASE_MS", value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    pub lock_lease_ms: Option<u64>,

    /// `reentrant` without an explicit lease: the lease the watchdog keeps
    /// renewing, every third of it, while the holder lives.
    #[arg(long, env = "HMDP_LOCK_WATCHDOG_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(30..=DAY_MS))]
    pub lock_watchdog_ms: u64,

    /// `reentrant`: the watchdog stops renewing after a holder has held the
    /// lock this long, so a stuck holder cannot keep a user locked forever;
    /// 0 renews for as long as the holder lives.
    #[arg(long, env = "HMDP_LOCK_MAX_HOLD_MS", default_value_t = 300_000,
          value_parser = clap::value_parser!(u64).range(0..=DAY_MS))]
    pub lock_max_hold_ms: u64,

    /// How long a purchase waits for a busy per-user lock; 0 fails at once
    /// with "不允许重复下单！" (hmdp's `tryLock()`).
    #[arg(long, env = "HMDP_LOCK_WAIT_MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=HOUR_MS))]
    pub lock_wait_ms: u64,

    /// Check a fencing token inside the purchase transaction.
    #[arg(long, env = "HMDP_FENCING", default_value_t = false)]
    pub fencing: bool,

    /// After taking a lock, wait until this many replicas acknowledged it
    /// (`WAIT`), so that a failover promoting one of them keeps the lock;
    /// fewer within --lock-sync-timeout-ms fails the acquisition (503).
    /// 0: don't wait (Redis's asynchronous replication). Single-Redis modes.
    #[arg(long, env = "HMDP_LOCK_SYNC_REPLICAS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=16))]
    pub lock_sync_replicas: u32,

    /// How long an acquisition waits for --lock-sync-replicas.
    #[arg(long, env = "HMDP_LOCK_SYNC_TIMEOUT_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub lock_sync_timeout_ms: u64,
}

impl LockSettings {
    pub fn wait(&self) -> Duration {
        Duration::from_millis(self.lock_wait_ms)
    }

    /// Refuses a wait for replicas that a reply may not take: `WAIT` runs
    /// on the Redis connection bounded by `timeout`, and a longer wait would
    /// turn every acquisition into a timeout.
    pub fn ensure_fits(&self, timeout: &TimeoutSettings) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.lock_sync_replicas == 0 || self.lock_sync_timeout_ms < timeout.backend_timeout_ms,
            "--lock-sync-timeout-ms ({}) must be shorter than --backend-timeout-ms ({})",
            self.lock_sync_timeout_ms,
            timeout.backend_timeout_ms
        );
        Ok(())
    }

    /// What the lock crate builds from these settings (without an observer).
    pub fn builder(&self) -> hmdp_lock::LockBuilder {
        let mut builder = hmdp_lock::LockBuilder::new(self.mode)
            .wait(self.wait())
            .nodes(self.lock_nodes.iter().cloned())
            .fencing(self.fencing)
            .sync_replicas(
                self.lock_sync_replicas,
                Duration::from_millis(self.lock_sync_timeout_ms),
            );
        match self.lock_lease_ms {
            Some(lease) => builder = builder.lease(Duration::from_millis(lease)),
            // The watchdog's settings, whose defaults apply to `reentrant`
            // alone (the builder refuses a setting its mode ignores).
            None if self.mode == LockMode::Reentrant => {
                builder = builder.watchdog_lease(Duration::from_millis(self.lock_watchdog_ms));
                if self.lock_max_hold_ms > 0 {
                    builder = builder.max_hold(Duration::from_millis(self.lock_max_hold_ms));
                }
            }
            None => {}
        }
        builder
    }
}

/// How a node places a purchase (`--seckill`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum SeckillMode {
    /// The per-user lock around the SQL transaction, inside the request: the
    /// answer comes after the commit.
    Sync,
    /// The course's V5: admission by `lua/seckill.lua` in Redis, the order
    /// handed to an in-process queue and written by a background task. Kept
    /// to show its failure: a node that dies with orders queued loses them.
    Queue,
    /// The course's V6: admission by `lua/seckill.lua`, the order appended to
    /// a Redis Stream that a consumer group on every node writes to MySQL.
    Stream,
}

impl SeckillMode {
    /// The mode's name on a command line and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            SeckillMode::Sync => "sync",
            SeckillMode::Queue => "queue",
            SeckillMode::Stream => "stream",
        }
    }
}

impl std::fmt::Display for SeckillMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The order stream's consumer (`--seckill stream`).
#[derive(Debug, Clone, Args)]
pub struct StreamSettings {
    /// Most orders the stream consumer writes in one MySQL transaction (and
    /// reads from the stream at once).
    #[arg(long, env = "HMDP_STREAM_BATCH", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub stream_batch: u64,

    /// How long an order read from the stream may stay unacknowledged (its
    /// consumer died, or its write failed) before a live consumer claims it
    /// and tries again, in milliseconds.
    #[arg(long, env = "HMDP_STREAM_CLAIM_IDLE_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(10..=DAY_MS))]
    pub stream_claim_idle_ms: u64,

    /// An order delivered more often than this without being written goes
    /// to the dead-letter stream instead of being tried again.
    #[arg(long, env = "HMDP_STREAM_MAX_DELIVERIES", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub stream_max_deliveries: u64,
}

impl StreamSettings {
    pub fn batch(&self) -> usize {
        self.stream_batch as usize
    }

    pub fn claim_idle(&self) -> Duration {
        Duration::from_millis(self.stream_claim_idle_ms)
    }
}

/// The order's life after the sale: payment deadline and sweep.
#[derive(Debug, Clone, Args)]
pub struct AfterSaleSettings {
    /// How long an order may stay unpaid: past `createTime` + this, it is
    /// closed and its unit and its buyer's turn go back on sale.
    #[arg(long, env = "HMDP_PAY_TIMEOUT_SECS", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(1..=30 * 86_400))]
    pub pay_timeout_secs: u64,

    /// How often each node sweeps MySQL for unpaid orders past their
    /// deadline that Redis lost the due time of (they are closed within
    /// this, plus 5 seconds, of their deadline).
    #[arg(long, env = "HMDP_PAY_SWEEP_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub pay_sweep_secs: u64,

    /// Fault injection: sleep this long between closing an order in MySQL
    /// and giving its unit back to Redis, the window in which a node killed
    /// leaves the give-back owed.
    #[arg(long, env = "HMDP_CHAOS_GIVEBACK_DELAY_MS", default_value_t = 0)]
    pub chaos_giveback_delay_ms: u64,
}

impl AfterSaleSettings {
    pub fn pay_timeout(&self) -> Duration {
        Duration::from_secs(self.pay_timeout_secs)
    }

    pub fn sweep_every(&self) -> Duration {
        Duration::from_secs(self.pay_sweep_secs)
    }

    pub fn chaos_giveback_delay(&self) -> Duration {
        Duration::from_millis(self.chaos_giveback_delay_ms)
    }
}

/// Settings of one HTTP node (`hmdp serve`).
#[derive(Debug, Clone, Args)]
pub struct ServeSettings {
    #[command(flatten)]
    pub store: StoreSettings,

    /// Maximum MySQL connections of this node.
    #[arg(long, env = "HMDP_DB_POOL", default_value_t = 32)]
    pub db_pool: u32,

    #[command(flatten)]
    pub lock: LockSettings,

    /// How purchases are placed: `sync` answers after the order's
    /// transaction committed; `queue` and `stream` admit the purchase in
    /// Redis (stock, buyers, sale window in one Lua script), answer the order
    /// id at once and write the order to MySQL afterwards.
    #[arg(long, env = "HMDP_SECKILL", value_enum, default_value_t = SeckillMode::Sync)]
    pub seckill: SeckillMode,

    /// How many shards the sales of seckill vouchers created through this
    /// node are split into in Redis (1 to 64), unless the request says
    /// (`"shards"`). Kept with the voucher, so every node splits its sale the
    /// same way. 1 keeps every key of a sale under the hash tag `{seckill}`,
    /// in one Redis Cluster slot; N spreads its stock, buyers and order
    /// streams over N tags chosen to land evenly on the cluster's masters.
    #[arg(long, env = "HMDP_SECKILL_SHARDS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(crate::shards::MAX_SHARDS)))]
    pub seckill_shards: u16,

    /// `sync` mode: the purchases of one voucher that arrive while a
    /// transaction of it is in flight on this node are written together in
    /// the next one, up to this many per transaction, each still under its
    /// buyer's lock and answered after the commit that holds its order. 1
    /// writes each purchase in a transaction of its own.
    #[arg(long, env = "HMDP_SYNC_BATCH_MAX", default_value_t = 128,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub sync_batch_max: u16,

    /// `sync` mode, shared commits: once a voucher's transaction has
    /// committed, the purchases already waiting for the next one wait up
    /// to this many milliseconds more for company (until `--sync-batch-max`
    /// wait), so that a busy voucher's transactions each hold more orders
    /// and MySQL's cost of a transaction is shared by more of them. Never
    /// when none waits: an idle voucher's purchase is written at once. 0
    /// writes what waits at once.
    #[arg(long, env = "HMDP_SYNC_BATCH_LINGER_MS", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub sync_batch_linger_ms: u64,

    #[command(flatten)]
    pub stream: StreamSettings,

    #[command(flatten)]
    pub after_sale: AfterSaleSettings,

    #[command(flatten)]
    pub limits: crate::limits::LimitSettings,

    #[command(flatten)]
    pub shed: crate::overload::ShedSettings,

    /// `queue`: on SIGTERM or SIGINT, how long the node keeps writing the
    /// orders still queued (already answered with their ids) before it
    /// exits; what is left then is logged, and stays pending in Redis.
    #[arg(long, env = "HMDP_QUEUE_DRAIN_SECS", default_value_t = 30)]
    pub queue_drain_secs: u64,

    /// TCP port to listen on; 0 picks a free one.
    #[arg(long, env = "HMDP_PORT", default_value_t = 8081)]
    pub port: u16,

    /// Address to listen on.
    #[arg(long, env = "HMDP_HOST", default_value = "0.0.0.0")]
    pub host: String,

    /// Name of this node in logs and responses (default: hostname:port).
    #[arg(long, env = "HMDP_NODE_ID")]
    pub node_id: Option<String>,

    /// Token required in `x-admin-token` to create vouchers, at least 16
    /// characters (default: random, logged once at start).
    #[arg(long, env = "HMDP_ADMIN_TOKEN", hide_env_values = true, value_parser = AdminTokenParser)]
    pub admin_token: Option<AdminToken>,

    /// Fault injection: sleep this long inside the critical section (lock
    /// held, transaction open), standing in for a GC pause or slow SQL. It
    /// counts toward the purchase's statements, which give up (503) past
    /// --backend-timeout-ms.
    #[arg(long, env = "HMDP_CHAOS_HOLD_MS", default_value_t = 0)]
    pub chaos_hold_ms: u64,

    /// Fault injection: sleep this long between the two halves of a move of
    /// stock between a sale's shards (after the units left one shard, before
    /// the other receives them), so that a test can kill the node there.
    #[arg(long, env = "HMDP_CHAOS_MOVE_PAUSE_MS", default_value_t = 0)]
    pub chaos_move_pause_ms: u64,

    /// How long a request body may take to arrive after its headers; a
    /// slower one fails with 408 and its connection is closed.
    #[arg(long, env = "HMDP_BODY_TIMEOUT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=HOUR_MS))]
    pub body_timeout_ms: u64,

    /// How long a session read from Redis is kept in this node's memory:
    /// its requests within that time skip Redis (and the refresh of the
    /// session's 30-minute TTL), and a user's simultaneous requests share
    /// one read. A logout on another node reaches this one within this
    /// time. 0 reads Redis on every request, as hmdp does.
    #[arg(long, env = "HMDP_SESSION_CACHE_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub session_cache_ms: u64,

    /// Minimum seconds between two login codes for one phone (0: no limit).
    #[arg(long, env = "HMDP_CODE_INTERVAL_SECS", default_value_t = 60)]
    pub code_interval_secs: u64,

    /// Do not apply pending migrations at start.
    #[arg(long, default_value_t = false)]
    pub no_migrate: bool,

    /// HTTP worker threads (default: one per core).
    #[arg(long, env = "HMDP_WORKERS")]
    pub workers: Option<usize>,
}

impl ServeSettings {
    /// The node's name when it listens on `port`: `--node-id`, or the
    /// kernel's hostname and the port.
    pub fn node_id_on(&self, port: u16) -> String {
        self.node_id.clone().unwrap_or_else(|| {
            // The kernel's hostname: `$HOSTNAME` is a shell variable that is
            // usually not exported to children.
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|name| name.trim().to_owned())
                .unwrap_or_else(|_| "localhost".into());
            format!("{host}:{port}")
        })
    }

    /// The node's name before it listens: unknown only when it takes any
    /// free port (`--port 0`) and has no `--node-id`.
    pub fn node_id_before_listening(&self) -> Option<String> {
        (self.node_id.is_some() || self.port != 0).then(|| self.node_id_on(self.port))
    }
}

/// The secret that `x-admin-token` must carry, long enough that it cannot be
/// guessed (an empty one would let an empty header in).
#[derive(Clone)]
pub struct AdminToken(String);

impl AdminToken {
    pub const MIN_CHARS: usize = 16;

    pub fn parse(raw: &str) -> Result<AdminToken, String> {
        if raw.chars().count() < Self::MIN_CHARS {
            return Err(format!(
                "the admin token (HMDP_ADMIN_TOKEN / --admin-token) must be at least {} \
                 characters, this one has {}; leave it unset to have a random one \
                 generated and logged",
                Self::MIN_CHARS,
                raw.chars().count()
            ));
        }
        Ok(AdminToken(raw.to_owned()))
    }

    /// 128 random bits, hex.
    pub fn generate() -> AdminToken {
        AdminToken(format!("{:032x}", rand::rng().random::<u128>()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Compares in constant time, so the answer's timing tells nothing of
    /// how much of a guess was right.
    pub fn matches(&self, given: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(given).into()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

/// Parses `--admin-token` without quoting the refused value, as clap's own
/// message would: a secret, even a refused one, has no place in a log.
#[derive(Clone)]
struct AdminTokenParser;

impl TypedValueParser for AdminTokenParser {
    type Value = AdminToken;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<AdminToken, clap::Error> {
        let parsed = match value.to_str() {
            Some(raw) => AdminToken::parse(raw),
            None => Err("the admin token (HMDP_ADMIN_TOKEN / --admin-token) is not UTF-8".into()),
        };
        parsed.map_err(|message| {
            clap::Error::raw(ErrorKind::ValueValidation, message + "\n").with_cmd(cmd)
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{redact_url, AdminToken, LockSettings, SeckillMode, ServeSettings};

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        lock: LockSettings,
    }

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        serve: ServeSettings,
    }

    fn parses(args: &[&str]) -> bool {
        Flags::try_parse_from(std::iter::once("hmdp").chain(args.iter().copied())).is_ok()
    }

    #[test]
    fn lock_durations_outside_their_range_are_refused() {
        assert!(parses(&[
            "--lock-lease-ms=300",
            "--lock-watchdog-ms=300",
            "--lock-wait-ms=2000"
        ]));
        assert!(
            !parses(&["--lock-lease-ms=0"]),
            "a zero lease deletes the key at once"
        );
        assert!(
            !parses(&["--lock-watchdog-ms=2"]),
            "renewing every 0 ms spins"
        );
        assert!(
            !parses(&["--lock-wait-ms=18446744073709551615"]),
            "Instant overflow"
        );
        assert!(!parses(&["--lock-lease-ms=-5"]));
    }

    #[test]
    fn admin_tokens_shorter_than_16_characters_are_refused() {
        for short in ["", "change-me", "fifteen-chars!!"] {
            let refused = Serve::try_parse_from(["hmdp", &format!("--admin-token={short}")])
                .err()
                .unwrap_or_else(|| panic!("admin token {short:?} accepted"))
                .to_string();
            assert!(
                refused.contains("HMDP_ADMIN_TOKEN") && refused.contains("16 characters"),
                "{refused}"
            );
            assert!(short.is_empty() || !refused.contains(short), "{refused}");
        }
        assert!(Serve::try_parse_from(["hmdp", "--admin-token=sixteen-chars!!!"]).is_ok());
    }

    #[test]
    fn the_seckill_mode_and_the_stream_settings_parse_within_their_ranges() {
        let serve = |flags: &[&str]| {
            Serve::try_parse_from(std::iter::once("hmdp").chain(flags.iter().copied()))
        };
        let defaults = serve(&[]).unwrap().serve;
        assert_eq!(defaults.seckill, SeckillMode::Sync);
        assert_eq!(
            (
                defaults.stream.batch(),
                defaults.stream.stream_max_deliveries
            ),
            (100, 5)
        );
        let stream = serve(&["--seckill=stream", "--stream-batch=10"])
            .unwrap()
            .serve;
        assert_eq!(
            (stream.seckill.to_string(), stream.stream.batch()),
            ("stream".into(), 10)
        );
        for refused in [
            "--seckill=async",
            "--stream-batch=0",
            "--stream-claim-idle-ms=0",
            "--stream-max-deliveries=0",
        ] {
            assert!(serve(&[refused]).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_body_timeout_outside_its_range_is_refused() {
        let serve = |flag: &str| Serve::try_parse_from(["hmdp", flag]);
        assert_eq!(
            serve("--body-timeout-ms=1000")
                .unwrap()
                .serve
                .body_timeout_ms,
            1000
        );
        assert!(
            serve("--body-timeout-ms=0").is_err(),
            "every body would time out"
        );
        assert!(
            serve("--body-timeout-ms=18446744073709551615").is_err(),
            "Instant overflow"
        );
    }

    #[test]
    fn redacted_urls_keep_everything_but_the_password() {
        for (url, shown) in [
            (
                "mysql://root:secret@host:3306/hmdp",
                "mysql://root:***@host:3306/hmdp",
            ),
            ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
            (
                "mysql://root@127.0.0.1:3306/hmdp",
                "mysql://root@127.0.0.1:3306/hmdp",
            ),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=secret",
                "redis+unix:///tmp/r.sock?db=1&pass=***",
            ),
            ("mysql://u:s@c:r/e#t@host/db", "mysql://u:***@host/db"),
            ("mysql://root:secret/db", "mysql://root:***/db"),
            ("mysql://[::1]:3306/db", "mysql://[::1]:3306/db"),
            ("redis://[::1]/0", "redis://[::1]/0"),
            ("root:secret@host", "root:***@host"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn admin_token_counts_characters_not_bytes() {
        assert!(AdminToken::parse("口令口令口令口令口令口令口令口令").is_ok());
        assert!(AdminToken::parse("口令口令口令").is_err());
        assert_eq!(AdminToken::generate().as_str().len(), 32);
    }

    #[test]
    fn admin_token_matches_only_itself() {
        let token = AdminToken::parse("sixteen-chars!!!").unwrap();
        assert!(token.matches(b"sixteen-chars!!!"));
        for wrong in [&b""[..], b"sixteen-chars!!", b"sixteen-chars!!!!"] {
            assert!(!token.matches(wrong));
        }
    }
}
