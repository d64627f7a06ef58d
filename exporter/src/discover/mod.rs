//! Node discovery: hwloc facts + sysfs/driver facts + vendor probes + the override file ->
//! a [`NodeTopology`].
//!
//! Start at [`discover`]. The parts, by name: [`hwloc`] (CPUs, NUMA, the PCI tree),
//! [`accelerators`] (which PCI functions are accelerators, vendor naming), [`memory`] (memory and
//! huge pages per NUMA node, for NodeResourceTopology), [`sysfs`] (files
//! under the root), [`nvml`] (NVIDIA's library, or recorded answers), [`overrides`] (the
//! operator's file). Links: PCIe classes from the PCI paths, then vendor fabrics (NVLink from
//! NVML, Ascend HCCS rules), then the override file, each refining the previous.

pub mod accelerators;
pub mod hwloc;
pub mod memory;
pub mod nvml;
pub mod overrides;
pub mod sysfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fumarole_topology::{
    Device, DeviceKind, Health, LinkClass, LinkMatrix, NodeTopology, PciId, SuperNode,
    SuperNodeSource, Vendor, pcie_class,
};

use accelerators::AscendFamily;
use hwloc::{HwlocError, PciFunction};
pub use hwloc::{Source, use_fsroot};
use nvml::{NvmlError, NvmlProbe, NvmlReport};
use overrides::{OverrideError, Overrides};
use sysfs::Root;

/// Where a root keeps its override file, relative to the root.
pub const OVERRIDE_FILE: &str = "/etc/fumarole/topology.yaml";
/// Where a dump or fixture root keeps recorded NVML answers (never read from `/`).
pub const RECORDED_NVML_FILE: &str = "/fumarole/nvml.json";

/// What to discover and how.
#[derive(Clone, Debug)]
pub struct DiscoverOptions {
    pub source: Source,
    /// Describe only the CPUs this process may use (hwloc's default view) instead of the
    /// whole machine.
    pub restrict_to_allowed: bool,
    /// Node name; defaults to the root's kernel hostname.
    pub hostname: Option<String>,
    /// Override file; defaults to [`OVERRIDE_FILE`] under the root when it exists.
    pub override_file: Option<PathBuf>,
    /// Super-node membership given by the operator (node label or configuration); wins over
    /// the override file and the NVLink fabric.
    pub super_node: Option<SuperNode>,
}

impl DiscoverOptions {
    pub fn new(source: Source) -> Self {
        Self {
            source,
            restrict_to_allowed: false,
            hostname: None,
            override_file: None,
            super_node: None,
        }
    }
}

