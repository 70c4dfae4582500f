//! What the purchase knows about a voucher before it takes the lock, kept in
//! memory: a flash sale hits one voucher thousands of times a second, and
//! its sale window never changes once created.
//!
//! Stock is the one moving part. The cache remembers that a voucher *sold
//! out*, so that the storm after the last unit is refused without touching
//! MySQL or Redis. While stock remains, the transaction's `stock > 0` update
//! (or the admission script) stays the source of truth. Stock comes back
//! when an unpaid order is cancelled or closed: the node that gave the unit
//! back forgets the sold-out at once ([`Catalog::stock_returned`]), and
//! tells the other nodes (`sale_news.rs`), as a node that sees a sale sell
//! out does; a node that missed the news learns it when it reads the
//! voucher again, within [`REREAD_AFTER`].
//!
//! A voucher is read again from MySQL every [`REREAD_AFTER`], by one
//! purchase while the others go on with what was read: a database reset or
//! restored behind the nodes' back hands the id to another voucher (another
//! sale token), which this node then learns within that bound.
//!
//! An id that names no seckill voucher is remembered as missing for a
//! moment, so that a flood of purchases of made-up ids (a scanner, a
//! front end polling too early) does not reach MySQL every time. A voucher
//! created meanwhile becomes buyable on this node that moment later.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::{Local, NaiveDateTime};

use super::sale_state::layout_of;
use crate::error::{Error, Rejection};
use crate::ids::VoucherId;
use crate::metrics;
use crate::shards::Layout;
use crate::store::{SaleFence, Store};

/// A seckill voucher as the pre-checks see it.
#[derive(Debug)]
pub struct SaleInfo {
    begin_time: NaiveDateTime,
    end_time: NaiveDateTime,
    sold_out: AtomicBool,
    /// The voucher's sale token: its Redis sale must carry the same.
    token: u64,
    /// How its sale is split into shards in Redis.
    layout: Layout,
    /// Its shards' fences as MySQL had them when read.
    fence: SaleFence,
    read_at: Instant,
    /// Set by the one purchase that reads the voucher again.
    rereading: AtomicBool,
}

impl SaleInfo {
    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Its shards' fences as MySQL had them when read (`store/sale_fence.rs`).
    pub fn fence(&self) -> &SaleFence {
        &self.fence
    }

    pub fn is_sold_out(&self) -> bool {
        self.sold_out.load(Ordering::Relaxed)
    }

    /// Records that the last unit is gone, until a unit comes back; `true`
    /// if this node did not know it yet.
    pub fn mark_sold_out(&self) -> bool {
        !self.sold_out.swap(true, Ordering::Relaxed)
    }

    /// Why a purchase at `now` (this node's clock) is refused before any
    /// lock or script, in hmdp's order: not started, ended, sold out (as
    /// far as this node saw). `None`: on sale.
    pub fn refusal_at(&self, now: NaiveDateTime) -> Option<Rejection> {
        if now < self.begin_time {
            Some(Rejection::NotStarted)
        } else if now > self.end_time {
            Some(Rejection::Ended)
        } else if self.is_sold_out() {
            Some(Rejection::SoldOut)
        } else {
            None
        }
    }
}

/// How long a voucher read from MySQL is used before it is read again.
const REREAD_AFTER: Duration = Duration::from_secs(5);

/// How long an id found missing is answered as missing without MySQL.
const MISSING_FOR: Duration = Duration::from_secs(2);
/// At most this many missing ids are remembered: the ids are the client's
/// choice, so the map must not grow with them.
const MAX_MISSING: usize = 10_000;

/// Seckill vouchers read once from MySQL. Vouchers that exist are kept for
/// good, so that map is bounded by the vouchers an admin created.
pub struct Catalog {
    store: Store,
    vouchers: RwLock<HashMap<VoucherId, Arc<SaleInfo>>>,
    /// Ids found missing, with when they were looked up.
    missing: Mutex<HashMap<VoucherId, Instant>>,
    /// The shard layouts the sales use, and when they were read: where an
    /// Idempotency-Key of an admitted purchase may live.
    layouts: Mutex<Option<(Instant, Vec<Layout>)>>,
    /// The turn to read a voucher not known yet, per voucher while its
    /// purchases wait for it or read.
    first_reads: Mutex<HashMap<VoucherId, Arc<tokio::sync::Mutex<()>>>>,
}

