//! The `hmdp` command line: one binary for the node, its tools and its lab.

use clap::{Parser, Subcommand};

use hmdp::cluster::demo::{self, DemoSettings};
use hmdp::config::{ServeSettings, StoreSettings};
use hmdp::loadtest::{self, tokens::TokensSettings, LoadtestSettings};
use hmdp::startup::Application;
use hmdp::store::{self, Store};

/// hmdp-rs: the Heima Dianping flash-sale voucher backend, and a lab of the
/// distributed locks that guard its one-order-per-user purchase.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one HTTP node (applies pending migrations first unless --no-migrate).
    Serve(Box<ServeSettings>),
    /// Create the database if missing, apply pending migrations and exit.
    Migrate(StoreSettings),
    /// Log N users in through the HTTP API and write one token per line.
    Tokens(Box<TokensSettings>),
    /// Fire many users' simultaneous purchases of one voucher and measure.
    Loadtest(Box<LoadtestSettings>),
    /// Two nodes behind nginx, one load test per lock mode, side by side.
    Demo(Box<DemoSettings>),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hmdp::telemetry::init();
    match Cli::parse().command {
        Command::Serve(settings) => {
            let app = Application::build(*settings).await?;
            app.run_until_stopped().await?;
        }
        Command::Migrate(settings) => {
            store::create_database_if_missing(&settings.database_url).await?;
            Store::connect_lazy(&settings.database_url, 1, settings.backend_timeout())?
                .migrate()
                .await?;
            tracing::info!("migrations applied");
        }
        Command::Tokens(settings) => loadtest::tokens::run(*settings).await?,
        Command::Loadtest(settings) => loadtest::run_command(*settings).await?,
        Command::Demo(settings) => demo::run(*settings).await?,
    }
    Ok(())
}
