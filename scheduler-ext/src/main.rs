//! `fumarole-scheduler-ext`: the cluster service.
//!
//! Subcommands: `serve` (the kube-scheduler extender and Volcano extender HTTP APIs over the
//! live cluster, or over a snapshot directory), `explain` (per node verdict, `q`, `loss`,
//! score and devices for one pod, from a snapshot), `simulate` (replay a job trace over a
//! simulated cluster per placement policy and report the placement quality) and
//! `generate-trace` (a seeded job trace for `simulate`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Pod;
use scheduler_ext::extender::{Service, Settings};
use scheduler_ext::live::LiveOptions;
use scheduler_ext::metrics::{self, Metrics};
use scheduler_ext::score::gpu_aware::GpuAware;
use scheduler_ext::server::{self, TlsFiles};
use scheduler_ext::simulate::policy::Policy;
use scheduler_ext::simulate::shape::ClusterShape;
use scheduler_ext::view::ClusterView;
use scheduler_ext::{explain, extender, live, simulate, snapshot};

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

#[derive(clap::Args)]
struct ServeArgs {
    /// Build the cluster view from the YAML files in this directory instead of an API server
    /// (DeviceTopology, Numatopology, Node and Pod objects, as `kubectl get -o yaml` writes
    /// them). Without it the view comes from the API server (KUBECONFIG, ~/.kube/config or the
    /// in-cluster service account).
    #[arg(long)]
    cluster_snapshot: Option<PathBuf>,
    /// Kubeconfig file for the API server (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, conflicts_with = "cluster_snapshot")]
    kubeconfig: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8888")]
    listen: SocketAddr,
    /// PEM certificate (chain) for HTTPS; with --tls-key-file.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key for HTTPS; with --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// How long devices committed to a pod are held until the pod shows up bound with them.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    commit_ttl: Duration,
    /// How long a gpu-group-size unit's super-node reservation waits for the unit's next pod.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    reservation_ttl: Duration,
    /// Coalesce cluster changes for this long before rebuilding the view.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    view_debounce: Duration,
    /// Schedulers whose bound accelerator pods get `fumarole.dev/devices` written after the fact
    /// (those that bind without calling bind / allocateFunc); comma-separated, empty for none.
    #[arg(long, value_delimiter = ',', default_value = "volcano")]
    annotate_bound_pods_of: Vec<String>,
    /// Publish Volcano HyperNode objects (topology.volcano.sh/v1alpha1) for the super-nodes.
    #[arg(long)]
    publish_hypernodes: bool,
    #[command(flatten)]
    scoring: Scoring,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the extender APIs: kube-scheduler under /kube-scheduler, Volcano under /volcano,
    /// plus /healthz and /metrics.
    Serve(Box<ServeArgs>),
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
    /// Replay a job trace over a simulated cluster, once per placement policy, and report the
    /// placement quality of each (table, Markdown or JSON; SVG plots with --plot-dir).
    Simulate(Box<SimulateArgs>),
    /// Write a seeded job trace for `simulate` (the same trace for the same arguments).
    GenerateTrace(GenerateArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// The simulated cluster: `NODESxFIXTURE[:SUPER_NODES]`, e.g. 64xdgx-h100:8 or
    /// 32xatlas-800-910:4 (fixtures: dgx-h100, atlas-800-910, pcie-4gpu, metax-c500-8 and the
    /// 16-device dgx-h100-x2, atlas-910b-16, pcie-16gpu, metax-c500-16).
    #[arg(long, value_name = "SHAPE")]
    cluster: ClusterShape,
    /// The job trace (JSON lines; see `generate-trace`).
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// Policies to compare, in order (repeat the flag); default: all of fumarole, binpack,
    /// spread, random, nvidia.
    #[arg(long = "policy", value_name = "NAME")]
    policies: Vec<Policy>,
    /// Seed of the `random` policy.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long a gpu-group-size unit's super-node reservation waits for its pods (simulated).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    reservation_ttl: Duration,
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Drop the jobs' gpu-group-size and atomic-gpu-group-size (to see what the super-node
    /// rules cost).
    #[arg(long)]
    without_groups: bool,
    /// Write `<trace>.stranded.svg` and `<trace>.metrics.svg` into this directory.
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
    #[command(flatten)]
    scoring: Scoring,
}

#[derive(Clone, Copy, ValueEnum)]
enum ReportFormat {
    Table,
    Markdown,
    Json,
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// The cluster the trace is for (sets the load and the largest multi-node job).
    #[arg(long, value_name = "SHAPE")]
    cluster: ClusterShape,
    /// Number of jobs.
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Offered load as a share of the cluster's devices (device-seconds asked per second).
    #[arg(long, default_value_t = 0.9)]
    load: f64,
    /// Write the trace here instead of standard output.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
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
        Command::Serve(args) => serve(*args),
        Command::Simulate(args) => simulate_cmd(*args),
        Command::GenerateTrace(args) => generate_cmd(args),
    }
}

