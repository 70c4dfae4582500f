//! One reconnecting connection to a Redis server per thread, each driven by
//! that thread's runtime: a command and its reply wake no other thread, as
//! they do when every thread sends on one connection driven by one of them.
//! A break any thread's connection finds retires them all, so that after a
//! Redis restart one command fails, as on a single connection, not one per
//! thread.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// The connections to one server, one per thread that sent a command;
/// clones share them.
#[derive(Clone)]
pub struct PerThread {
    shared: Arc<Shared>,
}

/// What every thread's connection is opened from.
struct Shared {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// Raised when a thread's connection breaks: a thread whose connection
    /// is of an older generation opens a new one before its next command.
    generation: AtomicU64,
}

/// A thread's connection of one [`PerThread`], of the generation it was
/// opened in.
struct Opened {
    owner: Weak<Shared>,
    generation: u64,
    connection: ConnectionManager,
}

thread_local! {
    /// This thread's connections, one per [`PerThread`] it sent on (a node
    /// has a few: its commands', its stream reader's).
    static OPENED: RefCell<Vec<Opened>> = const { RefCell::new(Vec::new()) };
}

impl PerThread {
    /// Connections to the server of `client`, each opened on its thread's
    /// first command with `config`.
    pub(crate) fn new(client: redis::Client, config: ConnectionManagerConfig) -> Self {
        PerThread {
            shared: Arc::new(Shared {
                client,
                config,
                generation: AtomicU64::new(0),
            }),
        }
    }

    /// The calling thread's connection and its generation, opened (without
    /// connecting: that happens on its first command) if the thread has
    /// none of the current generation. Call it on a Tokio runtime: the
    /// connection's tasks are spawned on the caller's.
    fn here(&self) -> RedisResult<(u64, ConnectionManager)> {
        let generation = self.shared.generation.load(Ordering::Acquire);
        OPENED.with_borrow_mut(|opened| {
            let mine = opened
                .iter()
                .position(|one| std::ptr::eq(one.owner.as_ptr(), Arc::as_ptr(&self.shared)));
            if let Some(index) = mine {
                if opened[index].generation == generation {
                    return Ok((generation, opened[index].connection.clone()));
                }
                opened.swap_remove(index);
            }
            // Connections of dropped owners go as a new one comes.
            opened.retain(|one| one.owner.strong_count() > 0);
            let connection = ConnectionManager::new_lazy_with_config(
                self.shared.client.clone(),
                self.shared.config.clone(),
            )?;
            opened.push(Opened {
                owner: Arc::downgrade(&self.shared),
                generation,
                connection: connection.clone(),
            });
            Ok((generation, connection))
        })
    }

    /// `send` on the calling thread's connection. A break that the
    /// connection would reconnect after retires every thread's connection
    /// of its generation (once, however many threads find it).
    async fn sent<T>(
        &self,
        send: impl AsyncFnOnce(&mut ConnectionManager) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let (generation, mut connection) = self.here()?;
        let result = send(&mut connection).await;
        if matches!(&result, Err(error) if error.is_unrecoverable_error()) {
            let _ = self.shared.generation.compare_exchange(
                generation,
                generation + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        result
    }
}

impl ConnectionLike for PerThread {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.sent(async |connection| connection.req_packed_command(cmd).await))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.sent(async move |connection| {
            connection
                .req_packed_commands(pipeline, offset, count)
                .await
        }))
    }

    fn get_db(&self) -> i64 {
        self.shared
            .client
            .get_connection_info()
            .redis_settings()
            .db()
    }
}
