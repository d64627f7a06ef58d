//! CPUs, NUMA nodes, distances and the PCI tree through hwloc (`hwlocality`).
//!
//! hwloc reads the filesystem root from the `HWLOC_FSROOT` environment variable when a
//! topology is loaded; there is no per-topology setting in hwloc 2.x. Changing the environment
//! of a running multi-threaded process is unsound, so a process chooses its root once, with
//! [`use_fsroot`], before it starts threads (the agent does this first thing in `main`), and
//! [`load`] checks that the root it is asked for is the one in force.

use std::path::{Path, PathBuf};

use fumarole_topology::{CpuSet, NumaNode, Package, ProcessingUnit};
use hwlocality::Topology;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::{DownstreamAttributes, ObjectAttributes, UpstreamAttributes};
use hwlocality::object::types::ObjectType;
use hwlocality::topology::builder::{BuildFlags, TypeFilter};

/// What hwloc is loaded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// This machine (`/`).
    Host,
    /// A sysfs/procfs dump or another root (hwloc corpus tarballs, our fixtures, a host
    /// mounted elsewhere). Must be the root set with [`use_fsroot`].
    FsRoot(PathBuf),
    /// An XML file written by `lstopo --of xml` or hwloc's export.
    Xml(PathBuf),
}

impl Source {
    /// The filesystem root vendor files are read from; `None` for XML input.
    pub fn root(&self) -> Option<&Path> {
        match self {
            Source::Host => Some(Path::new("/")),
            Source::FsRoot(p) => Some(p),
            Source::Xml(_) => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HwlocError {
    #[error("{path}: no such directory")]
    MissingRoot { path: PathBuf },
    #[error(
        "filesystem root {path} is not the one in force (HWLOC_FSROOT={current:?}); call use_fsroot before starting threads"
    )]
    RootNotSet {
        path: PathBuf,
        current: Option<String>,
    },
    #[error("{path}: cannot be read as hwloc XML: {message}")]
    Xml { path: PathBuf, message: String },
    #[error("hwloc could not build the topology{}: {message}", at.as_ref().map(|p| format!(" of {}", p.display())).unwrap_or_default())]
    Build {
        at: Option<PathBuf>,
        message: String,
    },
}

/// Points hwloc at `root` for the rest of this process (`HWLOC_FSROOT`), and, for a root
/// other than `/`, restricts it to the Linux backend (`HWLOC_COMPONENTS=linux,stop`, as hwloc's
/// own test suite does) so the CPUID and libpciaccess backends do not mix this machine's
/// hardware into the dump's. An `HWLOC_COMPONENTS` already set is kept.
///
/// # Safety
/// Changes the process environment: call it before any other thread exists, or while no
/// other thread can read the environment.
pub unsafe fn use_fsroot(root: &Path) {
    // SAFETY: forwarded to the caller.
    unsafe {
        std::env::set_var("HWLOC_FSROOT", root);
        if root != Path::new("/") && std::env::var_os("HWLOC_COMPONENTS").is_none() {
            std::env::set_var("HWLOC_COMPONENTS", "linux,stop");
        }
    }
}

/// A PCI function and where it sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    pub bus_id: String,
    pub vendor: u16,
    pub device: u16,
    pub class: u16,
    /// Host bridge (`pciDDDD:BB`) then PCI bridges, top first.
    pub path: Vec<String>,
    /// CPUs of the nearest CPU-side ancestor (hwloc's locality of the device).
    pub local_cpus: CpuSet,
    /// NUMA node of the nearest CPU-side ancestor, when it covers exactly one.
    pub numa_node: Option<u32>,
}

/// What hwloc tells us about the node.
#[derive(Clone, Debug, Default)]
pub struct HwlocFacts {
    pub packages: Vec<Package>,
    pub processing_units: Vec<ProcessingUnit>,
    pub allowed_cpus: CpuSet,
    pub numa_nodes: Vec<NumaNode>,
    pub pci: Vec<PciFunction>,
}

