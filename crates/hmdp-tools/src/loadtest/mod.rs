//! The load generator (`hmdp loadtest`): many users, each firing several
//! purchases of one voucher at once, through nginx or one node, with bounded
//! concurrency over reused connections; latency percentiles, outcomes by
//! `errorCode`, requests per serving node, and the invariant audit.

pub mod crowd;
mod lanes;
mod report;
pub mod tokens;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use futures::future::join_all;
use hdrhistogram::Histogram;
use hyper::header::HeaderValue;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::task::JoinSet;

use hmdp::config::StoreSettings;
use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::seckill::SaleState;
use hmdp::store::{Store, VoucherAudit};

use crate::audit;
use crate::history::{self, Call, Event, Failure};
use lanes::{Lanes, ShotError};
pub use report::Report;
use tokens::Login;

/// `hmdp loadtest`.
#[derive(Debug, Clone, Args)]
pub struct LoadtestSettings {
    /// Base URL of nginx or of one node.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub target: String,

    /// The seckill voucher to buy (required unless --workload creates one).
    #[arg(long, required_unless_present = "workload")]
    pub voucher: Option<i64>,

    /// A named workload on a fresh voucher created through the admin API:
    /// `sale` (stock = --users, one purchase per user: committed orders/s),
    /// `storm` (stock = a tenth of --users, --per-user purchases per user at
    /// once: requests/s, nearly all of them rejected) or `crowd` (stock = a
    /// quarter of --users: --users honest buyers and --bots bots, each class
    /// measured on its own; docs/limits.md).
    #[arg(long, value_enum, conflicts_with = "voucher")]
    pub workload: Option<Workload>,

    /// Stock of the --workload voucher, instead of the workload's own.
    #[arg(long, requires = "workload")]
    pub stock: Option<i32>,

    /// Admin token of the nodes, to create the --workload voucher.
    #[arg(long, env = "HMDP_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Distinct users (logged in first unless --tokens is given).
    #[arg(long, default_value_t = 500)]
    pub users: usize,

    /// Purchases each user fires at once.
    #[arg(long, default_value_t = 5)]
    pub per_user: usize,

    /// Requests in flight at most (a user's purchases always go together),
    /// over as many connections, opened before the clock starts.
    #[arg(long, default_value_t = 200)]
    pub concurrency: usize,

    /// `sale` and `storm` (and --voucher): over how many source addresses
    /// the users are spread (127.3.0.1, ...; user i sends from the (i mod
    /// N)th), so that per-address limits see N clients instead of this
    /// machine alone. Needs a target on 127.0.0.1. 1: the machine's own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=65535))]
    pub addresses: u64,

    /// `crowd`: bots, each sending purchase after purchase until every
    /// honest buyer is done (their users come after the --users honest ones).
    #[arg(long, default_value_t = 200)]
    pub bots: usize,

    /// `crowd`: how many addresses the bots share (127.2.0.1, ...; each
    /// honest buyer has one of their own, 127.1.x.y).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=250))]
    pub bot_addresses: u64,

    /// `crowd`: over how many ms the honest buyers' first purchases are
    /// spread, evenly.
    #[arg(long, default_value_t = 1000)]
    pub spread_ms: u64,

    /// Tokens to use, one per line (from `hmdp tokens`), instead of logging in.
    #[arg(long)]
    pub tokens: Option<PathBuf>,

    /// Read the database before and after and check the invariants. For a
    /// voucher Redis holds a sale for (`queue` / `stream` nodes), first wait
    /// for its admitted orders to be written, then run `hmdp audit` on it.
    #[arg(long)]
    pub verify: bool,

    /// With --verify on an asynchronous sale: how long to wait for the
    /// admitted orders to be written before auditing what is there.
    #[arg(long, default_value_t = 60)]
    pub drain_timeout_secs: u64,

    /// With --verify: pass even when an audit check could not be made (the
    /// sale gone from Redis after the run). Without it, a check not made
    /// fails the run: a verification that cannot see must not pass.
    #[arg(long)]
    pub allow_unchecked: bool,

