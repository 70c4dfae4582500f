//! What the purchase knows about a voucher before it takes the lock, kept in
//! memory: a flash sale hits one voucher thousands of times a second, and
//! its sale window never changes once created.
//!
//! Stock is the one moving part. The cache only remembers that a voucher
//! *sold out* — stock never grows again (there is no restocking API) — so a
//! sold-out voucher is refused without touching MySQL. While stock remains,
//! the transaction's `stock > 0` update stays the source of truth.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use chrono::NaiveDateTime;

use crate::store::Store;

/// A seckill voucher as the pre-checks see it.
#[derive(Debug)]
pub struct SaleInfo {
    pub begin_time: NaiveDateTime,
    pub end_time: NaiveDateTime,
    sold_out: AtomicBool,
}

impl SaleInfo {
    pub fn is_sold_out(&self) -> bool {
        self.sold_out.load(Ordering::Relaxed)
    }

    /// Records that the last unit is gone; stock never comes back.
    pub fn mark_sold_out(&self) {
        self.sold_out.store(true, Ordering::Relaxed);
    }
}

/// Seckill vouchers read once from MySQL. Only vouchers that exist are
/// kept, so the map is bounded by the vouchers an admin created.
pub struct Catalog {
    store: Store,
    vouchers: RwLock<HashMap<i64, Arc<SaleInfo>>>,
}

impl Catalog {
    pub fn new(store: Store) -> Self {
        Catalog {
            store,
            vouchers: RwLock::new(HashMap::new()),
        }
    }

    /// The voucher's sale info, `None` when no such seckill voucher exists.
    pub async fn sale(&self, voucher_id: i64) -> Result<Option<Arc<SaleInfo>>, sqlx::Error> {
        if let Some(info) = self.cached(voucher_id) {
            return Ok(Some(info));
        }
        let Some(row) = self.store.seckill_voucher(voucher_id).await? else {
            return Ok(None);
        };
        let info = Arc::new(SaleInfo {
            begin_time: row.begin_time,
            end_time: row.end_time,
            sold_out: AtomicBool::new(row.stock < 1),
        });
        let mut vouchers = self.vouchers.write().expect("catalog poisoned");
        Ok(Some(vouchers.entry(voucher_id).or_insert(info).clone()))
    }

    fn cached(&self, voucher_id: i64) -> Option<Arc<SaleInfo>> {
        let vouchers = self.vouchers.read().expect("catalog poisoned");
        vouchers.get(&voucher_id).cloned()
    }
}
