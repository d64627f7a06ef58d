//! `fumarole-scheduler-ext`: the cluster service.
//!
//! Subcommands: `serve` (the kube-scheduler extender and Volcano extender HTTP APIs over the
//! live cluster, or over a snapshot directory) and `explain` (per node verdict, `q`, `loss`,
//! score and devices for one pod, from a snapshot) and `defrag` (moves that make room for the
//! largest waiting unit, from a snapshot or the live cluster). Each lives in [`cmd`].

mod cmd;

use clap::{Parser, Subcommand};

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
}

fn main() -> std::process::ExitCode {
    scheduler_ext::cli::main_with(|| match Cli::parse().command {
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Explain(args) => cmd::explain::run(args),
        Command::Defrag(args) => cmd::defrag::run(args),
    })
}
