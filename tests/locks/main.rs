//! Lock tests against the machine's real Redis: the contract every mode
//! keeps, and the lab's verdict for each scenario and mode. One binary.

mod contract;
mod fencing;
mod helpers;
mod lab;
mod proxy;
mod quorum;
mod reentrant;
