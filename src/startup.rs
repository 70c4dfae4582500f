//! Wiring: builds the shared state once, binds the listener, runs the server
//! until it is told to stop (SIGTERM/SIGINT, or a handle in tests); and the
//! node's commands, `serve` and `migrate`, that both binaries run.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::http::StatusCode;
use actix_web::middleware::{from_fn, DefaultHeaders, ErrorHandlers};
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use clap::{Args, Subcommand};
use hmdp_lock::DistributedLock;
use tracing_actix_web::TracingLogger;

use crate::after_sale::{AfterSale, Closer, PayDeadlines};
use crate::api::{self, AppState};
use crate::auth::Sessions;
use crate::cache::ShopCache;
use crate::config::AdminToken;
use crate::config::{
    connect_redis, redact_url, DatabaseSettings, LockSettings, SeckillMode, ServeSettings,
    TimeoutSettings,
};
use crate::keys::Keys;
use crate::limits::Limits;
use crate::metrics;
use crate::overload::Overload;
use crate::redis_handle::RedisConnection;
use crate::seckill::stream::{RoundsNow, StreamConsumer};
use crate::seckill::Seckill;
use crate::store::{self, Store};
use crate::telemetry::RequestIdSpan;

/// The lock `settings` configure, sending its commands on `redis` (see [`hmdp_lock::LockBuilder::sharing`]),
/// counting its events into the node's metrics.
pub fn build_lock(
    settings: &LockSettings,
    redis: impl Into<RedisConnection>,
    redis_url: &str,
) -> anyhow::Result<Arc<dyn DistributedLock>> {
    let source = hmdp_lock::RedisSource::from_url(redis_url)
        .with_context(|| format!("invalid REDIS_URL `{}`", redact_url(redis_url)))?;
    settings
        .builder()
        .observer(Arc::new(metrics::LockMetrics))
        .sharing(redis.into())
        .build(source)
        .with_context(|| format!("cannot build --lock {}", settings.mode))
}

/// How long a node keeps an idle keep-alive connection: longer than nginx
/// keeps its idle connections to the nodes (`keepalive_timeout 60s` in the
/// upstream of `nginx.conf`), so that nginx is always the side that closes
/// one. With actix's default of 5 s, a burst arriving after five quiet
/// seconds could be sent on connections the node was closing at that very
/// moment; nginx does not resend a POST, answers 502 and takes the node out.
const IDLE_CONNECTION_KEPT: Duration = Duration::from_secs(75);

/// A built, bound, not yet running node.
pub struct Application {
    port: u16,
    server: Server,
    /// `--seckill stream`: this node's consumer of the order stream, started
    /// with the server and stopped after it.
    stream_consumer: Option<StreamConsumer>,
    /// Closes this node's share of the unpaid orders past their deadline,
    /// run alongside the server and stopped after it.
    closer: Closer,
    /// Drained of its queued orders (`queue`) once the server has stopped.
    seckill: Arc<Seckill>,
    queue_drain: Duration,
}

