//! `fumarole-agent`: the node agent binary.
//!
//! Subcommands: `discover` (print this node's topology, or a dump's, or a bundled fixture's),
//! `fixture` (list the bundled fixture nodes or write one out).
//! `run` (publishing, device plugins, QoS) arrives with later work.

mod discover;
mod render;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "fumarole-agent",
    version,
    about = "fumarole node agent: accelerator topology, device plugins, node QoS"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "FUMAROLE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Discover a node's CPUs, NUMA nodes, accelerators and links, and print them.
    Discover(discover::DiscoverArgs),
    /// List the bundled fixture nodes, or write one out as a filesystem root.
    Fixture(discover::FixtureArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Discover(args) => discover::run(args),
        Command::Fixture(args) => discover::fixture(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("FUMAROLE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
