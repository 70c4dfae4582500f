//! `hmdp up`: the demo's two nodes and nginx (and with --prometheus,
//! Prometheus scraping them), left running for outside tools (wrk, oha,
//! JMeter, `hmdp loadtest`) until Ctrl-C or SIGTERM, in a sandbox database
//! and Redis prefix that are removed when it stops.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use hmdp_lock::LockMode;

use super::prometheus::{Prometheus, PrometheusSettings};
use super::{node_flags, until_signal};
use super::{Nodes, NodesSpec, Sandbox};
use hmdp::config::{DatabaseSettings, RedisSettings, SeckillMode};

/// `hmdp up`.
#[derive(Debug, Clone, Args)]
pub struct UpSettings {
    /// Lock mode of both nodes.
    #[arg(long, value_enum, default_value_t = LockMode::Reentrant)]
    pub lock: LockMode,

    /// Purchase path of both nodes: `sync`, `queue` or `stream`.
    #[arg(long, value_enum, default_value_t = SeckillMode::Sync)]
    pub seckill: SeckillMode,

    /// Passed to both nodes: sleep this long inside the critical section.
    #[arg(long, default_value_t = 0)]
    pub chaos_hold_ms: u64,

    /// Once everything answers, write `NAME=value` lines here (nginx's URL,
    /// the sandbox's `DATABASE_URL`, `HMDP_REDIS_PREFIX`, `HMDP_ADMIN_TOKEN`,
    /// the nodes' own URLs (for their `/metrics`), the process ids of the
    /// nodes and of nginx, and with --prometheus its URL) for a shell to
    /// source.
    #[arg(long)]
    pub env_file: Option<PathBuf>,

    #[command(flatten)]
    pub prometheus: PrometheusSettings,

    /// MySQL server: a sandbox database is created on it.
    #[command(flatten)]
    pub database: DatabaseSettings,

    /// Redis: the nodes' keys go under a sandbox prefix of their own,
    /// itself under --redis-prefix.
    #[command(flatten)]
    pub redis: RedisSettings,
}

/// `hmdp up`: runs until interrupted, then stops the children and
/// removes the sandbox.
pub async fn run(settings: UpSettings) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the hmdp executable")?;
    let sandbox = Sandbox::create(&settings.database.url, &settings.redis, "up").await?;
    // hmdp's sample shops, each with a voucher on sale: hmdp's front end,
    // pointed at these nodes, has something to show and to sell.
    crate::seed::seed(&sandbox.store(1)?).await?;
    let outcome = until_signal(serve(&settings, exe, &sandbox))
        .await
        .unwrap_or_else(|signal| {
            eprintln!("{signal}: stopping");
            Ok(())
        });
    // The nodes went with the `serve` future; now the data goes too.
    drop(sandbox);
    outcome
}

/// Starts the nodes and keeps them until the future is dropped: a signal
/// during start-up stops the children as surely as one afterwards.
async fn serve(settings: &UpSettings, exe: PathBuf, sandbox: &Sandbox) -> anyhow::Result<()> {
    let spec = NodesSpec::in_sandbox(exe, sandbox);
    let nodes = Nodes::start(
        spec,
        &node_flags(settings.lock, settings.seckill, settings.chaos_hold_ms),
    )
    .await?;
    let prometheus = settings.prometheus.start(&nodes).await?;
    let env = describe(&nodes, sandbox, prometheus.as_ref());
    if let Some(path) = &settings.env_file {
        std::fs::write(path, &env).with_context(|| format!("writing {}", path.display()))?;
    }
    print!("{env}");
    eprintln!(
        "two nodes ({}, {}) behind nginx; Ctrl-C stops them",
        settings.lock, settings.seckill
    );
    if let Some(prometheus) = &prometheus {
        eprintln!(
            "Prometheus at {} scrapes both nodes every second with deploy/prometheus/alerts.yml",
            prometheus.url()
        );
    }
    std::future::pending().await
}

/// The nodes as shell variable assignments.
fn describe(nodes: &Nodes, sandbox: &Sandbox, prometheus: Option<&Prometheus>) -> String {
    let pids: Vec<String> = nodes
        .node_pids()
        .iter()
        .map(|pid| pid.to_string())
        .collect();
    let mut out = String::new();
    let _ = writeln!(out, "HMDP_TARGET={}", nodes.url());
    let _ = writeln!(out, "DATABASE_URL={}", sandbox.database.url);
    let _ = writeln!(out, "REDIS_URL={}", sandbox.redis.redis_url);
    let _ = writeln!(out, "HMDP_REDIS_PREFIX={}", sandbox.redis.prefix);
    let _ = writeln!(out, "HMDP_ADMIN_TOKEN={}", nodes.spec().admin_token);
    let _ = writeln!(out, "HMDP_NODE_URLS=\"{}\"", nodes.node_urls().join(" "));
    let _ = writeln!(out, "HMDP_NODE_PIDS=\"{}\"", pids.join(" "));
    if let Some(pid) = nodes.nginx_pid() {
        let _ = writeln!(out, "HMDP_NGINX_PID={pid}");
    }
    if let Some(prometheus) = prometheus {
        let _ = writeln!(out, "HMDP_PROMETHEUS={}", prometheus.url());
    }
    out
}
