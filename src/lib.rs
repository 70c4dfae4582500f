//! hmdp-rs: the Heima Dianping flash-sale backend, with a gallery of
//! distributed locks that each fail (or hold) the way the course shows. The
//! tools that exercise it (lab, demo, load generator, benchmarks) live in
//! `hmdp-tools`, on top of this library; the node's own binary is
//! `hmdp-server` (`src/main.rs`).

pub mod after_sale;
pub mod api;
pub mod auth;
pub mod cache;
pub mod config;
pub mod contract;
pub mod error;
pub mod id_worker;
pub mod idempotency;
pub mod ids;
pub mod keys;
pub mod limits;
pub mod metrics;
pub mod overload;
pub mod redis_handle;
pub mod seckill;
pub mod settings_file;
pub mod shards;
pub mod startup;
pub mod store;
pub mod telemetry;
