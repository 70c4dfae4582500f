//! The stage of the asynchronous-purchase scenarios (`queue-crash`,
//! `stream-crash`, `redis-restart`): real `hmdp serve` nodes started as the
//! cluster starts them, in a sandbox of their own (a database and a Redis
//! key prefix, removed afterwards), a voucher on sale and users who buy it
//! once each. What the buyers were told is counted from their answers; what
//! happened to the orders is read from MySQL and Redis.

use std::time::Duration;

use anyhow::Context;
use hmdp::config::{RedisSettings, SeckillMode};
use hmdp::ids::VoucherId;
use hmdp::keys::Keys;
use hmdp::seckill::stream::GROUP;
use hmdp::seckill::SaleState;
use hmdp::store::Store;
use hmdp_lock::LockMode;
use hmdp_test_support::free_ports;
use tempfile::TempDir;

use super::harness::Lab;
use super::SaleLabArgs;
use crate::audit::{self, Audit};
use crate::loadtest::{self, tokens::Login, Drain, Plan};
use crate::nodes::{node_flags, Node, NodesSpec, Sandbox};

/// The lease of the nodes' per-user locks, renewed while their holder lives.
const LOCK_LEASE_MS: u64 = 2000;

/// Nodes, sandbox and sale of one run. Fields drop in order: the nodes go
/// before their database and their keys do.
pub(super) struct SaleStage {
    nodes: Vec<Node>,
    spec: NodesSpec,
    client: reqwest::Client,
    redis: hmdp_lock::Connection,
    pub store: Store,
    pub sale_state: SaleState,
    voucher: Option<VoucherId>,
    /// The nodes' logs.
    _dir: TempDir,
    sandbox: Sandbox,
}

impl SaleStage {
    /// A sandbox on the lab's MySQL and on `redis`, with `nodes` nodes to
    /// start (none running yet).
    pub async fn open(
        args: &SaleLabArgs,
        redis: &RedisSettings,
        nodes: usize,
    ) -> anyhow::Result<Self> {
        let redis_url = redis.url.as_str();
        let sandbox = Sandbox::create(&args.database.url, redis, "lab").await?;
        let exe = std::env::current_exe().context("cannot find the hmdp executable")?;
        let spec = NodesSpec::in_sandbox(exe, &sandbox);
        let dir = tempfile::Builder::new().prefix("hmdp-lab-").tempdir()?;
        let ports: [u16; 2] = free_ports().context("no free local port")?;
        let nodes = (0..nodes)
            .map(|index| {
                let id = format!("node{}", index + 1);
                let log = dir.path().join(format!("{id}.log"));
                Node::new(&id, ports[index], log)
            })
            .collect();
        let redis = hmdp::config::connect_redis(redis_url, Duration::from_secs(2))?;
        let store = sandbox.store(4)?;
        let keys = Keys::new(sandbox.redis.prefix.clone());
        Ok(SaleStage {
            nodes,
            spec,
            client: loadtest::http_client(64)?,
            sale_state: SaleState::new(redis.clone(), keys, store.clone()),
            redis,
            store,
            voucher: None,
            _dir: dir,
            sandbox,
        })
    }

    /// Starts node `index` in `seckill` mode with the lab's lock, a writer
    /// that holds each transaction open `chaos_hold_ms`, and `extra` flags;
    /// returns once it is ready.
    pub async fn start_node(
        &mut self,
        lab: &Lab,
        index: usize,
        seckill: SeckillMode,
        chaos_hold_ms: u64,
        extra: &[&str],
    ) -> anyhow::Result<()> {
        let mut flags = node_flags(lab.mode(), seckill, chaos_hold_ms);
        // A killed node's per-user locks stay until their lease runs out,
        // and its orders wait for them (a writer that finds a user's lock
        // busy leaves the order pending): with the 30 s default lease the
        // scenario would wait half a minute.
        let lease = match lab.mode() {
            LockMode::Reentrant => "--lock-watchdog-ms",
            _ => "--lock-lease-ms",
        };
        flags.push(format!("{lease}={LOCK_LEASE_MS}"));
        flags.push("--db-pool=8".into());
        flags.extend(extra.iter().map(|flag| flag.to_string()));
        (self.nodes[index])
            .start_moving_if_taken(&self.spec, &flags)
            .await?;
        let slow = if chaos_hold_ms > 0 {
            format!(", its writer holding each transaction open {chaos_hold_ms} ms")
        } else {
            String::new()
        };
        let extra = if extra.is_empty() {
            String::new()
        } else {
            format!(" {}", extra.join(" "))
        };
        lab.say(
            self.node_name(index),
            format!("starts: --seckill {seckill}{extra}{slow}"),
        );
        Ok(())
    }

    /// SIGKILLs node `index`: nothing in its memory survives.
    pub async fn kill_node(&mut self, lab: &Lab, index: usize) {
        self.nodes[index].kill().await;
        lab.say(self.node_name(index), "is killed (SIGKILL)");
    }

