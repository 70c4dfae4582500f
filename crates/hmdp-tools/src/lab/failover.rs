//! `hmdp lab failover`: a lock on a replicated Redis is lost when the master
//! dies before its write reached the replica; a lock over independent servers
//! survives losing one of them.
//!
//! Single-Redis modes (default `reentrant`): the scenario starts a master and
//! a replica on free ports, the replica fed through a relay the lab can hold
//! back. A locks on the master while replication is held back, the master
//! dies, the replica is promoted (what Sentinel would do) and B locks on it:
//! two holders. `multi` and `redlock`: three independent servers; one dies
//! after A locked, and B cannot gather the nodes it needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hmdp_lock::{Holder, LockMode, NodeReport, QuorumLock};
use redis::AsyncCommands;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::harness::Lab;
use hmdp_test_support::{poll_until, RedisServer};

const LEASE: Duration = Duration::from_millis(2000);

pub(super) async fn run(lab: &Lab) -> anyhow::Result<String> {
    match lab.mode() {
        LockMode::Multi | LockMode::Redlock => independent_nodes(lab).await,
        _ => replicated(lab).await,
    }
}

async fn replicated(lab: &Lab) -> anyhow::Result<String> {
    let mut master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]).await?;
    let link = ReplicationLink::open(master.port()).await?;
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &link.port.to_string()]).await?;
    wait_for_sync(&replica).await?;
    lab.say(
        "redis",
        format!(
            "master :{} replicates to replica :{}",
            master.port(),
            replica.port()
        ),
    );

    let on_master = lab.lock_on(&master.url(), &[], LEASE, Duration::ZERO)?;
    link.hold_back();
    lab.say("redis", "replication to the replica is held back");
    let a = lab.acquire_and_enter("A", &*on_master).await?;
    let (on_master_now, on_replica_now) = (
        has_key(&master, lab.key()).await?,
        has_key(&replica, lab.key()).await?,
    );
    lab.say(
        "redis",
        format!("the lock key is on the master: {on_master_now}, on the replica: {on_replica_now}"),
    );
    master.kill();
    drop(link);
    lab.say("redis", "the master dies before replicating the lock");
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut replica.connect().await?)
        .await
        .context("cannot promote the replica")?;
    lab.say(
        "redis",
        "the replica is promoted to master, without the lock key",
    );

    let on_replica = lab.lock_on(&replica.url(), &[], LEASE, Duration::ZERO)?;
    lab.visit("B", &*on_replica, None).await?;
    lab.leave("A");
    // A's lock died with the master; its release has nowhere to go.
    drop(a);
    lab.say(
        "A",
        "has nothing left to release: its lock died with the master",
    );

    Ok(if lab.broken() {
        "Replication is asynchronous: the master acknowledged A's lock and died before \
         the replica had it, so the promoted replica handed the same lock to B. A lock \
         over independent servers (--lock multi or redlock) does not depend on one \
         server's replication."
    } else {
        "B was refused after the failover."
    }
    .to_owned())
}

