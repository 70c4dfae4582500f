//! The batch statements of the purchase transaction, whose length follows
//! the batch's, prepare nothing: a node that has written batches of every
//! size keeps no statement per size, and so never closes one in front of
//! its next packet (where, without `TCP_NODELAY`, that packet would wait
//! for MySQL's delayed ACK).

use std::collections::BTreeMap;
use std::time::Duration;

use hmdp::ids::{OrderId, UserId, VoucherId};
use hmdp::store::{self, Lookup, NewOrder, Store};
use hmdp_test_support::{MariaDbServer, Tables, TestDatabase};

/// The server's count of a statement command (`Com_stmt_prepare`, ...),
/// read as text, itself no prepared statement.
async fn com(store: &Store, name: &str) -> u64 {
    Tables::of(store.pool()).global_status(name).await.unwrap()
}

#[tokio::test]
async fn batches_of_every_size_prepare_no_statement_and_close_none() {
    // A server of the test's own: its counters count this test alone.
    let server = MariaDbServer::start_with(&[])
        .await
        .expect("a private mariadbd starts (scripts/services.sh installs it)");
    let database = TestDatabase::create(&server.url(), "batch_sql")
        .await
        .unwrap();
    let store = Store::connect_lazy(&database.url, 1, Duration::from_secs(10)).unwrap();
    store.migrate().await.unwrap();
    let voucher = VoucherId::new(7);
    let (prepared, closed) = (
        com(&store, "Com_stmt_prepare").await,
        com(&store, "Com_stmt_close").await,
    );

    // More sizes than sqlx's statement cache holds (100 a connection).
    let mut next_id = 1;
    for size in 1..=150_i64 {
        let orders: Vec<NewOrder> = (0..size)
            .map(|i| {
                next_id += 1;
                NewOrder::unsequenced(
                    OrderId::new(next_id),
                    UserId::new((size * 1000 + i) as u64),
                    voucher,
                )
            })
            .collect();
        let ids: Vec<OrderId> = orders.iter().map(|order| order.id).collect();
        let users: Vec<UserId> = orders.iter().map(|order| order.user_id).collect();
        let mut tx = store.begin().await.unwrap();
        // Voucher 7 has no stock row: its units are short, every order
        // inserted all the same.
        let short = store::insert_orders_taking_stock(&mut tx, &orders)
            .await
            .unwrap();
        assert_eq!(short, vec![(voucher, size as u32)]);
        let lookup = Lookup {
            ids: ids.clone(),
            users: BTreeMap::from([(voucher, users.clone())]),
        };
        let found = store::look_up(&mut tx, &lookup).await.unwrap();
        assert_eq!(found.written, orders);
        let holders = users.iter().map(|user| (*user, voucher)).collect();
        assert_eq!(found.holders, holders);
        store::delete_orders(&mut tx, &ids[1..]).await.unwrap();
        tx.commit().await.unwrap();
    }

    assert_eq!(com(&store, "Com_stmt_prepare").await, prepared);
    assert_eq!(com(&store, "Com_stmt_close").await, closed);
    let left = Tables::of(store.pool()).all_orders().await.unwrap();
    assert_eq!(left, 150, "the first order of each batch kept");
}
