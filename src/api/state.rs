//! What every request handler may need, built once by `startup.rs` and shared
//! by all workers.

use std::sync::Arc;
use std::time::Duration;

use crate::after_sale::AfterSale;
use crate::auth::Sessions;
use crate::cache::ShopCache;
use crate::config::AdminToken;
use crate::limits::Limits;
use crate::overload::Overload;
use crate::redis_handle::RedisConnection;
use crate::seckill::Seckill;
use crate::store::Store;

/// Everything a request handler may need, shared by all workers.
pub struct AppState {
    pub node_id: String,
    pub store: Store,
    pub redis: RedisConnection,
    pub sessions: Sessions,
    /// The request limits every node shares.
    pub limits: Limits,
    /// The purchases in flight, and how many the node admits at once.
    pub overload: Overload,
    pub seckill: Arc<Seckill>,
    /// Pay, cancel, use and the unpaid-order timeout.
    pub after_sale: Arc<AfterSale>,
    /// Shops and shop categories, read through Redis.
    pub shops: ShopCache,
    pub admin_token: AdminToken,
    /// Upper bound on one backend call before answering 503.
    pub backend_timeout: Duration,
}
