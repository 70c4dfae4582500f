//! The due times of unpaid orders in Redis (`{seckill}:due`, a sorted set
//! by deadline): written when an order is committed, claimed by the nodes'
//! closers (`lua/claim_due.lua`), removed once the order is settled. Redis
//! may lose them (a restart), and so may a node killed before it wrote
//! them: the closer's MySQL sweep finds those orders.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::{AsyncCommands, Script};
use tokio::sync::mpsc;

use crate::ids::OrderId;
use crate::keys::Keys;
use crate::redis_handle::RedisConnection;

static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/claim_due.lua")));

/// How long a claimed order is its claimer's before another node may claim
/// it: far longer than a close takes.
const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// The payment deadline of unpaid orders, in Redis.
#[derive(Clone)]
pub struct PayDeadlines {
    redis: RedisConnection,
    key: String,
    pay_timeout: Duration,
    /// Due times on their way to Redis, `(epoch ms, order id)`.
    due: mpsc::UnboundedSender<(u64, i64)>,
}

/// Most due times written in one `ZADD`.
const WRITTEN_AT_ONCE: usize = 1000;

fn epoch_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

impl PayDeadlines {
    /// Starts the task that writes the due times (on the caller's runtime;
    /// it ends when the last clone is dropped).
    pub fn new(redis: RedisConnection, keys: &Keys, pay_timeout: Duration) -> Self {
        let (due, queued) = mpsc::unbounded_channel();
        tokio::spawn(write_due_times(redis.clone(), keys.pay_deadlines(), queued));
        PayDeadlines {
            redis,
            key: keys.pay_deadlines(),
            pay_timeout,
            due,
        }
    }

    /// How long an order may stay unpaid.
    pub fn pay_timeout(&self) -> Duration {
        self.pay_timeout
    }

    /// Schedules the close of `orders`, just committed, at their deadline.
    /// The purchase's answer does not wait for it: the due times go to the
    /// node's writer, which sends those that queued up meanwhile in one
    /// `ZADD` (a sale's thousands of orders a second cost Redis a few
    /// commands). Should they never arrive (Redis down, the node killed),
    /// the sweep closes those orders from MySQL.
    pub fn schedule(&self, orders: impl IntoIterator<Item = OrderId>) {
        let due = epoch_ms_now() + self.pay_timeout.as_millis() as u64;
        for order in orders {
            // The writer only stops with the runtime: nothing to do then.
            let _ = self.due.send((due, order.get()));
        }
    }

    /// Claims up to `limit` orders whose deadline has come.
    pub async fn claim(&self, limit: usize) -> redis::RedisResult<Vec<OrderId>> {
        let claimed: Vec<i64> = CLAIM
            .key(&self.key)
            .arg(epoch_ms_now())
            .arg(CLAIM_LEASE.as_millis() as u64)
            .arg(limit)
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(claimed.into_iter().map(OrderId::new).collect())
    }

    /// Looks at `order` again in `after` (MySQL's clock says it is not due
    /// yet).
    pub async fn retry_in(&self, order: OrderId, after: Duration) -> redis::RedisResult<()> {
        let due = epoch_ms_now() + after.as_millis() as u64;
        redis::cmd("ZADD")
            .arg(&self.key)
            .arg("XX")
            .arg(due)
            .arg(order.get())
            .query_async(&mut self.redis.clone())
            .await
    }

    /// `order` is settled (paid, closed, gone): it has no deadline any more.
    pub async fn settled(&self, order: OrderId) -> redis::RedisResult<()> {
        self.redis.clone().zrem(&self.key, order.get()).await
    }
}

/// Writes the due times queued on `queued` to the sorted set `key`, what
/// queued up during the previous write in one `ZADD`.
async fn write_due_times(
    mut redis: RedisConnection,
    key: String,
    mut queued: mpsc::UnboundedReceiver<(u64, i64)>,
) {
    let mut due = Vec::with_capacity(WRITTEN_AT_ONCE);
    while queued.recv_many(&mut due, WRITTEN_AT_ONCE).await > 0 {
        if let Err(error) = redis.zadd_multiple::<_, _, _, ()>(&key, &due).await {
            tracing::warn!(%error, orders = due.len(),
                "payment deadlines not stored in Redis; the sweep closes these orders");
        }
        due.clear();
    }
}
