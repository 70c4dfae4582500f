//! The contract of a lock mode, written once and run against every mode: one
//! `lock_contract!` line per mode, with what that mode promises.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use hmdp_lock::{LockMode, Release};
use hmdp_test_support::wait_for;
use tokio::time::{sleep, Instant};

use crate::helpers::{without_hanging, Subject, HANG_GUARD};

/// Long enough that no lease runs out during a test that does not mean it to.
const LONG_LEASE: Duration = Duration::from_secs(10);
/// Short enough to wait out, long enough to be far from scheduling noise: a
/// quorum mode's first take on fresh nodes on a loaded machine must not
/// use it up (its validity is the lease minus the time the round took).
const SHORT_LEASE: Duration = Duration::from_secs(1);
/// How long a mode without a lease is watched to keep a key it was given a
/// short lease for: three of them.
const THREE_SHORT_LEASES: Duration = Duration::from_secs(3);

/// What a mode promises beyond mutual exclusion on one node.
pub struct Promises {
    /// A key whose holder never releases frees itself once its lease is over.
    pub lease_expires: bool,
    /// What a holder's release does after its lease ran out and another
    /// holder took the key.
    pub stale_release: StaleRelease,
    /// Mutual exclusion holds between two lock instances (two nodes).
    pub across_nodes: bool,
}

pub enum StaleRelease {
    /// The release sees another owner's token and leaves the key alone.
    Refused,
    /// The release deletes the new holder's lock (lock v1's failure).
    DeletesNewHolder,
    /// The mode has no lease, so no holder is ever stale.
    NoLease,
}

/// A per-process mutex: no lease, one node only.
pub const IN_PROCESS: Promises = Promises {
    lease_expires: false,
    stale_release: StaleRelease::NoLease,
    across_nodes: false,
};
/// Lock v1: a lease, and a release that deletes whatever holds the key.
pub const UNCHECKED_RELEASE: Promises = Promises {
    lease_expires: true,
    stale_release: StaleRelease::DeletesNewHolder,
    across_nodes: true,
};
/// Lock v2 and later: a lease, and a release that checks the owner.
pub const OWNER_CHECKED: Promises = Promises {
    lease_expires: true,
    stale_release: StaleRelease::Refused,
    across_nodes: true,
};

/// Generates the contract's tests for one mode.
macro_rules! lock_contract {
    ($name:ident, $mode:expr, $promises:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mutual_exclusion_under_50_contenders() {
                mutual_exclusion(Subject::new($mode).await, &$promises).await;
            }

            #[tokio::test]
            async fn different_keys_are_independent() {
                independent_keys(Subject::new($mode).await).await;
            }

            #[tokio::test]
            async fn a_wait_ends_by_its_deadline() {
                wait_deadline(Subject::new($mode).await).await;
            }

            #[tokio::test]
            async fn a_stale_release_does_what_the_mode_promises() {
                stale_release(Subject::new($mode).await, &$promises).await;
            }

            #[tokio::test]
            async fn a_dropped_hold_gives_the_key_back() {
                dropped_hold(Subject::new($mode).await).await;
            }

            #[tokio::test]
            async fn the_lease_frees_an_abandoned_key() {
                lease_expiry(Subject::new($mode).await, &$promises).await;
            }
        }
    };
}

lock_contract!(local, LockMode::Local, IN_PROCESS);
lock_contract!(redis_naive, LockMode::RedisNaive, UNCHECKED_RELEASE);
lock_contract!(redis_owner, LockMode::RedisOwner, OWNER_CHECKED);
lock_contract!(redis_lua, LockMode::RedisLua, OWNER_CHECKED);
lock_contract!(reentrant, LockMode::Reentrant, OWNER_CHECKED);
lock_contract!(multi, LockMode::Multi, OWNER_CHECKED);
lock_contract!(redlock, LockMode::Redlock, OWNER_CHECKED);

/// 50 tasks contend for one key, each waiting as long as it takes; each
/// holder sleeps inside, so an overlap would be seen. Where the mode promises
/// it, the contenders are spread over two lock instances, like two nodes.
async fn mutual_exclusion(subject: Subject, promises: &Promises) {
    const CONTENDERS: usize = 50;
    let nodes = if promises.across_nodes { 2 } else { 1 };
    let locks: Vec<_> = (0..nodes)
        .map(|_| subject.lock(LONG_LEASE, Duration::from_secs(30)))
        .collect();
    let key = subject.key("contended");
    let inside = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));

    let contenders = (0..CONTENDERS).map(|i| {
        let lock = locks[i % nodes].clone();
        let (key, inside, most_inside) = (key.clone(), inside.clone(), most_inside.clone());
        tokio::spawn(async move {
            let held = lock
                .acquire(&key)
                .await
                .unwrap()
                .expect("a 30 s wait outlasts 50 short holds");
            let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most_inside.fetch_max(now_inside, Ordering::SeqCst);
            sleep(Duration::from_millis(2)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            held.release().await.unwrap()
        })
    });
    let releases = join_all(contenders).await;

    assert_eq!(most_inside.load(Ordering::SeqCst), 1, "{}", subject.mode);
    for release in releases {
        assert_eq!(release.unwrap(), Release::Released);
    }
}