async fn independent_nodes(lab: &Lab) -> anyhow::Result<String> {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(RedisServer::start().await?);
    }
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let build = || match lab.mode() {
        LockMode::Multi => QuorumLock::multi(&urls, LEASE, Duration::ZERO),
        _ => QuorumLock::redlock(&urls, LEASE, Duration::ZERO),
    };
    let (node_a, node_b) = (build()?, build()?);
    let ports: Vec<String> = servers.iter().map(|s| format!(":{}", s.port())).collect();
    lab.say(
        "redis",
        format!(
            "three independent servers {}; {} of 3 must agree",
            ports.join(" "),
            node_a.quorum()
        ),
    );

    let (a, votes) = node_a
        .acquire_reported(Holder::new(), lab.key(), Duration::ZERO)
        .await?;
    lab.say("A", format!("asks every node: {}", describe(&votes)));
    let a = a.context("A could not lock the free nodes")?;
    lab.say("A", "acquires the lock");
    lab.enter("A");
    servers[1].kill();
    lab.say("redis", format!("server {} dies", ports[1]));

    let (b, votes) = node_b
        .acquire_reported(Holder::new(), lab.key(), Duration::ZERO)
        .await?;
    lab.say("B", format!("asks every node: {}", describe(&votes)));
    match b {
        Some(held) => {
            lab.say("B", "acquires the lock");
            lab.enter("B");
            lab.leave("B");
            held.release().await?;
        }
        None => lab.say("B", "is refused: too few nodes agreed"),
    }
    lab.leave("A");
    let release = a.release().await?;
    lab.say(
        "A",
        format!("releases on every node it holds ({release:?}: one of them is dead)"),
    );

    Ok(if lab.broken() {
        "B gathered enough nodes although A held the lock.".to_owned()
    } else {
        format!(
            "A's lock lives on independent servers; losing one of them left B short of \
             the {} node(s) it needs, with A still holding the others.",
            node_b.quorum()
        )
    })
}

fn describe(votes: &[NodeReport]) -> String {
    let said: Vec<String> = votes
        .iter()
        .map(|vote| {
            let port = vote.node.rsplit(':').next().unwrap_or(&vote.node);
            format!(":{} {}", port.trim_end_matches("/0"), vote.detail)
        })
        .collect();
    let agreed = votes.iter().filter(|vote| vote.agreed).count();
    format!("{} ({agreed} agreed)", said.join(", "))
}

/// Whether `key` is on `server` itself.
pub(super) async fn has_key(server: &RedisServer, key: &str) -> anyhow::Result<bool> {
    Ok(server.connect().await?.exists(key).await?)
}

/// Waits until the replica has finished its first sync with the master.
async fn wait_for_sync(replica: &RedisServer) -> anyhow::Result<()> {
    let connection = replica.connect().await?;
    let (within, every) = (Duration::from_secs(10), Duration::from_millis(20));
    poll_until(
        "the replica to sync with its master",
        within,
        every,
        || async {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut connection.clone())
                .await?;
            Ok(info.contains("master_link_status:up"))
        },
    )
    .await
}

/// A TCP relay between a replica and its master that the lab can hold back:
/// once held, nothing more from the master reaches the replica, so "the
/// write has not replicated yet" is a fact, not a race.
struct ReplicationLink {
    port: u16,
    held: Arc<AtomicBool>,
    relay: JoinHandle<()>,
}

impl ReplicationLink {
    async fn open(master_port: u16) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let held = Arc::new(AtomicBool::new(false));
        let relay = tokio::spawn(relay(listener, master_port, held.clone()));
        Ok(ReplicationLink { port, held, relay })
    }

    fn hold_back(&self) {
        self.held.store(true, Ordering::SeqCst);
    }
}

impl Drop for ReplicationLink {
    fn drop(&mut self) {
        // Aborting the relay drops its connections with it.
        self.relay.abort();
    }
}

async fn relay(listener: TcpListener, master_port: u16, held: Arc<AtomicBool>) {
    let mut links = JoinSet::new();
    while let Ok((replica, _)) = listener.accept().await {
        let Ok(master) = TcpStream::connect(("127.0.0.1", master_port)).await else {
            continue;
        };
        let (mut from_replica, mut to_replica) = replica.into_split();
        let (mut from_master, mut to_master) = master.into_split();
        links.spawn(async move {
            let _ = tokio::io::copy(&mut from_replica, &mut to_master).await;
        });
        let held = held.clone();
        links.spawn(async move {
            let mut buffer = vec![0; 64 * 1024];
            loop {
                let read = match from_master.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => read,
                };
                // Held back: the bytes are dropped, and never released again.
                if held.load(Ordering::SeqCst) {
                    continue;
                }
                if to_replica.write_all(&buffer[..read]).await.is_err() {
                    return;
                }
            }
        });
    }
}
