//! The `hmdp` command line: one binary for the node, its tools and its lab.

use std::io::Write;

use clap::{Parser, Subcommand};

use hmdp::startup::ServerCommand;
use hmdp::telemetry::LogSettings;
use hmdp_tools::audit::{self, AuditSettings};
use hmdp_tools::bench::{self, BenchDbArgs, BenchDrainArgs, BenchLockArgs};
use hmdp_tools::dead_letters::{self, DeadLettersSettings};
use hmdp_tools::history::{self, CheckSettings};
use hmdp_tools::lab;
use hmdp_tools::loadtest::{self, tokens::TokensSettings, LoadtestSettings};
use hmdp_tools::nodes::demo::{self, DemoSettings};
use hmdp_tools::nodes::soak::{self, SoakSettings};
use hmdp_tools::nodes::up::{self, UpSettings};
use hmdp_tools::seed::{self, SeedSettings};

/// mimalloc: a node allocates for every request, response, Redis reply and
/// row; glibc's malloc spent a tenth of a node's CPU on it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// hmdp-rs: the Heima Dianping flash-sale voucher backend, and a lab of the
/// distributed locks that guard its one-order-per-user purchase.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    #[command(flatten)]
    logs: LogSettings,
}

#[derive(Subcommand)]
enum Command {
    /// `serve` and `migrate`, as `hmdp-server` runs them.
    #[command(flatten)]
    Server(ServerCommand),
    /// Load sample shop categories and shops, each with a seckill voucher on
    /// sale, for hmdp's front end (creates and migrates the database if
    /// needed; running it again leaves the same rows).
    Seed(SeedSettings),
    /// Log N users in through the HTTP API and write one token per line.
    ///
    /// Sessions it opens are remembered in Redis (`load:sessions`, phone →
    /// token) and reused while alive, so it can run again at once on the same
    /// phones: a phone gets one login code a minute, which this leaves as it is.
    Tokens(Box<TokensSettings>),
    /// Fire many users' simultaneous purchases of one voucher and measure.
    Loadtest(Box<LoadtestSettings>),
    /// Reconcile one voucher's sale between Redis and MySQL.
    ///
    /// Checks Redis stock + buyers = initial, MySQL orders + stock = initial,
    /// buyers = users with an order + users with one on its way, one order
    /// per user, no dead letters. Exit status: 0 when every check holds, 1
    /// when one is broken (the differences listed), 2 when the audit failed.
    Audit(Box<AuditSettings>),
    /// Judge a run's history (`loadtest --history`, `soak --history`)
    /// against MySQL, as its clients saw it.
    ///
    /// Every success answer is an order with that id, nobody was told
    /// success for two active orders, no unit sold twice, no unit lost
    /// (SOLD_OUT answered only by a sale that sold every unit), every
    /// payment and cancel as answered. Exit status: 0 when every check
    /// holds, 1 when one is broken, 2 when the check itself failed.
    Check(Box<CheckSettings>),
    /// List the order stream's dead letters, or replay them into MySQL.
    ///
    /// A dead letter is an order the consumers gave up on: a malformed
    /// entry, an order id another order holds, a unit MySQL does not have.
    /// Replaying writes its order as a consumer would, once whatever was
    /// written before, and removes the letter; an order that still cannot
    /// be written says why and stays listed.
    DeadLetters(Box<DeadLettersSettings>),
    /// Two nodes behind nginx, one load test per lock mode and purchase
    /// path, side by side.
    Demo(Box<DemoSettings>),
    /// Two nodes behind nginx, left running for outside load tools until Ctrl-C.
    // Scripts written for its first name, `cluster`, still run (hidden:
    // "cluster" names a Redis Cluster everywhere else).
    #[command(alias = "cluster")]
    Up(Box<UpSettings>),
    /// Run two nodes behind nginx under load for minutes with a fault every
    /// interval (a node SIGKILLed, Redis restarted) and verify every sale.
    Soak(Box<SoakSettings>),
    /// Reproduce one failure of the course with a timeline and a verdict.
    ///
    /// Runs against the configured Redis in a key namespace of its own, removed
    /// afterwards (the asynchronous purchase's scenarios also start nodes on a
    /// database of their own). Exit status: 0 when the promise held (mutual
    /// exclusion; every buyer told success holds one order; a closed order's
    /// unit back on sale once), 1 when it broke, 2 when the run itself failed.
    Lab {
        #[command(subcommand)]
        scenario: lab::Scenario,
    },
    /// Measure lock acquire+release pairs per second and latency for one mode.
    BenchLock(Box<BenchLockArgs>),
    /// Measure the bare purchase transaction on MySQL (no HTTP, no lock).
    BenchDb(Box<BenchDbArgs>),
    /// Measure how fast running `--seckill stream` nodes write a backlog of
    /// orders admitted straight in Redis.
    BenchDrain(Box<BenchDrainArgs>),
}