/// Why discovery failed. Each variant names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error(transparent)]
    Hwloc(#[from] HwlocError),
    #[error(transparent)]
    Override(#[from] OverrideError),
    #[error(transparent)]
    Nvml(#[from] NvmlError),
}

/// Discovers the node described by `opts`. `nvml` is asked only when NVIDIA devices exist.
pub fn discover(
    opts: &DiscoverOptions,
    nvml: &dyn NvmlProbe,
) -> Result<NodeTopology, DiscoverError> {
    discover_with_nvml(opts, nvml).map(|(t, _)| t)
}

/// [`discover`], also returning NVML's answers (`None` when NVML was not asked or is absent):
/// the node-wide facts (driver and CUDA versions, compute capability) that the topology does
/// not carry, for the GFD-compatible labels.
pub fn discover_with_nvml(
    opts: &DiscoverOptions,
    nvml: &dyn NvmlProbe,
) -> Result<(NodeTopology, Option<NvmlReport>), DiscoverError> {
    let facts = hwloc::load(&opts.source, opts.restrict_to_allowed)?;
    let root = opts.source.root().map(Root::new);

    let override_path = opts.override_file.clone().or_else(|| {
        root.as_ref()
            .map(|r| r.join(OVERRIDE_FILE))
            .filter(|p| p.is_file())
    });
    let overrides = match &override_path {
        Some(p) => Some(Overrides::load(p)?),
        None => None,
    };

    let candidates: Vec<(&PciFunction, DeviceKind)> = facts
        .pci
        .iter()
        .filter_map(|f| accelerators::classify(f.vendor, f.class).map(|k| (f, k)))
        .collect();

    let report = if candidates
        .iter()
        .any(|(f, _)| Vendor::from_pci(f.vendor) == Vendor::Nvidia)
    {
        match nvml.probe() {
            Ok(r) => r,
            Err(e @ NvmlError::Call { .. }) => {
                tracing::warn!(error = %e, "NVML failed: NVIDIA links come from the PCI tree only");
                None
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };

    let mut devices = build_devices(
        &candidates,
        root.as_ref(),
        report.as_ref(),
        overrides.as_ref(),
    );
    devices.sort_by_key(|d| (d.vendor, d.index));

    let links = build_links(
        &devices,
        report.as_ref(),
        overrides.as_ref(),
        override_path.as_deref(),
    )?;

    let super_node = opts
        .super_node
        .clone()
        .or_else(|| {
            overrides
                .as_ref()
                .and_then(|o| o.super_node.clone())
                .map(|id| SuperNode {
                    id,
                    source: SuperNodeSource::OverrideFile,
                })
        })
        .or_else(|| report.as_ref().and_then(nvlink_clique));

    let hostname = opts
        .hostname
        .clone()
        .or_else(|| root.as_ref().and_then(Root::hostname))
        .unwrap_or_else(|| "localhost".into());

    let topology = NodeTopology {
        hostname,
        packages: facts.packages,
        processing_units: facts.processing_units,
        allowed_cpus: facts.allowed_cpus,
        numa_nodes: facts.numa_nodes,
        devices,
        links,
        super_node,
    };
    Ok((topology, report))
}

fn build_devices(
    candidates: &[(&PciFunction, DeviceKind)],
    root: Option<&Root>,
    report: Option<&NvmlReport>,
    overrides: Option<&Overrides>,
) -> Vec<Device> {
    let nvml_by_bus: BTreeMap<String, &nvml::NvmlGpu> = report
        .map(|r| {
            r.gpus
                .iter()
                .map(|g| (nvml::normalize_bus_id(&g.pci_bus_id), g))
                .collect()
        })
        .unwrap_or_default();

    // Position within the vendor, in PCI bus order: the order drivers number devices.
    let mut by_vendor: BTreeMap<Vendor, Vec<(&PciFunction, DeviceKind)>> = BTreeMap::new();
    for (f, kind) in candidates {
        by_vendor
            .entry(Vendor::from_pci(f.vendor))
            .or_default()
            .push((f, *kind));
    }
    let mut devices = Vec::new();
    for (vendor, mut list) in by_vendor {
        list.sort_by(|a, b| a.0.bus_id.cmp(&b.0.bus_id));
        for (position, (f, kind)) in list.into_iter().enumerate() {
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            let gpu = nvml_by_bus.get(&f.bus_id).copied();
            let proc_info = match vendor {
                Vendor::Nvidia => root.and_then(|r| r.nvidia_info(&f.bus_id)),
                _ => None,
            };
            let ascend = match vendor {
                Vendor::Huawei => AscendFamily::from_device_id(f.device),
                _ => None,
            };
            let index = gpu.map_or(position, |g| g.index);
            let uuid = gpu
                .map(|g| g.uuid.clone())
                .or_else(|| proc_info.as_ref().and_then(|p| p.uuid.clone()));
            let model = overrides
                .and_then(|o| o.model_for(&f.bus_id, f.vendor, f.device))
                .map(str::to_owned)
                .or_else(|| gpu.map(|g| g.name.clone()))
                .or_else(|| proc_info.as_ref().and_then(|p| p.model.clone()))
                .or_else(|| accelerators::known_model(f.vendor, f.device).map(str::to_owned))
                .unwrap_or_else(|| accelerators::fallback_model(f.vendor, f.device));
            let id = match (vendor, &uuid, ascend) {
                (Vendor::Nvidia, Some(u), _) => u.clone(),
                (Vendor::Huawei, _, Some(fam)) => format!("{}-{index}", fam.resource_name()),
                _ => f.bus_id.clone(),
            };

            // The device's own node under /dev, when the vendor has a convention for it.
            let primary = match vendor {
                Vendor::Nvidia => {
                    let minor = gpu
                        .and_then(|g| g.minor)
                        .or_else(|| proc_info.as_ref().and_then(|p| p.minor))
                        .unwrap_or(index);
                    Some(format!("/dev/nvidia{minor}"))
                }
                Vendor::Huawei if ascend.is_some() => Some(format!("/dev/davinci{index}")),
                _ => None,
            };
            let mut dev_nodes = Vec::new();
            let mut health = Health::Healthy;
            if let Some(root) = root {
                if let Some(node) = primary {
                    if root.exists(&node) {
                        dev_nodes.push(node);
                    } else {
                        tracing::warn!(device = %id, node = %node, "device node missing: reporting the device unhealthy");
                        health = Health::Unhealthy;
                    }
                }
                for name in root.pci_children(&f.bus_id, "drm") {
                    let node = format!("/dev/dri/{name}");
                    if root.exists(&node) {
                        dev_nodes.push(node);
                    }
                }
            }

            let numa_node = root
                .and_then(|r| r.pci_numa_node(&f.bus_id))
                .or(f.numa_node);
            let local_cpus = root
                .and_then(|r| r.pci_local_cpus(&f.bus_id))
                .unwrap_or_else(|| f.local_cpus.clone());
            devices.push(Device {
                id,
                index,
                vendor,
                kind,
                model,
                pci_bus_id: f.bus_id.clone(),
                pci_path: f.path.clone(),
                pci_id: PciId {
                    vendor: f.vendor,
                    device: f.device,
                    class: f.class,
                },
                numa_node,
                local_cpus,
                dev_nodes,
                health,
                uuid,
                serial: gpu.and_then(|g| g.serial.clone()),
                memory_bytes: gpu.and_then(|g| g.memory_bytes),
                mig: gpu.map(|g| g.mig.clone()).unwrap_or_default(),
            });
        }
    }
    devices
}

fn build_links(
    devices: &[Device],
    report: Option<&NvmlReport>,
    overrides: Option<&Overrides>,
    override_path: Option<&Path>,
) -> Result<LinkMatrix, OverrideError> {
    let mut links = LinkMatrix::from_fn(devices.len(), |a, b| {
        let (a, b) = (&devices[a], &devices[b]);
        pcie_class(&a.pci_path, a.numa_node, &b.pci_path, b.numa_node)
    });
    let position: BTreeMap<&str, usize> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| (d.pci_bus_id.as_str(), i))
        .collect();

    if let Some(report) = report {
        for ((a, b), count) in nvml::nvlink_counts(report) {
            if let (Some(&a), Some(&b)) = (position.get(a.as_str()), position.get(b.as_str()))
                && count > 0
            {
                links.set(a, b, LinkClass::Nvlink { count });
            }
        }
    }

    for (i, a) in devices.iter().enumerate() {
        for (j, b) in devices.iter().enumerate().skip(i + 1) {
            let fam = |d: &Device| match d.vendor {
                Vendor::Huawei => AscendFamily::from_device_id(d.pci_id.device),
                _ => None,
            };
            if let (Some(fa), Some(fb)) = (fam(a), fam(b))
                && fa == fb
                && let Some(class) = fa.hccs(a.index, b.index)
            {
                links.set(i, j, class);
            }
        }
    }

    if let (Some(o), Some(path)) = (overrides, override_path) {
        let bus_ids: Vec<String> = devices.iter().map(|d| d.pci_bus_id.clone()).collect();
        for (a, b, class) in o.link_classes(path, &bus_ids)? {
            links.set(a, b, class);
        }
    }
    Ok(links)
}

/// The super-node of an NVLink fabric: all GPUs of the node should report the same cluster
/// uuid and clique; the id is `<cluster uuid>.<clique id>`.
fn nvlink_clique(report: &NvmlReport) -> Option<SuperNode> {
    let mut cliques: Vec<String> = report
        .gpus
        .iter()
        .filter_map(|g| g.fabric.as_ref())
        .map(|f| format!("{}.{}", f.cluster_uuid, f.clique_id))
        .collect();
    cliques.sort();
    cliques.dedup();
    if cliques.len() > 1 {
        tracing::warn!(
            ?cliques,
            "GPUs report different NVLink cliques; using the first"
        );
    }
    cliques.into_iter().next().map(|id| SuperNode {
        id,
        source: SuperNodeSource::NvlinkClique,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml::{FabricInfo, NvmlGpu};

    #[test]
    fn clique_becomes_the_super_node() {
        let gpu = |clique| NvmlGpu {
            fabric: Some(FabricInfo {
                cluster_uuid: "c0ffee".into(),
                clique_id: clique,
            }),
            ..Default::default()
        };
        let report = NvmlReport {
            driver_version: None,
            cuda_driver_version: None,
            gpus: vec![gpu(7), gpu(7)],
        };
        let sn = nvlink_clique(&report).unwrap();
        assert_eq!(sn.id, "c0ffee.7");
        assert_eq!(sn.source, SuperNodeSource::NvlinkClique);
        assert!(nvlink_clique(&NvmlReport::default()).is_none());
    }
}
