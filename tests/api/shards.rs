//! Sales split into shards on a private three-master Redis Cluster: the
//! shards land evenly on the masters, one order per user holds across
//! shards under two nodes' storms, every unit sells (the buyers' shard
//! empty or not), and a node killed while it moves stock between shards
//! loses no unit and doubles none. On the machine's Redis: a cancelled
//! order's unit goes back to its shard, and a unit its receiving shard
//! cannot take ages on `hmdp_stock_transit_oldest_seconds` until it is
//! delivered.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::future::join_all;
use hmdp::config::SeckillMode;
use hmdp::ids::{UserId, VoucherId};
use hmdp::seckill::{STALE_AFTER, SWEEP_EVERY};
use hmdp::shards::{slot, Layout};
use hmdp_lock::LockMode;
use hmdp_test_support::{wait_for, wait_until, RedisCluster};
use redis::AsyncCommands;
use serde_json::Value;

use crate::helpers::{buy_at, metric, spawn_app, NodeProcess, TestApp};

const SHARDS: u16 = 6;

/// A node in `stream` mode on `cluster`, creating six-shard sales.
async fn sharded_app(cluster: &RedisCluster) -> TestApp {
    spawn_app(|s| {
        s.store.redis.url = cluster.url();
        s.seckill = SeckillMode::Stream;
        s.seckill_shards = SHARDS;
        s.lock.mode = LockMode::Reentrant;
    })
    .await
}

/// A second node, a process of its own, on the same cluster and database.
async fn second_node(app: &TestApp, cluster: &RedisCluster, extra: &[&str]) -> NodeProcess {
    let redis = format!("--redis-url={}", cluster.url());
    let shards = format!("--seckill-shards={SHARDS}");
    let mut flags = vec!["--seckill=stream", "--lock=reentrant", &redis, &shards];
    flags.extend(extra);
    NodeProcess::start(app, &flags).await
}

/// Users logged in with their ids.
async fn users(app: &TestApp, n: usize) -> Vec<(UserId, String)> {
    let tokens = app.login_many(n).await;
    join_all(tokens.into_iter().map(|token| async move {
        let id = app.user_id(&token).await;
        (id, token)
    }))
    .await
}

/// The order id a success answer carries.
fn order_of(answer: &Value) -> Option<i64> {
    (answer["success"] == true).then(|| answer["data"].as_str().unwrap().parse().unwrap())
}

/// Waits until every success answer is an order of its user in MySQL, the
/// sale balances there, and Redis holds no unit, none in transit, and a
/// buyer per order.
async fn every_success_written(app: &TestApp, voucher: VoucherId, told: &HashMap<UserId, i64>) {
    let sold = told.len() as i64;
    wait_until("the orders written", Duration::from_secs(30), || async {
        app.audit(voucher).await.active_orders >= sold
    })
    .await;
    let audit = app.audit(voucher).await;
    assert_eq!(audit.active_orders, sold, "{audit:?}");
    assert_eq!(audit.duplicate_users, 0, "{audit:?}");
    assert_eq!(audit.stock_left, 0, "{audit:?}");
    for (user, order) in told {
        let owner = app.tables().active_buyer(*order).await.unwrap();
        assert_eq!(owner, Some(user.get()), "order {order} told to user {user}");
    }
    let sale = app.redis_sale(voucher).await.expect("the sale in Redis");
    assert_eq!((sale.stock, sale.in_transit), (0, 0), "{sale:?}");
    assert_eq!(sale.buyers.len() as i64, sold, "{sale:?}");
    assert_eq!(sale.initial, sold, "{sale:?}");
    for shard in &sale.shards {
        assert_eq!(
            shard.stock + shard.buyers,
            shard.initial + shard.received - shard.lent,
            "{shard:?}"
        );
    }
}

