//! Debian's `prometheus` as a child process beside the two nodes: a generated
//! config and its storage in a temporary directory, both nodes' `/metrics`
//! scraped every second, the repository's `deploy/prometheus/alerts.yml`
//! evaluated every second. `hmdp up --prometheus` and
//! `hmdp demo --prometheus` start it; [`PrometheusApi`] reads what it sees.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use clap::Args;
use hmdp_test_support::{free_ports, ChildProcess, Stdout};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tempfile::TempDir;
use tokio::process::Command;

use super::Nodes;

/// The repository's recording and alert rules, built in so that the tools
/// run from any directory with exactly the rules promtool tests.
pub const RULES: &str = include_str!("../../../../deploy/prometheus/alerts.yml");

/// Where Debian's `prometheus` package puts the server
/// (scripts/services.sh installs it).
pub const BINARY: &str = "/usr/bin/prometheus";

/// Prometheus' customary port, taken when it is free.
const USUAL_PORT: u16 = 9090;

/// Scrape and rule evaluation interval: a fault shows in Prometheus within
/// seconds (a production Prometheus scrapes every 15 s or more).
const INTERVAL: &str = "1s";

/// How long a scrape of every node may take to come: Prometheus hands new
/// targets to its scrapers at most every 5 s, then scrapes each every second.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long Prometheus may take to answer `/-/ready`: it opens its empty
/// storage and loads the rules, well within this on a busy two-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// `--prometheus[=PORT]`, shared by `hmdp up` and `hmdp demo`.
#[derive(Debug, Clone, Default, Args)]
pub struct PrometheusSettings {
    /// Also run Prometheus (Debian's /usr/bin/prometheus) scraping both
    /// nodes' /metrics every second and evaluating the rules of
    /// deploy/prometheus/alerts.yml every second; its URL is printed (and
    /// by `hmdp demo`, at the end, its targets and alerts). On PORT if given
    /// (`--prometheus=9191`), else on 9090 if free, else on a free port. It
    /// stops with the nodes, its data removed.
    #[arg(long, value_name = "PORT", num_args = 0..=1, require_equals = true)]
    pub prometheus: Option<Option<u16>>,
}

impl PrometheusSettings {
    /// Prometheus scraping `nodes`, if asked for.
    pub async fn start(&self, nodes: &Nodes) -> anyhow::Result<Option<Prometheus>> {
        match self.prometheus {
            Some(port) => Ok(Some(Prometheus::start(nodes, port).await?)),
            None => Ok(None),
        }
    }
}

/// A running Prometheus; killed when dropped, and its directory (config,
/// rules, storage, log) removed after it.
pub struct Prometheus {
    api: PrometheusApi,
    /// Only held to be killed on drop, before its directory goes.
    _process: ChildProcess,
    _dir: TempDir,
}

impl Prometheus {
    /// Starts Prometheus on `port` (else 9090 if free, else a free port)
    /// scraping `nodes`; returns once it answers `/-/ready` and
    /// has scraped every node.
    pub async fn start(nodes: &Nodes, port: Option<u16>) -> anyhow::Result<Prometheus> {
        if !Path::new(BINARY).is_file() {
            bail!("{BINARY} not found: run scripts/services.sh (Debian's prometheus package)");
        }
        let dir = tempfile::Builder::new()
            .prefix("hmdp-prometheus-")
            .tempdir()
            .context("cannot create Prometheus' directory")?;
        let port = match port {
            Some(port) => port,
            None => usual_or_free_port()?,
        };
        let nodes: Vec<(&str, u16)> = (nodes.members.iter())
            .map(|node| (node.id.as_str(), node.port))
            .collect();
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(dir.path().join(RULES_FILE), RULES).context("writing the rules")?;
        std::fs::write(&config_file, config(&nodes)).context("writing prometheus.yml")?;

        let started = Utc::now();
        let mut command = Command::new(BINARY);
        command
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let log = dir.path().join("prometheus.log");
        let mut process = ChildProcess::spawn("prometheus", command, &log, Stdout::Log)?;
        let api = PrometheusApi::new(&format!("http://127.0.0.1:{port}"))?;
        let ready = format!("{}/-/ready", api.url());
        process.wait_until_answers(&ready, READY_TIMEOUT).await?;
        api.targets_scraped_after(started).await?;
        Ok(Prometheus {
            api,
            _process: process,
            _dir: dir,
        })
    }

    /// Its base URL (the web UI, `/api/v1/...`).
    pub fn url(&self) -> &str {
        self.api.url()
    }

    pub fn api(&self) -> &PrometheusApi {
        &self.api
    }
}

/// The rules' file name beside the config, which names it relatively.
const RULES_FILE: &str = "alerts.yml";

/// Prometheus' config for nodes `(id, port)`: job `hmdp`, as the rules
/// expect, each node's `instance` label its id, so that an alert names
/// `node1` rather than a port. JSON, which Prometheus reads as YAML.
fn config(nodes: &[(&str, u16)]) -> String {
    let targets: Vec<_> = (nodes.iter())
        .map(|(id, port)| {
            json!({
                "targets": [format!("127.0.0.1:{port}")],
                "labels": {"instance": id},
            })
        })
        .collect();
    let config = json!({
        "global": {
            "scrape_interval": INTERVAL,
            "scrape_timeout": INTERVAL,
            "evaluation_interval": INTERVAL,
        },
        "rule_files": [RULES_FILE],
        "scrape_configs": [{"job_name": "hmdp", "static_configs": targets}],
    });
    serde_json::to_string_pretty(&config).expect("a JSON value serializes")
}

