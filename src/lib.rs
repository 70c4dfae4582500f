//! hmdp-rs: the Heima Dianping flash-sale backend, with a gallery of
//! distributed locks that each fail (or hold) the way the course shows. The
//! tools that exercise it (lab, demo, load generator, benchmarks) live in
//! `hmdp-tools`, on top of this library; the node's own binary is
//! `hmdp-server` (`src/main.rs`).

/// The order's life after the sale: pay, cancel, use, the unpaid-order
/// timeout, and the unit given back.
pub mod after_sale;
/// hmdp's HTTP API: routes, handlers, the `Result` body.
pub mod api;
/// Login codes and Redis sessions.
pub mod auth;
/// The Redis cache of shops and shop categories in front of MySQL.
pub mod cache;
/// Flags, environment and defaults of every command.
pub mod config;
/// The crate-wide error (its HTTP answer is `api/response.rs`).
pub mod error;
/// hmdp's Redis id worker.
pub mod id_worker;
/// The answers to purchase requests sent with an `Idempotency-Key`.
pub mod idempotency;
/// Typed ids of users, shops, vouchers and orders, parsed at the edge.
pub mod ids;
/// Every Redis key, in one place.
pub mod keys;
/// Prometheus metrics.
pub mod metrics;
/// The purchase use case.
pub mod seckill;
/// A sale's shards: their hash tags, which buyer goes where, what an order
/// id says of its shard.
pub mod shards;
/// Wiring a node together, and its `serve` and `migrate`.
pub mod startup;
/// All SQL.
pub mod store;
/// Log set-up.
pub mod telemetry;
