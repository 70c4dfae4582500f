//! What the node's binary does: `serve` and `migrate`. The `hmdp-server`
//! binary (`src/main.rs`) is these two alone; the `hmdp` command of the tools
//! offers them beside its own, running this same code.

use clap::{Args, Subcommand};

use crate::config::{DatabaseSettings, ServeSettings, TimeoutSettings};
use crate::startup::Application;
use crate::store::{self, Store};

/// The node's commands.
#[derive(Subcommand)]
pub enum ServerCommand {
    /// Run one HTTP node (applies pending migrations first unless --no-migrate).
    Serve(Box<ServeSettings>),
    /// Create the database if missing, apply pending migrations and exit.
    Migrate(MigrateSettings),
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
        }
        Ok(())
    }
}
