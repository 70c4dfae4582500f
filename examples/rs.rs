use redis::AsyncCommands;
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let s = hmdp::redis_server::RedisServer::start().unwrap();
    let c = hmdp::startup::connect_redis(&s.url(), std::time::Duration::from_secs(2)).unwrap();
    let c2 = hmdp::startup::connect_redis(&s.url(), std::time::Duration::from_secs(2)).unwrap();
    let _: () = c2.clone().set("x", "1").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let futs = (0..5).map(|i| {
        let mut c = c.clone();
        async move {
            let r: redis::RedisResult<Option<String>> = c.get(format!("k{i}")).await;
            r
        }
    });
    let rs = futures::future::join_all(futs).await;
    println!("{:?}", rs.iter().filter(|r| r.is_err()).count());
    println!("{:?}", rs.iter().find(|r| r.is_err()));
}