fn main() -> anyhow::Result<()> {
    let Cli { command, logs } = Cli::parse();
    // The lab breaks Redis on purpose and tells it on its timeline;
    // redis-rs's own notes on the connections it repairs would only
    // interleave with it (its errors still show).
    let default = match command {
        Command::Lab { .. } => "info,redis=error",
        _ => "info",
    };
    // A node runs on the runtime `hmdp-server` gives it. bench-lock runs
    // its tasks as an actix worker runs requests: on one
    // current-thread runtime. There the tasks sharing the multiplexed Redis
    // connection all queue their next command before its writer task runs,
    // and the commands leave in one write; on the multi-thread scheduler a
    // woken writer runs at once (the LIFO slot) and every command costs a
    // write of its own. The load generator runs there too: it shares the
    // cores with what it measures, and one thread never hands a task to
    // another (a fifth less CPU per request than on the multi-thread one).
    // bench-db as well: it is the ceiling of the purchase's SQL, which a
    // node runs on such a runtime, and there it commits 1–9% more.
    let runtime = match command {
        Command::Server(_) => ServerCommand::runtime(),
        Command::BenchLock(_) | Command::Loadtest(_) | Command::BenchDb(_) => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build()?;
    runtime.block_on(async {
        // On the runtime, which sends the trace exports, if any.
        let node_id = match &command {
            Command::Server(server) => server.node_id(),
            _ => None,
        };
        let traces = logs.init(default, node_id);
        let ran = run(command).await;
        traces.shutdown().await;
        ran
    })
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Server(command) => command.run().await?,
        Command::Seed(settings) => seed::run(settings).await?,
        Command::Tokens(settings) => loadtest::tokens::run(*settings).await?,
        Command::Loadtest(settings) => loadtest::run_command(*settings).await?,
        Command::Demo(settings) => demo::run(*settings).await?,
        Command::Up(settings) => up::run(*settings).await?,
        Command::Soak(settings) => soak::run(*settings).await?,
        Command::BenchLock(args) => {
            bench::bench_lock(*args).await?;
        }
        Command::BenchDb(args) => {
            bench::bench_db(*args).await?;
        }
        Command::BenchDrain(args) => {
            bench::bench_drain(*args).await?;
        }
        Command::DeadLetters(settings) => {
            let code = dead_letters::run(&settings).await.unwrap_or_else(|error| {
                eprintln!("error: {error:#}");
                2
            });
            std::io::stdout().flush()?;
            std::process::exit(code);
        }
        Command::Audit(settings) => {
            let code = audit::run(&settings).await.unwrap_or_else(|error| {
                eprintln!("error: {error:#}");
                2
            });
            std::io::stdout().flush()?;
            std::process::exit(code);
        }
        Command::Check(settings) => {
            let code = history::run(&settings).await.unwrap_or_else(|error| {
                eprintln!("error: {error:#}");
                2
            });
            std::io::stdout().flush()?;
            std::process::exit(code);
        }
        Command::Lab { scenario } => {
            let code = match lab::run(&scenario).await {
                Ok(report) => {
                    print!("{report}");
                    report.exit_code()
                }
                Err(error) => {
                    eprintln!("error: {error:#}");
                    2
                }
            };
            std::io::stdout().flush()?;
            std::process::exit(code);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The long flags of `hmdp <path...>`.
    fn flags(path: &[&str]) -> Vec<String> {
        let mut command = Cli::command();
        command.build();
        let mut command = &command;
        for name in path {
            command = command.find_subcommand(name).expect("a subcommand");
        }
        command
            .get_arguments()
            .filter_map(|arg| arg.get_long().map(str::to_owned))
            .collect()
    }

    /// Each command's `--help` lists the backend settings it reads and none
    /// that it ignores.
    #[test]
    fn each_command_takes_only_the_backend_settings_it_uses() {
        const BACKEND: [&str; 5] = [
            "database-url",
            "redis-url",
            "redis-prefix",
            "db-pool",
            "backend-timeout-ms",
        ];
        const STORES: &[&str] = &[
            "database-url",
            "redis-url",
            "redis-prefix",
            "backend-timeout-ms",
        ];
        const REDIS: &[&str] = &["redis-url", "redis-prefix", "backend-timeout-ms"];
        let expected: [(&[&str], &[&str]); 15] = [
            (&["seed"], &["database-url"]),
            (&["serve"], &BACKEND),
            (&["migrate"], &["database-url", "backend-timeout-ms"]),
            (&["tokens"], REDIS),
            (&["loadtest"], STORES),
            (&["audit"], STORES),
            (&["dead-letters"], STORES),
            (&["demo"], STORES),
            (&["up"], &["database-url", "redis-url", "redis-prefix"]),
            (&["soak"], &[]),
            (&["bench-lock"], REDIS),
            (&["bench-db"], STORES),
            (&["bench-drain"], STORES),
            (&["lab", "misdelete"], &["redis-url", "redis-prefix"]),
            (
                &["lab", "gc-pause"],
                &["database-url", "redis-url", "redis-prefix"],
            ),
        ];
        for (path, wanted) in expected {
            let flags = flags(path);
            let backend: Vec<&str> = BACKEND
                .into_iter()
                .filter(|flag| flags.iter().any(|f| f == flag))
                .collect();
            assert_eq!(backend, wanted, "hmdp {}", path.join(" "));
        }
    }
}
