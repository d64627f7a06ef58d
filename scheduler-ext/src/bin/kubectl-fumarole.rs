//! `kubectl-fumarole`: the kubectl plugin (`kubectl fumarole explain|node|top`). Copy it onto
//! PATH under this name and kubectl finds it. Everything lives in [`scheduler_ext::kubectl`].

use clap::Parser;

fn main() -> std::process::ExitCode {
    scheduler_ext::cli::main_logging("warn", || {
        scheduler_ext::kubectl::run(scheduler_ext::kubectl::Cli::parse())
    })
}
