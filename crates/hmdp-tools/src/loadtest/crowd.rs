//! The crowd workload (`hmdp loadtest --workload crowd`): honest buyers and
//! bots at one sale, each class measured on its own. Each honest buyer comes
//! from an address of their own and sends one purchase, and one retry after
//! a failure, their first purchases spread evenly over the first
//! `--spread-ms`; the bots share a few addresses and each sends purchase
//! after purchase, as fast as its answers come, from the start until every
//! honest buyer is done. The addresses are this machine's loopback ones
//! (127.1.x.y for the buyers, 127.2.0.x for the bots): nginx sees each as a
//! client of its own, and tells the nodes in `X-Real-IP`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use hmdp::limits::Rule;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use super::lanes::loopback_address;

/// Who the crowd is.
#[derive(Debug, Clone)]
pub struct Crowd {
    pub target: String,
    pub voucher: i64,
    pub stock: usize,
    /// The honest buyers' tokens.
    pub humans: Vec<String>,
    /// The bots' tokens.
    pub bots: Vec<String>,
    /// How many addresses the bots share.
    pub bot_addresses: usize,
    /// Over how long the honest buyers' first purchases are spread.
    pub spread: Duration,
}

/// The `hmdp serve` flags of the limits a crowd runs under: on, at their
/// defaults, but for the logins, which the crowd's users all made from
/// this machine's one address before it came.
pub fn limit_flags() -> Vec<String> {
    let logins = [
        Rule::CodeByIp,
        Rule::CodeByAll,
        Rule::LoginByIp,
        Rule::LoginByAll,
    ];
    let off = logins.map(|rule| format!("{}=off", rule.flag()));
    std::iter::once("--limits=on".to_owned())
        .chain(off)
        .collect()
}

/// How long an honest buyer waits before their retry when the refusal
/// names no `Retry-After`: a person reading the message and clicking again.
const HUMAN_PAUSE: Duration = Duration::from_millis(500);

/// What one purchase request came back with.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    /// `OK`, the `errorCode`, or the transport failure.
    outcome: String,
    latency: Duration,
    retry_after: Option<Duration>,
}

impl Answer {
    fn won(&self) -> bool {
        self.outcome == "OK"
    }
}

/// One class's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    pub buyers: usize,
    pub requests: u64,
    pub refused_429: u64,
    pub refused_503: u64,
    /// Buyers told they got a unit.
    pub units_won: u64,
    /// The most units one buyer of the class was told they got.
    pub most_won_by_one: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Answers by `errorCode` (`OK` for a unit).
    pub outcomes: BTreeMap<String, u64>,
}

/// The crowd run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct CrowdReport {
    pub voucher: i64,
    pub stock: usize,
    pub spread_ms: u128,
    pub bot_addresses: usize,
    pub humans: ClassReport,
    pub bots: ClassReport,
    /// The honest buyers' share of the units sold, in percent.
    pub humans_share_of_units: f64,
    /// Their share of the buyers, in percent.
    pub humans_share_of_buyers: f64,
    /// Honest buyers whose first purchase was answered 429.
    pub humans_429_on_first_purchase: u64,
}

/// Runs the crowd at the sale; fails only if a client cannot be built.
pub async fn run(crowd: &Crowd) -> anyhow::Result<CrowdReport> {
    let url = format!(
        "{}/voucher-order/seckill/{}",
        crowd.target.trim_end_matches('/'),
        crowd.voucher
    );
    // Every client first: a buyer's starts no later than their turn.
    let bot_clients = (0..crowd.bot_addresses.max(1))
        .map(|i| client_at(bot_address(i), crowd.bots.len()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let human_clients = (0..crowd.humans.len())
        .map(|i| client_at(loopback_address(1, i, "honest buyers")?, 1))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let every = crowd.spread / u32::try_from(crowd.humans.len().max(1)).unwrap_or(u32::MAX);
    let humans_done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    let mut bots = JoinSet::new();
    for (i, token) in crowd.bots.iter().enumerate() {
        let client = bot_clients[i % bot_clients.len()].clone();
        let (url, token, done) = (url.clone(), token.clone(), humans_done.clone());
        bots.spawn(async move { bot(&client, &url, &token, &done).await });
    }
    let mut humans = JoinSet::new();
    for ((i, token), client) in crowd.humans.iter().enumerate().zip(human_clients) {
        let (url, token) = (url.clone(), token.clone());
        let at = started + every * u32::try_from(i).unwrap_or(u32::MAX);
        humans.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            human(&client, &url, &token).await
        });
    }
    let humans = humans.join_all().await;
    humans_done.store(true, Ordering::Relaxed);
    let bots = bots.join_all().await;
    Ok(report(crowd, &humans, &bots))
}

/// An honest buyer: one purchase, and one retry after a failure.
async fn human(client: &reqwest::Client, url: &str, token: &str) -> Vec<Answer> {
    let first = purchase(client, url, token).await;
    if first.won() {
        return vec![first];
    }
    tokio::time::sleep(first.retry_after.unwrap_or(HUMAN_PAUSE)).await;
    let retry = purchase(client, url, token).await;
    vec![first, retry]
}

/// A bot: purchase after purchase, as fast as its answers come, until the
/// honest buyers are done.
async fn bot(client: &reqwest::Client, url: &str, token: &str, done: &AtomicBool) -> Vec<Answer> {
    let mut answers = Vec::new();
    while !done.load(Ordering::Relaxed) {
        answers.push(purchase(client, url, token).await);
    }
    answers
}