    /// Also write the result as a JSON object to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Record every purchase sent and its answer to this file (JSON lines),
    /// for `hmdp check` to judge against MySQL afterwards.
    #[arg(long)]
    pub history: Option<PathBuf>,

    /// MySQL for --verify; Redis (URL and prefix) for logging users in.
    #[command(flatten)]
    pub store: StoreSettings,
}

/// The load test's named workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Stock S, S users, one purchase each: every request should commit.
    Sale,
    /// U users x K simultaneous purchases of a stock of U / 10: a tenth of
    /// the users get one order, every other request is turned away (a
    /// duplicate while the user's lock is held, sold out after).
    Storm,
    /// U honest buyers (one purchase, one retry after a failure, each from
    /// an address of their own) and B bots (purchase after purchase from a
    /// few addresses) at a stock of U / 4.
    Crowd,
}

impl Workload {
    /// The stock of the workload's voucher for `users` users.
    pub fn stock(self, users: usize) -> usize {
        match self {
            Workload::Sale => users,
            Workload::Storm => users.div_ceil(10),
            Workload::Crowd => users.div_ceil(4),
        }
    }
}

/// An HTTP client for many small requests to one host: connections are kept
/// and reused (one per request in flight), Nagle is off, no proxy is consulted.
pub fn http_client(concurrency: usize) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency.max(1))
        .tcp_nodelay(true)
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")
}

/// One load run: who buys what, how hard.
pub struct Plan {
    /// Base URL of nginx or one node.
    pub target: String,
    pub voucher: i64,
    /// One token per user.
    pub tokens: Vec<String>,
    pub per_user: usize,
    pub concurrency: usize,
    /// How many source addresses the users are spread over.
    pub addresses: usize,
    /// Advanced once per answered request; hidden when not on a terminal.
    pub progress: ProgressBar,
}

impl Plan {
    pub fn requests(&self) -> u64 {
        (self.tokens.len() * self.per_user) as u64
    }
}

/// A progress bar on a terminal, a hidden (but still counting) one elsewhere.
pub fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        let bar = ProgressBar::hidden();
        bar.set_length(total);
        return bar;
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests  {per_sec}  {elapsed}")
            .expect("static template"),
    );
    bar
}

/// What one run measured, before any audit.
pub struct Measured {
    pub requests: u64,
    pub elapsed: Duration,
    /// Microseconds from sending a request to reading its whole answer.
    pub latency_us: Histogram<u64>,
    /// The same, of the purchases answered with an order.
    pub ordered_latency_us: Histogram<u64>,
    /// `OK`, an `errorCode`, `HTTP_<status>` for a body that is not hmdp's
    /// `Result`, or a transport failure (`CONNECT_ERROR`, `TIMEOUT`, ...).
    pub outcomes: BTreeMap<String, u64>,
    /// Answers by the node named in `x-served-by` (`-` when none answered).
    pub served_by: BTreeMap<String, u64>,
    /// Every success answer: who was told which order, by which node, when.
    pub told: Vec<Told>,
    /// Every purchase sent and what it was answered, as `hmdp check` reads
    /// them (the client is the buyer's index into the plan's tokens, the
    /// user their id).
    pub history: Vec<Event>,
}

/// A success answer: what a buyer was told. A run is judged by these, the
/// way Jepsen judges one: each must end as exactly that order in MySQL.
#[derive(Debug, Clone)]
pub struct Told {
    /// The buyer: an index into the plan's tokens.
    pub user: usize,
    /// The buyer's user id, as MySQL files their orders.
    pub user_id: i64,
    pub order_id: i64,
    /// The node named in `x-served-by`.
    pub node: String,
    /// When the answer was read.
    pub at: Instant,
}

/// What one purchase request came back with.
struct Shot {
    sent_at: Instant,
    latency: Duration,
    outcome: String,
    node: String,
    /// The order id of a success answer.
    order_id: Option<i64>,
    answered_at: Instant,
}

/// The parts of hmdp's `Result` body the outcome needs.
#[derive(Deserialize)]
struct ResultBody {
    success: bool,
    #[serde(rename = "errorCode")]
    error_code: Option<String>,
    /// The order id (as a string) of a purchase's success answer.
    data: Option<serde_json::Value>,
}