impl Application {
    pub async fn build(settings: ServeSettings) -> anyhow::Result<Application> {
        let timeout = settings.store.backend_timeout();
        settings.lock.ensure_fits(&settings.store.timeout)?;
        if !settings.no_migrate {
            store::create_database_if_missing(&settings.store.database.url).await?;
        }
        let store = Store::for_requests(&settings.store.database.url, settings.db_pool, timeout)?;
        if !settings.no_migrate {
            store.migrate().await?;
        }
        let redis = connect_redis(&settings.store.redis.url, timeout)?;
        let keys = Keys::new(settings.store.redis.prefix.clone());
        let lock = build_lock(&settings.lock, redis.clone(), &settings.store.redis.url)?;

        let listener = TcpListener::bind((settings.host.as_str(), settings.port))
            .with_context(|| format!("cannot listen on {}:{}", settings.host, settings.port))?;
        let port = listener.local_addr()?.port();
        let node_id = settings.node_id_on(port);
        let admin_token = settings.admin_token.clone().unwrap_or_else(|| {
            let token = AdminToken::generate();
            tracing::info!(
                admin_token = token.as_str(),
                "generated admin token (set HMDP_ADMIN_TOKEN to fix it)"
            );
            token
        });

        let deadlines = PayDeadlines::new(redis.clone(), &keys, settings.after_sale.pay_timeout());
        let seckill = Seckill::new(
            store.clone(),
            lock,
            redis.clone(),
            keys.clone(),
            deadlines.clone(),
            Duration::from_millis(settings.chaos_hold_ms),
        )
        .with_default_shards(settings.seckill_shards)
        .with_shared_commits(
            settings.sync_batch_max.into(),
            Duration::from_millis(settings.sync_batch_linger_ms),
        )
        .with_move_pause(Duration::from_millis(settings.chaos_move_pause_ms))
        .start(settings.seckill)
        .await;
        seckill.listen_for_news(&settings.store.redis.url);
        let returned_to = seckill.clone();
        let after_sale = Arc::new(AfterSale::new(
            store.clone(),
            redis.clone(),
            keys.clone(),
            deadlines,
            Arc::new(move |voucher_id| returned_to.stock_returned(voucher_id)),
            settings.after_sale.chaos_giveback_delay(),
        ));
        let closer = Closer::new(after_sale.clone(), settings.after_sale.sweep_every());
        let stream_consumer = match settings.seckill {
            SeckillMode::Stream => Some(StreamConsumer::new(
                seckill.writer(),
                redis.clone(),
                &settings.store.redis.url,
                timeout,
                &settings.stream,
                &node_id,
            )?),
            SeckillMode::Sync | SeckillMode::Queue => None,
        };
        let shops = ShopCache::new(
            redis.clone(),
            &settings.store.redis.url,
            keys.clone(),
            store.clone(),
            timeout,
        )?;
        let state = web::Data::new(AppState {
            node_id: node_id.clone(),
            shops,
            store,
            limits: Limits::new(redis.clone(), keys.clone(), settings.limits.clone()),
            overload: Overload::new(&settings.shed),
            sessions: Sessions::new(
                redis.clone(),
                keys,
                Duration::from_secs(settings.code_interval_secs),
                Duration::from_millis(settings.session_cache_ms),
            ),
            redis,
            seckill: seckill.clone(),
            after_sale,
            admin_token,
            backend_timeout: timeout,
        });
        metrics::init(&settings.lock.mode.to_string());
        tracing::info!(
            %node_id,
            port,
            lock = %settings.lock.mode,
            seckill = %settings.seckill,
            "node starting"
        );

        let body_timeout = Duration::from_millis(settings.body_timeout_ms);
        let mut server = HttpServer::new(move || {
            App::new()
                .wrap(from_fn(move |request, next| {
                    api::body_deadline::enforce(body_timeout, request, next)
                }))
                .wrap(from_fn(api::front_end::refusals_as_200))
                .wrap(
                    ErrorHandlers::new()
                        .handler(StatusCode::METHOD_NOT_ALLOWED, api::method_not_allowed),
                )
                .wrap(DefaultHeaders::new().add(("x-served-by", node_id.clone())))
                .wrap(from_fn(metrics::record_http))
                .wrap(TracingLogger::<RequestIdSpan>::new())
                .app_data(state.clone())
                .configure(api::configure)
        })
        .shutdown_timeout(30)
        .keep_alive(IDLE_CONNECTION_KEPT)
        .listen(listener)?;
        if let Some(workers) = settings.workers {
            server = server.workers(workers);
        }
        Ok(Application {
            port,
            server: server.run(),
            stream_consumer,
            closer,
            seckill,
            queue_drain: Duration::from_secs(settings.queue_drain_secs),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's closer, which [`run_until_stopped`](Self::run_until_stopped)
    /// runs in the background; a clone runs a round of it at once.
    pub fn closer(&self) -> &Closer {
        &self.closer
    }

    /// What asks the node's order stream consumer (`--seckill stream`),
    /// which [`run_until_stopped`](Self::run_until_stopped) runs, for its
    /// next rounds at once.
    pub fn stream_rounds(&self) -> Option<RoundsNow> {
        (self.stream_consumer.as_ref()).map(StreamConsumer::rounds_now)
    }

    /// Serves until stopped; SIGTERM and SIGINT stop accepting and let
    /// in-flight requests finish (actix's graceful shutdown). The order
    /// stream's consumer, if any, runs alongside and is stopped after the
    /// server: it finishes and acknowledges the batch it holds first. In
    /// `queue` mode the orders still queued are written then, within
    /// `--queue-drain-secs`.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let consumer = self.stream_consumer.map(StreamConsumer::spawn);
        let closer = self.closer.spawn();
        let served = self.server.await;
        closer.stop();
        if let Some(consumer) = consumer {
            consumer.stop().await;
        }
        self.seckill.drain_queue(self.queue_drain).await;
        served
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Application;
    use crate::config::ServeSettings;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        serve: ServeSettings,
    }

    /// The message `hmdp serve` prints when it cannot start with these flags.
    async fn build_error(flags: &[&str]) -> String {
        let args = ["hmdp", "--no-migrate", "--port=0", "--host=127.0.0.1"];
        let settings = Serve::parse_from(args.iter().chain(flags).copied()).serve;
        match Application::build(settings).await {
            Ok(_) => panic!("started with {flags:?}"),
            Err(error) => format!("{error:#}"),
        }
    }

    #[tokio::test]
    async fn an_invalid_database_url_is_reported_without_its_password() {
        let error = build_error(&["--database-url=mysql://root:s3cret@127.0.0.1:port/hmdp"]).await;
        assert!(!error.contains("s3cret"), "{error}");
        assert!(error.contains("invalid DATABASE_URL"), "{error}");
    }

    #[tokio::test]
    async fn an_invalid_redis_url_is_reported_without_its_password() {
        let error = build_error(&["--redis-url=redis://:s3cret@127.0.0.1:port/0"]).await;
        assert!(!error.contains("s3cret"), "{error}");
        assert!(error.contains("invalid REDIS_URL"), "{error}");
    }
}

/// The node's commands.
#[derive(Subcommand)]
pub enum ServerCommand {
    /// Run one HTTP node (applies pending migrations first unless --no-migrate).
    Serve(Box<ServeSettings>),
    /// Create the database if missing, apply pending migrations and exit.
    Migrate(MigrateSettings),
    /// Print the API's OpenAPI 3.1 contract (what `/openapi.json` serves)
    /// and exit.
    Openapi,
}

/// `migrate`: MySQL only.
#[derive(Args)]
pub struct MigrateSettings {
    #[command(flatten)]
    database: DatabaseSettings,

    #[command(flatten)]
    timeout: TimeoutSettings,
}

impl ServerCommand {
    /// The name of the node `serve` runs, where known before it starts
    /// (see [`ServeSettings::node_id_before_listening`]).
    pub fn node_id(&self) -> Option<String> {
        match self {
            ServerCommand::Serve(settings) => settings.node_id_before_listening(),
            ServerCommand::Migrate(_) | ServerCommand::Openapi => None,
        }
    }

    /// How the runtime the commands run on is built: one worker thread (the
    /// caller enables its drivers). A node's requests run on actix's worker
    /// threads, each a current-thread runtime of its own; this one runs the
    /// rest — the node's start, the closer, the stream's consumer. With a
    /// worker per core beside actix's, those workers woke one another for
    /// Redis' replies, and a synchronous sale cost the nodes more CPU per
    /// order in each of eight rounds, a seventh more at the median
    /// (docs/performance.md, "One worker for what is not a request").
    pub fn runtime() -> tokio::runtime::Builder {
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        runtime.worker_threads(1);
        runtime
    }

    /// Runs the command to its end: a node until SIGTERM or SIGINT, a
    /// migration until it is applied.
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            ServerCommand::Serve(settings) => {
                let app = Application::build(*settings).await?;
                app.run_until_stopped().await?;
            }
            ServerCommand::Migrate(settings) => {
                store::create_database_if_missing(&settings.database.url).await?;
                Store::connect_lazy(
                    &settings.database.url,
                    1,
                    settings.timeout.backend_timeout(),
                )?
                .migrate()
                .await?;
                tracing::info!("migrations applied");
            }
            ServerCommand::Openapi => println!("{}", api::openapi::contract_json()),
        }
        Ok(())
    }
}
