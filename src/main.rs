//! `hmdp-server`: the node alone — `serve` and `migrate`, nothing of the
//! tools or the test kit linked in. The image runs this binary.

use clap::Parser;

use hmdp::startup::ServerCommand;
use hmdp::telemetry::LogFormat;

/// mimalloc: a node allocates for every request, response, Redis reply and
/// row; glibc's malloc spent a tenth of a node's CPU on it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// hmdp-rs node: the Heima Dianping flash-sale voucher backend.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: ServerCommand,

    /// Log lines as `text` (for a person at a terminal) or `json` (one
    /// object per line, for a collector).
    #[arg(
        long,
        global = true,
        env = "HMDP_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    hmdp::telemetry::init_with_default("info", cli.log_format);
    cli.command.run().await
}
