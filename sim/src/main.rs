//! `fumarole-sim`: the placement-quality simulator.
//!
//! Subcommands: `run` (replay a job trace over a simulated cluster once per placement policy
//! and report the placement quality of each), `generate-trace` (a seeded job trace for
//! `run`), `sweep` (many generated traces, every policy, each figure's mean and spread) and
//! `sharing` (a mixed trace of training jobs and inference shares, with and without sharing).
//! See the crate documentation of `fumarole_sim` for the model.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use fumarole_sim::policy::Policy;
use fumarole_sim::report::{self, Metrics};
use fumarole_sim::shape::ClusterShape;
use scheduler_ext::cli::{self, ReservationArgs, ScoringArgs};

#[derive(Parser)]
#[command(name = "fumarole-sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a job trace over a simulated cluster, once per placement policy, and report the
    /// placement quality of each (table, Markdown or JSON; SVG plots with --plot-dir).
    Run(Box<RunArgs>),
    /// Write a seeded job trace for `run` (the same trace for the same arguments).
    GenerateTrace(GenerateArgs),
    /// Generate a trace for every cluster x load x seed, run every policy on each, and report
    /// each figure's mean, spread and range per policy (Markdown), the delays per trace and
    /// fumarole's targets.
    Sweep(Box<SweepArgs>),
    /// Generate mixed traces of whole-device training jobs and one-replica inference pods and
    /// run each without sharing, with shares packed (fumarole), with shares spread, and both
    /// clusters under the nvidia baseline; report the GPUs inference holds, the waits and the
    /// training pods' interconnect (Markdown).
    Sharing(Box<SharingArgs>),
}