/// 9090 when nothing listens there, else a free port.
fn usual_or_free_port() -> anyhow::Result<u16> {
    if TcpListener::bind(("127.0.0.1", USUAL_PORT)).is_ok() {
        return Ok(USUAL_PORT);
    }
    let [port] = free_ports().context("no free local port")?;
    Ok(port)
}

/// A scrape target as `/api/v1/targets` describes it (the fields read here).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    pub scrape_url: String,
    pub labels: BTreeMap<String, String>,
    /// `up`, `down` or `unknown` (not scraped yet).
    pub health: String,
    pub last_error: String,
    pub last_scrape: DateTime<Utc>,
}

/// An alert as `/api/v1/alerts` describes it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `pending` (its `for:` not yet over) or `firing`.
    pub state: String,
    pub active_at: String,
    pub value: String,
}

impl Alert {
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }

    /// `Name{label="value", ...}` without the alert's name and severity.
    pub fn describe(&self) -> String {
        let labels: Vec<String> = (self.labels.iter())
            .filter(|(name, _)| !matches!(name.as_str(), "alertname" | "severity"))
            .map(|(name, value)| format!("{name}=\"{value}\""))
            .collect();
        format!("{}{{{}}}", self.name(), labels.join(", "))
    }
}

/// The HTTP API of a Prometheus, started here or by `hmdp up`.
#[derive(Clone)]
pub struct PrometheusApi {
    url: String,
    client: reqwest::Client,
}

/// The envelope of every `/api/v1` answer.
#[derive(Deserialize)]
struct Answer<T> {
    status: String,
    data: Option<T>,
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Targets {
    active_targets: Vec<Target>,
}

#[derive(Deserialize)]
struct Alerts {
    alerts: Vec<Alert>,
}

impl PrometheusApi {
    /// The API of the Prometheus at `url` (`http://host:port`).
    pub fn new(url: &str) -> anyhow::Result<PrometheusApi> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(PrometheusApi {
            url: url.trim_end_matches('/').to_owned(),
            client,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The targets being scraped, with each one's last scrape, in the
    /// order of their labels (`node1` first).
    pub async fn targets(&self) -> anyhow::Result<Vec<Target>> {
        let mut targets = self
            .get::<Targets>("targets?state=active")
            .await?
            .active_targets;
        targets.sort_by(|a, b| a.labels.cmp(&b.labels));
        Ok(targets)
    }

    /// The alerts pending or firing now.
    pub async fn alerts(&self) -> anyhow::Result<Vec<Alert>> {
        let alerts: Alerts = self.get("alerts").await?;
        Ok(alerts.alerts)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let url = format!("{}/api/v1/{path}", self.url);
        let answer: Answer<T> = (self.client.get(&url).send().await)
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("GET {url}"))?
            .json()
            .await
            .with_context(|| format!("GET {url}: not Prometheus' answer"))?;
        match answer.data {
            Some(data) if answer.status == "success" => Ok(data),
            _ => bail!("GET {url}: {}: {:?}", answer.status, answer.error),
        }
    }

    /// The targets once each has been scraped after `moment`: what
    /// Prometheus saw of the nodes as they are now, not of one restarting.
    pub async fn targets_scraped_after(
        &self,
        moment: DateTime<Utc>,
    ) -> anyhow::Result<Vec<Target>> {
        let deadline = tokio::time::Instant::now() + SCRAPE_TIMEOUT;
        loop {
            let targets = self.targets().await?;
            // None until Prometheus has handed its targets to the scrapers.
            let fresh = |target: &Target| target.last_scrape > moment;
            if !targets.is_empty() && targets.iter().all(fresh) {
                return Ok(targets);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("not every target scraped within {SCRAPE_TIMEOUT:?} after {moment}: {targets:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Each node as scraped after `moment` and the alerts pending or
    /// firing, in a few lines, for the end of a run.
    pub async fn summary(&self, moment: DateTime<Utc>) -> anyhow::Result<String> {
        let targets = self.targets_scraped_after(moment).await?;
        let alerts = self.alerts().await?;
        let mut out = format!("Prometheus {} (deploy/prometheus/alerts.yml)\n", self.url);
        for target in &targets {
            let instance = target.labels.get("instance").map_or("?", String::as_str);
            let _ = write!(out, "  target {instance}: {}", target.health);
            if !target.last_error.is_empty() {
                let _ = write!(out, " ({})", target.last_error);
            }
            out.push('\n');
        }
        if alerts.is_empty() {
            out.push_str("  alerts: none pending or firing\n");
        }
        for alert in &alerts {
            let _ = writeln!(
                out,
                "  alert {} {} since {}",
                alert.describe(),
                alert.state,
                alert.active_at
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_scrapes_each_node_as_job_hmdp_named_by_its_id() {
        let config: serde_json::Value =
            serde_json::from_str(&config(&[("node1", 18081), ("node2", 18082)])).unwrap();
        let job = &config["scrape_configs"][0];
        assert_eq!(job["job_name"], "hmdp", "the rules select job=\"hmdp\"");
        assert_eq!(job["static_configs"][1]["targets"][0], "127.0.0.1:18082");
        assert_eq!(job["static_configs"][1]["labels"]["instance"], "node2");
        assert_eq!(config["rule_files"][0], RULES_FILE);
        assert_eq!(config["global"]["evaluation_interval"], "1s");
    }
}