/// Loads the topology from `source` and extracts the facts. With `restrict_to_allowed`
/// the view is limited to this process's cpuset (hwloc's default); otherwise the whole
/// machine is described.
pub fn load(source: &Source, restrict_to_allowed: bool) -> Result<HwlocFacts, HwlocError> {
    let at = source.root().map(Path::to_path_buf);
    let build_err = |message: String| HwlocError::Build {
        at: at.clone(),
        message,
    };
    match source {
        Source::Host | Source::FsRoot(_) => {
            let root = source.root().unwrap_or(Path::new("/"));
            if !root.is_dir() {
                return Err(HwlocError::MissingRoot {
                    path: root.to_path_buf(),
                });
            }
            let current = std::env::var("HWLOC_FSROOT").ok();
            let in_force = current.as_deref().map(Path::new).unwrap_or(Path::new("/"));
            if in_force != root {
                return Err(HwlocError::RootNotSet {
                    path: root.to_path_buf(),
                    current,
                });
            }
        }
        Source::Xml(path) => {
            if !path.is_file() {
                return Err(HwlocError::Xml {
                    path: path.clone(),
                    message: "no such file".into(),
                });
            }
        }
    }

    let mut flags = BuildFlags::empty();
    if !restrict_to_allowed {
        flags |= BuildFlags::INCLUDE_DISALLOWED;
    }
    let mut builder = Topology::builder()
        .with_flags(flags)
        .map_err(|e| build_err(e.to_string()))?
        .with_io_type_filter(TypeFilter::KeepAll)
        .map_err(|e| build_err(e.to_string()))?
        .with_type_filter(ObjectType::OSDevice, TypeFilter::KeepNone)
        .map_err(|e| build_err(e.to_string()))?;
    if let Source::Xml(path) = source {
        builder = builder.from_xml_file(path).map_err(|e| HwlocError::Xml {
            path: path.clone(),
            message: e.to_string(),
        })?;
    }
    let topology = builder.build().map_err(|e| match source {
        Source::Xml(path) => HwlocError::Xml {
            path: path.clone(),
            message: e.to_string(),
        },
        _ => build_err(e.to_string()),
    })?;
    Ok(extract(&topology))
}