    fn node_name(&self, index: usize) -> &'static str {
        ["node1", "node2"][index]
    }

    /// Creates a voucher of stock `buyers` through node `index`, logs
    /// `buyers` users in and has each buy once at the same moment; returns
    /// how many were told success (answered an order id).
    pub async fn sell(&mut self, lab: &Lab, index: usize, buyers: usize) -> anyhow::Result<u64> {
        let target = self.nodes[index].url();
        let stock = i32::try_from(buyers).context("too many buyers")?;
        let voucher =
            loadtest::create_voucher(&self.client, &target, &self.spec.admin_token, stock).await?;
        self.voucher = Some(VoucherId::new(voucher));
        let keys = Keys::new(self.sandbox.redis.prefix.clone());
        let tokens = Login::new(self.client.clone(), &target, self.redis.clone(), keys)
            .users(0, buyers, 16)
            .await?;
        let plan = Plan {
            target,
            voucher,
            tokens,
            per_user: 1,
            concurrency: 64,
            addresses: 1,
            progress: indicatif::ProgressBar::hidden(),
        };
        let measured = loadtest::run(&plan).await?;
        let told_success = measured.outcomes.get("OK").copied().unwrap_or(0);
        let answers: Vec<String> = measured
            .outcomes
            .iter()
            .map(|(outcome, n)| format!("{outcome} {n}"))
            .collect();
        lab.say(
            "buyers",
            format!(
                "{buyers} users buy voucher {voucher} (stock {buyers}) once each: {}; \
                 {told_success} told success with an order id",
                answers.join(", ")
            ),
        );
        Ok(told_success)
    }

    pub fn voucher(&self) -> VoucherId {
        self.voucher.expect("the sale has started")
    }

    /// Orders written to MySQL, and how many users hold more than one.
    pub async fn orders(&self) -> anyhow::Result<(i64, i64)> {
        let audit = self.store.audit_voucher(self.voucher()).await?;
        Ok((audit.active_orders, audit.duplicate_users))
    }

    /// Admitted orders not written yet: in the pending orders hash, in the
    /// order stream.
    pub async fn on_their_way(&self) -> anyhow::Result<(usize, usize)> {
        let voucher = self.voucher();
        Ok((
            self.sale_state.pending_orders_of(voucher).await?.len(),
            self.sale_state.streamed_orders_of(voucher).await?.len(),
        ))
    }

    /// Waits up to `deadline` for the admitted orders to be written.
    pub async fn drain(&self, deadline: Duration) -> anyhow::Result<Drain> {
        loadtest::drain(&self.sale_state, self.voucher(), deadline).await
    }

    /// `hmdp audit` of the sale.
    pub async fn audit(&self) -> anyhow::Result<Audit> {
        audit::audit(
            &self.store,
            &self.sale_state,
            self.voucher(),
            audit::AuditOptions::strict(),
        )
        .await
    }

    /// The sale's end against what its buyers heard: MySQL's orders, the
    /// audit, and a failure for buyers told success who have no order, or
    /// for more orders than buyers. Returns how many buyers lost their
    /// order, and the audit.
    pub async fn judge(&self, lab: &Lab, told_success: u64) -> anyhow::Result<(i64, Audit)> {
        let (orders, duplicates) = self.orders().await?;
        lab.say(
            "mysql",
            format!(
                "{orders} order(s) of voucher {}, {duplicates} user(s) with two",
                self.voucher()
            ),
        );
        let audit = self.audit().await?;
        lab.say("audit", audit.verdict());
        let lost = told_success as i64 - orders;
        if lost > 0 {
            lab.fail(
                "buyers",
                format!("{lost} of {told_success} buyers told success have no order"),
            );
        }
        if duplicates > 0 || orders > told_success as i64 {
            lab.fail(
                "mysql",
                format!(
                    "{orders} order(s) for {told_success} buyers told success, \
                     {duplicates} user(s) with two"
                ),
            );
        }
        Ok((lost, audit))
    }

    /// Entries of the order stream read by a consumer and not acknowledged
    /// (`XPENDING`'s count), and entries in the stream (`XLEN`): the
    /// consumers delete what they acknowledged, so the rest is unread.
    pub async fn stream_entries(&self) -> anyhow::Result<(i64, i64)> {
        let stream = Keys::new(self.sandbox.redis.prefix.clone())
            .single()
            .orders();
        let ((read, _, _, _), entries): ((i64, redis::Value, redis::Value, redis::Value), i64) =
            redis::pipe()
                .cmd("XPENDING")
                .arg(&stream)
                .arg(GROUP)
                .cmd("XLEN")
                .arg(&stream)
                .query_async(&mut self.redis.clone())
                .await
                .context("XPENDING and XLEN of the order stream")?;
        Ok((read, entries))
    }

    /// The value of the sample `name` (with its labels, if any) on node
    /// `index`'s `/metrics`; 0 when absent.
    pub async fn metric(&self, index: usize, name: &str) -> anyhow::Result<f64> {
        let text = self
            .client
            .get(format!("{}/metrics", self.nodes[index].url()))
            .send()
            .await?
            .text()
            .await?;
        Ok(text
            .lines()
            .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|value| value.trim().parse().ok())
            .unwrap_or(0.0))
    }
}
