//! A real Redis Cluster of private `redis-server` processes on free local
//! ports: three masters and a replica of each, joined by `redis-cli --cluster
//! create`, for the tests and the lab that must run on a cluster (and kill
//! one of its masters).

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{is_master, poll_until, RedisServer};

/// How long the cluster may take to agree that every slot is served.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the cluster's state is looked at while waiting for it.
const POLL: Duration = Duration::from_millis(100);

/// How long the cluster may take to promote a replica, or to bring a
/// restarted server in sync as a replica.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(30);

/// Masters of a test cluster; each gets one replica.
pub const MASTERS: usize = 3;

/// Six cluster-enabled servers, every slot assigned; all killed when dropped.
pub struct RedisCluster {
    /// The masters first, then their replicas, as `redis-cli` was given them
    /// (it pairs them itself; ask the cluster who replicates whom).
    servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the servers, creates the cluster and waits until every server
    /// reports `cluster_state:ok`.
    pub async fn start() -> anyhow::Result<RedisCluster> {
        Self::start_with(&[]).await
    }

    /// As [`start`](Self::start), with extra `redis-server` arguments for
    /// every server.
    pub async fn start_with(extra_args: &[&str]) -> anyhow::Result<RedisCluster> {
        // A dead master is failed over within about two seconds.
        let mut args = vec!["--cluster-node-timeout", "1000"];
        args.extend_from_slice(extra_args);
        let mut servers = Vec::with_capacity(2 * MASTERS);
        for _ in 0..2 * MASTERS {
            servers.push(RedisServer::start_cluster_node(&args).await?);
        }
        let addresses: Vec<String> = servers
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.port()))
            .collect();
        let created = tokio::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .await
            .context("cannot run redis-cli (see scripts/services.sh)")?;
        if !created.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&created.stderr)
            );
        }
        let cluster = RedisCluster { servers };
        cluster.wait_until_ok().await?;
        cluster.wait_until_replicated().await?;
        Ok(cluster)
    }

    /// Waits until every master has its replica attached and every replica
    /// is in sync: `redis-cli` reports the cluster created before the
    /// replicas have joined, and a failover needs a synced replica.
    async fn wait_until_replicated(&self) -> anyhow::Result<()> {
        let waited = poll_until(
            "the cluster's replicas to sync",
            READY_TIMEOUT,
            POLL,
            || async {
                let mut replicated = true;
                for server in &self.servers {
                    replicated &= replication_of(server).await.is_synced();
                }
                Ok(replicated)
            },
        )
        .await;
        if let Err(error) = waited {
            // Which server is behind, and how: a start that times out says so.
            let mut report = Vec::new();
            for server in &self.servers {
                let replication = replication_of(server).await;
                report.push(format!(
                    ":{} link {}, knows {} replica(s)",
                    server.port(),
                    if replication.linked { "up" } else { "down" },
                    replication.known_replicas
                ));
            }
            return Err(error.context(report.join("; ")));
        }
        Ok(())
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`: every server, so a
    /// client finds the cluster whichever of them is down.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .servers
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.port()))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The servers, in the order they were started.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The servers, to kill one.
    pub fn servers_mut(&mut self) -> &mut [RedisServer] {
        &mut self.servers
    }

    /// The port of the replica of the master on `master_port`, from the
    /// master's own `INFO replication` (the cluster's view of its replicas
    /// trails behind it).
    pub async fn replica_of(&self, master_port: u16) -> anyhow::Result<u16> {
        let master = &self.servers[self.position(master_port)?];
        // `slave0:ip=127.0.0.1,port=7004,state=online,offset=...,lag=0`
        info_replication(master)
            .await?
            .lines()
            .find(|line| line.starts_with("slave0:"))
            .and_then(|line| {
                line.split(',')
                    .find_map(|field| field.strip_prefix("port="))
            })
            .and_then(|port| port.parse().ok())
            .with_context(|| format!("master :{master_port} reports no replica"))
    }

    /// Where the server on `port` is in [`servers`](Self::servers).
    pub fn position(&self, port: u16) -> anyhow::Result<usize> {
        self.servers
            .iter()
            .position(|server| server.port() == port)
            .with_context(|| format!("no server of the cluster on :{port}"))
    }

    /// Freezes the replica of the master on `master_port` (SIGSTOP) and
    /// cuts its replication link, so that nothing the master writes from
    /// now on reaches it (a slow network, a long pause on the replica);
    /// returns the replica's port, for [`fail_over`](Self::fail_over).
    /// Frozen first, so that it cannot reconnect; then its link is cut,
    /// since a frozen process's socket would still take in what is sent.
    pub async fn stall_replica_of(&self, master_port: u16) -> anyhow::Result<u16> {
        let replica = self.replica_of(master_port).await?;
        self.servers[self.position(replica)?].pause()?;
        let master = &self.servers[self.position(master_port)?];
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query_async(&mut master.connect().await?)
            .await
            .context("cannot cut the replication link")?;
        Ok(replica)
    }

    /// The master on `master_port` dies (SIGKILL) and its stalled `replica`
    /// thaws (SIGCONT) to find it gone: the cluster promotes the replica,
    /// missing what the master wrote since the stall (the real mechanism:
    /// failure detection, election, slot takeover). Returns once every slot
    /// is served again; the old master is left down.
    pub async fn fail_over(&mut self, master_port: u16, replica: u16) -> anyhow::Result<()> {
        let (master_at, replica_at) = (self.position(master_port)?, self.position(replica)?);
        self.servers[master_at].kill();
        self.servers[replica_at].resume()?;
        let promoted = &self.servers[replica_at];
        let what = format!("the cluster to promote :{replica}");
        poll_until(&what, FAILOVER_DEADLINE, POLL, || async {
            Ok(is_master(&mut promoted.connect().await?).await?)
        })
        .await?;
        self.wait_until_ok().await
    }

    /// The replica of the master on `master_port` misses what the master
    /// writes for `missed` (frozen, its link cut: see
    /// [`stall_replica_of`](Self::stall_replica_of)), then is promoted by
    /// `CLUSTER FAILOVER TAKEOVER`, as an operator forces a failover
    /// without the master's agreement: it serves the master's slots without
    /// what it missed, and the old master, still running, is demoted to its
    /// replica and drops what it wrote since. Returns the promoted replica's
    /// port and when it took over, once every slot is served again and the
    /// old master is in sync with it.
    pub async fn take_over_after(
        &self,
        master_port: u16,
        missed: Duration,
    ) -> anyhow::Result<(u16, std::time::Instant)> {
        let replica = self.replica_of(master_port).await?;
        // Opened before the freeze: the command written while the replica
        // is frozen waits in its socket and is read as soon as it thaws,
        // before its replication cron (once a second) reconnects it to the
        // master it would catch up from.
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", replica)).await?;
        if self.stall_replica_of(master_port).await? != replica {
            bail!("master :{master_port} changed replicas");
        }
        tokio::time::sleep(missed).await;
        socket
            .write_all(b"*3\r\n$7\r\nCLUSTER\r\n$8\r\nFAILOVER\r\n$8\r\nTAKEOVER\r\n")
            .await?;
        let promoted = &self.servers[self.position(replica)?];
        promoted.resume()?;
        let mut reply = [0_u8; 5];
        tokio::time::timeout(FAILOVER_DEADLINE, socket.read_exact(&mut reply))
            .await
            .context("no answer to CLUSTER FAILOVER TAKEOVER")??;
        if &reply != b"+OK\r\n" {
            bail!(
                "CLUSTER FAILOVER TAKEOVER answered {:?}",
                String::from_utf8_lossy(&reply)
            );
        }
        let took_over = std::time::Instant::now();
        let what = format!("the cluster to promote :{replica}");
        poll_until(&what, FAILOVER_DEADLINE, POLL, || async {
            Ok(is_master(&mut promoted.connect().await?).await?)
        })
        .await?;
        self.wait_until_ok().await?;
        let what = format!(":{master_port} to replicate :{replica} in sync");
        poll_until(&what, FAILOVER_DEADLINE, POLL, || async {
            Ok(info_replication(promoted).await?.contains("state=online"))
        })
        .await?;
        Ok((replica, took_over))
    }

    /// The server on `port`, killed by [`fail_over`](Self::fail_over),
    /// starts again empty (nothing is kept on disk) and the cluster makes it
    /// the replica of `new_master`, as an operator's restart would; returns
    /// once it is in sync.
    pub async fn rejoin(&mut self, port: u16, new_master: u16) -> anyhow::Result<()> {
        let at = self.position(port)?;
        self.servers[at].restart().await?;
        let master = &self.servers[self.position(new_master)?];
        let what = format!(":{new_master} to get a replica in sync");
        poll_until(&what, FAILOVER_DEADLINE, POLL, || async {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut master.connect().await?)
                .await?;
            Ok(info.contains("state=online"))
        })
        .await
    }

    /// The master serving `slot`, by the cluster's own `CLUSTER SLOTS`.
    pub async fn master_of_slot(&self, slot: u16) -> anyhow::Result<u16> {
        let server = (self.servers.iter())
            .find(|server| server.is_running())
            .context("no server of the cluster runs")?;
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut server.connect().await?)
            .await?;
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let low: u16 = redis::from_redis_value_ref(&fields[0])?;
            let high: u16 = redis::from_redis_value_ref(&fields[1])?;
            if (low..=high).contains(&slot) {
                let redis::Value::Array(master) = &fields[2] else {
                    bail!("CLUSTER SLOTS names no master for {low}-{high}");
                };
                return Ok(redis::from_redis_value_ref(&master[1])?);
            }
        }
        bail!("no master serves slot {slot}")
    }

    /// Waits until every running server reports every slot served.
    pub async fn wait_until_ok(&self) -> anyhow::Result<()> {
        poll_until("the cluster to report ok", READY_TIMEOUT, POLL, || async {
            let mut all_ok = true;
            for server in self.servers.iter().filter(|server| server.is_running()) {
                all_ok &= matches!(cluster_state(server).await, Ok(state) if state == "ok");
            }
            Ok(all_ok)
        })
        .await
    }
}

/// One server's view of the cluster's replication.
struct Replication {
    /// A master with its replica attached, or a replica in sync with its
    /// master.
    linked: bool,
    /// Replicas the server knows of: every node must know every replica
    /// (gossip spreads that late), as the masters vote in a replica's
    /// election.
    known_replicas: usize,
}

impl Replication {
    fn is_synced(&self) -> bool {
        self.linked && self.known_replicas == MASTERS
    }
}

/// What `server` says of replication; an unanswered question counts as
/// not synced.
async fn replication_of(server: &RedisServer) -> Replication {
    let info = info_replication(server).await.unwrap_or_default();
    let nodes = cluster_nodes(server).await.unwrap_or_default();
    Replication {
        linked: info.contains("connected_slaves:1") || info.contains("master_link_status:up"),
        known_replicas: nodes
            .lines()
            .filter_map(|node| node.split_whitespace().nth(2))
            .filter(|flags| flags.split(',').any(|flag| flag == "slave"))
            .count(),
    }
}

/// One server's `INFO replication`.
async fn info_replication(server: &RedisServer) -> anyhow::Result<String> {
    ask(server, &["INFO", "replication"]).await
}

/// One server's `CLUSTER NODES`: its view of every node, a line each.
async fn cluster_nodes(server: &RedisServer) -> anyhow::Result<String> {
    ask(server, &["CLUSTER", "NODES"]).await
}

/// A command answered with text, within a second.
async fn ask(server: &RedisServer, command: &[&str]) -> anyhow::Result<String> {
    let reply = async {
        Ok::<_, anyhow::Error>(
            redis::cmd(command[0])
                .arg(&command[1..])
                .query_async::<String>(&mut server.connect().await?)
                .await?,
        )
    };
    tokio::time::timeout(Duration::from_secs(1), reply)
        .await
        .with_context(|| format!("{} timed out", command.join(" ")))?
}

/// `cluster_state` from one server's `CLUSTER INFO`: `ok` or `fail`.
pub async fn cluster_state(server: &RedisServer) -> anyhow::Result<String> {
    let info = ask(server, &["CLUSTER", "INFO"]).await?;
    info.lines()
        .find_map(|line| line.strip_prefix("cluster_state:"))
        .map(|state| state.trim().to_owned())
        .context("CLUSTER INFO without cluster_state")
}
