//! `fumarole-scheduler-ext`: the cluster service.
//!
//! Subcommands: `serve` (the kube-scheduler extender and Volcano extender HTTP APIs over the
//! live cluster, or over a snapshot directory) and `explain` (per node verdict, `q`, `loss`,
//! score and devices for one pod, from a snapshot) and `defrag` (moves that make room for the
//! largest waiting unit, from a snapshot or the live cluster). Each lives in [`cmd`].
//! `serve` reads its flags from `--config FILE` too ([`CONFIGURATION`], `fumarole_settings`;
//! flags and env vars win), and `explain` and `defrag` take from that file's `serve` section
//! the flags they share with it (the deployed service's scoring); `config check FILE` prints
//! the flags a file stands for.

mod cmd;

/// mimalloc rather than glibc's malloc: an all-names `filter` over 5,000 nodes allocates and
/// frees a verdict per node, and glibc's allocator took a fifth of the service's CPU in a
/// profile of that load (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use fumarole_settings::Spec;
use fumarole_settings::cli::ConfigArgs;

/// The service's configuration file: `kind: SchedulerExtConfiguration`, a `serve` section with
/// `serve`'s flags in camelCase.
const CONFIGURATION: Spec = Spec {
    kind: "SchedulerExtConfiguration",
    reads: &[
        ("serve", "serve"),
        ("explain", "serve"),
        ("defrag", "serve"),
    ],
};

#[derive(Parser)]
#[command(name = "fumarole-scheduler-ext", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the extender APIs: kube-scheduler under /kube-scheduler, Volcano under /volcano,
    /// plus /ui, /healthz and /metrics.
    Serve(Box<cmd::serve::ServeArgs>),
    /// Explain, per node, where a pod could go and which devices it would get.
    Explain(cmd::explain::ExplainArgs),
    /// The fewest running pods whose move would make room for the largest waiting unit.
    Defrag(cmd::defrag::DefragArgs),
    /// Configuration files (`serve --config FILE`).
    Config(ConfigArgs),
}

fn main() -> std::process::ExitCode {
    let cli: Cli = CONFIGURATION.parse();
    scheduler_ext::cli::main_with(|| match cli.command {
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Explain(args) => cmd::explain::run(args),
        Command::Defrag(args) => cmd::defrag::run(args),
        Command::Config(args) => CONFIGURATION
            .config::<Cli>(&args)
            .map(|out| print!("{out}"))
            .map_err(Into::into),
    })
}
