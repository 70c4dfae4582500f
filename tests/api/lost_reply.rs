//! An admission whose reply is lost on a Redis Cluster: redis-rs's cluster
//! connection sends a request again when its connection drops before the
//! reply (`RetryMethod::Reconnect`). The admission script has then run once
//! already, and must answer the re-sent attempt as it answered the first —
//! not refuse the buyer it has just admitted as `ALREADY_ORDERED`.
//!
//! The cluster is one private master holding every slot, announcing the port
//! of a proxy in front of it, so that every connection the node opens goes
//! through the proxy; the proxy, once armed, forwards a script call and then
//! closes the connection instead of passing its reply on.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmdp::config::SeckillMode;
use hmdp_lock::LockMode;
use hmdp_test_support::redis_cluster::cluster_state;
use hmdp_test_support::{wait_until, Direction, Faults, RedisServer, TcpProxy, Verdict};

use crate::helpers::spawn_app;

/// A one-master Redis Cluster whose clients all go through a proxy that can
/// lose one reply.
struct OneMasterBehindProxy {
    proxy_port: u16,
    /// Scripts to let through before the one whose reply is dropped, plus
    /// one; 0: drop none.
    countdown: Arc<AtomicU32>,
    _master: RedisServer,
}

impl OneMasterBehindProxy {
    async fn start() -> OneMasterBehindProxy {
        let proxy = TcpProxy::listen().await.unwrap();
        let proxy_port = proxy.port();
        let master = RedisServer::start_cluster_node(&[
            "--cluster-announce-ip",
            "127.0.0.1",
            "--cluster-announce-port",
            &proxy_port.to_string(),
        ])
        .await
        .expect("a cluster-enabled redis-server starts");
        let _: () = redis::cmd("CLUSTER")
            .arg(&["ADDSLOTSRANGE", "0", "16383"])
            .query_async(&mut master.connect().await.unwrap())
            .await
            .unwrap();
        wait_until(
            "the one-master cluster",
            Duration::from_secs(20),
            || async { cluster_state(&master).await.ok().as_deref() == Some("ok") },
        )
        .await;
        let countdown = Arc::new(AtomicU32::new(0));
        let faults = LoseOneScriptReply {
            countdown: countdown.clone(),
            doomed: Mutex::new(None),
        };
        let _relaying = proxy.relay_to(master.port(), Arc::new(faults));
        OneMasterBehindProxy {
            proxy_port,
            countdown,
            _master: master,
        }
    }

    fn url(&self) -> String {
        format!("redis+cluster://127.0.0.1:{}", self.proxy_port)
    }

    /// Drops the reply of the `nth` script call from now (1: the next).
    fn drop_script_reply(&self, nth: u32) {
        self.countdown.store(nth, Ordering::SeqCst);
    }

    /// Whether the reply the proxy was told to drop has been dropped.
    fn dropped(&self) -> bool {
        self.countdown.load(Ordering::SeqCst) == 0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_whose_admission_reply_was_lost_is_told_the_order_the_retry_finds() {
    let cluster = OneMasterBehindProxy::start().await;
    let app = spawn_app(|s| {
        s.store.redis.url = cluster.url();
        s.seckill = SeckillMode::Stream;
    })
    .await;
    let voucher = app.create_open_seckill(5).await;
    let tokens = app.login_many(2).await;
    // A first buyer loads the sale and has their order written, so that the
    // next script the node runs is the second buyer's admission.
    let first = app.purchase(voucher, &tokens[0]).await;
    assert_eq!(first["success"], true, "{first}");
    wait_until(
        "the first order written",
        Duration::from_secs(20),
        || async { app.audit(voucher).await.active_orders == 1 && app.pending_orders().await == 0 },
    )
    .await;

    cluster.drop_script_reply(1);
    let answer = app.purchase(voucher, &tokens[1]).await;
    assert!(cluster.dropped(), "the proxy dropped no reply: {answer}");
    assert_eq!(
        answer["success"], true,
        "an admitted buyer, told whether they got the unit: {answer}"
    );
    let told = answer["data"].as_str().expect("an order id").to_owned();
    wait_until(
        "the second order written",
        Duration::from_secs(20),
        || async { app.audit(voucher).await.active_orders == 2 },
    )
    .await;
    let buyer = app.user_id(&tokens[1]).await;
    let written = (app.tables())
        .order_ids_of(voucher.get(), buyer.get())
        .await
        .unwrap();
    assert_eq!(written, [told.parse::<i64>().unwrap()]);
    let audit = app.audit(voucher).await;
    assert!(audit.stock_balances(5), "{audit:?}");
}

/// The proxy's faults: while `countdown` is above 0, each script call
/// (`EVAL`, `EVALSHA`) counts it down, and the connection of the call that
/// brings it to 0 is closed as soon as a reply comes back on it.
struct LoseOneScriptReply {
    countdown: Arc<AtomicU32>,
    /// The connection whose next reply is lost.
    doomed: Mutex<Option<u64>>,
}

impl Faults for LoseOneScriptReply {
    async fn chunk(&self, connection: u64, direction: Direction, chunk: &[u8]) -> Verdict {
        let mut doomed = self.doomed.lock().expect("doomed poisoned");
        match direction {
            Direction::Requests => {
                if chunk.windows(4).any(|window| window == b"EVAL")
                    && (self.countdown).fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                        left.checked_sub(1)
                    }) == Ok(1)
                {
                    *doomed = Some(connection);
                }
                Verdict::Pass
            }
            // The reply is lost with the connection.
            Direction::Replies if *doomed == Some(connection) => Verdict::Close,
            Direction::Replies => Verdict::Pass,
        }
    }
}

/// The same lost reply for a reentrant lock's take: the take sent again must
/// not count a second hold, or the purchase's release leaves the user's lock
/// held until its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_take_whose_reply_was_lost_is_not_counted_twice() {
    // The purchase's scripts: the take, then the release.
    a_purchase_with_a_lost_lock_script_reply_answers_and_frees_the_lock(1).await;
}

/// And for its release: the release sent again finds the key gone (its first
/// attempt deleted it); the purchase still answers, and the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_release_whose_reply_was_lost_leaves_the_lock_free() {
    a_purchase_with_a_lost_lock_script_reply_answers_and_frees_the_lock(2).await;
}

/// A `reentrant` purchase whose `nth` lock script's reply is lost: it is
/// answered with its order, written once, and its user's lock is free.
async fn a_purchase_with_a_lost_lock_script_reply_answers_and_frees_the_lock(nth: u32) {
    let cluster = OneMasterBehindProxy::start().await;
    let app = spawn_app(|s| {
        s.store.redis.url = cluster.url();
        s.lock.mode = LockMode::Reentrant;
    })
    .await;
    let voucher = app.create_open_seckill(5).await;
    let tokens = app.login_many(2).await;
    // A first purchase has Redis learn the lock's scripts: the next take
    // runs at its first `EVALSHA`, not after a `NOSCRIPT`.
    let first = app.purchase(voucher, &tokens[0]).await;
    assert_eq!(first["success"], true, "{first}");

    cluster.drop_script_reply(nth);
    let answer = app.purchase(voucher, &tokens[1]).await;
    assert!(cluster.dropped(), "the proxy dropped no reply: {answer}");
    assert_eq!(answer["success"], true, "{answer}");
    assert_eq!(
        app.lock_keys().await,
        Vec::<String>::new(),
        "the lock is free once the purchase answered"
    );
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.active_orders, audit.duplicate_users),
        (2, 0),
        "{audit:?}"
    );
}
