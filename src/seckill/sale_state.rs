//! The asynchronous purchase's state in Redis (keys in `keys.rs`): each
//! seckill voucher's sale (stock, initial stock, window), its buyers, and
//! the orders admitted but not yet written.
//!
//! MySQL stays the source a sale is loaded from: `lua/seckill_load.lua`
//! writes a voucher's hash and buyers only if the hash is absent, in one
//! call, so nodes loading the same voucher at once agree, a sale already
//! running in Redis is never reset, and a Redis restarted empty is filled
//! again from MySQL at the next node start or purchase. A sale carries its
//! voucher's sale token: one left by an earlier voucher of the same id (a
//! database reset or restored while Redis kept its keys) is replaced, not
//! sold from.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::{Local, NaiveDateTime, TimeZone};
use hmdp_lock::Connection as RedisConnection;
use redis::{AsyncCommands, Script};
use serde::Serialize;

use crate::error::Error;
use crate::ids::{OrderId, UserId, VoucherId};
use crate::keys::Keys;
use crate::metrics;
use crate::store::{NewOrder, SaleSnapshot, Store};

static LOAD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/seckill_load.lua")));
static READMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/seckill_readmit.lua")));

/// What `lua/seckill_readmit.lua` did with an order about to be committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readmit {
    /// Redis had lost it: counted again in the reloaded sale.
    Counted,
    /// Redis never lost it.
    Pending,
    /// No sale in Redis: the reload, after the commit, counts it.
    NoSale,
    /// Its buyer was admitted again after the reload, with another order.
    UserAgain,
    /// No unit left: the reloaded sale sold it to a later buyer.
    NoUnit,
}

impl Readmit {
    /// Whether the order may be committed: its unit and buyer are its own
    /// in Redis, or will be once the sale is reloaded.
    pub fn may_commit(self) -> bool {
        matches!(self, Readmit::Counted | Readmit::Pending | Readmit::NoSale)
    }
}

/// A voucher's sale as Redis holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSale {
    /// Stock when the sale was loaded, orders already written included.
    pub initial: i64,
    /// Stock left to admit.
    pub stock: i64,
    /// The sale window, Unix epoch milliseconds.
    pub begin_ms: i64,
    pub end_ms: i64,
    /// Users admitted, ascending.
    pub buyers: Vec<UserId>,
}

/// An order admitted and not yet written, as `GET /voucher-order/{id}`
/// shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingOrder {
    pub id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
    /// Always `true`: what tells a client this order is not written yet
    /// (a written order has no such field).
    pending: bool,
}

/// What `lua/seckill_load.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Put {
    /// This very sale was there: nothing written.
    Kept,
    Loaded,
    /// Another token's sale was there: replaced.
    Replaced,
}

/// Sales, buyers and pending orders in Redis.
pub struct SaleState {
    pub(super) redis: RedisConnection,
    pub(super) keys: Keys,
    store: Store,
    /// Loads of one voucher run one at a time: after a Redis restart every
    /// purchase of a hot voucher finds it missing at once, and only the
    /// first should read its buyers from MySQL; the others find it loaded.
    /// Other vouchers' loads do not wait for it. One entry per voucher that
    /// exists in MySQL (a load is asked for no other).
    loading: Mutex<HashMap<VoucherId, Arc<tokio::sync::Mutex<()>>>>,
}

impl SaleState {
    pub fn new(redis: RedisConnection, keys: Keys, store: Store) -> Self {
        SaleState {
            redis,
            keys,
            store,
            loading: Mutex::new(HashMap::new()),
        }
    }

    /// Loads every seckill voucher of MySQL that Redis lacks (a node
    /// starting in `queue` or `stream` mode); returns how many it loaded.
    pub async fn load_missing(&self) -> Result<usize, Error> {
        let mut loaded = 0;
        for voucher_id in self.store.seckill_voucher_ids().await? {
            loaded += usize::from(self.load(voucher_id).await?);
        }
        Ok(loaded)
    }

    /// Loads one voucher's sale from MySQL unless Redis has this very sale
    /// (same sale token); `true` when this call loaded it, or replaced an
    /// earlier voucher's sale under the same id (logged and counted),
    /// `false` when it was there or MySQL has no such seckill voucher.
    ///
    /// A sale loaded before (Redis lost it) may have orders admitted before
    /// the loss still in writers' hands: it admits nobody for the backend
    /// timeout, the longest such a writer takes to reach the voucher's
    /// stock row and count its orders again (`lua/seckill_readmit.lua`), so
    /// that no unit they hold goes to a later buyer. A sale loaded for the
    /// first time admits at once.
    ///
    /// Gives up (503) after the backend timeout, the wait for another
    /// load of the same voucher included: a frozen MySQL must not hold the
    /// purchases waiting on it for ever.
    pub async fn load(&self, voucher_id: VoucherId) -> Result<bool, Error> {
        let deadline = self.store.backend_timeout();
        tokio::time::timeout(deadline, self.load_now(voucher_id))
            .await
            .map_err(|_| {
                super::over_budget(&format!("loading voucher {voucher_id}'s sale"), deadline)
            })?
    }

