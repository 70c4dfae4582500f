//! `reentrant` beyond the shared contract: re-entry by the same holder,
//! waiting on release messages, the watchdog and its lost-lock signal.

use hmdp_lock::{DistributedLock, Holder, LockGuard, ReentrantLock, ReentrantOptions, Release};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use hmdp_test_support::{wait_for, wait_until, RedisServer};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use crate::helpers::{connect, held_with_waiters, redis_url, without_hanging, HANG_GUARD};
use crate::proxy::Proxy;

fn lock(options: ReentrantOptions) -> ReentrantLock {
    let url = redis_url();
    ReentrantLock::new(
        redis::Client::open(url.as_str()).unwrap(),
        hmdp_lock::connection::connection_manager(&url, Duration::from_secs(10)).unwrap(),
        options,
    )
}

fn watchdog(lease: Duration, wait: Duration) -> ReentrantOptions {
    ReentrantOptions {
        lease: None,
        watchdog_lease: lease,
        max_hold: None,
        wait,
    }
}

fn key(name: &str) -> String {
    format!("test:{}:lock:{name}", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
async fn a_holder_reenters_three_deep_and_needs_as_many_releases() {
    let lock = lock(watchdog(Duration::from_secs(30), Duration::ZERO));
    let key = key("reentered");
    let me = Holder::new();

    let outer = lock.acquire_as(me, &key).await.unwrap().expect("free key");
    let middle = lock.acquire_as(me, &key).await.unwrap().expect("re-entry");
    let inner = lock.acquire_as(me, &key).await.unwrap().expect("re-entry");
    assert!(lock.acquire(&key).await.unwrap().is_none(), "others wait");
    let count: u32 = connect(&redis_url())
        .await
        .hget(&key, lock_field(&key).await)
        .await
        .unwrap();
    assert_eq!(count, 3);

    assert_eq!(inner.release().await.unwrap(), Release::StillHeld(2));
    assert_eq!(middle.release().await.unwrap(), Release::StillHeld(1));
    assert!(
        lock.acquire(&key).await.unwrap().is_none(),
        "still held once"
    );
    assert_eq!(outer.release().await.unwrap(), Release::Released);
    let next = lock.acquire(&key).await.unwrap().expect("freed");
    assert_eq!(next.release().await.unwrap(), Release::Released);
}

/// The holds counted in the lock hash `key`, all owners together.
async fn holds(key: &str) -> u32 {
    let counts: Vec<u32> = connect(&redis_url()).await.hvals(key).await.unwrap();
    counts.iter().sum()
}

/// The single owner field of the lock hash.
async fn lock_field(key: &str) -> String {
    let fields: Vec<String> = connect(&redis_url()).await.hkeys(key).await.unwrap();
    assert_eq!(fields.len(), 1, "{fields:?}");
    fields.into_iter().next().unwrap()
}

#[tokio::test]
async fn a_dropped_guard_gives_its_hold_back() {
    let lock = lock(watchdog(Duration::from_secs(30), Duration::from_secs(2)));
    let key = key("dropped");
    let me = Holder::new();
    let outer = lock.acquire_as(me, &key).await.unwrap().unwrap();
    drop(lock.acquire_as(me, &key).await.unwrap().unwrap());
    // The dropped guard gives its hold back in the background.
    wait_until(
        "the dropped guard's hold given back",
        HANG_GUARD,
        || async { holds(&key).await == 1 },
    )
    .await;
    assert_eq!(outer.release().await.unwrap(), Release::Released);

    // A task that panics while holding still lets the next holder in.
    let lock = Arc::new(lock);
    let panicked = tokio::spawn({
        let (lock, key) = (lock.clone(), key.clone());
        async move {
            let _held = lock.acquire(&key).await.unwrap().unwrap();
            panic!("the holder fails");
        }
    });
    assert!(panicked.await.is_err());
    // The wait (2 s) is far shorter than the lease (30 s): only the drop's
    // release can let the next holder in within it.
    let next = lock
        .acquire(&key)
        .await
        .unwrap()
        .expect("freed by the drop");
    next.release().await.unwrap();
    wait_until("no watchdog left", HANG_GUARD, || async {
        lock.renewing() == 0
    })
    .await;
}

/// A waiter on a key held for the whole 30 s lease gives up at its
/// deadline: not before it, and without waiting out the lease.
#[tokio::test]
async fn a_wait_ends_at_its_deadline() {
    const WAIT: Duration = Duration::from_millis(300);
    let lock = lock(watchdog(Duration::from_secs(30), WAIT));
    let key = key("deadline");
    let held = lock.acquire(&key).await.unwrap().unwrap();

    for _ in 0..3 {
        let started = Instant::now();
        let waited = without_hanging("a wait past its deadline", lock.acquire(&key)).await;
        assert!(waited.unwrap().is_none());
        let waited = started.elapsed();
        assert!(waited >= WAIT, "gave up early, after {waited:?}");
    }
    held.release().await.unwrap();
}

/// 100 waiters on one key, each served in turn by a release message: the
/// holder's lease is 30 s, so a waiter that missed its wake-up would sit out
/// the whole test.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_waiters_are_all_served_by_release_messages() {
    const WAITERS: usize = 100;
    let lock = Arc::new(lock(watchdog(
        Duration::from_secs(30),
        Duration::from_secs(20),
    )));
    let key = key("queue");
    let first = lock.acquire(&key).await.unwrap().unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();

    let waiters = (0..WAITERS).map(|_| {
        let (lock, key, inside, served) =
            (lock.clone(), key.clone(), inside.clone(), served.clone());
        tokio::spawn(async move {
            let held = lock.acquire(&key).await.unwrap().expect("served in time");
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two inside");
            sleep(Duration::from_millis(1)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            served.fetch_add(1, Ordering::SeqCst);
            held.release().await.unwrap()
        })
    });
    let waiters: Vec<_> = waiters.collect();
    // Part of the scenario, not a wait for a state: the waiters line up
    // behind the first holder meanwhile. One not yet waiting at the release
    // only finds the key free or busy later; nothing below depends on when.
    sleep(Duration::from_millis(200)).await;
    assert_eq!(first.release().await.unwrap(), Release::Released);
    for release in join_all(waiters).await {
        assert_eq!(release.unwrap(), Release::Released);
    }
    assert_eq!(served.load(Ordering::SeqCst), WAITERS);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "served in {took:?}");
    println!("{WAITERS} waiters served in {took:?}");
}

#[tokio::test]
async fn the_watchdog_keeps_a_lock_three_leases_long_and_stops_after_release() {
    // Renewed every third of it (333 ms): a renewal may come up to two
    // thirds of a lease (667 ms) late and still find the key leased.
    const LEASE: Duration = Duration::from_secs(1);
    let lock = lock(watchdog(LEASE, Duration::ZERO));
    let other = self::lock(watchdog(LEASE, Duration::ZERO));
    let key = key("watched");
    let held = lock.acquire(&key).await.unwrap().unwrap();
    assert_eq!(lock.renewing(), 1);

    // What must not happen over three and a half leases (ten renewals):
    // the key left without a lease, or someone else getting in. The time
    // is the point here; each check is a quarter lease after the last.
    let started = Instant::now();
    while started.elapsed() < LEASE * 3 + LEASE / 2 {
        sleep(LEASE / 4).await;
        assert!(other.acquire(&key).await.unwrap().is_none(), "kept out");
        let ttl: i64 = connect(&redis_url()).await.pttl(&key).await.unwrap();
        assert!(ttl > 0, "lease renewed: {ttl}");
    }
    held.ensure_held().await.expect("still held");

    assert_eq!(held.release().await.unwrap(), Release::Released);
    wait_until("no renewal task left", HANG_GUARD, || async {
        lock.renewing() == 0
    })
    .await;
    // Nothing brings the key back for a whole lease (three renewal
    // periods): a negative check, so a time, not a state, is waited for.
    sleep(LEASE).await;
    let exists: bool = connect(&redis_url()).await.exists(&key).await.unwrap();
    assert!(!exists, "the key is gone and nothing renewed it");
}

#[tokio::test]
async fn a_renewal_that_finds_the_lock_gone_signals_it_lost() {
    // The first renewal comes a second in, the lease would run out two
    // seconds after it: the renewal, not the lease running out, is what
    // finds the hold lost (and stops), even on a loaded machine.
    const LEASE: Duration = Duration::from_secs(3);
    let lock = lock(watchdog(LEASE, Duration::ZERO));
    let key = key("lost");
    let held = lock.acquire(&key).await.unwrap().unwrap();
    held.ensure_held().await.expect("held");

    let _: () = connect(&redis_url()).await.del(&key).await.unwrap();
    wait_until("the watchdog noticed", HANG_GUARD, || async {
        held.ensure_held().await.is_err()
    })
    .await;
    assert_eq!(lock.renewing(), 0, "and stopped");
    assert_eq!(held.release().await.unwrap(), Release::Expired);
}

#[tokio::test]
async fn the_watchdog_stops_at_the_maximum_hold_time() {
    const LEASE: Duration = Duration::from_millis(300);
    let lock = lock(ReentrantOptions {
        max_hold: Some(Duration::from_millis(400)),
        ..watchdog(LEASE, Duration::ZERO)
    });
    let key = key("stuck");
    let held = lock.acquire(&key).await.unwrap().unwrap();
    // Renewed until the maximum hold (400 ms), then left to run out; a
    // watchdog that kept renewing would keep the key past the guard.
    wait_until(
        "renewal stopped and the lease ran out",
        HANG_GUARD,
        || async {
            let exists: bool = connect(&redis_url()).await.exists(&key).await.unwrap();
            !exists
        },
    )
    .await;
    assert!(held.ensure_held().await.is_err());
    assert_eq!(held.release().await.unwrap(), Release::Expired);
}

#[tokio::test]
async fn redis_unreachable_past_the_lease_signals_the_lock_lost() {
    // Wide enough that a loaded machine still checks well inside the lease.
    const LEASE: Duration = Duration::from_millis(1000);
    let mut server = RedisServer::start().await.unwrap();
    let lock = ReentrantLock::new(
        redis::Client::open(server.url()).unwrap(),
        hmdp_lock::connection::connection_manager(&server.url(), Duration::from_millis(100))
            .unwrap(),
        watchdog(LEASE, Duration::ZERO),
    );
    let held = lock.acquire(&key("unreachable")).await.unwrap().unwrap();
    held.ensure_held().await.expect("held");

    server.kill();
    // Not lost before the lease is over: a negative check at a quarter of
    // the lease, with three quarters (750 ms) to spare.
    sleep(LEASE / 4).await;
    held.ensure_held().await.expect("the lease is not over yet");
    wait_until("lost once the lease ran out", HANG_GUARD, || async {
        held.ensure_held().await.is_err()
    })
    .await;
}

/// Many waiters on many keys share the process's one subscription connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_waiters_share_one_subscription_connection() {
    let server = RedisServer::start().await.unwrap();
    let lock = Arc::new(ReentrantLock::new(
        redis::Client::open(server.url()).unwrap(),
        hmdp_lock::connection::connection_manager(&server.url(), Duration::from_secs(10)).unwrap(),
        watchdog(Duration::from_secs(30), Duration::from_secs(5)),
    ));
    let keys: Vec<String> = (0..5).map(|i| format!("lock:order:{i}")).collect();
    let (holds, waiters) = held_with_waiters(&lock, &keys, 20).await;

    let mut redis = connect(&server.url()).await;
    wait_until("a waiter subscribed on every key", HANG_GUARD, || async {
        channels(&server).await.len() == keys.len()
    })
    .await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(clients.lines().count(), 1, "{clients}");
    let channels = channels(&server).await;
    assert_eq!(
        channels.len(),
        keys.len(),
        "one channel per key: {channels:?}"
    );

    for held in holds {
        held.release().await.unwrap();
    }
    for waiter in join_all(waiters).await {
        assert!(waiter.unwrap().is_clean());
    }
}