fn cpuset_of(obj: &TopologyObject) -> CpuSet {
    obj.cpuset()
        .map(|set| {
            set.iter_set()
                .filter_map(|i| u32::try_from(usize::from(i)).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn single_node(obj: &TopologyObject) -> Option<u32> {
    let nodes = obj.nodeset()?;
    if nodes.weight() != Some(1) {
        return None;
    }
    nodes
        .first_set()
        .and_then(|i| u32::try_from(usize::from(i)).ok())
}

fn os_index(obj: &TopologyObject) -> Option<u32> {
    obj.os_index().and_then(|i| u32::try_from(i).ok())
}

fn extract(topology: &Topology) -> HwlocFacts {
    let mut pus: Vec<ProcessingUnit> = topology
        .objects_with_type(ObjectType::PU)
        .filter_map(|pu| {
            let core = pu.first_ancestor_with_type(ObjectType::Core);
            Some(ProcessingUnit {
                os_index: os_index(pu)?,
                core: core.and_then(|c| u32::try_from(c.logical_index()).ok()),
                core_id: core.and_then(os_index),
                package_id: pu
                    .first_ancestor_with_type(ObjectType::Package)
                    .and_then(os_index),
                die_id: pu
                    .first_ancestor_with_type(ObjectType::Die)
                    .and_then(os_index),
                numa_node: pu
                    .nodeset()
                    .and_then(|n| n.first_set())
                    .and_then(|i| u32::try_from(usize::from(i)).ok()),
            })
        })
        .collect();
    pus.sort_by_key(|p| p.os_index);
    let online: CpuSet = pus.iter().map(|p| p.os_index).collect();

    let numa_objects: Vec<&TopologyObject> =
        topology.objects_with_type(ObjectType::NUMANode).collect();
    let distances = numa_distances(topology, &numa_objects);
    let mut numa_nodes: Vec<NumaNode> = numa_objects
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            let memory_bytes = match node.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
                _ => 0,
            };
            Some(NumaNode {
                id: os_index(node)?,
                cpus: cpuset_of(node).intersection(&online),
                memory_bytes,
                distances: distances.get(i).cloned().unwrap_or_default(),
                kind: node.subtype().map(|s| s.to_string_lossy().into_owned()),
            })
        })
        .collect();
    // hwloc lists NUMA nodes in logical order; distance rows follow that order too, so sort
    // both together by OS id.
    let order: Vec<usize> = {
        let mut idx: Vec<usize> = (0..numa_nodes.len()).collect();
        idx.sort_by_key(|i| numa_nodes[*i].id);
        idx
    };
    if order.iter().enumerate().any(|(pos, i)| pos != *i) {
        numa_nodes = order
            .iter()
            .map(|i| {
                let mut n = numa_nodes[*i].clone();
                if !n.distances.is_empty() {
                    n.distances = order.iter().map(|j| n.distances[*j]).collect();
                }
                n
            })
            .collect();
    }

    let pci = topology
        .objects_with_type(ObjectType::PCIDevice)
        .filter_map(|dev| {
            let Some(ObjectAttributes::PCIDevice(a)) = dev.attributes() else {
                return None;
            };
            let bus_id = format!(
                "{:04x}:{:02x}:{:02x}.{:x}",
                a.domain(),
                a.bus_id(),
                a.bus_device(),
                a.function()
            );
            let mut path = Vec::new();
            let mut parent = dev.parent();
            while let Some(p) = parent {
                let Some(ObjectAttributes::Bridge(b)) = p.attributes() else {
                    break;
                };
                match (b.upstream_attributes(), b.downstream_attributes()) {
                    (Some(UpstreamAttributes::PCI(up)), _) => path.push(format!(
                        "{:04x}:{:02x}:{:02x}.{:x}",
                        up.domain(),
                        up.bus_id(),
                        up.bus_device(),
                        up.function()
                    )),
                    (None, Some(DownstreamAttributes::PCI(down))) => path.push(format!(
                        "pci{:04x}:{:02x}",
                        down.domain(),
                        down.secondary_bus()
                    )),
                    (None, None) => {}
                }
                parent = p.parent();
            }
            path.reverse();
            let cpu_side = dev.first_non_io_ancestor();
            Some(PciFunction {
                bus_id,
                vendor: a.vendor_id(),
                device: a.device_id(),
                class: a.class_id(),
                path,
                local_cpus: cpu_side
                    .map(cpuset_of)
                    .unwrap_or_default()
                    .intersection(&online),
                numa_node: cpu_side.and_then(single_node),
            })
        })
        .collect();

    let packages = topology
        .objects_with_type(ObjectType::Package)
        .map(|p| Package {
            id: os_index(p),
            cpus: cpuset_of(p).intersection(&online),
        })
        .collect();

    HwlocFacts {
        packages,
        allowed_cpus: topology
            .allowed_cpuset()
            .iter_set()
            .filter_map(|i| u32::try_from(usize::from(i)).ok())
            .collect::<CpuSet>()
            .intersection(&online),
        processing_units: pus,
        numa_nodes,
        pci,
    }
}

/// NUMA distance rows in the order of `nodes`, from the OS-provided latency matrix.
fn numa_distances(topology: &Topology, nodes: &[&TopologyObject]) -> Vec<Vec<u32>> {
    let Ok(all) = topology.distances(None) else {
        return Vec::new();
    };
    let Some(matrix) = all.iter().find(|d| {
        d.num_objects() == nodes.len() && nodes.iter().all(|n| d.object_idx(n).is_some())
    }) else {
        return Vec::new();
    };
    nodes
        .iter()
        .map(|a| {
            nodes
                .iter()
                .map(|b| {
                    matrix
                        .object_pair_distance((a, b))
                        .map_or(0, |(ab, _)| u32::try_from(ab).unwrap_or(u32::MAX))
                })
                .collect()
        })
        .collect()
}