/// Holding one key neither blocks nor is disturbed by another key.
async fn independent_keys(subject: Subject) {
    let lock = subject.lock(LONG_LEASE, Duration::ZERO);
    let (first, second) = (subject.key("first"), subject.key("second"));

    let held_first = lock.acquire(&first).await.unwrap().expect("free key");
    assert!(lock.acquire(&first).await.unwrap().is_none(), "busy key");
    let held_second = lock.acquire(&second).await.unwrap().expect("other key");

    assert_eq!(held_second.release().await.unwrap(), Release::Released);
    assert!(lock.acquire(&first).await.unwrap().is_none(), "still busy");
    assert_eq!(held_first.release().await.unwrap(), Release::Released);
    let again = lock.acquire(&first).await.unwrap().expect("freed key");
    assert_eq!(again.release().await.unwrap(), Release::Released);
}

/// A waiter on a busy key gives up at its deadline, not before and without
/// waiting out the holder's lease; a waiter whose holder releases in time
/// gets in.
async fn wait_deadline(subject: Subject) {
    const WAIT: Duration = Duration::from_secs(1);
    let lock = subject.lock(LONG_LEASE, WAIT);
    let key = subject.key("waited");
    let held = lock.acquire(&key).await.unwrap().expect("free key");

    let started = Instant::now();
    let waited = without_hanging("a wait past its deadline", lock.acquire(&key)).await;
    assert!(waited.unwrap().is_none());
    let waited = started.elapsed();
    assert!(waited >= WAIT, "gave up early, after {waited:?}");

    let waiter = tokio::spawn({
        let (lock, key) = (lock.clone(), key.clone());
        async move { lock.acquire(&key).await.unwrap() }
    });
    // Part of the scenario: the holder releases while the waiter waits,
    // which leaves the waiter nine tenths of its wait (900 ms) to be served.
    sleep(WAIT / 10).await;
    assert_eq!(held.release().await.unwrap(), Release::Released);
    let taken = waiter.await.unwrap().expect("released within the wait");
    assert_eq!(taken.release().await.unwrap(), Release::Released);
}

/// A holds past its lease, B takes the key, then A releases: modes that
/// check the owner leave B's lock alone; lock v1 deletes it and lets C in.
async fn stale_release(subject: Subject, promises: &Promises) {
    let lock = subject.lock(SHORT_LEASE, Duration::ZERO);
    let key = subject.key("stale");
    let a = lock.acquire(&key).await.unwrap().expect("free key");
    let b = match promises.stale_release {
        StaleRelease::NoLease => {
            // What must not happen: the key freed by time. So the time is
            // waited out, three short leases.
            sleep(THREE_SHORT_LEASES).await;
            let b = lock.acquire(&key).await.unwrap();
            assert!(b.is_none(), "no lease: A still holds the key");
            assert_eq!(a.release().await.unwrap(), Release::Released);
            return;
        }
        _ => {
            wait_for("A's lease is over", HANG_GUARD, || async {
                lock.acquire(&key).await.unwrap()
            })
            .await
        }
    };

    let a_release = a.release().await.unwrap();
    let c = lock.acquire(&key).await.unwrap();
    match promises.stale_release {
        StaleRelease::Refused => {
            assert_eq!(a_release, Release::NotOwner);
            assert!(c.is_none(), "B still holds the key");
            assert_eq!(b.release().await.unwrap(), Release::Released);
        }
        StaleRelease::DeletesNewHolder => {
            assert_eq!(a_release, Release::Released, "A's DEL removed B's key");
            let c = c.expect("C gets in beside B");
            // B's release now deletes C's key in turn.
            assert_eq!(b.release().await.unwrap(), Release::Released);
            assert_eq!(c.release().await.unwrap(), Release::Expired);
        }
        StaleRelease::NoLease => unreachable!("handled above"),
    }
}

/// A hold dropped without a release (a panic, a task cancelled) gives the
/// key back by itself, long before its lease would have: no user is locked
/// out for the lease's 10 s after a request that was cut short.
async fn dropped_hold(subject: Subject) {
    let lock = subject.lock(LONG_LEASE, Duration::from_secs(2));
    let key = subject.key("dropped");
    drop(lock.acquire(&key).await.unwrap().expect("free key"));
    let next = lock.acquire(&key).await.unwrap();
    let next = next.expect("the dropped hold gave the key back within the wait");
    assert_eq!(next.release().await.unwrap(), Release::Released);
}

/// A holder that never releases: the key frees itself once the lease is
/// over, and the late release reports it had expired. Without a lease the
/// key stays held until released.
async fn lease_expiry(subject: Subject, promises: &Promises) {
    let lock = subject.lock(SHORT_LEASE, Duration::ZERO);
    let key = subject.key("abandoned");
    let abandoned = lock.acquire(&key).await.unwrap().expect("free key");
    assert!(lock.acquire(&key).await.unwrap().is_none(), "held");

    if !promises.lease_expires {
        // What must not happen: the key freed by time. So the time is
        // waited out, three short leases.
        sleep(THREE_SHORT_LEASES).await;
        let next = lock.acquire(&key).await.unwrap();
        assert!(next.is_none(), "no lease: still held");
        assert_eq!(abandoned.release().await.unwrap(), Release::Released);
        return;
    }
    let next = wait_for("the lease freed the key", HANG_GUARD, || async {
        lock.acquire(&key).await.unwrap()
    })
    .await;
    assert_eq!(next.release().await.unwrap(), Release::Released);
    assert_eq!(abandoned.release().await.unwrap(), Release::Expired);
}