    async fn load_now(&self, voucher_id: VoucherId) -> Result<bool, Error> {
        let voucher_loads = self
            .loading
            .lock()
            .expect("sale loads poisoned")
            .entry(voucher_id)
            .or_default()
            .clone();
        let _one_at_a_time = voucher_loads.lock().await;
        // Checked first so that a sale already in Redis costs no read of
        // its buyers; the script checks again, for other nodes.
        let Some(row) = self.store.seckill_voucher(voucher_id).await? else {
            return Ok(false);
        };
        if self.token(voucher_id).await? == Some(row.sale_token) {
            return Ok(false);
        }
        let Some((tx, sale)) = self.store.lock_sale(voucher_id).await? else {
            return Ok(false);
        };
        // Stored while the stock row is held: see `Store::lock_sale`.
        let opens_in = if sale.loaded_before {
            self.store.backend_timeout()
        } else {
            Duration::ZERO
        };
        // Stored and committed in a task of its own: a load given up on at
        // its deadline must not end the transaction, and free the stock row
        // for a close whose give-back would then miss this sale, while its
        // write to Redis is still on its way.
        let (redis, keys) = (self.redis.clone(), self.keys.clone());
        let stored = tokio::spawn(async move {
            let put = put(redis, &keys, voucher_id, &sale, opens_in).await?;
            tx.commit().await?;
            Ok::<_, Error>((put, sale))
        });
        let (put, sale) = stored.await.map_err(|failed| {
            Error::Internal(anyhow::Error::new(failed).context("the sale's load task failed"))
        })??;
        match put {
            Put::Kept => {}
            Put::Loaded => {
                tracing::info!(%voucher_id, initial = sale.initial(), stock = sale.stock,
                buyers = sale.buyers.len(), "seckill sale loaded into Redis from MySQL")
            }
            Put::Replaced => {
                metrics::STALE_SALES_REPLACED.inc();
                tracing::warn!(%voucher_id, initial = sale.initial(), stock = sale.stock,
                    "Redis held an earlier voucher's sale under this id (the database was reset \
                     or restored): replaced with this voucher's");
            }
        }
        Ok(put != Put::Kept)
    }

    /// The sale token of the voucher's sale in Redis: `None` when Redis has
    /// no sale for it, 0 for a sale stored without one.
    async fn token(&self, voucher_id: VoucherId) -> Result<Option<u64>, Error> {
        let (exists, token): (bool, Option<u64>) = redis::pipe()
            .exists(self.keys.seckill_voucher(voucher_id))
            .hget(self.keys.seckill_voucher(voucher_id), "token")
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(exists.then_some(token.unwrap_or(0)))
    }

    /// Removes a voucher: its rows and orders from MySQL, then its sale and
    /// buyers from Redis (a node that loads meanwhile finds it gone in MySQL).
    pub async fn delete_voucher(&self, voucher_id: VoucherId) -> Result<(), Error> {
        self.store.delete_voucher(voucher_id).await?;
        let keys = [
            self.keys.seckill_voucher(voucher_id),
            self.keys.seckill_buyers(voucher_id),
            self.keys.seckill_given_back(voucher_id),
        ];
        self.redis.clone().del::<_, ()>(&keys).await?;
        Ok(())
    }

    /// The voucher's sale as Redis has it, `None` when Redis has none.
    pub async fn read(&self, voucher_id: VoucherId) -> Result<Option<RedisSale>, Error> {
        let (fields, mut buyers): (Vec<Option<i64>>, Vec<u64>) = redis::pipe()
            .cmd("HMGET")
            .arg(self.keys.seckill_voucher(voucher_id))
            .arg(&["initial", "stock", "begin_ms", "end_ms"])
            .smembers(self.keys.seckill_buyers(voucher_id))
            .query_async(&mut self.redis.clone())
            .await?;
        let [Some(initial), Some(stock), Some(begin_ms), Some(end_ms)] = fields[..] else {
            return Ok(None);
        };
        buyers.sort_unstable();
        Ok(Some(RedisSale {
            initial,
            stock,
            begin_ms,
            end_ms,
            buyers: buyers.into_iter().map(UserId::new).collect(),
        }))
    }

