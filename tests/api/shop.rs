//! The pages on the way to a flash sale: shop categories, a category's
//! shops, a shop (read through the Redis cache), a user's details, the
//! (empty) blog lists — their JSON as hmdp's front end reads it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use hmdp::cache::{ShopCache, ENTRY_TTL, ENTRY_TTL_JITTER, MISSING_TTL};
use hmdp::error::Error;
use hmdp::ids::ShopId;
use hmdp::store::{Shop, ShopType};
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::helpers::{phone, spawn_app, TestApp};

fn shop(id: u64, type_id: u64) -> Shop {
    Shop {
        id: ShopId::new(id),
        name: format!("测试店铺{id}"),
        type_id,
        images: format!("/imgs/shops/{id}/1.jpg,/imgs/shops/{id}/2.jpg"),
        area: Some("运河上街".into()),
        address: "台州路2号".into(),
        x: 120.149993,
        y: 30.334229,
        avg_price: Some(80),
        sold: 4215,
        comments: 3035,
        score: 37,
        open_hours: Some("10:00-22:00".into()),
        create_time: None,
        update_time: None,
    }
}

async fn save_shops(app: &TestApp, shops: impl IntoIterator<Item = Shop>) {
    for shop in shops {
        app.store.save_shop(&shop).await.unwrap();
    }
}

async fn rename_in_mysql(app: &TestApp, id: u64, name: &str) {
    app.tables().rename_shop(id, name).await.unwrap();
}

async fn ttl(app: &TestApp, key: &str) -> Duration {
    let seconds: i64 = app.redis.clone().ttl(key).await.unwrap();
    Duration::from_secs(u64::try_from(seconds).expect("a key with a TTL"))
}

/// The cache a node builds, on the test's Redis prefix and database,
/// waiting at most `wait` for another reader's rebuild.
fn shop_cache(app: &TestApp, wait: Duration) -> ShopCache {
    ShopCache::new(
        app.redis.clone(),
        &hmdp_test_support::redis_url(),
        app.keys(),
        app.store.clone(),
        wait,
    )
    .unwrap()
}

fn ids(body: &Value) -> Vec<u64> {
    body["data"]
        .as_array()
        .unwrap_or_else(|| panic!("a list: {body}"))
        .iter()
        .map(|shop| shop["id"].as_u64().expect("a numeric id"))
        .collect()
}

#[tokio::test]
async fn shop_types_are_listed_by_sort_with_the_fields_the_home_page_reads() {
    let app = spawn_app(|_| {}).await;
    for (id, name, sort) in [(1, "美食", 1), (4, "健身运动", 10), (10, "美睫·美甲", 4)] {
        let shop_type = ShopType {
            id,
            name: Some(name.into()),
            icon: Some(format!("/types/{id}.png")),
            sort: Some(sort),
            create_time: None,
            update_time: None,
        };
        app.store.save_shop_type(&shop_type).await.unwrap();
    }

    let body = app.get_json("/shop-type/list", None).await;

    assert_eq!(body["success"], true, "{body}");
    let types = body["data"].as_array().unwrap();
    let listed: Vec<(u64, &str, &str, u64)> = types
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap(),
                t["name"].as_str().unwrap(),
                t["icon"].as_str().unwrap(),
                t["sort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (1, "美食", "/types/1.png", 1),
            (10, "美睫·美甲", "/types/10.png", 4),
            (4, "健身运动", "/types/4.png", 10),
        ]
    );
}

#[tokio::test]
async fn no_categories_yet_are_cached_as_missing_not_as_an_empty_list() {
    let app = spawn_app(|_| {}).await;

    let body = app.get_json("/shop-type/list", None).await;

    assert_eq!(body, json!({"success": true, "data": []}));
    let key = app.keys().cached_shop_types();
    let cached: Option<String> = app.redis.clone().get(&key).await.unwrap();
    assert_eq!(cached.as_deref(), Some(""));
    assert!(ttl(&app, &key).await <= MISSING_TTL);
}

