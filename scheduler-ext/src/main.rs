//! `fumarole-scheduler-ext`: the cluster service.
//!
//! Subcommands: `serve` (the kube-scheduler extender HTTP API over a cluster view; for now the
//! view comes from a snapshot directory) and `explain` (per node verdict, `q`, `loss`, score and
//! devices for one pod, from a snapshot).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Pod;
use scheduler_ext::score::gpu_aware::GpuAware;
use scheduler_ext::{explain, extender, request, snapshot};

#[derive(Parser)]
#[command(name = "fumarole-scheduler-ext", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// gpu-aware scoring arguments (Volcano's `weight` and `loss.weight`).
#[derive(clap::Args, Clone, Copy)]
struct Scoring {
    /// Multiplies the 0..100 (Volcano) score.
    #[arg(long, default_value_t = 1.0)]
    weight: f64,
    /// How much the loss counts against the quality (Volcano's `loss.weight`).
    #[arg(long = "loss-weight", default_value_t = 1.0)]
    loss_weight: f64,
}

impl Scoring {
    fn gpu_aware(self) -> Result<GpuAware> {
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

#[derive(Subcommand)]
enum Command {
    /// Serve the scheduler extender API (kube-scheduler under /kube-scheduler, /healthz).
    Serve {
        /// Build the cluster view from the YAML files in this directory instead of an API
        /// server (DeviceTopology, Node and Pod objects, as `kubectl get -o yaml` writes them).
        #[arg(long)]
        cluster_snapshot: PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0:8888")]
        listen: SocketAddr,
        #[command(flatten)]
        scoring: Scoring,
    },
    /// Explain, per node, where a pod could go and which devices it would get.
    Explain {
        /// Snapshot directory (see `serve`).
        #[arg(long)]
        cluster_snapshot: PathBuf,
        /// The pod (YAML or JSON).
        #[arg(long)]
        pod: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        #[command(flatten)]
        scoring: Scoring,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Explain {
            cluster_snapshot,
            pod,
            format,
            scoring,
        } => explain_cmd(&cluster_snapshot, &pod, format, scoring.gpu_aware()?),
        Command::Serve {
            cluster_snapshot,
            listen,
            scoring,
        } => serve(&cluster_snapshot, listen, scoring.gpu_aware()?),
    }
}

fn read_pod(path: &std::path::Path) -> Result<Pod> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let pod: Pod = serde_norway::from_str(&text)
        .with_context(|| format!("{}: not a Pod object", path.display()))?;
    Ok(pod)
}

fn explain_cmd(
    dir: &std::path::Path,
    pod_file: &std::path::Path,
    format: Format,
    g: GpuAware,
) -> Result<()> {
    let view = snapshot::load(dir)?;
    for w in &view.warnings {
        tracing::warn!("{w}");
    }
    let pod = read_pod(pod_file)?;
    let req = request::device_request(&pod, &view.resources())?;
    let rows = explain::explain(&view, &req, &g);
    match format {
        Format::Json => print!("{}", explain::json(&rows)),
        Format::Table => print!("{}", explain::table(&req, &rows)),
    }
    Ok(())
}

fn serve(dir: &std::path::Path, listen: SocketAddr, g: GpuAware) -> Result<()> {
    let view = snapshot::load(dir)?;
    for w in &view.warnings {
        tracing::warn!("{w}");
    }
    tracing::info!(nodes = view.len(), snapshot = %dir.display(), "cluster view loaded");
    let svc = Arc::new(extender::Service::new(view, g));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        tracing::info!(address = %listener.local_addr()?, "serving");
        axum::serve(listener, extender::router(svc))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("serving HTTP")
    })
}
