//! Release notifications for waiting holders: one pub/sub connection per lock
//! (a process builds one lock) that every local waiter shares.
//!
//! A waiter registers interest in a lock's release channel and the connection
//! subscribes to it once, however many local tasks wait on that key; the
//! subscription is dropped when the last of them leaves. Each release message
//! wakes one waiter (FIFO): the lock can only be taken by one of them anyway,
//! so waking all would be a thundering herd. A waiter that is woken but then
//! leaves without using the wake passes it on (tokio's `Notify` forwards an
//! unused `notify_one` when its `Notified` is dropped).
//!
//! All SUBSCRIBE / UNSUBSCRIBE commands are sent by one task, in order, after
//! looking at the current interest, so a late unsubscribe can never undo a
//! newer subscribe. If the connection drops, every waiter is woken to retry
//! at once, falls back to short polls, and the task reconnects and
//! resubscribes. A connection that goes silent without closing (its peer
//! gone without a FIN or RST: a NAT or firewall that dropped its state, a
//! frozen server) would look subscribed forever, so the task pings it and
//! treats one that stops answering as dropped.
//!
//! On one server the subscription is classic (`SUBSCRIBE`, the release
//! script `PUBLISH`es). On a Redis Cluster it is sharded (`SSUBSCRIBE` /
//! `SPUBLISH`, Redis 7): a release travels only to the master of its lock's
//! slot and the subscribers there, instead of being broadcast over the
//! cluster bus to every node. redis-rs routes each channel to its slot's
//! master and resubscribes after a reconnect or a slot move; a connection
//! lost, or a subscription the server drops (its slot moved away), counts as
//! the subscription lost: waiters retry and poll until it is back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClient;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "cluster")]
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::RedisResult;
#[cfg(feature = "cluster")]
use redis::{PushInfo, PushKind};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use crate::connection::RedisSource;

/// How long to wait before reconnecting a dropped subscription connection;
/// doubled after each attempt that fails again (a server that refuses the
/// subscription for good, such as `SSUBSCRIBE` before Redis 7), up to
/// [`MAX_RECONNECT_DELAY`]. Waiters poll meanwhile.
const RECONNECT_DELAY: Duration = Duration::from_millis(200);
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);
/// Upper bound on opening the subscription connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the subscription connection is pinged: a silent connection is
/// noticed within this plus [`REPLY_TIMEOUT`], where waiters would otherwise
/// sleep for the holder's whole lease.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(1);
/// How long a PING, SUBSCRIBE or UNSUBSCRIBE may go unanswered before the
/// connection is given up as dead. Generous: a false alarm only costs a
/// reconnect, with waiters polling meanwhile.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// The process's subscription to lock release channels.
pub(crate) struct ReleaseEvents {
    shared: Arc<Shared>,
    /// Started on first use: building a lock must not need Redis or a runtime.
    dispatcher: std::sync::Once,
    /// Handed to the dispatcher when it starts.
    pending: Mutex<Option<(RedisSource, mpsc::UnboundedReceiver<String>)>>,
}

struct Shared {
    /// `std` mutex: held for map updates only, never across an `.await`.
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    /// Channel names whose interest changed; the dispatcher reconciles them.
    changed: mpsc::UnboundedSender<String>,
}

struct Channel {
    /// Local waiters interested in this channel (guarded by the map's mutex).
    interest: Mutex<usize>,
    /// Whether Redis confirmed the subscription (and it is still alive).
    subscribed: watch::Sender<bool>,
    wake: Notify,
}

/// One waiter's interest in one release channel; dropping it withdraws it.
pub(crate) struct Listener {
    shared: Arc<Shared>,
    name: String,
    channel: Arc<Channel>,
}

impl ReleaseEvents {
    pub(crate) fn new(source: RedisSource) -> Self {
        let (changed, receiver) = mpsc::unbounded_channel();
        ReleaseEvents {
            shared: Arc::new(Shared {
                channels: Mutex::new(HashMap::new()),
                changed,
            }),
            dispatcher: std::sync::Once::new(),
            pending: Mutex::new(Some((source, receiver))),
        }
    }