/// The subscription connection drops while a waiter waits on a lock with a
/// 30 s lease: the waiter still gets in promptly after the release.
#[tokio::test]
async fn a_waiter_survives_the_subscription_connection_dropping() {
    let server = RedisServer::start().await.unwrap();
    let (held, waiter) = held_with_a_waiter(&server, &server.url()).await;
    until_subscribers(&server, RELEASED, 1).await;

    let mut redis = connect(&server.url()).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    wait_until("resubscribed", HANG_GUARD, || async {
        channels(&server).await == [RELEASED]
    })
    .await;

    release_and_expect_the_waiter_within(held, waiter, Duration::from_millis(500)).await;
}

/// The subscription connection goes silent without closing (its peer gone
/// without a FIN or RST: a NAT or firewall that dropped its state, a frozen
/// server) while a waiter naps on a key with a 30 s lease: the release
/// message never arrives, and the waiter still gets in within seconds, not
/// at its 10 s deadline.
#[tokio::test]
async fn a_waiter_is_not_left_on_a_subscription_connection_gone_silent() {
    let server = RedisServer::start().await.unwrap();
    let pubsub = Proxy::start(server.port()).await;
    let (held, waiter) = held_with_a_waiter(&server, &pubsub.url()).await;
    until_subscribers(&server, RELEASED, 1).await;
    pubsub.requests().hold();
    pubsub.replies().hold();
    release_and_expect_the_waiter_within(held, waiter, Duration::from_secs(6)).await;
}