/// The port of the master serving `slot`, from `CLUSTER SLOTS`.
async fn master_of(cluster: &RedisCluster, slot: u16) -> u16 {
    let mut redis = cluster.servers()[0].connect().await.unwrap();
    let ranges: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<Vec<redis::Value>>(&mut redis)
        .await
        .unwrap()
        .into_iter()
        .map(|range| {
            let redis::Value::Array(fields) = range else {
                panic!("a CLUSTER SLOTS range: {range:?}")
            };
            let low: u16 = redis::from_redis_value_ref(&fields[0]).unwrap();
            let high: u16 = redis::from_redis_value_ref(&fields[1]).unwrap();
            let redis::Value::Array(master) = &fields[2] else {
                panic!("a master: {:?}", fields[2])
            };
            let host: String = redis::from_redis_value_ref(&master[0]).unwrap();
            let port: u16 = redis::from_redis_value_ref(&master[1]).unwrap();
            (low, high, (host, port))
        })
        .collect();
    ranges
        .into_iter()
        .find(|(low, high, _)| (*low..=*high).contains(&slot))
        .map(|(_, _, (_, port))| port)
        .expect("every slot served")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_storming_a_six_shard_sale_sell_each_unit_once_and_one_per_user() {
    let cluster = RedisCluster::start().await.expect("a Redis Cluster starts");
    let layout = Layout::new(SHARDS.into()).unwrap();
    let mut per_master: HashMap<u16, usize> = HashMap::new();
    for shard in layout.shards() {
        *per_master
            .entry(master_of(&cluster, slot(shard.tag())).await)
            .or_default() += 1;
    }
    assert_eq!(
        per_master.values().copied().collect::<Vec<_>>(),
        [2, 2, 2],
        "two shards on each master: {per_master:?}"
    );

    let app = sharded_app(&cluster).await;
    let other = second_node(&app, &cluster, &[]).await;
    const STOCK: i64 = 90;
    let voucher = app.create_open_seckill(STOCK).await;
    let buyers = users(&app, 240).await;

    // Every buyer twice at once, once at each node.
    let answers = join_all(buyers.iter().map(|(user, token)| async {
        let (here, there) = tokio::join!(
            buy_at(&app.address, voucher, token),
            buy_at(&other.address, voucher, token)
        );
        (*user, [here, there])
    }))
    .await;
    let mut told = HashMap::new();
    for (user, answers) in &answers {
        let orders: Vec<i64> = answers.iter().filter_map(order_of).collect();
        assert!(
            orders.len() <= 1,
            "user {user} told success twice: {answers:?}"
        );
        for answer in answers.iter().filter(|answer| order_of(answer).is_none()) {
            let code = answer["errorCode"].as_str().unwrap_or("?");
            assert!(
                ["SOLD_OUT", "ALREADY_ORDERED"].contains(&code),
                "user {user}: {answer}"
            );
        }
        if let Some(order) = orders.first() {
            told.insert(*user, *order);
        }
    }
    assert_eq!(told.len() as i64, STOCK, "every unit sold, once");
    every_success_written(&app, voucher, &told).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buyers_who_all_hash_to_one_shard_buy_every_unit_of_every_shard() {
    let cluster = RedisCluster::start().await.expect("a Redis Cluster starts");
    let app = sharded_app(&cluster).await;
    const STOCK: i64 = 30;
    let voucher = app.create_open_seckill(STOCK).await;
    let layout = Layout::new(SHARDS.into()).unwrap();
    // Forty users of one shard (ids are consecutive: one in six).
    let buyers: Vec<_> = (users(&app, 6 * 40).await.into_iter())
        .filter(|(user, _)| layout.position_of(*user) == 0)
        .collect();
    assert_eq!(buyers.len(), 40);

    let answers = join_all(
        buyers
            .iter()
            .map(|(user, token)| async { (*user, buy_at(&app.address, voucher, token).await) }),
    )
    .await;
    let told: HashMap<_, _> = (answers.iter())
        .filter_map(|(user, answer)| order_of(answer).map(|order| (*user, order)))
        .collect();
    assert_eq!(told.len() as i64, STOCK, "{answers:?}");
    for (user, answer) in &answers {
        if !told.contains_key(user) {
            assert_eq!(answer["errorCode"], "SOLD_OUT", "user {user}: {answer}");
        }
    }
    every_success_written(&app, voucher, &told).await;
    let sale = app.redis_sale(voucher).await.unwrap();
    assert!(
        sale.shards[1..]
            .iter()
            .all(|shard| shard.buyers == 0 && shard.lent > 0),
        "every other shard lent its units to the buyers' shard: {sale:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_while_moving_stock_between_shards_loses_no_unit_and_doubles_none() {
    let cluster = RedisCluster::start().await.expect("a Redis Cluster starts");
    let app = sharded_app(&cluster).await;
    // Its moves stop between the lend and the receive for a minute.
    let mut paused = second_node(&app, &cluster, &["--chaos-move-pause-ms=60000"]).await;
    const STOCK: i64 = 12;
    let voucher = app.create_open_seckill(STOCK).await;
    let layout = Layout::new(SHARDS.into()).unwrap();
    let everyone = users(&app, 6 * 8).await;
    let (first_shard, others): (Vec<_>, Vec<_>) =
        (everyone.into_iter()).partition(|(user, _)| layout.position_of(*user) == 0);

    // The first shard's two units, sold by the healthy node.
    let mut told = HashMap::new();
    for (user, token) in &first_shard[..2] {
        let answer = buy_at(&app.address, voucher, token).await;
        told.insert(*user, order_of(&answer).expect("a unit of its own shard"));
    }
    // A third buyer of the first shard at the paused node: it lends units
    // of another shard and stops; it is killed there.
    let (stranded_user, stranded_token) = first_shard[2].clone();
    let address = paused.address.clone();
    let token = stranded_token.clone();
    let cut_short = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{address}/voucher-order/seckill/{voucher}"))
            .header("authorization", token)
            .send()
            .await
    });
    wait_until(
        "units lent and not received",
        Duration::from_secs(10),
        || async {
            app.redis_sale(voucher)
                .await
                .is_some_and(|sale| sale.in_transit > 0)
        },
    )
    .await;
    paused.kill().await;
    assert!(
        cut_short.await.unwrap().is_err(),
        "the killed node answered nothing"
    );

    // Within the bound, the live node delivers what the dead one lent.
    // The bound, and room for a busy machine.
    let bound = STALE_AFTER + SWEEP_EVERY + Duration::from_secs(12);
    wait_until("the stranded units delivered", bound, || async {
        app.redis_sale(voucher)
            .await
            .is_some_and(|sale| sale.in_transit == 0)
    })
    .await;
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!(sale.stock + sale.buyers.len() as i64, STOCK, "{sale:?}");

    // And every unit still sells, once: the buyer cut short among them.
    let rest: Vec<_> = std::iter::once((stranded_user, stranded_token))
        .chain(first_shard[3..].iter().cloned())
        .chain(others)
        .collect();
    let answers = join_all(
        rest.iter()
            .map(|(user, token)| async { (*user, buy_at(&app.address, voucher, token).await) }),
    )
    .await;
    told.extend(
        (answers.iter()).filter_map(|(user, answer)| order_of(answer).map(|order| (*user, order))),
    );
    let users: HashSet<_> = told.keys().collect();
    assert_eq!(users.len(), told.len());
    assert_eq!(told.len() as i64, STOCK, "{answers:?}");
    every_success_written(&app, voucher, &told).await;
}

/// One shard of a sale lost (its master restarted empty, say) while the
/// other shards' orders are in their writers' hands: the next purchase
/// loads the whole sale again from MySQL, the orders in flight are counted
/// again in their shards, and every unit sells once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_lost_while_orders_are_in_flight_reloads_the_sale_and_sells_each_unit_once() {
    const STOCK: i64 = 8;
    let redis = hmdp_test_support::RedisServer::start().await.unwrap();
    let app = spawn_app(|s| {
        s.store.redis.url = redis.url();
        s.seckill = SeckillMode::Stream;
        s.seckill_shards = 4;
        // Every writer stays in its transaction 3 s, before its INSERT.
        s.chaos_hold_ms = 3000;
        s.store.timeout.backend_timeout_ms = 8000;
    })
    .await;
    let voucher = app.create_open_seckill(STOCK).await;
    let layout = Layout::new(4).unwrap();
    let everyone = users(&app, 16).await;
    let mut told = HashMap::new();
    for (user, token) in &everyone[..4] {
        let answer = buy_at(&app.address, voucher, token).await;
        told.insert(*user, order_of(&answer).expect("admitted"));
    }
    wait_until(
        "the orders in their writer's hands",
        Duration::from_secs(20),
        || async { !app.lock_keys().await.is_empty() },
    )
    .await;

    let lost = app.keys().shard(layout.shard(2)).voucher(voucher);
    let buyers = app.keys().shard(layout.shard(2)).buyers(voucher);
    let _: () = redis::cmd("DEL")
        .arg(&[lost, buyers])
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();

    // Everyone tries (again), retrying while the reloaded sale has not
    // opened; a buyer of the lost shard first, whose purchase reloads it. (A
    // buyer admitted between the loss and the reload is counted again by its
    // writer the same way, as long as it reaches its commit within the hold.)
    let mut everyone = everyone;
    let first = (everyone.iter().skip(4))
        .position(|(user, _)| layout.position_of(*user) == 2)
        .expect("a buyer of the lost shard");
    everyone.swap(0, first + 4);
    for (user, token) in &everyone {
        let answer = std::sync::Mutex::new(Value::Null);
        wait_until("a final answer", Duration::from_secs(30), || async {
            let now = buy_at(&app.address, voucher, token).await;
            let settled = now["errorCode"] != "UNAVAILABLE";
            *answer.lock().unwrap() = now;
            settled
        })
        .await;
        let answer = answer.into_inner().unwrap();
        match (told.get(user), order_of(&answer)) {
            // As in hmdp, a sale sold out says so before it looks at the buyer.
            (Some(_), None) => assert!(
                ["ALREADY_ORDERED", "SOLD_OUT"].contains(&answer["errorCode"].as_str().unwrap()),
                "{answer}"
            ),
            (Some(first), Some(again)) => panic!("user {user} told {first} and {again}"),
            (None, Some(order)) => {
                told.insert(*user, order);
            }
            (None, None) => assert_eq!(answer["errorCode"], "SOLD_OUT", "{answer}"),
        }
    }
    assert_eq!(told.len() as i64, STOCK);
    every_success_written(&app, voucher, &told).await;
}