    /// Registers interest in `channel` and waits (until `patience` at most)
    /// for Redis to confirm the subscription, so that a release published
    /// after this returns is sure to be delivered.
    pub(crate) async fn listen(&self, channel: &str, patience: Instant) -> Listener {
        self.dispatcher.call_once(|| {
            let (source, receiver) = self
                .pending
                .lock()
                .expect("release events poisoned")
                .take()
                .expect("dispatcher starts once");
            tokio::spawn(dispatch(source, Arc::downgrade(&self.shared), receiver));
        });
        let entry = {
            let mut channels = self.shared.channels.lock().expect("channels poisoned");
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| {
                    Arc::new(Channel {
                        interest: Mutex::new(0),
                        subscribed: watch::Sender::new(false),
                        wake: Notify::new(),
                    })
                })
                .clone();
            *entry.interest.lock().expect("interest poisoned") += 1;
            entry
        };
        // The dispatcher only reads this channel's interest; a send fails only
        // when it has stopped, and then waiters fall back to polling.
        let _ = self.shared.changed.send(channel.to_owned());
        let listener = Listener {
            shared: self.shared.clone(),
            name: channel.to_owned(),
            channel: entry,
        };
        let _ = tokio::time::timeout_at(patience, listener.live()).await;
        listener
    }
}

impl Listener {
    /// Completes on the next release this listener is woken for.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.channel.wake.notified()
    }

    /// Whether releases are being delivered right now; when not, the waiter
    /// has to poll.
    pub(crate) fn is_live(&self) -> bool {
        *self.channel.subscribed.borrow()
    }

    /// Completes once releases are being delivered (at once if they are).
    pub(crate) async fn live(&self) {
        // The sender lives in the channel this listener holds, so the wait
        // can only end with the subscription confirmed.
        let _ = self.channel.subscribed.subscribe().wait_for(|on| *on).await;
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let channels = self.shared.channels.lock().expect("channels poisoned");
        let mut interest = self.channel.interest.lock().expect("interest poisoned");
        *interest -= 1;
        if *interest == 0 {
            drop(interest);
            drop(channels);
            let _ = self.shared.changed.send(std::mem::take(&mut self.name));
        }
    }
}

/// The subscription connection: commands go through it, and what Redis
/// pushes comes out as [`Notice`]s.
#[derive(Clone)]
enum Subscriber {
    /// `SUBSCRIBE` on a connection of its own to the one server.
    Server(redis::aio::PubSubSink),
    /// `SSUBSCRIBE` on a cluster connection of its own (RESP3, pushes
    /// delivered to the dispatcher).
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
}

/// What the subscription connection reports.
enum Notice {
    /// A release was published on this channel.
    Released(String),
    /// The server ended this channel's subscription: the answer to our own
    /// unsubscribe, or (sharded) its slot moved to another node. Only the
    /// cluster connection reports these.
    #[cfg(feature = "cluster")]
    Unsubscribed(String),
    /// The connection (or, on a cluster, one node's) dropped.
    Disconnected,
}

