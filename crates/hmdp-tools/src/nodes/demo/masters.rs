//! What a run cost each master of the demo's Redis Cluster: its share of
//! the sale's scripts (`INFO commandstats`: every `EVALSHA`, the admissions
//! and the moves of stock between shards) and the masters' CPU per
//! admission (`INFO cpu`, user + system, less what they use idle, measured
//! over a second before the run, over the admission scripts the nodes ran,
//! `hmdp_shard_admissions_total`). A one-shard sale lives in one
//! slot, so one master runs all of it; a sharded one spreads it.

use std::fmt::Write as _;

use std::time::{Duration, Instant};

use anyhow::Context;
use hmdp_test_support::{calls_in, is_master, RedisCluster, RedisServer};
use serde::Serialize;

/// One master's counters at one moment.
#[derive(Debug, Clone, Copy)]
struct Counters {
    port: u16,
    scripts: u64,
    cpu_seconds: f64,
}

/// The masters' counters at one moment, and the admissions the nodes ran.
#[derive(Debug, Clone)]
pub struct Sample {
    at: Instant,
    masters: Vec<Counters>,
    admissions: u64,
    /// The masters' CPU seconds a second idle, all summed, measured before
    /// this sample ([`sample_idle`]).
    idle_cpu_per_s: f64,
}

/// How long the masters are watched idle before a run.
const IDLE: Duration = Duration::from_secs(1);

/// A run's cost on the masters.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    /// Each master: its port, the scripts it ran, their share of all.
    pub masters: Vec<MasterShare>,
    /// Admission scripts the nodes ran.
    pub admissions: u64,
    /// The masters' CPU (user + system) per admission, microseconds.
    pub cpu_us_per_admission: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MasterShare {
    pub port: u16,
    pub scripts: u64,
    pub share: f64,
}

impl Spread {
    /// Whether every master ran within ±25% of an even share.
    pub fn even(&self) -> bool {
        let fair = 1.0 / self.masters.len() as f64;
        (self.masters.iter()).all(|master| (master.share - fair).abs() <= 0.25 * fair)
    }
}

/// The masters' counters after watching them idle for a second (the run
/// then subtracts their idle CPU), and the admission scripts the nodes at
/// `node_urls` ran so far.
pub async fn sample_idle(cluster: &RedisCluster, node_urls: &[String]) -> anyhow::Result<Sample> {
    let quiet = sample(cluster, node_urls).await?;
    tokio::time::sleep(IDLE).await;
    let mut now = sample(cluster, node_urls).await?;
    let cpu = |sample: &Sample| sample.masters.iter().map(|m| m.cpu_seconds).sum::<f64>();
    now.idle_cpu_per_s = (cpu(&now) - cpu(&quiet)) / (now.at - quiet.at).as_secs_f64();
    Ok(now)
}

/// The cluster's masters' counters now, and the admission scripts the nodes
/// at `node_urls` ran so far.
pub async fn sample(cluster: &RedisCluster, node_urls: &[String]) -> anyhow::Result<Sample> {
    let at = Instant::now();
    let mut masters = Vec::new();
    for server in cluster.servers() {
        if let Some(counters) = master_counters(server).await? {
            masters.push(counters);
        }
    }
    masters.sort_by_key(|master| master.port);
    let mut admissions = 0;
    for url in node_urls {
        admissions += node_admissions(url).await?;
    }
    Ok(Sample {
        at,
        masters,
        admissions,
        idle_cpu_per_s: 0.0,
    })
}

/// What happened between `before` and `after`.
pub fn spread(before: &Sample, after: &Sample) -> Spread {
    let scripts: Vec<(u16, u64, f64)> = (after.masters.iter())
        .map(|master| {
            let earlier = before.masters.iter().find(|then| then.port == master.port);
            let (scripts, cpu) = earlier.map_or((0, 0.0), |then| (then.scripts, then.cpu_seconds));
            (
                master.port,
                master.scripts.saturating_sub(scripts),
                master.cpu_seconds - cpu,
            )
        })
        .collect();
    let total: u64 = scripts.iter().map(|(_, scripts, _)| scripts).sum();
    let idle = before.idle_cpu_per_s * (after.at - before.at).as_secs_f64();
    let cpu: f64 = scripts.iter().map(|(_, _, cpu)| cpu).sum::<f64>() - idle;
    let admissions = after.admissions.saturating_sub(before.admissions);
    Spread {
        masters: (scripts.iter())
            .map(|&(port, scripts, _)| MasterShare {
                port,
                scripts,
                share: scripts as f64 / total.max(1) as f64,
            })
            .collect(),
        admissions,
        cpu_us_per_admission: cpu * 1e6 / admissions.max(1) as f64,
    }
}

/// One row of the masters' table: the run's label, then each master's share.
pub fn row(label: &str, spread: &Spread) -> String {
    let mut line = format!("{label:<28} {:>10}", spread.admissions);
    for master in &spread.masters {
        let _ = write!(line, " {:>7.1}%", master.share * 100.0);
    }
    let _ = write!(
        line,
        " {:>10.1}  {}",
        spread.cpu_us_per_admission,
        if spread.even() {
            "even (each within ±25% of a third)"
        } else {
            "uneven"
        }
    );
    line
}

/// The table's heading, for masters at `ports`.
pub fn heading(ports: &[u16]) -> String {
    let mut line = format!("{:<28} {:>10}", "run", "admissions");
    for port in ports {
        let _ = write!(line, " {:>8}", format!(":{port}"));
    }
    let _ = write!(line, " {:>10}", "CPU µs/adm");
    line
}

/// A server's counters if it is a master now.
async fn master_counters(server: &RedisServer) -> anyhow::Result<Option<Counters>> {
    let mut redis = server.connect().await?;
    if !is_master(&mut redis).await? {
        return Ok(None);
    }
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .arg("commandstats")
        .query_async(&mut redis)
        .await
        .with_context(|| format!("INFO of the Redis on :{}", server.port()))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(Some(Counters {
        port: server.port(),
        scripts: calls_in(&info, "evalsha"),
        cpu_seconds: field("used_cpu_user") + field("used_cpu_sys"),
    }))
}

/// `hmdp_shard_admissions_total` of the node at `url`, every shard summed.
async fn node_admissions(url: &str) -> anyhow::Result<u64> {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("{url}/metrics"))?
        .text()
        .await?;
    Ok(text
        .lines()
        .filter(|line| line.starts_with("hmdp_shard_admissions_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(scripts: [u64; 3], cpu: [f64; 3], admissions: u64) -> Sample {
        Sample {
            at: Instant::now(),
            idle_cpu_per_s: 0.0,
            masters: (0..3)
                .map(|i| Counters {
                    port: 7000 + i as u16,
                    scripts: scripts[i],
                    cpu_seconds: cpu[i],
                })
                .collect(),
            admissions,
        }
    }

    #[test]
    fn the_spread_is_each_masters_share_of_the_scripts_run_between_two_samples() {
        let before = sample([10, 10, 10], [1.0, 1.0, 1.0], 100);
        let after = sample([1010, 10, 10], [1.5, 1.0, 1.0], 1100);
        let one = spread(&before, &after);
        assert_eq!(one.masters[0].share, 1.0);
        assert!(!one.even());
        assert!((one.cpu_us_per_admission - 500.0).abs() < 1e-6);
        let after = sample([340, 320, 350], [1.1, 1.1, 1.1], 1100);
        assert!(spread(&before, &after).even());
        let after = sample([510, 260, 260], [1.1, 1.1, 1.1], 1100);
        assert!(!spread(&before, &after).even(), "half on one master");
    }
}