/// Runs the plan: every user's purchases fire together once enough of the
/// concurrency budget is free for all of them. Fails only on a `target`
/// that is not an `http://` URL; failed requests are outcomes.
pub async fn run(plan: &Plan) -> anyhow::Result<Measured> {
    let lanes = Arc::new(
        Lanes::new(
            &plan.target,
            &format!("/voucher-order/seckill/{}", plan.voucher),
            plan.concurrency,
        )?
        .spread_over(plan.addresses)?,
    );
    // A user needing more permits than exist would wait forever.
    let burst = plan.per_user.min(plan.concurrency.max(1)) as u32;
    // Who each token is, asked before the clock starts: the history names
    // every buyer by the user id MySQL files their orders under.
    let user_ids = tokens::user_ids(
        &http_client(plan.concurrency)?,
        &plan.target,
        &plan.tokens,
        plan.concurrency,
    )
    .await?;
    // As many connections as will carry requests at once, open before the
    // clock starts: a purchase's latency is its exchange, not a handshake.
    let shots = plan.tokens.len().saturating_mul(plan.per_user);
    lanes.open_ahead(plan.concurrency.min(shots)).await;
    let started = Instant::now();
    // Each purchase's Idempotency-Key: this run's, the user's, the shot's.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut users = JoinSet::new();
    for (user, token) in plan.tokens.iter().enumerate() {
        let token = HeaderValue::from_str(token)
            .with_context(|| format!("token {token:?} is not a header value"))?;
        let (lanes, per_user, bar) = (lanes.clone(), plan.per_user, plan.progress.clone());
        let run = run.clone();
        users.spawn(async move {
            let _permits = lanes.reserve(burst).await;
            let keys: Vec<HeaderValue> = (0..per_user)
                .map(|shot| {
                    HeaderValue::from_str(&format!("{run}-{user}-{shot}"))
                        .expect("hex and digits make a header value")
                })
                .collect();
            let shots = keys
                .iter()
                .map(|key| shoot(&lanes, user, &token, key, &bar));
            (user, join_all(shots).await)
        });
    }

    let mut latency_us =
        Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("static bounds");
    let mut ordered_latency_us = latency_us.clone();
    let mut outcomes = BTreeMap::new();
    let mut served_by = BTreeMap::new();
    let mut requests = 0;
    let mut told = Vec::new();
    let mut history = Vec::new();
    while let Some(joined) = users.join_next().await {
        let (user, shots) = joined.expect("a user task does not panic");
        for shot in shots {
            requests += 1;
            history.extend(shot.history(user, user_ids[user], plan.voucher));
            latency_us.saturating_record(shot.latency.as_micros().max(1) as u64);
            if let Some(order_id) = shot.order_id {
                ordered_latency_us.saturating_record(shot.latency.as_micros().max(1) as u64);
                told.push(Told {
                    user,
                    user_id: user_ids[user],
                    order_id,
                    node: shot.node.clone(),
                    at: shot.answered_at,
                });
            }
            *outcomes.entry(shot.outcome).or_insert(0) += 1;
            *served_by.entry(shot.node).or_insert(0) += 1;
        }
    }
    plan.progress.finish_and_clear();
    Ok(Measured {
        requests,
        elapsed: started.elapsed(),
        latency_us,
        ordered_latency_us,
        outcomes,
        served_by,
        told,
        history,
    })
}

impl Shot {
    /// The purchase's invocation and its answer, as `hmdp check` reads them.
    fn history(&self, client: usize, user_id: i64, voucher: i64) -> [Event; 2] {
        let (f, at_ms) = (Call::Buy, history::unix_ms(self.answered_at));
        let user = Some(user_id);
        let answer = match self.order_id {
            Some(order) => Event::Ok {
                client,
                user,
                voucher,
                f,
                order,
                node: self.node.clone(),
                at_ms,
            },
            None => Event::failed(
                history::definite_refusal(&self.outcome),
                Failure {
                    client,
                    user,
                    voucher,
                    f,
                    order: None,
                    error: self.outcome.clone(),
                    at_ms,
                },
            ),
        };
        let invoke = Event::Invoke {
            client,
            user,
            voucher,
            f,
            order: None,
            at_ms: history::unix_ms(self.sent_at),
        };
        [invoke, answer]
    }
}

