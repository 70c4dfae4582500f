//! HTTP API tests: one binary, one file per resource, against real MySQL and Redis.

mod admission;
mod after_sale;
mod bad_input;
mod batch_sql;
mod concurrency;
mod disconnects;
mod faults;
mod health;
mod helpers;
mod limits;
mod locks;
mod logs;
mod lost_reply;
mod queue;
mod redis_cluster;
mod redis_forgets;
mod shards;
mod shared_commits;
mod shop;
mod shutdown;
mod slow_body;
mod slow_mysql;
mod stream;
mod user;
mod voucher;
mod voucher_order;