/// The subscription connection cannot be opened at all (its server refuses
/// connections): a waiter polls instead of sleeping until its deadline or
/// the holder's lease, and still gets in soon after the release.
#[tokio::test]
async fn a_waiter_polls_when_no_subscription_can_be_opened() {
    let server = RedisServer::start().await.unwrap();
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("redis://{}", listener.local_addr().unwrap())
    };
    let (held, waiter) = held_with_a_waiter(&server, &refused).await;
    // Part of the scenario: the waiter, finding the key busy, polls
    // meanwhile; no state outside it shows that. One that had not started
    // yet would find the key free after the release, within the bound too.
    sleep(Duration::from_millis(200)).await;
    release_and_expect_the_waiter_within(held, waiter, Duration::from_millis(1000)).await;
}

/// Redis confirms a waiter's subscription only after the waiter retried and
/// found the key busy, and the holder released in between: the release
/// message went out before the subscription existed, so only a retry can
/// see it. Here the confirmation even reaches the waiter before the busy
/// answer does; the waiter must not take that confirmation as cover and nap
/// for the holder's 30 s lease.
#[tokio::test]
async fn a_release_before_a_late_subscription_confirmation_is_not_slept_through() {
    let server = RedisServer::start().await.unwrap();
    let (pubsub, commands) = (
        Proxy::start(server.port()).await,
        Proxy::start(server.port()).await,
    );
    let waiting = Arc::new(ReentrantLock::new(
        redis::Client::open(pubsub.url()).unwrap(),
        hmdp_lock::connection::connection_manager(&commands.url(), Duration::from_secs(10))
            .unwrap(),
        watchdog(Duration::from_secs(30), Duration::from_secs(10)),
    ));
    let holding = lock_on(&server);
    // One wait first: the subscription connection is open and the scripts loaded.
    let warm = holding.acquire("lock:order:0").await.unwrap().unwrap();
    let warm_waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.acquire("lock:order:0").await.unwrap() }
    });
    until_subscribers(&server, "{lock:order:0}:released", 1).await;
    warm.release().await.unwrap();
    warm_waiter.await.unwrap().unwrap().release().await.unwrap();
    // Its unsubscribe went through: the connection carries nothing else.
    until_subscribers(&server, "{lock:order:0}:released", 0).await;

    let held = holding.acquire("lock:order:1").await.unwrap().unwrap();
    pubsub.requests().hold();
    let answers = commands.replies().passed();
    let waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.acquire("lock:order:1").await.unwrap() }
    });
    // The waiter's first try found the key busy; its SUBSCRIBE, sent next,
    // waits in the proxy.
    let first_answer = commands.replies().passed_more_than(answers);
    without_hanging("the waiter's first try", first_answer).await;
    // The waiter's next retry reaches Redis and finds the key busy; its
    // answer stays in the proxy.
    commands.replies().hold();
    let (sent, answers) = (commands.requests().passed(), commands.replies().arrived());
    let retry = commands.requests().passed_more_than(sent);
    without_hanging("the waiter's retry", retry).await;
    let busy = commands.replies().arrived_more_than(answers);
    without_hanging("Redis answering the retry", busy).await;
    assert_eq!(held.release().await.unwrap(), Release::Released);
    // Only now does Redis see the SUBSCRIBE, and the waiter its confirmation.
    let confirmations = pubsub.replies().passed();
    pubsub.requests().pass();
    until_subscribers(&server, RELEASED, 1).await;
    let confirmed = pubsub.replies().passed_more_than(confirmations);
    without_hanging("the confirmation passing the proxy", confirmed).await;
    // Part of the scenario: a moment for the waiter to read the
    // confirmation before the busy answer. Should it read them the other
    // way round, it must be served just as soon.
    sleep(Duration::from_millis(100)).await;
    let answered = Instant::now();
    commands.replies().pass();

    let taken = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter slept through the release"))
        .unwrap()
        .expect("served within its wait");
    println!("served {:?} after the busy answer", answered.elapsed());
    taken.release().await.unwrap();
}