#[tokio::test]
async fn a_shop_has_hmdps_fields_with_its_images_as_one_string() {
    let app = spawn_app(|_| {}).await;
    save_shops(&app, [shop(1, 1)]).await;

    let body = app.get_json("/shop/1", None).await;

    assert_eq!(body["success"], true, "{body}");
    let data = &body["data"];
    assert_eq!(data["id"], 1, "a number: shop ids go into URLs as they are");
    assert_eq!(data["name"], "测试店铺1");
    assert_eq!(data["typeId"], 1);
    assert_eq!(data["images"], "/imgs/shops/1/1.jpg,/imgs/shops/1/2.jpg");
    assert_eq!(data["area"], "运河上街");
    assert_eq!(data["address"], "台州路2号");
    assert_eq!(data["x"], 120.149993);
    assert_eq!(data["y"], 30.334229);
    assert_eq!(data["avgPrice"], 80);
    assert_eq!(data["sold"], 4215);
    assert_eq!(data["comments"], 3035);
    assert_eq!(
        data["score"], 37,
        "stars times ten: the page divides by ten"
    );
    assert_eq!(data["openHours"], "10:00-22:00");
    assert!(data["createTime"].as_str().unwrap().contains('T'), "{data}");
    assert!(data.get("distance").is_none(), "null fields are left out");
}

#[tokio::test]
async fn an_unknown_shop_is_hmdps_answer_and_is_cached_as_missing() {
    let app = spawn_app(|_| {}).await;
    let key = app.keys().cached_shop(ShopId::new(999));

    let body = app.get_json("/shop/999", None).await;

    assert_eq!(
        body,
        json!({"success": false, "errorMsg": "店铺不存在！", "errorCode": "SHOP_NOT_FOUND"})
    );
    let marker: Option<String> = app.redis.clone().get(&key).await.unwrap();
    assert_eq!(marker.as_deref(), Some(""), "the missing marker");
    assert!(ttl(&app, &key).await <= MISSING_TTL);
    // While the marker lives, MySQL is not asked again.
    save_shops(&app, [shop(999, 1)]).await;
    assert_eq!(
        app.get_json("/shop/999", None).await["errorCode"],
        "SHOP_NOT_FOUND"
    );
    let _: () = app.redis.clone().del(&key).await.unwrap();
    assert_eq!(app.get_json("/shop/999", None).await["data"]["id"], 999);
}

#[tokio::test]
async fn a_cached_shop_is_served_from_redis_until_its_entry_goes() {
    let app = spawn_app(|_| {}).await;
    save_shops(&app, [shop(1, 1)]).await;
    let key = app.keys().cached_shop(ShopId::new(1));
    assert_eq!(
        app.get_json("/shop/1", None).await["data"]["name"],
        "测试店铺1"
    );
    let left = ttl(&app, &key).await;
    assert!(
        left > ENTRY_TTL - Duration::from_secs(60) && left <= ENTRY_TTL + ENTRY_TTL_JITTER,
        "{left:?}"
    );

    rename_in_mysql(&app, 1, "改名之后").await;
    assert_eq!(
        app.get_json("/shop/1", None).await["data"]["name"],
        "测试店铺1",
        "a hit does not read MySQL"
    );

    let _: () = app.redis.clone().del(&key).await.unwrap();
    assert_eq!(
        app.get_json("/shop/1", None).await["data"]["name"],
        "改名之后"
    );
}

#[tokio::test]
async fn concurrent_first_reads_of_a_cold_shop_rebuild_it_once() {
    let app = spawn_app(|_| {}).await;
    save_shops(&app, [shop(1, 1)]).await;
    let cache = Arc::new(shop_cache(&app, Duration::from_secs(5)));

    let reads = (0..32).map(|_| {
        let cache = cache.clone();
        tokio::spawn(async move { cache.shop(ShopId::new(1)).await })
    });
    let shops = join_all(reads).await;

    for read in shops {
        let shop = read.unwrap().unwrap().expect("the shop");
        assert_eq!(shop.name, "测试店铺1");
    }
    assert_eq!(
        cache.rebuilds(),
        1,
        "one reader read MySQL, the others waited"
    );
    let lock: Option<String> = app
        .redis
        .clone()
        .get(app.keys().shop_rebuild_lock(ShopId::new(1)))
        .await
        .unwrap();
    assert_eq!(lock, None, "the rebuild lock is given back");
}