/// A cancelled order of a sharded sale gives its unit back to the shard
/// that sold it, once; a buyer of another shard, refused while the sale was
/// sold out, then buys that unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_order_gives_its_unit_back_to_its_shard_and_a_buyer_of_another_buys_it() {
    const STOCK: i64 = 4;
    let app = spawn_app(|s| {
        s.seckill = SeckillMode::Stream;
        s.seckill_shards = 4;
    })
    .await;
    let voucher = app.create_open_seckill(STOCK).await;
    let layout = Layout::new(4).unwrap();
    let everyone = users(&app, 20).await;
    let of_shard = |position| {
        everyone
            .iter()
            .filter(move |(user, _)| layout.position_of(*user) == position)
    };
    // Every unit sold to buyers of shard 0, the other shards lending theirs.
    let mut told = HashMap::new();
    for (user, token) in of_shard(0).take(STOCK as usize) {
        let answer = buy_at(&app.address, voucher, token).await;
        told.insert(*user, order_of(&answer).expect("a unit"));
    }
    let (late, late_token) = of_shard(3).next().unwrap().clone();
    let refused = buy_at(&app.address, voucher, &late_token).await;
    assert_eq!(refused["errorCode"], "SOLD_OUT", "{refused}");

    let (canceller, canceller_token) = of_shard(0).next().unwrap();
    wait_until("the order written", Duration::from_secs(20), || async {
        app.audit(voucher).await.active_orders == STOCK
    })
    .await;
    let order = told.remove(canceller).unwrap();
    for _ in 0..2 {
        let cancelled = app
            .post_json(
                &format!("/voucher-order/{order}/cancel"),
                Some(canceller_token),
            )
            .await;
        assert_eq!(cancelled["success"], true, "{cancelled}");
    }
    wait_until(
        "the unit back in shard 0",
        Duration::from_secs(10),
        || async {
            app.redis_sale(voucher)
                .await
                .is_some_and(|sale| sale.shards[0].stock == 1)
        },
    )
    .await;

    let bought = buy_at(&app.address, voucher, &late_token).await;
    told.insert(late, order_of(&bought).expect("the unit given back"));
    wait_until("the orders written", Duration::from_secs(20), || async {
        app.audit(voucher).await.active_orders == STOCK
    })
    .await;
    let audit = app.audit(voucher).await;
    assert_eq!(
        (audit.closed_orders, audit.stock_left, audit.duplicate_users),
        (1, 0, 0)
    );
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!(
        (sale.stock, sale.in_transit, sale.buyers.len()),
        (0, 0, 4),
        "{sale:?}"
    );
    for shard in &sale.shards {
        assert_eq!(
            shard.stock + shard.buyers,
            shard.initial + shard.received - shard.lent
        );
    }
}

