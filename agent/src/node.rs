//! Which node the agent describes: this host, a filesystem root, a bundled fixture or an hwloc
//! XML file, and where NVIDIA answers come from (the library, `--nvml-library`, recorded
//! answers). Shared by `discover` and `run`.
//!
//! hwloc takes its filesystem root from the environment, so [`NodeArgs::prepare`] must run
//! before the process starts any thread (before the tokio runtime).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use fumarole_exporter::discover::nvml::{LibraryProbe, NoProbe, NvmlProbe, RecordedProbe};
use fumarole_exporter::discover::{self, DiscoverOptions, RECORDED_NVML_FILE, Source};
use fumarole_exporter::fixtures;
use fumarole_topology::{SuperNode, SuperNodeSource};

#[derive(Args, Clone)]
pub struct NodeArgs {
    /// Filesystem root to read /sys, /proc and /dev from (default: this machine, `/`).
    #[arg(long, value_name = "DIR", group = "input")]
    root: Option<PathBuf>,
    /// A bundled fixture node (dgx-h100, atlas-800t-a2, atlas-800-910, atlas-a3-16, metax-c500-8,
    /// pcie-4gpu, cpu-only).
    #[arg(long, value_name = "NAME", group = "input")]
    fixture: Option<String>,
    /// An hwloc XML file (`lstopo --of xml`) instead of a filesystem.
    #[arg(long, value_name = "FILE", group = "input")]
    from_xml: Option<PathBuf>,
    /// Describe only the CPUs this process may use, not the whole machine.
    #[arg(long)]
    restrict_to_allowed: bool,
    /// Topology override file (default: /etc/fumarole/topology.yaml under the root, if present).
    #[arg(long = "override", value_name = "FILE")]
    override_file: Option<PathBuf>,
    /// Recorded NVML answers (JSON) to use instead of the NVML library.
    #[arg(long, value_name = "FILE", conflicts_with = "nvml_library")]
    nvml_answers: Option<PathBuf>,
    /// The NVML library to load (default: `libnvidia-ml.so.1` from the library path on this
    /// host; on a `--root` or `--fixture` node only when given, instead of recorded answers).
    #[arg(long, value_name = "FILE", env = "FUMAROLE_NVML_LIBRARY")]
    nvml_library: Option<PathBuf>,
    /// Super-node id of this node (wins over the override file and the NVLink fabric).
    #[arg(long, value_name = "ID")]
    super_node: Option<String>,
}

/// Where NVIDIA answers come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvmlSource {
    /// The NVML library (a path, or the default `libnvidia-ml.so.1`).
    Library(Option<PathBuf>),
    /// Recorded answers (a file), or none at all: no NVML health either.
    Recorded,
}

/// A node ready to discover.
pub struct Prepared {
    pub options: DiscoverOptions,
    pub nvml: Box<dyn NvmlProbe + Send + Sync>,
    pub nvml_source: NvmlSource,
    /// Keeps a materialized fixture alive.
    _fixture_dir: Option<tempfile::TempDir>,
}

pub fn find_fixture(name: &str) -> Result<fixtures::Fixture> {
    fixtures::get(name).with_context(|| {
        format!(
            "unknown fixture {name:?}; bundled fixtures: {}",
            fixtures::NAMES.join(", ")
        )
    })
}

impl NodeArgs {
    /// Resolves the input, points hwloc at it and picks the NVML source. Call before any
    /// thread starts.
    pub fn prepare(&self, hostname: Option<String>) -> Result<Prepared> {
        let mut fixture_dir = None;
        let source = match (&self.root, &self.fixture, &self.from_xml) {
            (_, Some(name), _) => {
                let fixture = find_fixture(name)?;
                let dir = tempfile::Builder::new()
                    .prefix(&format!("fumarole-{name}-"))
                    .tempdir()
                    .context("creating a directory for the fixture")?;
                fixture.materialize(dir.path()).with_context(|| {
                    format!("writing fixture {name} to {}", dir.path().display())
                })?;
                let source = Source::FsRoot(dir.path().to_path_buf());
                fixture_dir = Some(dir);
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
            // SAFETY: the caller runs this before starting any thread (see the module doc).
            unsafe { discover::use_fsroot(root) };
        }

        let nvml_source = match (&self.nvml_answers, &self.nvml_library, &source) {
            (Some(_), _, _) => NvmlSource::Recorded,
            (None, Some(lib), _) => NvmlSource::Library(Some(lib.clone())),
            (None, None, Source::Host) => NvmlSource::Library(None),
            (None, None, _) => NvmlSource::Recorded,
        };
        let nvml: Box<dyn NvmlProbe + Send + Sync> =
            match (&self.nvml_answers, &nvml_source, &source) {
                (Some(file), _, _) => Box::new(RecordedProbe(file.clone())),
                (None, NvmlSource::Library(lib_path), _) => Box::new(LibraryProbe {
                    lib_path: lib_path.clone(),
                }),
                (None, _, Source::FsRoot(root)) => {
                    let recorded = root.join(RECORDED_NVML_FILE.trim_start_matches('/'));
                    if recorded.is_file() {
                        Box::new(RecordedProbe(recorded))
                    } else {
                        Box::new(NoProbe)
                    }
                }
                (None, _, _) => Box::new(NoProbe),
            };

        let mut options = DiscoverOptions::new(source);
        options.restrict_to_allowed = self.restrict_to_allowed;
        options.override_file = self.override_file.clone();
        options.hostname = hostname;
        options.super_node = self.super_node.clone().map(|id| SuperNode {
            id,
            source: SuperNodeSource::Config,
        });
        Ok(Prepared {
            options,
            nvml,
            nvml_source,
            _fixture_dir: fixture_dir,
        })
    }
}