/// How often a purchase whose answer was lost (a timeout, a dropped
/// connection) or is still being given (409: its first attempt runs) is
/// sent again with its Idempotency-Key: the node answers a resent purchase
/// with the first attempt's order, never a second one.
const RESENDS: usize = 3;
/// The pause before resending a purchase whose first attempt still runs.
const IN_USE_PAUSE: Duration = Duration::from_millis(50);

/// One logical purchase: sent, and resent with the same key while its
/// answer is lost.
async fn shoot(
    lanes: &Lanes,
    user: usize,
    token: &HeaderValue,
    key: &HeaderValue,
    bar: &ProgressBar,
) -> Shot {
    let started = Instant::now();
    let mut answer = lanes.post(user, token, key).await;
    for _ in 0..RESENDS {
        match &answer {
            Err(ShotError::Timeout | ShotError::Transport(_)) => {}
            Ok(answer) if answer.status == hyper::StatusCode::CONFLICT => {
                tokio::time::sleep(IN_USE_PAUSE).await;
            }
            _ => break,
        }
        answer = lanes.post(user, token, key).await;
    }
    let latency = started.elapsed();
    bar.inc(1);
    let answered_at = Instant::now();
    let mut order_id = None;
    let (outcome, node) = match answer {
        Ok(answer) => {
            let outcome = match serde_json::from_slice::<ResultBody>(&answer.body) {
                Ok(ResultBody {
                    success: true,
                    data,
                    ..
                }) => {
                    order_id = data.as_ref().and_then(|data| match data {
                        serde_json::Value::String(id) => id.parse().ok(),
                        other => other.as_i64(),
                    });
                    "OK".to_owned()
                }
                Ok(ResultBody {
                    error_code: Some(code),
                    ..
                }) => code,
                _ => format!("HTTP_{}", answer.status.as_u16()),
            };
            (outcome, answer.node.unwrap_or_else(|| "-".into()))
        }
        Err(error) => {
            tracing::debug!(%error, "purchase request failed");
            (error.outcome().to_owned(), "-".into())
        }
    };
    Shot {
        sent_at: started,
        latency,
        outcome,
        node,
        order_id,
        answered_at,
    }
}

