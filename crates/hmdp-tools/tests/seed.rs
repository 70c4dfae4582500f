//! `hmdp seed`: sample shop categories, shops and one seckill voucher a shop,
//! the same rows however often it runs, and a seeded voucher that sells.

use std::path::PathBuf;
use std::time::Duration;

use hmdp::config::RedisSettings;
use hmdp::keys::Keys;
use hmdp::store::Store;
use hmdp_test_support::{mysql_server_url, redis_url, wait_until, Tables};
use hmdp_tools::loadtest::tokens::Login;
use hmdp_tools::nodes::node::Node;
use hmdp_tools::nodes::{NodesSpec, Sandbox};
use serde_json::Value;

/// Runs `hmdp seed` on the sandbox's database; what it printed.
fn seed(sandbox: &Sandbox) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hmdp"))
        .args(["seed", "--database-url", &sandbox.database.url])
        .env("RUST_LOG", "warn")
        .output()
        .expect("hmdp runs");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// `SELECT COUNT(*)` of each seeded table.
async fn seeded_counts(store: &Store) -> [i64; 4] {
    Tables::of(store.pool()).seeded_rows().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeding_twice_leaves_the_same_rows_and_a_seeded_voucher_sells_in_stream_mode() {
    let sandbox = Sandbox::create(&mysql_server_url(), &RedisSettings::at(redis_url()), "test")
        .await
        .expect("MySQL is reachable (scripts/services.sh starts it)");
    let store = sandbox.store(1).unwrap();

    let first = seed(&sandbox);
    let after_first = seeded_counts(&store).await;
    let second = seed(&sandbox);

    assert_eq!(seeded_counts(&store).await, after_first);
    let [types, shops, vouchers, seckill] = after_first;
    assert!(types >= 10 && shops >= 30, "{after_first:?}");
    assert_eq!(
        (vouchers, seckill),
        (shops, shops),
        "one seckill voucher a shop"
    );
    assert!(
        first.contains(&format!("({shops} created, 0 already there)")),
        "{first}"
    );
    assert!(
        second.contains(&format!("(0 created, {shops} already there)")),
        "{second}"
    );
    assert_eq!(second.lines().count(), 1, "{second}");

    // What the front end does next: a category, a shop, its voucher, a purchase.
    let spec = NodesSpec::in_sandbox(PathBuf::from(env!("CARGO_BIN_EXE_hmdp")), &sandbox);
    let log = tempfile::NamedTempFile::new().unwrap();
    let flags = ["--seckill=stream".to_owned()];
    let mut node = Node::start_on_a_free_port("seeded", log.path().to_owned(), &spec, &flags)
        .await
        .unwrap_or_else(|error| panic!("the node did not start: {error:#}"));
    let client = reqwest::Client::new();
    let get = |path: String| {
        let client = client.clone();
        let url = format!("{}{path}", node.url());
        async move {
            client
                .get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let category = get("/shop/of/type?typeId=1&current=1".into()).await;
    let shop_id = category["data"][0]["id"].as_u64().expect("a shop");
    assert_eq!(get(format!("/shop/{shop_id}")).await["success"], true);
    let listed = get(format!("/voucher/list/{shop_id}")).await;
    let voucher: i64 = listed["data"][0]["id"].as_str().unwrap().parse().unwrap();
    let redis =
        hmdp::config::connect_redis(&sandbox.redis.redis_url, Duration::from_secs(10)).unwrap();
    let login = Login::new(
        client.clone(),
        &node.url(),
        redis,
        Keys::new(sandbox.redis.prefix.clone()),
    );
    let token = login
        .users(0, 1, 1)
        .await
        .expect("a user logs in")
        .remove(0);
    let purchase = || {
        client
            .post(format!("{}/voucher-order/seckill/{voucher}", node.url()))
            .header("authorization", &token)
            .send()
    };

    let bought: Value = purchase().await.unwrap().json().await.unwrap();
    let again: Value = purchase().await.unwrap().json().await.unwrap();

    assert_eq!(bought["success"], true, "{bought}");
    assert_eq!(again["errorCode"], "ALREADY_ORDERED", "{again}");
    let orders = || async {
        (Tables::of(store.pool()))
            .orders_of_voucher(voucher)
            .await
            .unwrap()
    };
    wait_until("the order written", Duration::from_secs(20), || async {
        orders().await == 1
    })
    .await;
    node.kill().await;
}
