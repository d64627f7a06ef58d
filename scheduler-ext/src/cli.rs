//! Command-line plumbing shared by the binaries that decide through the core
//! (`fumarole-scheduler-ext`, `fumarole-sim`, `kubectl-fumarole`): the gpu-aware flags and the
//! `main` frame (logging to stderr, `error: ...` and exit code 1 on failure).

use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::core::score::gpu_aware::GpuAware;

/// gpu-aware scoring arguments (Volcano's `weight` and `loss.weight`).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ScoringArgs {
    /// Multiplies the 0..100 (Volcano) score.
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// How much the loss counts against the quality (Volcano's `loss.weight`).
    #[arg(long = "loss-weight", default_value_t = 1.0)]
    pub loss_weight: f64,
}

impl ScoringArgs {
    /// The scorer, or why the flags are out of range.
    pub fn gpu_aware(self) -> Result<GpuAware> {
        if !(self.weight.is_finite() && self.weight >= 0.0) {
            bail!("--weight must be a number >= 0, got {}", self.weight);
        }
        if !(self.loss_weight.is_finite() && self.loss_weight >= 0.0) {
            bail!(
                "--loss-weight must be a number >= 0, got {}",
                self.loss_weight
            );
        }
        Ok(GpuAware {
            weight: self.weight,
            loss_weight: self.loss_weight,
        })
    }
}

/// Logs to stderr (`RUST_LOG`, default `info`), runs `command`, and turns its error into
/// `error: ...` on stderr and exit code 1.
pub fn main_with(command: impl FnOnce() -> Result<()>) -> ExitCode {
    main_logging("info", command)
}

/// [`main_with`] with another default log filter (`warn` for the kubectl plugin, whose stderr
/// a person reads beside its output).
pub fn main_logging(default_filter: &str, command: impl FnOnce() -> Result<()>) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .init();
    match command() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
