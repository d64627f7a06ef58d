//! `fumarole-scheduler-ext defrag`: the fewest running pods whose move would make room for the
//! largest waiting unit ([`scheduler_ext::core::defrag`]), from a cluster snapshot or the live
//! cluster.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::ValueEnum;
use scheduler_ext::core::defrag::{self, Advice};
use scheduler_ext::core::pod_facts::PodFacts;
use scheduler_ext::kubectl::{self, Global};
use scheduler_ext::snapshot::{self, Objects};

#[derive(clap::Args)]
pub struct DefragArgs {
    /// Snapshot directory (see `serve`) or one snapshot file; without it the live cluster is
    /// read (kubeconfig as kubectl finds it).
    #[arg(long)]
    cluster_snapshot: Option<PathBuf>,
    /// Path to the kubeconfig file, for the live cluster.
    #[arg(long, conflicts_with = "cluster_snapshot")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context, for the live cluster.
    #[arg(long, conflicts_with = "cluster_snapshot")]
    context: Option<String>,
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    output: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

pub fn run(args: DefragArgs) -> Result<()> {
    let advice = match &args.cluster_snapshot {
        Some(path) => from_snapshot(path)?,
        None => {
            let global = Global {
                kubeconfig: args.kubeconfig.clone(),
                context: args.context.clone(),
                namespace: None,
                output: None,
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(async {
                let conn = kubectl::config::connect(&global).await?;
                kubectl::defrag::read(&conn).await
            })?
        }
    };
    match args.output {
        Format::Json => print!("{}", defrag::json(&advice)),
        Format::Table => print!("{}", defrag::table(&advice)),
    }
    Ok(())
}

/// The advice over a snapshot directory or file.
fn from_snapshot(path: &Path) -> Result<Advice> {
    let objects = if path.is_dir() {
        snapshot::read_dir(path)?
    } else {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut o = Objects::default();
        o.add_text(path, &text)?;
        if o.topologies.is_empty() && o.nodes.is_empty() {
            return Err(snapshot::SnapshotError::Empty(path.to_path_buf()).into());
        }
        o
    };
    let view = objects.view()?;
    for w in view.warnings() {
        tracing::warn!("{w}");
    }
    let facts: Vec<PodFacts> = objects.pods.iter().map(PodFacts::of).collect();
    Ok(kubectl::defrag::advise(&view, &facts))
}
