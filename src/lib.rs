//! hmdp-rs: the Heima Dianping flash-sale backend, with a gallery of
//! distributed locks that each fail (or hold) the way the course shows.

/// hmdp's HTTP API: routes, handlers, the `Result` body.
pub mod api;
/// Login codes, Redis sessions, the user and admin guards.
pub mod auth;
/// `bench-lock` and `bench-db`: the lock and the transaction measured alone.
pub mod bench;
/// Two nodes and nginx as local child processes; `hmdp demo`, `hmdp cluster`.
pub mod cluster;
/// Flags, environment and defaults of every command.
pub mod config;
/// The crate-wide error and its HTTP mapping.
pub mod error;
/// hmdp's Redis id worker.
pub mod id_worker;
/// Typed ids of users, vouchers and orders, parsed at the edge.
pub mod ids;
/// Every Redis key, in one place.
pub mod keys;
/// Deterministic reproductions of the course's lock failures.
pub mod lab;
/// The load generator and the bulk login behind `hmdp tokens`.
pub mod loadtest;
/// Prometheus metrics.
pub mod metrics;
/// Private redis-server processes for the lab and fault tests.
pub mod redis_server;
/// The purchase use case.
pub mod seckill;
/// Wiring a node together.
pub mod startup;
/// All SQL.
pub mod store;
/// Log set-up.
pub mod telemetry;