#[tokio::test]
async fn a_reader_waits_for_anothers_rebuild_no_longer_than_its_wait() {
    let app = spawn_app(|_| {}).await;
    save_shops(&app, [shop(1, 1)]).await;
    let cache = shop_cache(&app, Duration::from_millis(300));
    // Another reader's rebuild that never ends (a node frozen mid-rebuild).
    let lock_key = app.keys().shop_rebuild_lock(ShopId::new(1));
    let _: () = app
        .redis
        .clone()
        .set_ex(&lock_key, "frozen", 10)
        .await
        .unwrap();

    let started = Instant::now();
    let read = cache.shop(ShopId::new(1)).await;

    assert!(matches!(read, Err(Error::Unavailable(_))), "{read:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(cache.rebuilds(), 0);
    let _: () = app.redis.clone().del(&lock_key).await.unwrap();
    assert!(cache.shop(ShopId::new(1)).await.unwrap().is_some());
}

#[tokio::test]
async fn a_category_lists_its_shops_five_a_page() {
    let app = spawn_app(|_| {}).await;
    save_shops(&app, (1..=7).map(|id| shop(id, 1))).await;
    save_shops(&app, [shop(8, 2)]).await;

    let first = app.get_json("/shop/of/type?typeId=1&current=1", None).await;
    let second = app.get_json("/shop/of/type?typeId=1&current=2", None).await;
    let third = app.get_json("/shop/of/type?typeId=1&current=3", None).await;
    let default = app.get_json("/shop/of/type?typeId=1", None).await;
    // As the list page sends it: a leading `&`, its position, a sort key.
    let as_the_page_asks = app
        .get_json(
            "/shop/of/type?&typeId=2&current=1&x=120.149993&y=30.334229&sortBy=score",
            None,
        )
        .await;

    assert_eq!(ids(&first), [1, 2, 3, 4, 5]);
    assert_eq!(ids(&second), [6, 7]);
    assert_eq!(third, json!({"success": true, "data": []}));
    assert_eq!(ids(&default), [1, 2, 3, 4, 5]);
    assert_eq!(ids(&as_the_page_asks), [8]);
    let listed = &first["data"][0];
    for field in ["name", "images", "area", "address"] {
        assert!(listed[field].is_string(), "{field}: {listed}");
    }
    for field in ["score", "comments", "avgPrice", "sold", "typeId"] {
        assert!(listed[field].is_u64(), "{field}: {listed}");
    }
}

#[tokio::test]
async fn malformed_shop_and_page_parameters_are_400() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(1)).await;
    for path in [
        "/shop/abc",
        "/shop/of/type",
        "/shop/of/type?typeId=abc",
        "/shop/of/type?typeId=0",
        "/shop/of/type?typeId=1&current=0",
        "/shop/of/type?typeId=1&current=-1",
        "/shop/of/type?typeId=1&current=x",
        "/blog/hot?current=0",
        "/blog/of/me?current=abc",
    ] {
        let response = app.get(path, Some(&token)).await;
        assert_eq!(response.status(), 400, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["success"], false, "{path}: {body}");
        assert_eq!(body["errorCode"], "BAD_REQUEST", "{path}: {body}");
    }
}

#[tokio::test]
async fn user_info_is_data_when_filled_in_and_a_bare_success_otherwise() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(1)).await;
    let user_id = app.user_id(&token).await;
    let path = format!("/user/info/{user_id}");

    assert_eq!(app.get(&path, None).await.status(), 401);
    assert_eq!(
        app.get_json(&path, Some(&token)).await,
        json!({"success": true})
    );

    app.tables().insert_user_info(user_id.get()).await.unwrap();
    let body = app.get_json(&path, Some(&token)).await;

    assert_eq!(
        body,
        json!({"success": true, "data": {
            "userId": user_id, "city": "杭州", "introduce": "爱吃爱玩", "fans": 3,
            "followee": 0, "gender": true, "birthday": "2000-01-02", "credits": 0, "level": 2
        }})
    );
}

#[tokio::test]
async fn the_blog_lists_are_empty() {
    let app = spawn_app(|_| {}).await;
    let token = app.login(&phone(1)).await;

    assert_eq!(
        app.get_json("/blog/hot?current=1", None).await,
        json!({"success": true, "data": []})
    );
    assert_eq!(
        app.get_json("/blog/of/me", Some(&token)).await,
        json!({"success": true, "data": []})
    );
    assert_eq!(app.get("/blog/of/me", None).await.status(), 401);
}
