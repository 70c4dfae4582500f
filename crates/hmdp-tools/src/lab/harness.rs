//! What every lab scenario runs on: locks built by the purchase's own
//! factory with a short lease, a clock shared by the actors, a timeline, and
//! the tracking of who is inside the critical section, from which the
//! verdict follows. What a run observed is handed back as a
//! [`Report`](super::report::Report).
//!
//! Mutual exclusion is judged on the critical section, not on the lock: an
//! actor is inside between `enter` and `leave`, and the lock kept its promise
//! when no two actors were ever inside at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::FutureExt;
use hmdp_lock::Connection as RedisConnection;
use hmdp_lock::{DistributedLock, Faults, Holder, LockGuard, LockMode, Release};
use redis::AsyncCommands;
use tokio::time::Instant;
use uuid::Uuid;

use super::report::{Actor, Event, Report};
use super::LabArgs;
use hmdp::config::LockSettings;
use hmdp::ids::{UserId, VoucherId};
use hmdp::keys::Keys;
use hmdp::store::{NewSeckillVoucher, NewVoucher, Store};
use hmdp_test_support::remove_keys_with_prefix;

/// Creates a seckill voucher of `stock` in MySQL, on sale from an hour ago
/// to an hour from now, for the scenarios that run the purchase.
pub(super) async fn open_voucher(
    store: &Store,
    title: &str,
    stock: i32,
) -> anyhow::Result<VoucherId> {
    store
        .insert_seckill_voucher(
            &NewVoucher::flash_sale(title),
            &NewSeckillVoucher::open_now(stock),
        )
        .await
        .context("cannot create the lab's voucher")
}

/// The scenario clock and the events recorded against it. Shared with the
/// fault injected into the lock, which outlives any borrow of the [`Lab`].
struct Timeline {
    start: Instant,
    events: Mutex<Vec<Event>>,
}

impl Timeline {
    fn record(&self, who: &'static str, what: impl Into<String>) {
        let event = Event {
            at: self.start.elapsed(),
            who,
            what: what.into(),
        };
        self.events.lock().expect("timeline poisoned").push(event);
    }

    async fn sleep_until(&self, ms: u64) {
        tokio::time::sleep_until(self.start + Duration::from_millis(ms)).await;
    }
}

/// Who is inside the critical section, and every moment more than one was.
#[derive(Default)]
struct Section {
    inside: BTreeSet<Actor>,
    overlaps: Vec<Vec<Actor>>,
    /// Breaks of the lock's promise other than an overlap (a holder
    /// blocked by itself, a stale holder's write that landed).
    failures: Vec<String>,
}

/// A stall armed for the next release that reaches the lock's
/// before-delete fault point: who stalls, and until when (ms on the clock).
type ArmedStall = Arc<Mutex<Option<(Actor, u64)>>>;

/// How long a lab lock waits for its replicas (`--lock-sync-replicas`).
pub const SYNC_REPLICAS_TIMEOUT: Duration = Duration::from_millis(500);

/// The stage a scenario plays on.
pub struct Lab {
    mode: LockMode,
    redis: RedisConnection,
    redis_url: String,
    lock_nodes: Vec<String>,
    /// `--fencing`: the scenario's locks mint fencing tokens.
    fencing: bool,
    /// Every key of this run starts with it, so a run sees nothing but its
    /// own keys and can delete them all afterwards.
    namespace: String,
    /// The lock key the actors contend for (user 1's `lock:order:1`).
    key: String,
    lease: Mutex<Option<Duration>>,
    timeline: Arc<Timeline>,
    section: Mutex<Section>,
    /// Who took the lock last: the owner of the key's token for the modes
    /// that keep the lock in one Redis key.
    last_acquirer: Mutex<Option<Actor>>,
    releases: Mutex<Vec<(Actor, Release)>>,
    stall: ArmedStall,
}

impl Lab {
    /// A stage for `mode` on `redis` (already reached), the rest as `args`
    /// asks. The scenario clock starts here.
    pub(super) fn new(mode: LockMode, redis: RedisConnection, args: &LabArgs) -> Self {
        // A fresh namespace per run, so runs never see each other's keys.
        let namespace = format!("{}lab:{}:", args.redis.prefix, Uuid::new_v4());
        let key = Keys::new(namespace.clone()).order_lock(UserId::new(1));
        Lab {
            mode,
            redis,
            redis_url: args.redis.url.clone(),
            lock_nodes: args.lock_nodes.clone(),
            fencing: args.fencing,
            namespace,
            key,
            lease: Mutex::new(None),
            timeline: Arc::new(Timeline {
                start: Instant::now(),
                events: Mutex::new(Vec::new()),
            }),
            section: Mutex::default(),
            last_acquirer: Mutex::default(),
            releases: Mutex::default(),
            stall: ArmedStall::default(),
        }
    }

