//! `hmdp-server`: the node alone — `serve` and `migrate`, nothing of the
//! tools or the test kit linked in. The image runs this binary.

use clap::{CommandFactory, FromArgMatches, Parser};

use hmdp::startup::ServerCommand;
use hmdp::telemetry::LogSettings;

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

    #[command(flatten)]
    logs: LogSettings,

    /// A settings file (TOML): one key per flag of the command, named as
    /// the flag without its dashes. Flags and the environment win over it.
    #[arg(long, global = true, env = "HMDP_CONFIG", value_name = "FILE")]
    config: Option<std::path::PathBuf>,

    /// Print the effective settings (of `serve` unless another command is
    /// named), each with where it came from, secrets masked, and exit.
    #[arg(long, global = true)]
    print_config: bool,
}

fn main() -> anyhow::Result<()> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let command = Cli::command();
    let print_config = args.iter().any(|arg| arg == "--print-config");
    let names_one = (args.iter().skip(1)).any(|arg| command.find_subcommand(arg).is_some());
    if print_config && !names_one {
        args.insert(1, "serve".into());
    }
    let (args, from_file) = hmdp::settings_file::with_file(&command, args)?;
    let matches = command.clone().get_matches_from(&args);
    if print_config {
        print!(
            "{}",
            hmdp::settings_file::print_out(&command, &matches, &from_file)
        );
        return Ok(());
    }
    let cli = Cli::from_arg_matches(&matches)?;
    let runtime = ServerCommand::runtime().enable_all().build()?;
    runtime.block_on(async {
        // On the runtime, which sends the trace exports, if any.
        let traces = cli.logs.init("info", cli.command.node_id());
        // Once the node has stopped (SIGTERM: its last requests answered,
        // its consumer's last batch written), the spans still held are
        // exported.
        let ran = cli.command.run().await;
        traces.shutdown().await;
        ran
    })
}
