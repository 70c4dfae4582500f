//! The tools around the hmdp product: the lab that reproduces the course's
//! lock failures, two nodes behind nginx for the demo and the soak, the load
//! generator, and the benchmarks. The product library (`hmdp`) knows none of
//! them.

/// `hmdp audit`: one voucher's sale reconciled between Redis and MySQL.
pub mod audit;
/// `bench-lock` and `bench-db`: the lock and the transaction measured alone.
pub mod bench;
/// Two nodes and nginx as local child processes; `hmdp demo`, `hmdp cluster`.
pub mod cluster;
/// `hmdp dead-letters`: the order stream's dead letters listed and replayed.
pub mod dead_letters;
/// A run's history as its clients saw it, and `hmdp check`, which judges
/// it against MySQL.
pub mod history;
/// Deterministic reproductions of the course's lock failures.
pub mod lab;
/// Latency percentiles, as the load test and the benchmarks report them.
pub mod latency;
/// The load generator and the bulk login behind `hmdp tokens`.
pub mod loadtest;
/// Buyers after the sale: pay, cancel, or leave the order to time out.
pub mod payers;
/// `hmdp seed`: sample shops, each with a seckill voucher, for the front end.
pub mod seed;