/// Units lent between shards whose receiving shard fails every receive:
/// the sweeping node's `hmdp_stock_transit_oldest_seconds` climbs past the
/// bound a stranded unit is delivered within, and drops back to 0 once the
/// receive succeeds and the units are settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_unit_in_transit_ages_on_the_gauge_until_it_is_delivered() {
    const STOCK: i64 = 4;
    const WAIT: Duration = Duration::from_secs(30);
    let app = spawn_app(|s| {
        s.seckill = SeckillMode::Stream;
        s.seckill_shards = 2;
    })
    .await;
    // The gauge is read off a node in a process of its own (the nodes of
    // every test in this process set one registry's gauges), whose moves
    // stop for a minute between the lend and the receive.
    let node = NodeProcess::start(&app, &["--seckill=stream", "--chaos-move-pause-ms=60000"]).await;
    let oldest = "hmdp_stock_transit_oldest_seconds";
    assert_eq!(metric(&node.address, oldest).await, 0.0);
    let voucher = app.create_open_seckill(STOCK).await;
    let layout = Layout::new(2).unwrap();
    let (first_shard, _): (Vec<_>, Vec<_>) =
        (users(&app, 16).await.into_iter()).partition(|(user, _)| layout.position_of(*user) == 0);
    // The first shard's two units, sold.
    for (_, token) in &first_shard[..2] {
        let answer = buy_at(&app.address, voucher, token).await;
        assert!(order_of(&answer).is_some(), "{answer}");
    }
    // The first shard fails every receive: its received set is no set.
    let received = app.keys().shard(layout.shard(0)).received(voucher);
    (app.redis.clone())
        .set::<_, _, ()>(&received, "no set")
        .await
        .unwrap();

    // A third buyer of the first shard, at the node: a unit of the second
    // is lent and stops there, and no sweep can deliver it.
    let address = node.address.clone();
    let token = first_shard[2].1.clone();
    let stopped_mover = tokio::spawn(async move { buy_at(&address, voucher, &token).await });
    let bound = (STALE_AFTER + SWEEP_EVERY).as_secs_f64();
    let stranded_for = wait_for("the unit in transit past the bound", WAIT, || async {
        let age = metric(&node.address, oldest).await;
        (age > bound).then_some(age)
    })
    .await;
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!(sale.in_transit, 1, "{stranded_for} s: {sale:?}");

    // The receive works again: a sweep delivers the unit.
    (app.redis.clone()).del::<_, ()>(&received).await.unwrap();
    wait_until("the gauge back to 0", WAIT, || async {
        metric(&node.address, oldest).await == 0.0
    })
    .await;
    let sale = app.redis_sale(voucher).await.unwrap();
    assert_eq!(
        (sale.in_transit, sale.shards[0].stock, sale.shards[1].stock),
        (0, 1, 1),
        "{sale:?}"
    );
    stopped_mover.abort();
}