/// `lock:order:1` held on `server` with a 30 s watchdog lease, and a task
/// started to wait up to 10 s for it, with release messages read from
/// `pubsub_url`.
async fn held_with_a_waiter(
    server: &RedisServer,
    pubsub_url: &str,
) -> (Box<dyn LockGuard>, JoinHandle<Option<Box<dyn LockGuard>>>) {
    let lock = Arc::new(ReentrantLock::new(
        redis::Client::open(pubsub_url).unwrap(),
        hmdp_lock::connection::connection_manager(&server.url(), Duration::from_secs(10)).unwrap(),
        watchdog(Duration::from_secs(30), Duration::from_secs(10)),
    ));
    let held = lock.acquire("lock:order:1").await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire("lock:order:1").await.unwrap() }
    });
    (held, waiter)
}

/// The release channel of `lock:order:1`.
const RELEASED: &str = "{lock:order:1}:released";

/// The channels with a subscriber on `server` (`PUBSUB CHANNELS`).
async fn channels(server: &RedisServer) -> Vec<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(&mut connect(&server.url()).await)
        .await
        .unwrap()
}

/// Waits until `channel` has `count` subscribers on `server`.
async fn until_subscribers(server: &RedisServer, channel: &str, count: u32) {
    let what = format!("{count} subscribers of {channel}");
    wait_until(&what, HANG_GUARD, || async {
        let (_, subscribers): (String, u32) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut connect(&server.url()).await)
            .await
            .unwrap();
        subscribers == count
    })
    .await;
}