/// Creates a seckill voucher on sale now through the admin API of `target`
/// (nginx or one node), as an admin would; returns its id.
pub async fn create_voucher(
    client: &reqwest::Client,
    target: &str,
    admin_token: &str,
    stock: i32,
) -> anyhow::Result<i64> {
    let body: serde_json::Value = client
        .post(format!("{}/voucher/seckill", target.trim_end_matches('/')))
        .header("x-admin-token", admin_token)
        .json(&json!({
            "shopId": 1,
            "title": "100元代金券",
            "subTitle": "周一至周日均可使用",
            "rules": "全场通用",
            "payValue": 8000,
            "actualValue": 10000,
            "type": 1,
            "stock": stock,
            "beginTime": hmdp_test_support::OPEN_SALE.0,
            "endTime": hmdp_test_support::OPEN_SALE.1,
        }))
        .send()
        .await?
        .json()
        .await
        .context("creating the voucher")?;
    body["data"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .with_context(|| format!("voucher not created: {body}"))
}

/// How the orders admitted by an asynchronous sale reached MySQL.
pub enum Drain {
    /// None pending any more, this long after the last answer (within
    /// the polling interval).
    Drained(Duration),
    /// Still this many pending at the deadline.
    Stuck(usize),
}

/// Waits until no order of `voucher_id` is pending (admitted, not yet
/// written) or `deadline` passed, counting from the load run's last answer.
/// Polls the pending orders' and the stream's lengths, which are cheap; they
/// count every voucher's orders, so once a second (and at the deadline) the
/// voucher's own are counted, in case another voucher's stay pending.
pub async fn drain(
    sale_state: &SaleState,
    voucher_id: VoucherId,
    deadline: Duration,
) -> anyhow::Result<Drain> {
    const POLL: Duration = Duration::from_millis(5);
    const COUNT_OWN_EVERY: Duration = Duration::from_secs(1);
    let started = Instant::now();
    let mut own_counted = started;
    loop {
        if sale_state.orders_on_their_way().await? == (0, 0) {
            return Ok(Drain::Drained(started.elapsed()));
        }
        let late = started.elapsed() >= deadline;
        if late || own_counted.elapsed() >= COUNT_OWN_EVERY {
            own_counted = Instant::now();
            let pending = sale_state.pending_orders_of(voucher_id).await?.len()
                + sale_state.streamed_orders_of(voucher_id).await?.len();
            if pending == 0 {
                return Ok(Drain::Drained(started.elapsed()));
            }
            if late {
                return Ok(Drain::Stuck(pending));
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Reads one token per line, skipping blank lines.
pub fn read_tokens(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect())
}

/// `hmdp loadtest`.
pub async fn run_command(settings: LoadtestSettings) -> anyhow::Result<()> {
    if settings.workload == Some(Workload::Crowd) {
        return crowd_command(settings).await;
    }
    let client = http_client(settings.concurrency)?;
    let tokens = tokens(&settings, &client).await?;
    let per_user = match settings.workload {
        Some(Workload::Sale) => 1,
        _ => settings.per_user,
    };
    let voucher = voucher(&settings, &client, tokens.len()).await?;
    let voucher_id = VoucherId::new(voucher);
    // The history names the stock the sale began with: read, as --verify
    // reads it, before the run.
    let stores = if settings.verify || settings.history.is_some() {
        Some(audit::connect(&settings.store)?)
    } else {
        None
    };
    let before = match &stores {
        Some((store, sale_state)) => Some((
            store
                .audit_voucher(voucher_id)
                .await
                .with_context(|| format!("reading voucher {voucher} before the run"))?,
            // Redis holds a sale for the vouchers `queue` and `stream` admit.
            sale_state.read(voucher_id).await?.is_some(),
        )),
        None => None,
    };

    let plan = Plan {
        target: settings.target.clone(),
        voucher,
        per_user,
        concurrency: settings.concurrency,
        addresses: settings.addresses as usize,
        progress: progress_bar((tokens.len() * per_user) as u64),
        tokens,
    };
    let started = Instant::now();
    let measured = run(&plan).await?;
    if let (Some(path), Some((before, _))) = (&settings.history, &before) {
        let sale = Event::Sale {
            voucher,
            stock: before.supply(),
            at_ms: history::unix_ms(started),
        };
        let events = [&sale].into_iter().chain(&measured.history);
        history::Recorder::create(path)?.record_all(events)?;
    }

    let verified = before.filter(|_| settings.verify);
    let report = judge(&settings, &plan, &measured, stores.as_ref().zip(verified)).await?;
    print!("{}", report.table());
    if let Some(path) = &settings.json {
        report.write_json(path)?;
    }
    if !report.violations.is_empty() {
        bail!("invariants broken: {}", report.violations.join("; "));
    }
    Ok(())
}

/// `hmdp loadtest --workload crowd`: the honest buyers' and the bots' users
/// logged in, the sale, each class's figures; with `--verify`, MySQL's
/// invariants and every unit told matched by an order.
async fn crowd_command(settings: LoadtestSettings) -> anyhow::Result<()> {
    let client = http_client(settings.concurrency)?;
    let everyone = LoadtestSettings {
        users: settings.users + settings.bots,
        ..settings.clone()
    };
    let mut humans = tokens(&everyone, &client).await?;
    let bots = humans.split_off(settings.users);
    let voucher = voucher(&settings, &client, settings.users).await?;
    let stock = settings
        .stock
        .map_or(Workload::Crowd.stock(settings.users), |stock| {
            stock.max(0) as usize
        });
    let crowd = crowd::Crowd {
        target: settings.target.clone(),
        voucher,
        stock,
        humans,
        bots,
        bot_addresses: settings.bot_addresses as usize,
        spread: Duration::from_millis(settings.spread_ms),
    };
    let report = crowd::run(&crowd).await?;
    print!("{}", report.table());
    if let Some(path) = &settings.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    if settings.verify {
        let (store, _) = audit::connect(&settings.store)?;
        let after = store.audit_voucher(VoucherId::new(voucher)).await?;
        let mut violations = after.violations(stock as i64, true);
        let told = report.humans.units_won + report.bots.units_won;
        if told != after.active_orders as u64 {
            violations.push(format!(
                "{told} buyers were told they got a unit, MySQL holds {} active orders",
                after.active_orders
            ));
        }
        if !violations.is_empty() {
            bail!("invariants broken: {}", violations.join("; "));
        }
        println!("verified: MySQL holds an order for every unit told, and no invariant broken");
    }
    Ok(())
}

/// The users' tokens: read from `--tokens`, or logged in through the API.
async fn tokens(
    settings: &LoadtestSettings,
    client: &reqwest::Client,
) -> anyhow::Result<Vec<String>> {
    Ok(match &settings.tokens {
        Some(path) => {
            let mut tokens = read_tokens(path)?;
            if tokens.len() < settings.users {
                bail!(
                    "{} holds {} tokens, fewer than --users {}",
                    path.display(),
                    tokens.len(),
                    settings.users
                );
            }
            tokens.truncate(settings.users);
            tokens
        }
        None => {
            let redis = hmdp::config::connect_redis(
                &settings.store.redis.url,
                settings.store.backend_timeout(),
            )?;
            let keys = Keys::new(settings.store.redis.prefix.clone());
            Login::new(client.clone(), &settings.target, redis, keys)
                .users(0, settings.users, 32)
                .await?
        }
    })
}

/// The voucher to buy: `--voucher`, or one the workload creates.
async fn voucher(
    settings: &LoadtestSettings,
    client: &reqwest::Client,
    users: usize,
) -> anyhow::Result<i64> {
    Ok(match (settings.voucher, settings.workload) {
        (Some(voucher), _) => voucher,
        (None, None) => bail!("give --voucher or --workload"),
        (None, Some(workload)) => {
            let token = settings
                .admin_token
                .as_deref()
                .context("--workload creates a voucher: give --admin-token (HMDP_ADMIN_TOKEN)")?;
            let stock = match settings.stock {
                Some(stock) => stock,
                None => i32::try_from(workload.stock(users))
                    .context("too many users for one voucher")?,
            };
            create_voucher(client, &settings.target, token, stock).await?
        }
    })
}

/// The voucher before the run: MySQL's audit of it, and whether Redis
/// holds its sale (the vouchers `queue` and `stream` admit).
type Before = (VoucherAudit, bool);

/// The run's report; with `--verify` (`verified`: the stores and what they
/// held before), the drain, the audit of MySQL and, for a sale admitted in
/// Redis, the reconciliation.
async fn judge(
    settings: &LoadtestSettings,
    plan: &Plan,
    measured: &Measured,
    verified: Option<(&(Store, SaleState), Before)>,
) -> anyhow::Result<Report> {
    let voucher_id = VoucherId::new(plan.voucher);
    let mut report = Report::new(plan, measured);
    if let Some(((store, sale_state), (before, admitted_in_redis))) = verified {
        if admitted_in_redis {
            let deadline = Duration::from_secs(settings.drain_timeout_secs);
            let drain = drain(sale_state, voucher_id, deadline).await?;
            report.add_drain(&drain, deadline);
        }
        let after = store
            .audit_voucher(voucher_id)
            .await
            .context("reading the voucher after the run")?;
        report.add_audit(before.supply(), &after, true);
        if admitted_in_redis {
            let options = audit::AuditOptions {
                allow_unchecked: settings.allow_unchecked,
                ..audit::AuditOptions::strict()
            };
            report.add_reconciliation(audit::audit(store, sale_state, voucher_id, options).await?);
        }
    }
    Ok(report)
}
