//! The `hmdp` command line: one binary for the node, its tools and its lab.

use clap::{Parser, Subcommand};

use hmdp::config::{ServeSettings, StoreSettings};
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
    }
    Ok(())
}