/// The parts of hmdp's `Result` body the crowd reads.
#[derive(Deserialize)]
struct ResultBody {
    success: bool,
    #[serde(rename = "errorCode")]
    error_code: Option<String>,
}

async fn purchase(client: &reqwest::Client, url: &str, token: &str) -> Answer {
    let sent = Instant::now();
    let answered = client.post(url).header("authorization", token).send().await;
    let (status, retry_after, outcome) = match answered {
        Ok(response) => {
            let status = response.status().as_u16();
            let retry_after = (response.headers().get("retry-after"))
                .and_then(|value| value.to_str().ok()?.parse().ok())
                .map(Duration::from_secs);
            let outcome = match response.json::<ResultBody>().await {
                Ok(ResultBody { success: true, .. }) => "OK".to_owned(),
                Ok(ResultBody {
                    error_code: Some(code),
                    ..
                }) => code,
                _ => format!("HTTP_{status}"),
            };
            (status, retry_after, outcome)
        }
        Err(error) if error.is_timeout() => (0, None, "TIMEOUT".to_owned()),
        Err(_) => (0, None, "TRANSPORT_ERROR".to_owned()),
    };
    Answer {
        status,
        outcome,
        latency: sent.elapsed(),
        retry_after,
    }
}

/// An HTTP client whose connections leave from `address`.
fn client_at(address: IpAddr, connections: usize) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .local_address(address)
        .pool_max_idle_per_host(connections.max(1))
        .tcp_nodelay(true)
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")
}

/// The `i`th bots' address: 127.2.0.1, 127.2.0.2, ...
fn bot_address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 2, 0, (i % 250 + 1) as u8))
}

fn class(answers: &[Vec<Answer>]) -> ClassReport {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("static bounds");
    let mut outcomes = BTreeMap::new();
    let (mut requests, mut refused_429, mut refused_503) = (0, 0, 0);
    for answer in answers.iter().flatten() {
        requests += 1;
        latency.saturating_record(answer.latency.as_micros().max(1) as u64);
        refused_429 += u64::from(answer.status == 429);
        refused_503 += u64::from(answer.status == 503);
        *outcomes.entry(answer.outcome.clone()).or_insert(0) += 1;
    }
    let won_by_each = answers
        .iter()
        .map(|buyer| buyer.iter().filter(|answer| answer.won()).count() as u64);
    ClassReport {
        buyers: answers.len(),
        requests,
        refused_429,
        refused_503,
        units_won: won_by_each.clone().sum(),
        most_won_by_one: won_by_each.max().unwrap_or(0),
        p50_ms: latency.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: latency.value_at_quantile(0.99) as f64 / 1000.0,
        outcomes,
    }
}

fn report(crowd: &Crowd, humans: &[Vec<Answer>], bots: &[Vec<Answer>]) -> CrowdReport {
    let (humans_class, bots_class) = (class(humans), class(bots));
    let sold = humans_class.units_won + bots_class.units_won;
    let percent = |part: f64, whole: f64| {
        if whole > 0.0 {
            100.0 * part / whole
        } else {
            0.0
        }
    };
    CrowdReport {
        voucher: crowd.voucher,
        stock: crowd.stock,
        spread_ms: crowd.spread.as_millis(),
        bot_addresses: crowd.bot_addresses,
        humans_share_of_units: percent(humans_class.units_won as f64, sold as f64),
        humans_share_of_buyers: percent(humans.len() as f64, (humans.len() + bots.len()) as f64),
        humans_429_on_first_purchase: humans
            .iter()
            .filter(|answers| answers.first().is_some_and(|first| first.status == 429))
            .count() as u64,
        humans: humans_class,
        bots: bots_class,
    }
}

impl CrowdReport {
    /// The report as a table for a terminal.
    pub fn table(&self) -> String {
        let mut out = format!(
            "crowd at voucher {} (stock {}): {} honest buyers, one purchase each (and one \
             retry after a failure) spread over {} ms; {} bots from {} addresses, purchase \
             after purchase\n",
            self.voucher,
            self.stock,
            self.humans.buyers,
            self.spread_ms,
            self.bots.buyers,
            self.bot_addresses
        );
        out +=
            "class   buyers  requests    429s    503s  units won  most by one   p50 ms   p99 ms\n";
        for (name, class) in [("humans", &self.humans), ("bots", &self.bots)] {
            out += &format!(
                "{name:<6} {:>7} {:>9} {:>7} {:>7} {:>10} {:>12} {:>8.1} {:>8.1}\n",
                class.buyers,
                class.requests,
                class.refused_429,
                class.refused_503,
                class.units_won,
                class.most_won_by_one,
                class.p50_ms,
                class.p99_ms
            );
        }
        out += &format!(
            "humans' share of the units: {:.1}% (their share of the buyers: {:.1}%)\n\
             humans answered 429 on their first purchase: {}\n",
            self.humans_share_of_units,
            self.humans_share_of_buyers,
            self.humans_429_on_first_purchase
        );
        for (name, class) in [("humans", &self.humans), ("bots", &self.bots)] {
            let outcomes: Vec<String> = (class.outcomes.iter())
                .map(|(outcome, n)| format!("{outcome} {n}"))
                .collect();
            out += &format!("{name}' answers: {}\n", outcomes.join(", "));
        }
        out
    }
}