fn simulate_cmd(args: SimulateArgs) -> Result<()> {
    use simulate::report::{self, Metrics};
    let scorer = args.scoring.gpu_aware()?;
    let horizon = Duration::from_secs(simulate::trace::MAX_SECONDS);
    if args.reservation_ttl > horizon {
        bail!(
            "--reservation-ttl must be at most {}, got {}",
            humantime::format_duration(horizon),
            humantime::format_duration(args.reservation_ttl)
        );
    }
    let cluster = args.cluster.build()?;
    let text = std::fs::read_to_string(&args.trace)
        .with_context(|| format!("reading {}", args.trace.display()))?;
    let name = args.trace.file_name().map_or_else(
        || args.trace.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut sim = simulate::Simulation::load(cluster, &text, &name)?;
    if args.without_groups {
        sim = sim.without_groups();
    }
    let policies = if args.policies.is_empty() {
        Policy::ALL.to_vec()
    } else {
        args.policies
    };
    let opts = simulate::Options {
        seed: args.seed,
        scorer,
        reservation_ttl: args.reservation_ttl,
    };
    let runs = simulate::compare(&sim, &policies, &opts);
    let metrics: Vec<Metrics> = runs.iter().map(|o| Metrics::of(&sim, o)).collect();
    match args.format {
        ReportFormat::Table => print!("{}", report::table(&sim, &metrics)),
        ReportFormat::Markdown => print!("{}", report::markdown(&sim, &metrics)),
        ReportFormat::Json => print!("{}", report::json(&sim, &metrics)),
    }
    if let Some(dir) = &args.plot_dir {
        let stem = args
            .trace
            .file_stem()
            .map_or_else(|| "trace".to_string(), |s| s.to_string_lossy().into_owned());
        let paths = simulate::plot::write_all(dir, &stem, &sim, &runs, &metrics)
            .with_context(|| format!("writing plots into {}", dir.display()))?;
        for p in paths {
            tracing::info!(path = %p.display(), "plot written");
        }
    }
    Ok(())
}

fn generate_cmd(args: GenerateArgs) -> Result<()> {
    if !(args.load.is_finite() && args.load > 0.0) {
        bail!("--load must be a number > 0, got {}", args.load);
    }
    if args.jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    let cluster = args.cluster.build()?;
    let spec = simulate::trace::GenSpec {
        seed: args.seed,
        jobs: args.jobs,
        load: args.load,
        capacity: cluster.capacity(),
        devices_per_node: u32::try_from(cluster.devices_per_node).unwrap_or(u32::MAX),
        super_node_size: u32::try_from(cluster.super_node_size()).unwrap_or(u32::MAX),
    };
    let jobs = simulate::trace::generate(&spec);
    let header = [format!(
        "fumarole-scheduler-ext generate-trace --cluster {} --jobs {} --seed {} --load {}",
        args.cluster, args.jobs, args.seed, args.load
    )];
    let text = simulate::trace::write(&jobs, &header);
    match &args.out {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(())
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
    let svc = Service::new(view, g);
    let (req, rows) = explain::explain(&svc, &pod)?;
    match format {
        Format::Json => print!("{}", explain::json(&rows)),
        Format::Table => print!("{}", explain::table(&req, &rows)),
    }
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
    let settings = Settings {
        scorer: args.scoring.gpu_aware()?,
        commit_ttl: args.commit_ttl,
        reservation_ttl: args.reservation_ttl,
    };
    let tls = match (args.tls_cert_file, args.tls_key_file) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let svc = match &args.cluster_snapshot {
            Some(dir) => {
                let view = snapshot::load(dir)?;
                for w in &view.warnings {
                    tracing::warn!("{w}");
                }
                tracing::info!(nodes = view.len(), snapshot = %dir.display(), "cluster view loaded");
                Arc::new(Service::with_settings(view, settings))
            }
            None => {
                let client = kube_client(args.kubeconfig.as_deref()).await?;
                let svc = Arc::new(Service::with_settings(ClusterView::default(), settings));
                let opts = LiveOptions {
                    debounce: args.view_debounce,
                    annotate_schedulers: args
                        .annotate_bound_pods_of
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect(),
                    publish_hypernodes: args.publish_hypernodes,
                };
                // The loop lives as long as the runtime; it ends with the process.
                drop(live::start(client, Arc::clone(&svc), opts).await?);
                svc
            }
        };
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        tracing::info!(address = %listener.local_addr()?, https = tls.is_some(), "serving");
        let app = metrics::instrument(extender::router(svc), Arc::new(Metrics::new()));
        server::serve(listener, app, tls, shutdown_signal()).await
    })
}

/// Resolves on SIGINT or SIGTERM (what the kubelet sends on pod deletion).
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

/// A client from `--kubeconfig`, else the usual inference (KUBECONFIG, ~/.kube/config,
/// in-cluster).
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding the API server (KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    kube::Client::try_from(config).context("building the API client")
}
