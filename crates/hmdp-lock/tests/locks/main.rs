//! Lock tests against the machine's real Redis: the contract every mode
//! keeps, and each mode's own promises. One binary.

mod cluster;
mod connection;
mod contract;
mod fencing;
mod helpers;
mod proxy;
mod quorum;
mod reentrant;
