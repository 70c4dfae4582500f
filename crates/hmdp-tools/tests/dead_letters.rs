//! `hmdp dead-letters list|replay`, run as commands on dead letters in the
//! consumer's own format: a malformed entry, an order that can be written,
//! an order whose buyer already holds another, an order written already.

mod common;

use hmdp::keys::Keys;
use hmdp_test_support::Tables;
use redis::AsyncCommands;

use common::{hmdp, seckill_voucher_in_mysql};

async fn orders_of(tables: &Tables<'_>, user: u64) -> Vec<i64> {
    tables.order_ids_of_user(user).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_and_replayed_once_or_left_listed_with_the_reason() {
    let sandbox = common::sandbox().await;
    let store = sandbox.store(2).unwrap();
    let tables = Tables::of(store.pool());
    let voucher = seckill_voucher_in_mysql(&store, 10).await;
    let voucher_text = voucher.to_string();
    // User 6 holds an order already; so does order 93's user 7.
    for (id, user) in [(90_i64, 6_u64), (93, 7)] {
        tables.insert_order(id, user, voucher).await.unwrap();
    }
    tables.add_stock(voucher, -2).await.unwrap();

    let keys = Keys::new(sandbox.redis.prefix.clone());
    let mut redis = common::redis().await;
    let mut letters = Vec::new();
    for (id, user, reason) in [
        ("1", "abc", "field `userId` is not a positive id: \"abc\""),
        (
            "91",
            "5",
            "delivered 3 times without being written (limit 2): no stock left in MySQL",
        ),
        (
            "92",
            "6",
            "delivered 3 times without being written (limit 2): no stock left in MySQL",
        ),
        (
            "93",
            "7",
            "delivered 3 times without being written (limit 2): no stock left in MySQL",
        ),
    ] {
        let letter: String = redis
            .xadd(
                keys.single().dead_letters(),
                "*",
                &[
                    ("id", id),
                    ("userId", user),
                    ("voucherId", &voucher_text),
                    ("entry", "1-0"),
                    ("deliveries", "3"),
                    ("reason", reason),
                ],
            )
            .await
            .unwrap();
        let _: () = redis
            .hset(keys.single().pending(), id, format!("{user}:{voucher}"))
            .await
            .unwrap();
        letters.push(letter);
    }

    let (code, out) = hmdp(&sandbox, &["dead-letters", "list"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("4 dead letter(s)"), "{out}");
    assert!(
        out.contains(&format!(
            "{}  malformed (field `userId` is not a positive id",
            letters[0]
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "{}  order 91 of user 5, voucher {voucher}",
            letters[1]
        )),
        "{out}"
    );
    assert!(out.contains("reason: delivered 3 times"), "{out}");

    // Malformed: nothing to write, left listed.
    let (code, out) = hmdp(&sandbox, &["dead-letters", "replay", &letters[0]]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("not written, left listed: malformed entry"),
        "{out}"
    );

    // A writable order: written, once, and the letter and its pending order go.
    let (code, out) = hmdp(&sandbox, &["dead-letters", "replay", &letters[1]]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("written: order 91 of user 5"), "{out}");
    assert_eq!(orders_of(&tables, 5).await, [91]);
    let stock = tables.stock(voucher).await.unwrap();
    assert_eq!(stock, 7);
    let pending: bool = redis.hexists(keys.single().pending(), 91).await.unwrap();
    assert!(!pending);
    let (code, out) = hmdp(&sandbox, &["dead-letters", "replay", &letters[1]]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no dead letter"), "{out}");

    // A buyer who holds another order: refused, left listed.
    let (code, out) = hmdp(&sandbox, &["dead-letters", "replay", &letters[2]]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("user 6 already holds another order of voucher"),
        "{out}"
    );
    assert_eq!(orders_of(&tables, 6).await, [90]);

    // Written already (by a consumer, or an earlier replay): removed only.
    let (code, out) = hmdp(&sandbox, &["dead-letters", "replay", "--all"]);
    assert_eq!(code, 1, "two letters are still refused: {out}");
    assert!(
        out.contains("already written: order 93 is in MySQL"),
        "{out}"
    );
    assert!(
        out.contains("3 dead letter(s) tried: 1 settled, 2 left listed; 2 dead letter(s) in all"),
        "{out}"
    );
    assert_eq!(orders_of(&tables, 7).await, [93]);

    let (code, out) = hmdp(&sandbox, &["dead-letters", "list"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 dead letter(s)"), "{out}");
}
