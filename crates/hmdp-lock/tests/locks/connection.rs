//! The connection [`hmdp_lock::connection::connect`] opens on one server: a
//! reconnecting connection per thread, of which a Redis restart costs one
//! command, not one per thread.

use std::time::Duration;

use hmdp_lock::Connection;
use hmdp_test_support::RedisServer;

/// How many threads send on the connection.
const THREADS: usize = 4;

/// Threads that each keep sending on `connection`, each driving its own:
/// the answers to each round of one `PING` per thread, in turn.
struct Senders {
    rounds: Vec<std::sync::mpsc::Sender<std::sync::mpsc::Sender<redis::RedisResult<String>>>>,
}

impl Senders {
    fn start(connection: &Connection) -> Senders {
        let rounds = (0..THREADS)
            .map(|_| {
                let (ask, asked) = std::sync::mpsc::channel::<
                    std::sync::mpsc::Sender<redis::RedisResult<String>>,
                >();
                let mut connection = connection.clone();
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    for reply in asked {
                        let answer = runtime.block_on(async {
                            // The runtime's tasks (the connection's reader
                            // and writer) run between rounds too.
                            tokio::task::yield_now().await;
                            redis::cmd("PING").query_async(&mut connection).await
                        });
                        if reply.send(answer).is_err() {
                            return;
                        }
                    }
                });
                ask
            })
            .collect();
        Senders { rounds }
    }

    /// One `PING` from each thread, one thread after another.
    fn round(&self) -> Vec<redis::RedisResult<String>> {
        self.rounds
            .iter()
            .map(|ask| {
                let (reply, answer) = std::sync::mpsc::channel();
                ask.send(reply).unwrap();
                answer.recv().unwrap()
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_thread_sends_on_a_connection_of_its_own() {
    let redis = RedisServer::start().await.unwrap();
    let connection = hmdp_lock::connection::connect(&redis.url(), Duration::from_secs(5)).unwrap();
    let senders = Senders::start(&connection);
    for _ in 0..3 {
        assert!(senders.round().iter().all(|answer| answer.is_ok()));
    }
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut redis.connect().await.unwrap())
        .await
        .unwrap();
    // The threads' connections, and the one that asked.
    assert_eq!(clients.lines().count(), THREADS + 1, "{clients}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_fails_one_command_of_all_the_threads_not_one_each() {
    let mut redis = RedisServer::start().await.unwrap();
    let connection = hmdp_lock::connection::connect(&redis.url(), Duration::from_secs(5)).unwrap();
    let senders = Senders::start(&connection);
    assert!(senders.round().iter().all(|answer| answer.is_ok()));

    redis.restart().await.unwrap();
    // Every thread's connection broke; the first thread to send finds it,
    // and the others open new ones before sending.
    let after = senders.round();
    let failed = after.iter().filter(|answer| answer.is_err()).count();
    assert_eq!(failed, 1, "{after:?}");
    assert!(senders.round().iter().all(|answer| answer.is_ok()));
}
