//! What the command tests share: running `hmdp` against a sandbox, a
//! connection to the machine's Redis, and a seckill voucher put straight
//! into MySQL (a `sync` sale, or a database restored behind the nodes' back).
// Every test binary compiles this module and uses a part of it.
#![allow(dead_code)]

pub mod nodes;

use std::process::Command;

use hmdp::config::RedisSettings;
use hmdp::store::{NewSeckillVoucher, NewVoucher, Store};
use hmdp_test_support::{mysql_server_url, redis_url};
use hmdp_tools::nodes::Sandbox;

/// A sandbox of its own (a database on the machine's MySQL, a key prefix on
/// its Redis), removed when dropped.
pub async fn sandbox() -> Sandbox {
    Sandbox::create(
        &format!("{}/hmdp", mysql_server_url()),
        &RedisSettings::at(redis_url()),
        "test",
    )
    .await
    .expect("MySQL is reachable")
}

/// Runs `hmdp` with `args` against the sandbox's database and Redis
/// prefix; returns its exit code and its output (stdout, then stderr).
pub fn hmdp(sandbox: &Sandbox, args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_hmdp"))
        .args(args)
        .env("DATABASE_URL", &sandbox.database.url)
        .env("REDIS_URL", &sandbox.redis.redis_url)
        .env("HMDP_REDIS_PREFIX", &sandbox.redis.prefix)
        .output()
        .expect("hmdp runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    let out = stdout + &stderr;
    println!("$ hmdp {}\n{out}", args.join(" "));
    (output.status.code().expect("exited"), out)
}

/// Runs `hmdp` with `args` and `--json` to a file of its own, which must
/// succeed; returns its output and the JSON report it wrote.
pub fn hmdp_report(sandbox: &Sandbox, args: &[&str]) -> (String, serde_json::Value) {
    let json = tempfile::NamedTempFile::new().unwrap();
    let mut args = args.to_vec();
    args.extend(["--json", json.path().to_str().unwrap()]);
    let (code, out) = hmdp(sandbox, &args);
    assert_eq!(code, 0, "{out}");
    let report = serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap();
    (out, report)
}

/// A seckill voucher of `stock` on sale for the next hour, inserted in
/// MySQL without any node knowing; its id.
pub async fn seckill_voucher_in_mysql(store: &Store, stock: i32) -> i64 {
    store
        .insert_seckill_voucher(
            &NewVoucher::flash_sale("in MySQL only"),
            &NewSeckillVoucher::open_now(stock),
        )
        .await
        .unwrap()
        .get()
}

/// A connection to the Redis the sandboxes' prefixes live on, to read and
/// change what the nodes keep there.
pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}
