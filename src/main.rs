//! `hmdp-server`: the node alone — `serve` and `migrate`, nothing of the
//! tools or the test kit linked in. The image runs this binary.

use clap::Parser;

use hmdp::startup::ServerCommand;

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let command = Cli::parse().command;
    hmdp::telemetry::init();
    command.run().await
}
