//! `fumarole-scheduler-ext explain`: per node, where a pod could go and which devices it would
//! get, from a cluster snapshot.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use k8s_openapi::api::core::v1::Pod;
use scheduler_ext::cli::{self, ScoringArgs, SuperPodArgs};
use scheduler_ext::core::explain;
use scheduler_ext::decider::Decider;
use scheduler_ext::protocol::scale;
use scheduler_ext::snapshot;

#[derive(clap::Args)]
pub struct ExplainArgs {
    /// Snapshot directory (see `serve`).
    #[arg(long)]
    cluster_snapshot: PathBuf,
    /// The pod (YAML or JSON).
    #[arg(long)]
    pod: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    #[command(flatten)]
    scoring: ScoringArgs,
    #[command(flatten)]
    super_pods: SuperPodArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

pub fn run(args: ExplainArgs) -> Result<()> {
    let view = snapshot::load(&args.cluster_snapshot)?;
    for w in view.warnings() {
        tracing::warn!("{w}");
    }
    let pod = read_pod(&args.pod)?;
    let settings = cli::settings(&[&args.scoring, &args.super_pods])?;
    if settings.whole_job_super_pod {
        bail!(
            "--whole-job-super-pod is applied to live views only (serve, kubectl fumarole explain)"
        );
    }
    let decider = Decider::new(view, settings);
    let (req, rows) = decider.explain(&pod, scale::shown(decider.scorer()))?;
    match args.format {
        Format::Json => print!("{}", explain::json(&rows)),
        Format::Table => print!("{}", explain::table(&req, &rows)),
    }
    Ok(())
}

fn read_pod(path: &Path) -> Result<Pod> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let pod: Pod = serde_norway::from_str(&text)
        .with_context(|| format!("{}: not a Pod object", path.display()))?;
    Ok(pod)
}
