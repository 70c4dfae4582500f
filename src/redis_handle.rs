//! The node's Redis handle: one connection (a reconnecting one per thread,
//! or one to a Redis Cluster) that every part of the product shares, the
//! purchase's lock included. Named here once, so that the product says what
//! it uses rather than where that comes from.

/// A shared connection to the node's Redis: cloned freely, commands
/// multiplexed on one socket per thread (or per cluster master).
pub type RedisConnection = hmdp_lock::Connection;
