//! `kubectl fumarole`: the kubectl plugin that shows people what the scheduler extension and
//! the agents see, read from the live cluster.
//!
//! - `explain POD`: per node, why the pod waits or where it would go, through the same
//!   [`crate::decider::Decider::explain`] the extension's `explain` uses, over a view read once
//!   from the API server ([`crate::live::read_once`]);
//! - `node NODE`: the node's link matrix and device health, from its `DeviceTopology`;
//! - `top`: devices free, in use and unhealthy per super-node (per node with `-o wide`);
//! - `defrag`: the fewest running pods whose move would make room for the largest waiting unit
//!   ([`crate::core::defrag`]).
//!
//! Start at [`Cli`] and [`run`]. Each subcommand's module turns what it read into a plain
//! report (serialized for `-o json|yaml`) and lays it out as a table; the layouts are pure
//! functions, tested without a cluster. The binary (`src/bin/kubectl-fumarole.rs`) only calls
//! [`run`].

pub mod config;
pub mod defrag;
pub mod explain;
pub mod node;
pub mod top;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

use crate::cli::{self, ScoringArgs, SuperPodArgs};

/// `kubectl fumarole ...` (kubectl runs `kubectl-fumarole` with the arguments after
/// `fumarole`).
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-fumarole",
    bin_name = "kubectl fumarole",
    version,
    about = "Topology-aware accelerator scheduling, as fumarole sees the cluster"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// kubectl's connection and output flags, accepted before or after the subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct Global {
    /// Path to the kubeconfig file (default: KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Namespace of the pod (default: the context's namespace, else "default").
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Output format: a table (default), a wider table, JSON or YAML.
    #[arg(short = 'o', long, value_enum, global = true)]
    pub output: Option<Output>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Why a pod waits, or where it would go: per node, the verdict, the reason, the score and
    /// the devices it would get.
    Explain {
        /// The pod's name (in -n/--namespace).
        pod: String,
        #[command(flatten)]
        scoring: ScoringArgs,
        /// The extension's `--super-pod-size` / `--reserve-nodes`, for `sp-block` jobs.
        #[command(flatten)]
        super_pods: SuperPodArgs,
    },
    /// A node's devices: the link class between every pair, health and who uses each.
    Node {
        /// The node's name.
        node: String,
    },
    /// Devices free, in use and unhealthy per super-node (and per node with -o wide).
    Top,
    /// The fewest running pods whose move would make room for the largest waiting unit, where
    /// each would go, and what it costs.
    Defrag,
}

/// `-o` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Json,
    Yaml,
    Wide,
}

/// How a report is printed: a table (`wide` or not) or serialized.
fn render<T: Serialize>(
    output: Option<Output>,
    report: &T,
    table: impl FnOnce(&T, bool) -> String,
) -> Result<String> {
    Ok(match output {
        None => table(report, false),
        Some(Output::Wide) => table(report, true),
        Some(Output::Json) => {
            let mut s = serde_json::to_string_pretty(report).context("writing JSON")?;
            s.push('\n');
            s
        }
        Some(Output::Yaml) => serde_norway::to_string(report).context("writing YAML")?,
    })
}

/// Runs one command and prints its report on stdout.
pub fn run(cli: Cli) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let text = rt.block_on(async {
        let conn = config::connect(&cli.global).await?;
        let output = cli.global.output;
        match cli.command {
            Command::Explain {
                pod,
                scoring,
                super_pods,
            } => {
                let settings = cli::settings(&[&scoring, &super_pods])?;
                let report = explain::read(&conn, &pod, settings).await?;
                render(output, &report, explain::table)
            }
            Command::Node { node } => {
                let report = node::read(&conn, &node).await?;
                render(output, &report, node::table)
            }
            Command::Top => {
                let report = top::read(&conn).await?;
                render(output, &report, top::table)
            }
            Command::Defrag => {
                let report = defrag::read(&conn).await?;
                render(output, &report, defrag::table)
            }
        }
    })?;
    print!("{text}");
    Ok(())
}
