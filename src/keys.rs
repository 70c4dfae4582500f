//! Every Redis key the service writes, in hmdp's layout, behind one optional
//! prefix so that deployments and test runs sharing a Redis stay apart.
//!
//! The keys of the asynchronous purchase share one hash tag, `{seckill}`:
//! the admission script touches a voucher's hash, its buyers, the order
//! stream, the pending orders and its id sequence in one call, which a Redis Cluster allows
//! only within one slot. (A hot sale is one voucher, hence one slot, anyway.)

use crate::ids::{ShopId, UserId, VoucherId};

/// Builds Redis keys.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys {
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `login:code:{phone}`: the login code sent to a phone (TTL 2 min).
    /// The braces are in the key: a phone's code keys are written together
    /// (a pipeline, lua/check_code.lua), so on a Redis Cluster they must
    /// share a slot, and the hash tag `{phone}` puts them in one.
    pub fn login_code(&self, phone: &str) -> String {
        format!("{}login:code:{{{phone}}}", self.prefix)
    }

    /// `login:code:limit:{phone}`: present while the phone may not ask for
    /// another code.
    pub fn login_code_limit(&self, phone: &str) -> String {
        format!("{}login:code:limit:{{{phone}}}", self.prefix)
    }

    /// `login:code:fail:{phone}`: wrong guesses of the current code.
    pub fn login_code_failures(&self, phone: &str) -> String {
        format!("{}login:code:fail:{{{phone}}}", self.prefix)
    }

    /// `login:token:{token}`: the session hash (TTL 30 min, refreshed).
    pub fn login_token(&self, token: &str) -> String {
        format!("{}login:token:{token}", self.prefix)
    }

    /// `load:sessions`: hash phone → token of the sessions the load tools
    /// (`hmdp tokens`, `hmdp loadtest`) opened, so that a run started again
    /// reuses the ones still alive instead of asking for login codes a phone
    /// gets once a minute. The nodes never read it.
    pub fn load_sessions(&self) -> String {
        format!("{}load:sessions", self.prefix)
    }

    /// `lock:order:{userId}`: the per-user purchase lock.
    pub fn order_lock(&self, user_id: UserId) -> String {
        format!("{}lock:order:{user_id}", self.prefix)
    }

    /// `cache:shop:{shopId}`: a shop as JSON (TTL 30 min and a jitter), or
    /// `""` for an id MySQL does not have (TTL 2 min).
    pub fn cached_shop(&self, shop_id: ShopId) -> String {
        format!("{}cache:shop:{shop_id}", self.prefix)
    }

    /// `lock:shop:{shopId}`: held by the one reader rebuilding that shop's
    /// cache entry.
    pub fn shop_rebuild_lock(&self, shop_id: ShopId) -> String {
        format!("{}lock:shop:{shop_id}", self.prefix)
    }

    /// `cache:type`: every shop category as a JSON list (hmdp's key).
    pub fn cached_shop_types(&self) -> String {
        format!("{}cache:type", self.prefix)
    }

    /// `lock:type`: held by the one reader rebuilding `cache:type`.
    pub fn shop_types_rebuild_lock(&self) -> String {
        format!("{}lock:type", self.prefix)
    }

    /// `icr:order:{yyyy:MM:dd}`: the id worker's per-day counter.
    pub fn id_counter(&self, business: &str, day: &str) -> String {
        format!("{}icr:{business}:{day}", self.prefix)
    }

    /// `{seckill}:voucher:{voucherId}`: a sale admitted in Redis, a hash of
    /// `initial` (stock when the sale was loaded, orders included), `stock`
    /// (left), `begin_ms` and `end_ms` (the window, Unix epoch milliseconds).
    pub fn seckill_voucher(&self, voucher_id: VoucherId) -> String {
        format!("{}{{seckill}}:voucher:{voucher_id}", self.prefix)
    }

    /// `{seckill}:buyers:{voucherId}`: the set of user ids admitted.
    pub fn seckill_buyers(&self, voucher_id: VoucherId) -> String {
        format!("{}{{seckill}}:buyers:{voucher_id}", self.prefix)
    }

    /// `{seckill}:given-back:{voucherId}`: the closed orders whose unit and
    /// buyer's turn went back to the sale (`lua/giveback.lua`), so that a
    /// give-back sent twice counts once.
    pub fn seckill_given_back(&self, voucher_id: VoucherId) -> String {
        format!("{}{{seckill}}:given-back:{voucher_id}", self.prefix)
    }

    /// `{seckill}:due`: unpaid orders by their payment deadline (a sorted
    /// set, score in Unix epoch milliseconds), claimed by the nodes' closers.
    pub fn pay_deadlines(&self) -> String {
        format!("{}{{seckill}}:due", self.prefix)
    }

    /// `{seckill}:idempotency:{userId}:{key}`: the answer to a purchase
    /// request sent with an `Idempotency-Key` header. In the `{seckill}`
    /// slot: the admission script (`queue`, `stream`) keeps it itself.
    pub fn idempotency(&self, user_id: UserId, key: &str) -> String {
        format!("{}{{seckill}}:idempotency:{user_id}:{key}", self.prefix)
    }

    /// `{seckill}:orders`: the stream of admitted orders (fields `id`,
    /// `userId`, `voucherId`) that the consumer group writes to MySQL. Every
    /// key of the asynchronous path carries the hash tag `{seckill}`, so a
    /// script touching several of them stays in one Redis Cluster slot.
    pub fn order_stream(&self) -> String {
        format!("{}{{seckill}}:orders", self.prefix)
    }

    /// `{seckill}:orders:dead`: orders the consumers gave up on, with the
    /// entry's fields plus `entry`, `deliveries` and `reason`.
    pub fn dead_letters(&self) -> String {
        format!("{}{{seckill}}:orders:dead", self.prefix)
    }

    /// `{seckill}:icr:order`: the sequence of the order ids the admission
    /// script draws (never reset: unlike the id worker's daily counter, it
    /// lives in the script's slot, and a day's key would have to be named
    /// before the script reads Redis's clock).
    pub fn admission_sequence(&self) -> String {
        format!("{}{{seckill}}:icr:order", self.prefix)
    }

    /// `{seckill}:pending`: hash order id → `<userId>:<voucherId>` of orders
    /// admitted and not yet written to MySQL.
    pub fn pending_orders(&self) -> String {
        format!("{}{{seckill}}:pending", self.prefix)
    }

    /// `{seckill}:attempt:<attempt>`: the order id one admission attempt was
    /// answered with, kept for a while (`seckill/admission.rs`), so that the
    /// same attempt sent again (a cluster connection re-sends a request whose
    /// reply it lost) is answered with it.
    pub fn admission_attempt(&self, attempt: u128) -> String {
        format!("{}{{seckill}}:attempt:{attempt:032x}", self.prefix)
    }
}