/// A purchase's turn to read a voucher not known yet: when it ends (the
/// voucher read, found missing or found read already; an error; the wait
/// given up midway), the turn is forgotten unless a newer one took its
/// place, so that the map does not grow with every id read or found
/// missing.
struct Turn<'a> {
    catalog: &'a Catalog,
    voucher_id: VoucherId,
    turn: &'a Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Ok(mut reads) = self.catalog.first_reads.lock() {
            if reads
                .get(&self.voucher_id)
                .is_some_and(|turn| Arc::ptr_eq(turn, self.turn))
            {
                reads.remove(&self.voucher_id);
            }
        }
    }
}

impl Catalog {
    pub fn new(store: Store) -> Self {
        Catalog {
            store,
            vouchers: RwLock::new(HashMap::new()),
            missing: Mutex::new(HashMap::new()),
            layouts: Mutex::new(None),
            first_reads: Mutex::new(HashMap::new()),
        }
    }

    /// The shard layouts the seckill sales use, read from MySQL at most
    /// every [`REREAD_AFTER`]: a voucher of a new shard count shows within
    /// that bound.
    pub async fn layouts_in_use(&self) -> Result<Vec<Layout>, Error> {
        {
            let layouts = self.layouts.lock().expect("layouts poisoned");
            if let Some((read_at, layouts)) = layouts.as_ref() {
                if read_at.elapsed() < REREAD_AFTER {
                    return Ok(layouts.clone());
                }
            }
        }
        let counts = self.store.sale_shard_counts().await?;
        let layouts = (counts.into_iter())
            .map(layout_of)
            .collect::<Result<Vec<_>, _>>()?;
        *self.layouts.lock().expect("layouts poisoned") = Some((Instant::now(), layouts.clone()));
        Ok(layouts)
    }

    /// The voucher's sale info, `None` when no such seckill voucher exists.
    /// Its read of MySQL gives up (503) after the backend timeout.
    pub async fn sale(&self, voucher_id: VoucherId) -> Result<Option<Arc<SaleInfo>>, Error> {
        if let Some(info) = self.cached(voucher_id) {
            let due = info.read_at.elapsed() >= REREAD_AFTER;
            if !due || info.rereading.swap(true, Ordering::Relaxed) {
                return Ok(Some(info));
            }
            // This purchase reads it again; should MySQL fail, the others
            // went on with what was read, and so does this one.
            return match self.read(voucher_id, Some(&info)).await {
                Ok(read) => Ok(read),
                Err(error) => {
                    info.rereading.store(false, Ordering::Relaxed);
                    tracing::warn!(%voucher_id, ?error, "voucher not read again; using what was read");
                    Ok(Some(info))
                }
            };
        }
        if self.recently_missing(voucher_id) {
            return Ok(None);
        }
        self.read_first(voucher_id).await
    }

    /// The first read of a voucher on this node, one purchase at a time:
    /// those that waited their turn find it read. The wait and the read
    /// give up (503) together after the backend timeout, so that with
    /// MySQL stuck every waiting purchase is answered then, not one
    /// timeout after another.
    async fn read_first(&self, voucher_id: VoucherId) -> Result<Option<Arc<SaleInfo>>, Error> {
        let deadline = self.store.backend_timeout();
        let turn = {
            let mut reads = self.first_reads.lock().expect("catalog poisoned");
            reads.entry(voucher_id).or_default().clone()
        };
        let read = async {
            let _one_at_a_time = turn.lock().await;
            let _turn_ends = Turn {
                catalog: self,
                voucher_id,
                turn: &turn,
            };
            if let Some(info) = self.cached(voucher_id) {
                return Ok(Some(info));
            }
            if self.recently_missing(voucher_id) {
                return Ok(None);
            }
            self.read(voucher_id, None).await
        };
        tokio::time::timeout(deadline, read)
            .await
            .map_err(|_| Error::over_budget(&format!("reading voucher {voucher_id}"), deadline))?
    }

