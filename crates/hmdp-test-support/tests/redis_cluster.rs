//! The test cluster comes up with every slot served, and survives losing a
//! master: its replica takes over.

use hmdp_test_support::redis_cluster::cluster_state;
use hmdp_test_support::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_cluster_starts_ok_and_fails_over_a_killed_master() {
    let mut cluster = RedisCluster::start().await.expect("the cluster starts");
    for server in cluster.servers() {
        assert_eq!(cluster_state(server).await.unwrap(), "ok");
    }
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));

    cluster.servers_mut()[0].kill();
    cluster
        .wait_until_ok()
        .await
        .expect("a replica is promoted and the cluster is ok again");
}