    /// A lock of the mode under test, built exactly as the purchase builds
    /// it but with the scenario's `lease` and `wait`, and with the lab's
    /// fault points wired in.
    /// `reentrant` runs as the purchase runs it, with its watchdog: the
    /// scenario's lease becomes the lease the watchdog renews.
    pub fn lock(
        &self,
        lease: Duration,
        wait: Duration,
    ) -> anyhow::Result<Arc<dyn DistributedLock>> {
        self.build_lock(
            &self.redis,
            &self.redis_url,
            &self.lock_nodes,
            lease,
            wait,
            0,
        )
    }

    /// Like [`Lab::lock`], on Redis servers the scenario runs itself: the
    /// single-Redis modes use `redis_url`, `multi` and `redlock` use `nodes`.
    pub fn lock_on(
        &self,
        redis_url: &str,
        nodes: &[String],
        lease: Duration,
        wait: Duration,
    ) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let redis = hmdp::config::connect_redis(redis_url, Duration::from_secs(1))?;
        self.build_lock(&redis, redis_url, nodes, lease, wait, 0)
    }

    /// Like [`Lab::lock_on`] for a single-Redis mode, handing a hold out
    /// only once `sync_replicas` replicas acknowledged it (0: at once).
    pub fn lock_replicated_on(
        &self,
        redis_url: &str,
        lease: Duration,
        sync_replicas: u32,
    ) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let redis = hmdp::config::connect_redis(redis_url, Duration::from_secs(1))?;
        self.build_lock(&redis, redis_url, &[], lease, Duration::ZERO, sync_replicas)
    }

    fn build_lock(
        &self,
        redis: &RedisConnection,
        redis_url: &str,
        nodes: &[String],
        lease: Duration,
        wait: Duration,
        sync_replicas: u32,
    ) -> anyhow::Result<Arc<dyn DistributedLock>> {
        let watchdog = self.mode == LockMode::Reentrant;
        let settings = LockSettings {
            mode: self.mode,
            lock_nodes: nodes.to_vec(),
            lock_lease_ms: (!watchdog && self.mode.leased()).then_some(lease.as_millis() as u64),
            lock_wait_ms: wait.as_millis() as u64,
            lock_watchdog_ms: lease.as_millis() as u64,
            lock_max_hold_ms: 0,
            fencing: self.fencing,
            lock_sync_replicas: sync_replicas,
            lock_sync_timeout_ms: SYNC_REPLICAS_TIMEOUT.as_millis() as u64,
        };
        *self.lease.lock().expect("lease poisoned") = Some(lease);
        settings
            .builder()
            .faults(self.faults())
            .sharing(redis.clone())
            .build(hmdp_lock::RedisSource::from_url(redis_url)?)
            .with_context(|| format!("cannot build --lock {}", settings.mode))
    }

    /// The lock key the actors contend for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Every key of this run starts with it.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether the scenario's locks mint fencing tokens.
    pub fn fencing(&self) -> bool {
        self.fencing
    }

    /// The mode under test.
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// The lab's Redis, for scenarios that run the purchase itself.
    pub fn redis(&self) -> RedisConnection {
        self.redis.clone()
    }

    /// Milliseconds since the scenario started.
    pub fn now_ms(&self) -> u64 {
        self.timeline.start.elapsed().as_millis() as u64
    }

    /// The next round 100 ms on the clock: where a story starts once its
    /// setup, which takes a moment, is done.
    pub fn soon(&self) -> u64 {
        (self.now_ms() / 100 + 1) * 100
    }

    /// Sleeps until `ms` after the scenario started.
    pub async fn at(&self, ms: u64) {
        self.timeline.sleep_until(ms).await;
    }

    /// Adds a line of narrative to the timeline.
    pub fn say(&self, who: Actor, what: impl Into<String>) {
        self.timeline.record(who, what);
    }

    /// `who` tries to take the lock; the attempt and its outcome go on the timeline.
    pub async fn acquire(
        &self,
        who: Actor,
        lock: &dyn DistributedLock,
    ) -> anyhow::Result<Option<Box<dyn LockGuard>>> {
        self.acquire_as(who, Holder::new(), lock).await
    }

    /// `who` tries to take the lock as `holder`: the same holder again
    /// re-enters a reentrant lock.
    pub async fn acquire_as(
        &self,
        who: Actor,
        holder: Holder,
        lock: &dyn DistributedLock,
    ) -> anyhow::Result<Option<Box<dyn LockGuard>>> {
        let held = lock
            .acquire_as(holder, &self.key)
            .await
            .with_context(|| format!("{who} could not reach the lock"))?;
        match &held {
            Some(_) => {
                *self.last_acquirer.lock().expect("acquirer poisoned") = Some(who);
                self.say(who, "acquires the lock")
            }
            None => self.say(who, "is refused: the lock is busy"),
        }
        Ok(held)
    }

    /// `who` takes the lock and enters the critical section. The lock must be
    /// free: the scenario's story starts from this holder, so a refusal is an
    /// error of the run, not a verdict.
    pub async fn acquire_and_enter(
        &self,
        who: Actor,
        lock: &dyn DistributedLock,
    ) -> anyhow::Result<Box<dyn LockGuard>> {
        self.acquire_and_enter_as(who, Holder::new(), lock).await
    }

    /// Like [`Lab::acquire_and_enter`], as `holder`.
    pub async fn acquire_and_enter_as(
        &self,
        who: Actor,
        holder: Holder,
        lock: &dyn DistributedLock,
    ) -> anyhow::Result<Box<dyn LockGuard>> {
        let held = self
            .acquire_as(who, holder, lock)
            .await?
            .with_context(|| format!("{who} found the key busy"))?;
        self.enter(who);
        Ok(held)
    }

    /// `who` tries the lock once; if it gets in, it works until `until_ms`
    /// on the clock (or leaves at once when `None`), then releases. Whether
    /// it got in: a refusal is part of the story, the verdict judges it.
    pub async fn visit(
        &self,
        who: Actor,
        lock: &dyn DistributedLock,
        until_ms: Option<u64>,
    ) -> anyhow::Result<bool> {
        let Some(held) = self.acquire(who, lock).await? else {
            return Ok(false);
        };
        self.enter(who);
        if let Some(until_ms) = until_ms {
            self.at(until_ms).await;
        }
        self.leave(who);
        self.release(who, held).await?;
        Ok(true)
    }

    /// `who` starts the work the lock guards. Entering beside someone else
    /// is the failure every scenario watches for.
    pub fn enter(&self, who: Actor) {
        let mut section = self.section.lock().expect("section poisoned");
        section.inside.insert(who);
        if section.inside.len() == 1 {
            self.say(who, "enters the critical section");
            return;
        }
        let together: Vec<Actor> = section.inside.iter().copied().collect();
        let others: Vec<Actor> = together.iter().copied().filter(|o| *o != who).collect();
        self.say(
            who,
            format!(
                "enters the critical section while {} is still inside: MUTUAL EXCLUSION BROKEN",
                others.join(" and ")
            ),
        );
        section.overlaps.push(together);
    }

    /// `who` has finished the work the lock guards.
    pub fn leave(&self, who: Actor) {
        self.section
            .lock()
            .expect("section poisoned")
            .inside
            .remove(who);
        self.say(who, "leaves the critical section");
    }

    /// `who` releases; what the release reported goes on the timeline.
    pub async fn release(&self, who: Actor, held: Box<dyn LockGuard>) -> anyhow::Result<Release> {
        let release = held
            .release()
            .await
            .with_context(|| format!("{who} could not reach the lock to release it"))?;
        let what = match release {
            Release::Released => "releases: the lock is freed (Released)".to_owned(),
            Release::StillHeld(left) => {
                format!("releases one hold: still holds the lock {left} more time(s) (StillHeld)")
            }
            Release::Expired => "releases: the key was already gone (Expired)".to_owned(),
            Release::NotOwner => {
                "releases: another owner holds the lock, left alone (NotOwner)".to_owned()
            }
        };
        let owner = *self.last_acquirer.lock().expect("acquirer poisoned");
        match owner {
            Some(owner) if release == Release::Released && owner != who && self.one_redis_key() => {
                self.say(
                    who,
                    format!(
                        "releases: reports Released, but the key it deleted was {owner}'s lock"
                    ),
                )
            }
            _ => self.say(who, what),
        }
        self.releases
            .lock()
            .expect("releases poisoned")
            .push((who, release));
        Ok(release)
    }

    /// Makes the next release that reaches the lock's before-delete point
    /// (see [`Faults::before_delete`]) stall there until `until_ms`.
    pub fn stall_next_release(&self, who: Actor, until_ms: u64) {
        *self.stall.lock().expect("stall poisoned") = Some((who, until_ms));
    }

    /// Puts the state of the lock key in Redis on the timeline at each of
    /// `times_ms` on the clock, for the modes that keep the lock in that one
    /// key.
    pub async fn observe_key_at(
        &self,
        times_ms: impl IntoIterator<Item = u64>,
    ) -> anyhow::Result<()> {
        for ms in times_ms {
            self.at(ms).await;
            self.observe_key().await?;
        }
        Ok(())
    }

    /// The lock key's state at this moment, on the timeline.
    async fn observe_key(&self) -> anyhow::Result<()> {
        if !self.one_redis_key() {
            return Ok(());
        }
        let mut redis = self.redis.clone();
        let ttl_ms: i64 = redis
            .pttl(&self.key)
            .await
            .context("cannot observe the lock key")?;
        let what = if ttl_ms >= 0 {
            format!("the lock key is held, {ttl_ms} ms of lease left")
        } else {
            "the lock key is free".to_owned()
        };
        self.timeline.record("redis", what);
        Ok(())
    }

    /// Whether the mode keeps the lock in the one key `key` names in
    /// the lab's Redis, so that the key's state is the lock's state.
    fn one_redis_key(&self) -> bool {
        matches!(
            self.mode,
            LockMode::RedisNaive | LockMode::RedisOwner | LockMode::RedisLua | LockMode::Reentrant
        )
    }

    /// Records a break of the lock's promise that is not an overlap.
    pub fn fail(&self, who: Actor, what: impl Into<String>) {
        let what = what.into();
        self.say(who, format!("{what}: BROKEN"));
        self.section
            .lock()
            .expect("section poisoned")
            .failures
            .push(format!("{who} {what}"));
    }

    /// Whether two actors were ever inside the critical section at once, or
    /// the lock broke its promise otherwise.
    pub fn broken(&self) -> bool {
        let section = self.section.lock().expect("section poisoned");
        !section.overlaps.is_empty() || !section.failures.is_empty()
    }

    /// The fault points of this lab's locks: a release stalls only when a
    /// scenario armed a stall for it.
    fn faults(&self) -> Faults {
        let stall = self.stall.clone();
        let timeline = self.timeline.clone();
        Faults {
            before_delete: Some(Arc::new(move || {
                let armed = stall.lock().expect("stall poisoned").take();
                let timeline = timeline.clone();
                async move {
                    let Some((who, until_ms)) = armed else {
                        return;
                    };
                    timeline.record(
                        who,
                        "stalls inside its release, just before the command that deletes the key",
                    );
                    timeline.sleep_until(until_ms).await;
                    timeline.record(who, "resumes its release");
                }
                .boxed()
            })),
        }
    }

    /// Deletes every key of this run.
    pub(super) async fn clean_up(&self) -> anyhow::Result<()> {
        remove_keys_with_prefix(&mut self.redis.clone(), &self.namespace)
            .await
            .context("cannot delete the lab's keys")?;
        Ok(())
    }

    /// Everything the run observed, with the scenario's explanation.
    pub(super) fn report(
        &self,
        scenario: &'static str,
        setup: Option<String>,
        promise: &'static str,
        explanation: String,
    ) -> Report {
        let section = self.section.lock().expect("section poisoned");
        Report {
            scenario,
            setup,
            promise,
            mode: self.mode,
            key: self.key.clone(),
            lease: *self.lease.lock().expect("lease poisoned"),
            events: self
                .timeline
                .events
                .lock()
                .expect("timeline poisoned")
                .clone(),
            overlaps: section.overlaps.clone(),
            failures: section.failures.clone(),
            fencing: self.fencing,
            releases: self.releases.lock().expect("releases poisoned").clone(),
            explanation,
        }
    }
}