impl Subscriber {
    /// Opens the connection, within [`CONNECT_TIMEOUT`].
    async fn connect(
        source: &RedisSource,
    ) -> Result<(Subscriber, BoxStream<'static, Notice>), String> {
        let connecting = async {
            match source {
                RedisSource::Server(client) => {
                    let (sink, messages) = client.get_async_pubsub().await?.split();
                    let notices = messages
                        .map(|message| Notice::Released(message.get_channel_name().to_owned()))
                        .chain(futures::stream::once(async { Notice::Disconnected }));
                    Ok((Subscriber::Server(sink), notices.boxed()))
                }
                #[cfg(feature = "cluster")]
                RedisSource::Cluster(nodes) => {
                    let (pushes, received) = mpsc::unbounded_channel::<PushInfo>();
                    let connection = ClusterClient::builder(nodes.clone())
                        .use_protocol(redis::ProtocolVersion::RESP3)
                        .push_sender(pushes)
                        .connection_timeout(CONNECT_TIMEOUT)
                        .response_timeout(REPLY_TIMEOUT)
                        .build()?
                        .get_async_connection()
                        .await?;
                    let pushes = futures::stream::unfold(received, |mut received| async move {
                        received.recv().await.map(|push| (push, received))
                    });
                    let notices =
                        pushes.filter_map(|push| std::future::ready(Notice::of_push(push)));
                    Ok((Subscriber::Cluster(connection), notices.boxed()))
                }
            }
        };
        let connected: RedisResult<_> =
            match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
                Ok(connected) => connected,
                Err(_) => return Err("timed out".to_owned()),
            };
        connected.map_err(|error| error.to_string())
    }

    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Subscriber::Server(sink) => sink.subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Subscriber::Cluster(connection) => connection.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Subscriber::Server(sink) => sink.unsubscribe(channel).await,
            #[cfg(feature = "cluster")]
            Subscriber::Cluster(connection) => connection.sunsubscribe(channel).await,
        }
    }

    /// Checks that the connection still answers: on a cluster, every
    /// master's (a sharded subscription may sit on any of them).
    async fn ping(&mut self) -> RedisResult<()> {
        match self {
            Subscriber::Server(sink) => sink.ping::<redis::Value>().await.map(drop),
            #[cfg(feature = "cluster")]
            Subscriber::Cluster(connection) => {
                let every_master = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                connection
                    .route_command(redis::cmd("PING"), every_master)
                    .await
                    .map(drop)
            }
        }
    }
}

#[cfg(feature = "cluster")]
impl Notice {
    /// The notice a RESP3 push of the cluster connection carries, if any.
    fn of_push(push: PushInfo) -> Option<Notice> {
        let channel = || match push.data.first() {
            Some(redis::Value::BulkString(name)) => {
                Some(String::from_utf8_lossy(name).into_owned())
            }
            _ => None,
        };
        match push.kind {
            PushKind::SMessage => channel().map(Notice::Released),
            PushKind::SUnsubscribe => channel().map(Notice::Unsubscribed),
            PushKind::Disconnection => Some(Notice::Disconnected),
            _ => None,
        }
    }
}

/// The dispatcher: owns the subscription connection, applies interest
/// changes in order and turns each release message into one wake-up.
async fn dispatch(
    source: RedisSource,
    shared: Weak<Shared>,
    mut changed: mpsc::UnboundedReceiver<String>,
) {
    let mut delay = RECONNECT_DELAY;
    loop {
        let (mut subscriber, mut notices) = match Subscriber::connect(&source).await {
            Ok(connected) => connected,
            Err(error) => {
                tracing::warn!(%error, retry_in = ?delay,
                    "lock release subscription unavailable; waiters poll");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RECONNECT_DELAY);
                if shared.strong_count() == 0 {
                    return;
                }
                continue;
            }
        };
        // Resubscribe whatever is wanted now (after a reconnect, everything).
        let wanted: Vec<String> = match shared.upgrade() {
            Some(shared) => shared
                .channels
                .lock()
                .expect("channels poisoned")
                .keys()
                .cloned()
                .collect(),
            None => return,
        };
        let mut subscriptions = Subscriptions::default();
        let mut healthy = true;
        for name in wanted {
            healthy &= reconcile(&shared, &mut subscriber, &mut subscriptions, name).await;
        }
        if healthy {
            delay = RECONNECT_DELAY;
        }
        let keepalive = keepalive(subscriber.clone());
        tokio::pin!(keepalive);
        while healthy {
            tokio::select! {
                notice = notices.next() => match notice {
                    Some(Notice::Released(name)) => wake_one(&shared, &name),
                    #[cfg(feature = "cluster")]
                    Some(Notice::Unsubscribed(name)) => {
                        healthy = subscriptions.unsubscribed(&name);
                    }
                    Some(Notice::Disconnected) | None => healthy = false,
                },
                () = &mut keepalive => healthy = false,
                name = changed.recv() => match name {
                    Some(name) => {
                        healthy =
                            reconcile(&shared, &mut subscriber, &mut subscriptions, name).await;
                    }
                    None => return,
                },
            }
        }
        tracing::warn!("lock release subscription lost; reconnecting");
        let Some(shared) = shared.upgrade() else {
            return;
        };
        for channel in shared.channels.lock().expect("channels poisoned").values() {
            channel.subscribed.send_replace(false);
            // Releases may have been missed: let every waiter retry now.
            channel.wake.notify_waiters();
        }
        drop(shared);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RECONNECT_DELAY);
    }
}