/// Releases `held`; the waiter must hold the key within `within` of that.
async fn release_and_expect_the_waiter_within(
    held: Box<dyn LockGuard>,
    waiter: JoinHandle<Option<Box<dyn LockGuard>>>,
    within: Duration,
) {
    let released = Instant::now();
    held.release().await.unwrap();
    let taken = waiter.await.unwrap().expect("served within its wait");
    assert!(released.elapsed() < within, "{:?}", released.elapsed());
    taken.release().await.unwrap();
}

/// Stalls writes on the server for 300 ms, so that a lock script sent now
/// is surely in flight when its caller gives up after 100 ms.
async fn stall_writes(redis: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("WRITE")
        .query_async(redis)
        .await
        .unwrap();
}

/// The scripts the server behind `redis` has run so far (`EVALSHA` calls):
/// once a lock has loaded its scripts, each of its takes, renewals and
/// releases is one.
async fn scripts_run(redis: &mut MultiplexedConnection) -> u64 {
    hmdp_test_support::command_calls(redis, "evalsha")
        .await
        .unwrap()
}

/// Waits until the server behind `redis` has run `count` scripts in all:
/// those of `what`.
async fn until_scripts_run(redis: &MultiplexedConnection, count: u64, what: &str) {
    wait_until(&format!("{what} run"), HANG_GUARD, || {
        let mut redis = redis.clone();
        async move { scripts_run(&mut redis).await >= count }
    })
    .await;
}

fn lock_on(server: &RedisServer) -> ReentrantLock {
    ReentrantLock::new(
        redis::Client::open(server.url()).unwrap(),
        hmdp_lock::connection::connection_manager(&server.url(), Duration::from_secs(10)).unwrap(),
        watchdog(Duration::from_secs(30), Duration::ZERO),
    )
}

/// A caller that gives up while its acquisition is in flight (a timeout, a
/// client gone) leaves no lock behind for the 30 s lease.
#[tokio::test]
async fn an_acquisition_abandoned_in_flight_gives_the_key_back() {
    let server = RedisServer::start().await.unwrap();
    let lock = lock_on(&server);
    let warm = lock.acquire("lock:order:0").await.unwrap().unwrap();
    warm.release().await.unwrap();
    let mut redis = connect(&server.url()).await;
    let scripts = scripts_run(&mut redis).await;
    // Writes stall on the server, so the acquisition is surely in flight.
    stall_writes(&mut redis).await;

    let abandoned =
        tokio::time::timeout(Duration::from_millis(100), lock.acquire("lock:order:1")).await;
    assert!(abandoned.is_err(), "gave up while the script was stalled");
    // The key is absent while the take is stalled too: what counts is
    // after the take and its undo ran.
    until_scripts_run(&redis, scripts + 2, "the stalled take and its undo").await;
    let exists: bool = redis.exists("lock:order:1").await.unwrap();
    assert!(!exists, "the abandoned hold was given back");
}