    /// Reads the voucher from MySQL into the catalog, replacing `known`.
    /// MySQL's stock says whether it is sold out: a unit given back by a
    /// closed order on any node shows there.
    async fn read(
        &self,
        voucher_id: VoucherId,
        known: Option<&SaleInfo>,
    ) -> Result<Option<Arc<SaleInfo>>, Error> {
        let deadline = self.store.backend_timeout();
        metrics::VOUCHER_READS.inc();
        let row = tokio::time::timeout(deadline, self.store.seckill_voucher(voucher_id))
            .await
            .map_err(|_| {
                Error::over_budget(&format!("reading voucher {voucher_id}"), deadline)
            })??;
        let Some(row) = row else {
            self.forget(voucher_id);
            self.remember_missing(voucher_id);
            return Ok(None);
        };
        let info = Arc::new(SaleInfo {
            begin_time: row.begin_time,
            end_time: row.end_time,
            sold_out: AtomicBool::new(row.stock < 1),
            token: row.sale_token,
            layout: super::sale_state::layout_of(row.shards)?,
            fence: SaleFence::parse(&row.sale_fence),
            read_at: Instant::now(),
            rereading: AtomicBool::new(false),
        });
        let mut vouchers = self.vouchers.write().expect("catalog poisoned");
        if known.is_some() {
            vouchers.insert(voucher_id, info.clone());
            return Ok(Some(info));
        }
        Ok(Some(vouchers.entry(voucher_id).or_insert(info).clone()))
    }

    /// Whether this node saw the voucher sell out, not longer ago than
    /// [`REREAD_AFTER`], and its sale is on by this node's clock (outside
    /// the window, a purchase is to hear that the sale has not started or
    /// has ended). Memory only: a voucher not read yet is not known to be
    /// sold out, and one due to be read again is asked about (a unit may
    /// have come back).
    pub fn sold_out_now(&self, voucher_id: VoucherId) -> bool {
        self.cached(voucher_id).is_some_and(|sale| {
            sale.read_at.elapsed() < REREAD_AFTER
                && sale.refusal_at(Local::now().naive_local()) == Some(Rejection::SoldOut)
        })
    }

    /// Another node saw the voucher sell out: so it is here too, if this
    /// node knows the voucher (one it never read learns it from MySQL).
    pub fn sold_out_elsewhere(&self, voucher_id: VoucherId) {
        if let Some(sale) = self.cached(voucher_id) {
            sale.mark_sold_out();
        }
    }

    /// A unit of the voucher came back on sale: it is not sold out.
    pub fn stock_returned(&self, voucher_id: VoucherId) {
        if let Some(sale) = self.cached(voucher_id) {
            sale.sold_out.store(false, Ordering::Relaxed);
        }
    }

    /// Drops what is known of the voucher, which is read again from MySQL
    /// next time: its id was reused by a newer voucher.
    pub fn forget(&self, voucher_id: VoucherId) {
        let mut vouchers = self.vouchers.write().expect("catalog poisoned");
        vouchers.remove(&voucher_id);
    }

    fn cached(&self, voucher_id: VoucherId) -> Option<Arc<SaleInfo>> {
        let vouchers = self.vouchers.read().expect("catalog poisoned");
        vouchers.get(&voucher_id).cloned()
    }

    fn recently_missing(&self, voucher_id: VoucherId) -> bool {
        let missing = self.missing.lock().expect("catalog poisoned");
        missing
            .get(&voucher_id)
            .is_some_and(|looked_up| looked_up.elapsed() < MISSING_FOR)
    }

    fn remember_missing(&self, voucher_id: VoucherId) {
        let mut missing = self.missing.lock().expect("catalog poisoned");
        if missing.len() >= MAX_MISSING {
            missing.retain(|_, looked_up| looked_up.elapsed() < MISSING_FOR);
            if missing.len() >= MAX_MISSING {
                // A flood of fresh ids: forget them all rather than grow.
                missing.clear();
            }
        }
        missing.insert(voucher_id, Instant::now());
    }
}