    /// The order if it is admitted, not yet written, and `user_id`'s.
    pub async fn pending_order(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<PendingOrder>, Error> {
        let entry: Option<String> = self
            .redis
            .clone()
            .hget(self.keys.pending_orders(), order_id.get())
            .await?;
        let Some(entry) = entry else {
            return Ok(None);
        };
        let order = pending_entry(order_id, &entry)?;
        Ok((order.user_id == user_id).then_some(PendingOrder {
            id: order_id,
            user_id,
            voucher_id: order.voucher_id,
            pending: true,
        }))
    }

    /// Of `orders`, those not in the pending hash: Redis lost them (their
    /// writer read them before it restarted empty).
    pub async fn not_pending(&self, orders: &[NewOrder]) -> Result<Vec<NewOrder>, Error> {
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = orders.iter().map(|order| order.id.get()).collect();
        let found: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(self.keys.pending_orders())
            .arg(&ids)
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(orders
            .iter()
            .zip(found)
            .filter(|(_, found)| found.is_none())
            .map(|(order, _)| *order)
            .collect())
    }

    /// Counts `order`, which Redis lost, again in its voucher's sale (see
    /// `lua/seckill_readmit.lua`); run while its writer holds the stock row.
    pub async fn readmit(&self, order: NewOrder, append_to_stream: bool) -> Result<Readmit, Error> {
        let code: i64 = READMIT
            .key(self.keys.seckill_voucher(order.voucher_id))
            .key(self.keys.seckill_buyers(order.voucher_id))
            .key(self.keys.pending_orders())
            .key(self.keys.order_stream())
            .arg(order.id.get())
            .arg(order.user_id.get())
            .arg(order.voucher_id.get())
            .arg(u8::from(append_to_stream))
            .invoke_async(&mut self.redis.clone())
            .await?;
        match code {
            0 => Ok(Readmit::Counted),
            1 => Ok(Readmit::Pending),
            2 => Ok(Readmit::NoSale),
            3 => Ok(Readmit::UserAgain),
            4 => Ok(Readmit::NoUnit),
            other => Err(Error::Internal(anyhow::anyhow!(
                "lua/seckill_readmit.lua answered {other}"
            ))),
        }
    }

    /// Marks orders as written (or as never to be written): they leave the
    /// pending hash.
    pub async fn forget_pending(&self, order_ids: &[OrderId]) -> Result<(), Error> {
        let ids: Vec<i64> = order_ids.iter().map(|id| id.get()).collect();
        self.redis
            .clone()
            .hdel::<_, _, ()>(self.keys.pending_orders(), ids)
            .await?;
        Ok(())
    }
}

/// A sale time as Redis compares it: the wall-clock time MySQL holds, in
/// this node's time zone (the zone the synchronous purchase compares it in),
/// as Unix epoch milliseconds. A time that the zone skips (a daylight-saving
/// gap) is read as UTC rather than refused; zones without one (China's)
/// never get there.
fn epoch_ms(at: NaiveDateTime) -> i64 {
    Local.from_local_datetime(&at).earliest().map_or_else(
        || at.and_utc().timestamp_millis(),
        |at| at.timestamp_millis(),
    )
}

/// Writes `sale` into Redis unless this very sale is there
/// (`lua/seckill_load.lua`).
async fn put(
    mut redis: RedisConnection,
    keys: &Keys,
    voucher_id: VoucherId,
    sale: &SaleSnapshot,
    opens_in: Duration,
) -> Result<Put, Error> {
    let mut load = LOAD.prepare_invoke();
    load.key(keys.seckill_voucher(voucher_id))
        .key(keys.seckill_buyers(voucher_id))
        .key(keys.seckill_given_back(voucher_id))
        .arg(sale.initial())
        .arg(sale.stock)
        .arg(epoch_ms(sale.begin_time))
        .arg(epoch_ms(sale.end_time))
        .arg(sale.token)
        .arg(opens_in.as_millis() as u64)
        .arg(sale.buyers.len());
    for buyer in &sale.buyers {
        load.arg(buyer.get());
    }
    for order in &sale.given_back {
        load.arg(order.get());
    }
    let put: i64 = load.invoke_async(&mut redis).await?;
    Ok(match put {
        0 => Put::Kept,
        1 => Put::Loaded,
        _ => Put::Replaced,
    })
}

/// The order the pending orders hash holds under `order_id`, as the
/// admission script writes it: `<userId>:<voucherId>`.
pub(super) fn pending_entry(order_id: OrderId, entry: &str) -> Result<NewOrder, Error> {
    entry
        .split_once(':')
        .and_then(|(user, voucher)| Some((user.parse().ok()?, voucher.parse().ok()?)))
        .map(|(user, voucher)| NewOrder {
            id: order_id,
            user_id: UserId::new(user),
            voucher_id: VoucherId::new(voucher),
        })
        .ok_or_else(|| {
            Error::Internal(anyhow::anyhow!(
                "pending order {order_id} holds {entry:?}, not userId:voucherId"
            ))
        })
}