/// A release abandoned in flight is finished by its guard's `Drop` as a
/// retry of the same release, which finds the first attempt's answer: with
/// the holder inside twice, one hold is given back, not both, and nobody
/// else gets in while the outer hold lives.
#[tokio::test]
async fn a_release_abandoned_in_flight_gives_back_one_hold_not_two() {
    let server = RedisServer::start().await.unwrap();
    let lock = lock_on(&server);
    // Loads the scripts, so that the release below is one command.
    let warm = lock.acquire("lock:order:0").await.unwrap().unwrap();
    warm.release().await.unwrap();
    let key = "lock:order:1";
    let me = Holder::new();
    let outer = lock.acquire_as(me, key).await.unwrap().expect("free key");
    let inner = lock.acquire_as(me, key).await.unwrap().expect("re-entry");
    let mut redis = connect(&server.url()).await;
    let scripts = scripts_run(&mut redis).await;
    stall_writes(&mut redis).await;

    let abandoned = tokio::time::timeout(Duration::from_millis(100), inner.release()).await;
    assert!(abandoned.is_err(), "gave up while the script was stalled");
    until_scripts_run(&redis, scripts + 2, "the stalled release and its retry").await;
    let holds: HashMap<String, u32> = redis.hgetall(key).await.unwrap();
    assert_eq!(holds.values().sum::<u32>(), 1, "one hold left: {holds:?}");
    assert!(
        lock.acquire(key).await.unwrap().is_none(),
        "another owner got in while the outer holder is inside"
    );
    assert_eq!(outer.release().await.unwrap(), Release::Released);
}

/// A release that crosses a renewal in flight is not a lost lock: the
/// renewal finds the key gone because it was given back. Many short holds
/// under a lease renewed every 10 ms, half released in place, half in the
/// background while their task waits to take the key again.
///
/// A lease this short can run out for real when the machine stalls a task
/// past two renewals; such a hold is rightly reported lost, and its release
/// says so (`Expired`, or `NotOwner` once its task took the key again).
/// What may never happen is a hold reported lost whose release found the
/// key still its own: so no more holds are lost than releases found their
/// lease run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_crossing_a_renewal_is_not_a_lost_lock() {
    let lock = Arc::new(lock(watchdog(Duration::from_millis(30), Duration::ZERO)));
    let key = key("crossing");
    let holders = (0..20u64).map(|task| {
        let (lock, key) = (lock.clone(), format!("{key}:{task}"));
        tokio::spawn(async move {
            let mut releases = Vec::new();
            for round in 0..40u64 {
                let held = lock.acquire(&key).await.unwrap().expect("own key");
                sleep(Duration::from_micros((task * 700 + round * 1300) % 15_000)).await;
                if round % 2 == 0 {
                    releases.push(held.release().await.unwrap());
                    continue;
                }
                let background = tokio::spawn(held.release());
                let again = wait_for("the background release", HANG_GUARD, || async {
                    lock.acquire(&key).await.unwrap()
                })
                .await;
                releases.push(background.await.unwrap().unwrap());
                releases.push(again.release().await.unwrap());
            }
            releases
        })
    });
    let mut releases = Vec::new();
    for holder in join_all(holders).await {
        releases.extend(holder.unwrap());
    }
    assert_eq!(releases.len(), 20 * 60);
    // A hold whose lease ran out finds its key gone, or taken again by its
    // own task: both are releases of a hold truly lost.
    let ran_out = releases
        .iter()
        .filter(|&&r| matches!(r, Release::Expired | Release::NotOwner))
        .count();
    assert!(
        releases.iter().all(|r| !matches!(r, Release::StillHeld(_))),
        "a single hold was held twice: {releases:?}"
    );
    assert!(
        lock.holds_lost() <= ran_out as u64,
        "{} holds reported lost, but only {ran_out} releases found their lease run out",
        lock.holds_lost()
    );
}
