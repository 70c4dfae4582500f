//! The tools around the hmdp product: the lab that reproduces the course's
//! lock failures, two nodes behind nginx for the demo and the soak, the load
//! generator, and the benchmarks. The product library (`hmdp`) knows none of
//! them.

pub mod audit;
pub mod bench;
pub mod dead_letters;
pub mod history;
pub mod lab;
pub mod latency;
pub mod loadtest;
pub mod nodes;
pub mod payers;
pub mod seed;
