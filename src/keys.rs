//! Every Redis key the service writes, in hmdp's layout, behind one optional
//! prefix so that deployments and test runs sharing a Redis stay apart.
//!
//! The keys of the asynchronous purchase live in a sale's shards
//! ([`ShardKeys`], `shards.rs`): each shard's keys share one hash
//! tag, since the admission script touches a voucher's hash, its buyers,
//! the order stream and the pending orders in one call,
//! which a Redis Cluster allows only within one slot. A one-shard sale's
//! tag is `{seckill}`.

use crate::ids::{ShopId, UserId, VoucherId};
use crate::shards::Shard;

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

    /// `sale:news`: the pub/sub channel on which the nodes tell each other
    /// that a sale sold out or got a unit back (`seckill/sale_news.rs`).
    pub fn sale_news(&self) -> String {
        format!("{}sale:news", self.prefix)
    }

    /// `limit:{rule}:{subject}`: a limit's allowance for one subject (a
    /// user, a client IP, a phone, or everyone), kept by `lua/gcra.lua`.
    pub fn limit(&self, rule: &str, subject: &str) -> String {
        format!("{}limit:{rule}:{subject}", self.prefix)
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

    /// `{seckill}:due`: unpaid orders by their payment deadline (a sorted
    /// set, score in Unix epoch milliseconds), claimed by the nodes' closers.
    pub fn pay_deadlines(&self) -> String {
        format!("{}{{seckill}}:due", self.prefix)
    }

    /// The keys of one shard of the asynchronous purchase.
    pub fn shard(&self, shard: Shard) -> ShardKeys<'_> {
        ShardKeys { keys: self, shard }
    }

    /// The keys of a one-shard sale, `{seckill}:…`.
    pub fn single(&self) -> ShardKeys<'_> {
        self.shard(Shard::SINGLE)
    }
}

/// The keys of one shard, each under the shard's hash tag (`{seckill}` for
/// a one-shard sale, written `{tag}` below).
#[derive(Debug, Clone, Copy)]
pub struct ShardKeys<'a> {
    keys: &'a Keys,
    shard: Shard,
}

impl ShardKeys<'_> {
    pub fn shard(&self) -> Shard {
        self.shard
    }

    fn key(&self, name: std::fmt::Arguments<'_>) -> String {
        format!("{}{{{}}}:{name}", self.keys.prefix, self.shard.tag())
    }

    /// `{tag}:voucher:{voucherId}`: the shard's part of a sale admitted in
    /// Redis, a hash of `initial` (its stock when the sale was loaded, orders
    /// included), `stock` (left), `begin_ms` and `end_ms` (the window, Unix
    /// epoch milliseconds), `token` (the voucher's sale token), `epoch` (the
    /// load it came from), `lent` / `received` (units moved out and in since),
    /// `moves` (how many) and `in_transit` (units lent, not yet settled).
    pub fn voucher(&self, voucher_id: VoucherId) -> String {
        self.key(format_args!("voucher:{voucher_id}"))
    }

    /// `{tag}:buyers:{voucherId}`: the set of user ids admitted.
    pub fn buyers(&self, voucher_id: VoucherId) -> String {
        self.key(format_args!("buyers:{voucher_id}"))
    }

    /// `{tag}:given-back:{voucherId}`: the closed orders whose unit and
    /// buyer's turn went back to the sale (`lua/giveback.lua`), so that a
    /// give-back sent twice counts once.
    pub fn given_back(&self, voucher_id: VoucherId) -> String {
        self.key(format_args!("given-back:{voucher_id}"))
    }

    /// `{tag}:received:{voucherId}`: the transfers of stock this shard
    /// received from the sale's other shards (`lua/shard_receive.lua`), so
    /// that a transfer received twice counts once.
    pub fn received(&self, voucher_id: VoucherId) -> String {
        self.key(format_args!("received:{voucher_id}"))
    }

    /// `{tag}:transit`: hash transfer id → `<voucherId>:<to>:<units>:<epoch>:<ms>`
    /// of the units this shard lent to another shard and has not yet seen
    /// arrive (`lua/shard_lend.lua`): `to` the receiving shard's table
    /// index, `ms` when it was lent (Redis's clock).
    pub fn transit(&self) -> String {
        self.key(format_args!("transit"))
    }

    /// `{tag}:idempotency:{userId}:{key}`: the answer to a purchase
    /// request sent with an `Idempotency-Key` header, in the buyer's shard:
    /// the admission script (`queue`, `stream`) keeps it itself.
    pub fn idempotency(&self, user_id: UserId, key: &str) -> String {
        self.key(format_args!("idempotency:{user_id}:{key}"))
    }

    /// `{tag}:orders`: the shard's stream of admitted orders (fields `id`,
    /// `userId`, `voucherId`, `seq`) that the consumer group writes to MySQL.
    pub fn orders(&self) -> String {
        self.key(format_args!("orders"))
    }

    /// `{tag}:orders:dead`: orders the consumers gave up on, with the
    /// entry's fields plus `entry`, `deliveries` and `reason`.
    pub fn dead_letters(&self) -> String {
        self.key(format_args!("orders:dead"))
    }

    /// `{tag}:pending`: hash order id → `<userId>:<voucherId>:<sequence>`
    /// of orders admitted and not yet written to MySQL (the admission's
    /// number in its shard, `sale_state/fence.rs`).
    pub fn pending(&self) -> String {
        self.key(format_args!("pending"))
    }

    /// `{tag}:attempt:<attempt>`: the order id one admission attempt was
    /// answered with, kept for a while (`seckill/sale_state/admission.rs`), so that the
    /// same attempt sent again (a cluster connection re-sends a request whose
    /// reply it lost) is answered with it.
    pub fn attempt(&self, attempt: u128) -> String {
        self.key(format_args!("attempt:{attempt:032x}"))
    }
}