#[derive(clap::Args)]
pub struct SharingArgs {
    /// The simulated cluster (an NVIDIA fixture): `NODESxFIXTURE[:SUPER_NODES]`.
    #[arg(long, value_name = "SHAPE", default_value = "16xdgx-h100:2")]
    cluster: ClusterShape,
    /// The first this many nodes offer their GPUs in replicas.
    #[arg(long, default_value_t = 2)]
    shared_nodes: usize,
    /// Replicas per GPU on those nodes.
    #[arg(long, default_value_t = 4)]
    replicas: u32,
    /// Training jobs per trace (the generated mix, on the nodes offering whole GPUs).
    #[arg(long, default_value_t = 400)]
    jobs: usize,
    /// One-replica inference jobs per trace.
    #[arg(long, default_value_t = 400)]
    inference: usize,
    /// Offered training load as a share of the whole GPUs.
    #[arg(long, default_value_t = 0.8)]
    load: f64,
    /// Trace seeds (repeat the flag); default 1, 2, 3.
    #[arg(long = "seed", value_name = "SEED")]
    seeds: Vec<u64>,
    #[command(flatten)]
    reservations: ReservationArgs,
    #[command(flatten)]
    scoring: ScoringArgs,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// The simulated cluster: `NODESxFIXTURE[:SUPER_NODES]`, e.g. 64xdgx-h100:8 or
    /// 32xatlas-800-910:4 (fixtures: dgx-h100, atlas-800-910, pcie-4gpu, metax-c500-8 and the
    /// 16-device dgx-h100-x2, atlas-910b-16, pcie-16gpu, metax-c500-16).
    #[arg(long, value_name = "SHAPE")]
    cluster: ClusterShape,
    /// The job trace (JSON lines; see `generate-trace`).
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// Policies to compare, in order (repeat the flag); default: all of fumarole,
    /// volcano-hard, first-fit, binpack, spread, random, nvidia (fumarole-defrag only when
    /// named).
    #[arg(long = "policy", value_name = "NAME")]
    policies: Vec<Policy>,
    /// Seed of the `random` policy.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    reservations: ReservationArgs,
    /// `fumarole-defrag` moves only pods whose job has run at most this long (simulated; a
    /// move restarts the job from scratch).
    #[arg(long, default_value = "2h", value_parser = humantime::parse_duration)]
    defrag_max_run: Duration,
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Drop the jobs' gpu-group-size and atomic-gpu-group-size (to see what the super-node
    /// rules cost).
    #[arg(long)]
    without_groups: bool,
    /// Write `<trace>.stranded.svg` and `<trace>.metrics.svg` into this directory.
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
    /// Write every job's outcome under every policy here, one JSON object a line (start,
    /// queueing delay, super-nodes and nodes of its pods), to compare policies job by job.
    #[arg(long, value_name = "FILE")]
    jobs_out: Option<PathBuf>,
    #[command(flatten)]
    scoring: ScoringArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum ReportFormat {
    Table,
    Markdown,
    Json,
}

#[derive(clap::Args)]
pub struct GenerateArgs {
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

#[derive(clap::Args)]
pub struct SweepArgs {
    /// Cluster shapes (repeat the flag); default: one of each 8-device-or-smaller fixture,
    /// 64xdgx-h100:8, 32xatlas-800-910:4, 64xpcie-4gpu:8, 64xmetax-c500-8:8.
    #[arg(long = "cluster", value_name = "SHAPE")]
    clusters: Vec<ClusterShape>,
    /// Offered loads (repeat the flag); default 0.8, 0.9, 1.0, 1.1.
    #[arg(long = "load", value_name = "LOAD")]
    loads: Vec<f64>,
    /// Traces per cluster and load, each with its own seed.
    #[arg(long, default_value_t = 2)]
    seeds: u64,
    /// The first seed (the committed traces use 1 to 3).
    #[arg(long, default_value_t = 101)]
    first_seed: u64,
    /// Jobs per trace.
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    /// Policies to compare, in order (repeat the flag); default: all but fumarole-defrag
    /// (named, it runs too).
    #[arg(long = "policy", value_name = "NAME")]
    policies: Vec<Policy>,
    /// Seed of the `random` policy.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    reservations: ReservationArgs,
    /// `fumarole-defrag` moves only pods whose job has run at most this long (simulated; a
    /// move restarts the job from scratch).
    #[arg(long, default_value = "2h", value_parser = humantime::parse_duration)]
    defrag_max_run: Duration,
    #[command(flatten)]
    scoring: ScoringArgs,
}

fn run_cmd(args: RunArgs) -> Result<()> {
    let settings = cli::settings(&[&args.scoring, &args.reservations])?;
    let horizon = Duration::from_secs(fumarole_sim::trace::MAX_SECONDS);
    if settings.reservation_ttl > horizon {
        bail!(
            "--reservation-ttl must be at most {}, got {}",
            humantime::format_duration(horizon),
            humantime::format_duration(settings.reservation_ttl)
        );
    }
    let cluster = args.cluster.build()?;
    let text = std::fs::read_to_string(&args.trace)
        .with_context(|| format!("reading {}", args.trace.display()))?;
    let name = args.trace.file_name().map_or_else(
        || args.trace.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut sim = fumarole_sim::Simulation::load(cluster, &text, &name)?;
    if args.without_groups {
        sim = sim.without_groups();
    }
    let policies = if args.policies.is_empty() {
        Policy::ALL.to_vec()
    } else {
        args.policies
    };
    let opts = fumarole_sim::Options {
        seed: args.seed,
        settings,
        defrag_max_run: args.defrag_max_run,
        spread_shares: false,
    };
    let runs = fumarole_sim::compare(&sim, &policies, &opts);
    let metrics: Vec<Metrics> = runs.iter().map(|o| Metrics::of(&sim, o)).collect();
    match args.format {
        ReportFormat::Table => print!("{}", report::table(&sim, &metrics)),
        ReportFormat::Markdown => print!("{}", report::markdown(&sim, &metrics)),
        ReportFormat::Json => print!("{}", report::json(&sim, &metrics)),
    }
    if let Some(path) = &args.jobs_out {
        std::fs::write(path, report::jobs_jsonl(&sim, &runs))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dir) = &args.plot_dir {
        let stem = args
            .trace
            .file_stem()
            .map_or_else(|| "trace".to_string(), |s| s.to_string_lossy().into_owned());
        let paths = fumarole_sim::plot::write_all(dir, &stem, &sim, &runs, &metrics)
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
    let spec = fumarole_sim::trace::GenSpec {
        seed: args.seed,
        jobs: args.jobs,
        load: args.load,
        capacity: cluster.capacity(),
        devices_per_node: u32::try_from(cluster.devices_per_node).unwrap_or(u32::MAX),
        super_node_size: u32::try_from(cluster.super_node_size()).unwrap_or(u32::MAX),
    };
    let jobs = fumarole_sim::trace::generate(&spec);
    let header = [format!(
        "fumarole-sim generate-trace --cluster {} --jobs {} --seed {} --load {}",
        args.cluster, args.jobs, args.seed, args.load
    )];
    let text = fumarole_sim::trace::write(&jobs, &header);
    match &args.out {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(())
}

fn sweep_cmd(args: SweepArgs) -> Result<()> {
    let settings = cli::settings(&[&args.scoring, &args.reservations])?;
    let horizon = Duration::from_secs(fumarole_sim::trace::MAX_SECONDS);
    if settings.reservation_ttl > horizon {
        bail!(
            "--reservation-ttl must be at most {}",
            humantime::format_duration(horizon)
        );
    }
    if let Some(l) = args.loads.iter().find(|l| !(l.is_finite() && **l > 0.0)) {
        bail!("--load must be a number > 0, got {l}");
    }
    if args.jobs == 0 || args.seeds == 0 {
        bail!("--jobs and --seeds must be at least 1");
    }
    let clusters = if args.clusters.is_empty() {
        [
            "64xdgx-h100:8",
            "32xatlas-800-910:4",
            "64xpcie-4gpu:8",
            "64xmetax-c500-8:8",
        ]
        .iter()
        .map(|s| s.parse())
        .collect::<Result<Vec<ClusterShape>, _>>()?
    } else {
        args.clusters
    };
    let spec = fumarole_sim::sweep::SweepSpec {
        clusters,
        loads: if args.loads.is_empty() {
            vec![0.8, 0.9, 1.0, 1.1]
        } else {
            args.loads
        },
        first_seed: args.first_seed,
        seeds: args.seeds,
        jobs: args.jobs,
    };
    let policies = if args.policies.is_empty() {
        Policy::ALL.to_vec()
    } else {
        args.policies
    };
    let opts = fumarole_sim::Options {
        seed: args.seed,
        settings,
        defrag_max_run: args.defrag_max_run,
        spread_shares: false,
    };
    let runs = fumarole_sim::sweep::run(&spec, &policies, &opts, |i, n, r| {
        tracing::info!(trace = %r.case.name(), "{i}/{n} traces simulated");
    })?;
    print!("{}", fumarole_sim::sweep::markdown(&spec, &runs));
    Ok(())
}

fn sharing_cmd(args: SharingArgs) -> Result<()> {
    let settings = cli::settings(&[&args.scoring, &args.reservations])?;
    if !(args.load.is_finite() && args.load > 0.0) {
        bail!("--load must be a number > 0, got {}", args.load);
    }
    let cluster = args
        .cluster
        .build_shared(args.shared_nodes, args.replicas)?;
    let seeds = if args.seeds.is_empty() {
        vec![1, 2, 3]
    } else {
        args.seeds
    };
    let opts = fumarole_sim::Options {
        settings,
        ..fumarole_sim::Options::default()
    };
    for seed in seeds {
        let spec = fumarole_sim::trace::GenSpec {
            seed,
            jobs: args.jobs,
            load: args.load,
            capacity: cluster.capacity(),
            devices_per_node: u32::try_from(cluster.devices_per_node).unwrap_or(u32::MAX),
            super_node_size: u32::try_from(cluster.super_node_size()).unwrap_or(u32::MAX),
        };
        let jobs = fumarole_sim::sharing::mixed_trace(&spec, args.inference);
        let text = fumarole_sim::trace::write(&jobs, &[]);
        let name = format!("seed {seed}");
        let sim = fumarole_sim::Simulation::load(cluster.clone(), &text, &name)?;
        let rows = fumarole_sim::sharing::compare(&sim, &opts)?;
        let caption = format!(
            "`{}`, {} shared nodes x {} replicas, {} training jobs at load {}, {} inference \
             pods, seed {seed}:",
            args.cluster, args.shared_nodes, args.replicas, args.jobs, args.load, args.inference
        );
        println!("{}", fumarole_sim::sharing::markdown(&caption, &rows));
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    scheduler_ext::cli::main_with(|| match Cli::parse().command {
        Command::Run(args) => run_cmd(*args),
        Command::GenerateTrace(args) => generate_cmd(args),
        Command::Sweep(args) => sweep_cmd(*args),
        Command::Sharing(args) => sharing_cmd(*args),
    })
}
