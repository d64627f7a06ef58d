//! `fumarole-agent discover`: run discovery once and print the result.
//!
//! hwloc takes its filesystem root from the environment, so the root is chosen here, before
//! anything starts a thread (see `fumarole_exporter::discover::use_fsroot`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use fumarole_exporter::discover::nvml::{LibraryProbe, NoProbe, NvmlProbe, RecordedProbe};
use fumarole_exporter::discover::{self, DiscoverOptions, RECORDED_NVML_FILE, Source};
use fumarole_exporter::fixtures;
use fumarole_topology::{SuperNode, SuperNodeSource};

use crate::render;

#[derive(Args)]
pub struct DiscoverArgs {
    /// Filesystem root to read /sys, /proc and /dev from (default: this machine, `/`).
    #[arg(long, value_name = "DIR", group = "input")]
    root: Option<PathBuf>,
    /// A bundled fixture node (dgx-h100, atlas-800t-a2, atlas-800-910, metax-c500-8,
    /// pcie-4gpu, cpu-only).
    #[arg(long, value_name = "NAME", group = "input")]
    fixture: Option<String>,
    /// An hwloc XML file (`lstopo --of xml`) instead of a filesystem.
    #[arg(long, value_name = "FILE", group = "input")]
    from_xml: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Describe only the CPUs this process may use, not the whole machine.
    #[arg(long)]
    restrict_to_allowed: bool,
    /// Topology override file (default: /etc/fumarole/topology.yaml under the root, if present).
    #[arg(long = "override", value_name = "FILE")]
    override_file: Option<PathBuf>,
    /// Recorded NVML answers (JSON) to use instead of the NVML library.
    #[arg(long, value_name = "FILE")]
    nvml_answers: Option<PathBuf>,
    /// Super-node id of this node (wins over the override file and the NVLink fabric).
    #[arg(long, value_name = "ID")]
    super_node: Option<String>,
    /// Node name (default: the root's kernel hostname).
    #[arg(long, env = "NODE_NAME")]
    hostname: Option<String>,
}

#[derive(Args)]
pub struct FixtureArgs {
    /// Fixture to write; without it, list the fixtures.
    name: Option<String>,
    /// Directory to write the fixture's filesystem root into (created; must be empty).
    #[arg(long, value_name = "DIR", requires = "name")]
    out: Option<PathBuf>,
}

/// `fumarole-agent fixture [NAME --out DIR]`.
pub fn fixture(args: FixtureArgs) -> Result<()> {
    let (Some(name), Some(out)) = (&args.name, &args.out) else {
        for name in fixtures::NAMES {
            if let Some(f) = fixtures::get(name) {
                println!("{name:<14} {}", f.description);
            }
        }
        return Ok(());
    };
    let fixture = find_fixture(name)?;
    if out.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        bail!("--out {}: directory is not empty", out.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    fixture.materialize(out).with_context(|| format!("writing fixture {name} to {}", out.display()))?;
    println!("{}", out.display());
    Ok(())
}

fn find_fixture(name: &str) -> Result<fixtures::Fixture> {
    fixtures::get(name).with_context(|| {
        format!("unknown fixture {name:?}; bundled fixtures: {}", fixtures::NAMES.join(", "))
    })
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
    Matrix,
}

pub fn run(args: DiscoverArgs) -> Result<()> {
    // Keeps a materialized fixture alive until discovery is done.
    let mut _fixture_dir = None;
    let source = match (&args.root, &args.fixture, &args.from_xml) {
        (_, Some(name), _) => {
            let Some(fixture) = fixtures::get(name) else {
                bail!(
                    "unknown fixture {name:?}; bundled fixtures: {}",
                    fixtures::NAMES.join(", ")
                );
            };
            let dir = tempfile::Builder::new()
                .prefix(&format!("fumarole-{name}-"))
                .tempdir()
                .context("creating a directory for the fixture")?;
            fixture
                .materialize(dir.path())
                .with_context(|| format!("writing fixture {name} to {}", dir.path().display()))?;
            let source = Source::FsRoot(dir.path().to_path_buf());
            _fixture_dir = Some(dir);
            source
        }
        (_, _, Some(xml)) => Source::Xml(xml.clone()),
        (Some(root), _, _) if root != Path::new("/") => {
            if !root.is_dir() {
                bail!("--root {}: no such directory", root.display());
            }
            Source::FsRoot(root.clone())
        }
        _ => Source::Host,
    };
    if let Some(root) = source.root() {
        // SAFETY: `discover` runs before the process starts any thread (no runtime exists yet,
        // and logging writes synchronously).
        unsafe { discover::use_fsroot(root) };
    }

    let nvml: Box<dyn NvmlProbe> = match (&args.nvml_answers, &source) {
        (Some(file), _) => Box::new(RecordedProbe(file.clone())),
        (None, Source::Host) => Box::new(LibraryProbe::default()),
        (None, Source::FsRoot(root)) => {
            let recorded = root.join(RECORDED_NVML_FILE.trim_start_matches('/'));
            if recorded.is_file() {
                Box::new(RecordedProbe(recorded))
            } else {
                Box::new(NoProbe)
            }
        }
        (None, Source::Xml(_)) => Box::new(NoProbe),
    };

    let mut opts = DiscoverOptions::new(source);
    opts.restrict_to_allowed = args.restrict_to_allowed;
    opts.override_file = args.override_file;
    opts.hostname = args.hostname;
    opts.super_node = args.super_node.map(|id| SuperNode {
        id,
        source: SuperNodeSource::Config,
    });
    let topology = discover::discover(&opts, nvml.as_ref())?;

    let text = match args.format {
        Format::Json => render::json(&topology)?,
        Format::Yaml => render::yaml(&topology)?,
        Format::Table => render::table(&topology),
        Format::Matrix => render::matrix(&topology),
    };
    print!("{text}");
    Ok(())
}