/// The channels one connection is subscribed to, and the unsubscribe
/// answers still to come back for the ones given up.
#[derive(Default)]
struct Subscriptions {
    active: std::collections::HashSet<String>,
    /// Our own unsubscribes, per channel, whose answer has not been seen
    /// among the notices (it comes back on the same ordered stream).
    #[cfg(feature = "cluster")]
    unsubscribing: HashMap<String, usize>,
}

#[cfg(feature = "cluster")]
impl Subscriptions {
    /// Notes the server ending `name`'s subscription; false when it is one
    /// we did not ask to end (its slot moved): the connection is then no
    /// longer trusted to deliver.
    fn unsubscribed(&mut self, name: &str) -> bool {
        match self.unsubscribing.get_mut(name) {
            Some(answers) => {
                *answers -= 1;
                if *answers == 0 {
                    self.unsubscribing.remove(name);
                }
                true
            }
            None => !self.active.contains(name),
        }
    }
}

/// Brings one channel's subscription in line with its current interest.
/// Returns false when the connection failed.
async fn reconcile(
    shared: &Weak<Shared>,
    subscriber: &mut Subscriber,
    subscriptions: &mut Subscriptions,
    name: String,
) -> bool {
    let Some(shared) = shared.upgrade() else {
        return false;
    };
    let entry = {
        let mut channels = shared.channels.lock().expect("channels poisoned");
        let wanted = channels
            .get(&name)
            .map(|channel| *channel.interest.lock().expect("interest poisoned") > 0)
            .unwrap_or(false);
        if !wanted {
            channels.remove(&name);
            None
        } else {
            channels.get(&name).cloned()
        }
    };
    drop(shared);
    match entry {
        Some(entry) if !subscriptions.active.contains(&name) => {
            if let Err(error) = answered(subscriber.subscribe(&name)).await {
                tracing::warn!(%error, "cannot subscribe to lock releases");
                return false;
            }
            subscriptions.active.insert(name);
            entry.subscribed.send_replace(true);
        }
        Some(entry) => {
            entry.subscribed.send_replace(true);
        }
        None if subscriptions.active.remove(&name) => {
            // Only the cluster connection reports unsubscribes.
            #[cfg(feature = "cluster")]
            if matches!(subscriber, Subscriber::Cluster(_)) {
                *subscriptions.unsubscribing.entry(name.clone()).or_default() += 1;
            }
            if let Err(error) = answered(subscriber.unsubscribe(&name)).await {
                tracing::warn!(%error, "cannot unsubscribe from lock releases");
                return false;
            }
        }
        None => {}
    }
    true
}

/// Pings the subscription connection every [`KEEPALIVE_EVERY`]; completes
/// when a ping fails or goes unanswered, i.e. when the connection is dead.
async fn keepalive(mut subscriber: Subscriber) {
    loop {
        tokio::time::sleep(KEEPALIVE_EVERY).await;
        if let Err(error) = answered(subscriber.ping()).await {
            tracing::warn!(%error, "lock release subscription does not answer");
            return;
        }
    }
}

/// One command's answer on the subscription connection; none within
/// [`REPLY_TIMEOUT`] is an error like a failed connection.
async fn answered<T>(
    command: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(REPLY_TIMEOUT, command).await {
        Ok(answer) => answer.map_err(|error| error.to_string()),
        Err(_) => Err(format!("no answer within {REPLY_TIMEOUT:?}")),
    }
}

fn wake_one(shared: &Weak<Shared>, name: &str) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let channel = shared
        .channels
        .lock()
        .expect("channels poisoned")
        .get(name)
        .cloned();
    if let Some(channel) = channel {
        channel.wake.notify_one();
    }
}
