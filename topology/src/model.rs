//! [`NodeTopology`]: everything fumarole knows about one node's hardware.
//!
//! Discovery (`fumarole-exporter`) fills it; publishing, the device plugin and the scheduler
//! extension read it. The JSON form (camelCase keys, cpusets as Linux list strings, links as a
//! pair list) is documented in `docs/node-topology.md` and is stable: fields are only added.

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;
use crate::link::{Link, LinkMatrix, LinkMatrixError};

/// One node's hardware: CPUs, NUMA nodes, accelerators, the links between accelerators and the
/// super-node the node belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    try_from = "NodeTopologyWire",
    into = "NodeTopologyWire"
)]
pub struct NodeTopology {
    pub hostname: String,
    /// Physical packages (sockets), in hwloc's logical order.
    pub packages: Vec<Package>,
    /// Online processing units (hardware threads), ascending by `os_index`.
    pub processing_units: Vec<ProcessingUnit>,
    /// CPUs this process may use (the cgroup cpuset); a subset of all PUs. Describes the
    /// caller, not the node: the agent runs in a shared pool that excludes exclusive CPUs.
    pub allowed_cpus: CpuSet,
    /// NUMA nodes, ascending by `id`, including CPU-less ones (GPU memory, HBM, NVM tiers).
    pub numa_nodes: Vec<NumaNode>,
    /// Accelerators, ordered by vendor then `index`.
    pub devices: Vec<Device>,
    /// Symmetric link matrix over `devices` (same indices).
    pub links: LinkMatrix,
    pub super_node: Option<SuperNode>,
}

/// One physical package (socket).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Package {
    /// The kernel's `physical_package_id`, when the OS reports one (s390 does not).
    pub id: Option<u32>,
    /// Online CPUs in the package (may be empty in a view restricted to the allowed CPUs,
    /// where a package is kept for its memory).
    pub cpus: CpuSet,
}

/// One hardware thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessingUnit {
    /// The kernel's CPU number (`/sys/devices/system/cpu/cpuN`).
    pub os_index: u32,
    /// Node-unique index of the core this PU belongs to; `None` when the OS reports no cores.
    pub core: Option<u32>,
    /// The kernel's `core_id` (unique only within a package / die).
    pub core_id: Option<u32>,
    /// Physical package (socket) id.
    pub package_id: Option<u32>,
    /// Die id within the package, when the machine reports dies.
    pub die_id: Option<u32>,
    /// NUMA node whose memory is local to this PU.
    pub numa_node: Option<u32>,
}

/// What kind of memory a NUMA node holds, when the OS says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NumaNode {
    /// OS NUMA node id (`/sys/devices/system/node/nodeN`).
    pub id: u32,
    /// Online CPUs local to this node (empty for memory-only nodes).
    pub cpus: CpuSet,
    /// Local memory in bytes.
    pub memory_bytes: u64,
    /// Relative distances to every node, in the order of `NodeTopology::numa_nodes`
    /// (10 = local, as in the ACPI SLIT). Empty when the OS reports none.
    pub distances: Vec<u32>,
    /// Memory kind when known, e.g. `"GPUMemory"`, `"DRAM"`, `"HBM"`, `"NVM"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Huawei,
    Metax,
    Amd,
    Intel,
    Other,
}

impl Vendor {
    /// Vendor from a PCI vendor id.
    pub fn from_pci(vendor_id: u16) -> Self {
        match vendor_id {
            0x10de => Vendor::Nvidia,
            0x19e5 => Vendor::Huawei,
            0x9999 => Vendor::Metax,
            0x1002 => Vendor::Amd,
            0x8086 => Vendor::Intel,
            _ => Vendor::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Huawei => "huawei",
            Vendor::Metax => "metax",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
            Vendor::Other => "other",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Gpu,
    Npu,
    Other,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Health {
    #[default]
    Healthy,
    Unhealthy,
}

/// The PCI identity of a device. Ids are written as `0x`-prefixed hex in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciId {
    #[serde(with = "hex16")]
    pub vendor: u16,
    #[serde(with = "hex16")]
    pub device: u16,
    /// Class and subclass (`0x0302` = 3D controller, `0x1200` = processing accelerator).
    #[serde(with = "hex16")]
    pub class: u16,
}

/// One accelerator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Stable id, the one the device plugin advertises: the NVIDIA uuid when known,
    /// `Ascend910-<N>` / `Ascend310P-<N>` for Ascend (`/dev/davinci<N>`), else the PCI bus id.
    pub id: String,
    /// Index among devices of the same vendor (NVML index, davinci minor, else PCI order).
    pub index: u32,
    pub vendor: Vendor,
    pub kind: DeviceKind,
    /// Marketing model name when known (`"NVIDIA H100 80GB HBM3"`, `"Ascend910B"`), else a
    /// name derived from the PCI ids.
    pub model: String,
    /// `dddd:bb:dd.f`, lower case.
    pub pci_bus_id: String,
    /// The PCIe path from the CPU down to the device: the host bridge as `pciDDDD:BB` (its
    /// root bus, as in `/sys/devices`), then the bus id of every PCI bridge, top first. Empty
    /// when unknown. Link classes between PCIe devices are derived from it
    /// ([`crate::link::pcie_class`]).
    #[serde(default)]
    pub pci_path: Vec<String>,
    pub pci_id: PciId,
    /// NUMA node the device is attached to.
    pub numa_node: Option<u32>,
    /// CPUs local to the device.
    pub local_cpus: CpuSet,
    /// Device nodes a container needs, e.g. `/dev/nvidia0`, `/dev/davinci3`.
    pub dev_nodes: Vec<String>,
    pub health: Health,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Device memory in bytes, when the vendor library reports it (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The MIG instances NVML reports on this GPU (MIG mode enabled); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigInstance>,
}

/// One MIG device of a GPU (a GPU instance's compute instance), as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// `MIG-<uuid>`: what `NVIDIA_VISIBLE_DEVICES` names it by.
    pub uuid: String,
    /// The MIG profile (`1g.10gb`, `3g.40gb`, `1g.10gb+me`).
    pub profile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

impl Device {
    /// The extended resource the vendor's device plugin advertises this device as
    /// (`nvidia.com/gpu`, `huawei.com/Ascend910`, `metax-tech.com/gpu`, ...).
    pub fn default_resource_name(&self) -> String {
        match self.vendor {
            Vendor::Nvidia => "nvidia.com/gpu".into(),
            Vendor::Huawei => match self.id.rsplit_once('-') {
                Some((family, _)) if family.starts_with("Ascend") => format!("huawei.com/{family}"),
                _ => "huawei.com/npu".into(),
            },
            Vendor::Metax => "metax-tech.com/gpu".into(),
            Vendor::Amd => "amd.com/gpu".into(),
            Vendor::Intel => "gpu.intel.com/i915".into(),
            Vendor::Other => "fumarole.dev/accelerator".into(),
        }
    }
}

/// Where a node's super-node id came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SuperNodeSource {
    /// NVIDIA fabric: NVLink domain cluster uuid + clique id, from NVML.
    NvlinkClique,
    /// The topology override file.
    OverrideFile,
    /// A node label.
    NodeLabel,
    /// The agent's configuration.
    Config,
    /// The hardware itself: an Ascend A3 chip's super-pod id from DCMI
    /// (`dcmi_get_device_info`, super-pod info).
    Hardware,
}

/// Membership of a group of nodes joined by a scale-up fabric (NVL72 rack, Ascend super-pod).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SuperNode {
    pub id: String,
    pub source: SuperNodeSource,
}

/// Headline counts; `discover --format json` prints this as `"summary"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct Summary {
    pub packages: usize,
    pub numa_nodes: usize,
    pub cores: usize,
    pub pus: usize,
    pub accelerators: usize,
}

/// Why a deserialized topology is inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("links: {0}")]
    Links(#[from] LinkMatrixError),
    #[error("numa node {id}: {got} distances for {want} NUMA nodes")]
    DistanceRow { id: u32, got: usize, want: usize },
    #[error("device id {0:?} appears twice")]
    DuplicateDevice(String),
}

impl NodeTopology {
    /// Headline counts: packages, distinct cores among online PUs, all NUMA nodes, all
    /// accelerators.
    pub fn summary(&self) -> Summary {
        use std::collections::BTreeSet;
        let cores: BTreeSet<u32> = self
            .processing_units
            .iter()
            .filter_map(|p| p.core)
            .collect();
        Summary {
            packages: self.packages.len(),
            numa_nodes: self.numa_nodes.len(),
            cores: cores.len(),
            pus: self.processing_units.len(),
            accelerators: self.devices.len(),
        }
    }

    /// All online CPUs.
    pub fn cpus(&self) -> CpuSet {
        self.processing_units.iter().map(|p| p.os_index).collect()
    }

    /// The device with this id.
    pub fn device(&self, id: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.id == id)
    }

    /// Checks the invariants the JSON form cannot express.
    pub fn validate(&self) -> Result<(), TopologyError> {
        if self.links.len() != self.devices.len() {
            return Err(LinkMatrixError::OutOfRange {
                a: 0,
                b: self.links.len().max(1) - 1,
                n: self.devices.len(),
            }
            .into());
        }
        let n = self.numa_nodes.len();
        for node in &self.numa_nodes {
            if !node.distances.is_empty() && node.distances.len() != n {
                return Err(TopologyError::DistanceRow {
                    id: node.id,
                    got: node.distances.len(),
                    want: n,
                });
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        for d in &self.devices {
            if !ids.insert(d.id.as_str()) {
                return Err(TopologyError::DuplicateDevice(d.id.clone()));
            }
        }
        Ok(())
    }
}

/// The serialized shape: like [`NodeTopology`] with `links` as a pair list.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeTopologyWire {
    hostname: String,
    packages: Vec<Package>,
    processing_units: Vec<ProcessingUnit>,
    allowed_cpus: CpuSet,
    numa_nodes: Vec<NumaNode>,
    devices: Vec<Device>,
    links: Vec<Link>,
    #[serde(default)]
    super_node: Option<SuperNode>,
}

impl TryFrom<NodeTopologyWire> for NodeTopology {
    type Error = TopologyError;
    fn try_from(w: NodeTopologyWire) -> Result<Self, Self::Error> {
        let links = LinkMatrix::from_links(w.devices.len(), &w.links)?;
        let t = NodeTopology {
            hostname: w.hostname,
            packages: w.packages,
            processing_units: w.processing_units,
            allowed_cpus: w.allowed_cpus,
            numa_nodes: w.numa_nodes,
            devices: w.devices,
            links,
            super_node: w.super_node,
        };
        t.validate()?;
        Ok(t)
    }
}

impl From<NodeTopology> for NodeTopologyWire {
    fn from(t: NodeTopology) -> Self {
        NodeTopologyWire {
            hostname: t.hostname,
            packages: t.packages,
            processing_units: t.processing_units,
            allowed_cpus: t.allowed_cpus,
            numa_nodes: t.numa_nodes,
            devices: t.devices,
            links: t.links.links(),
            super_node: t.super_node,
        }
    }
}

mod hex16 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u16, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("0x{v:04x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
        let s = String::deserialize(d)?;
        let digits = s.trim().trim_start_matches("0x");
        u16::from_str_radix(digits, 16)
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a 16-bit hex id")))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::link::LinkClass;

    pub(crate) fn gpu(i: u32) -> Device {
        Device {
            id: format!("GPU-{i}"),
            index: i,
            vendor: Vendor::Nvidia,
            kind: DeviceKind::Gpu,
            model: "H100".into(),
            pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
            pci_path: vec!["pci0000:00".into()],
            pci_id: PciId {
                vendor: 0x10de,
                device: 0x2330,
                class: 0x0302,
            },
            numa_node: Some(0),
            local_cpus: CpuSet::parse("0-3").unwrap(),
            dev_nodes: vec![format!("/dev/nvidia{i}")],
            health: Health::Healthy,
            uuid: Some(format!("GPU-{i}")),
            serial: None,
            memory_bytes: None,
            mig: Vec::new(),
        }
    }

    /// Two NVLinked H100s on one NUMA node, super-node `sn-1`.
    pub(crate) fn sample() -> NodeTopology {
        let pus = (0..4)
            .map(|i| ProcessingUnit {
                os_index: i,
                core: Some(i / 2),
                core_id: Some(i / 2),
                package_id: Some(0),
                die_id: None,
                numa_node: Some(0),
            })
            .collect();
        NodeTopology {
            hostname: "n1".into(),
            packages: vec![Package {
                id: Some(0),
                cpus: CpuSet::parse("0-3").unwrap(),
            }],
            processing_units: pus,
            allowed_cpus: CpuSet::parse("0-3").unwrap(),
            numa_nodes: vec![NumaNode {
                id: 0,
                cpus: CpuSet::parse("0-3").unwrap(),
                memory_bytes: 1 << 30,
                distances: vec![10],
                kind: None,
            }],
            devices: vec![gpu(0), gpu(1)],
            links: LinkMatrix::filled(2, LinkClass::Nvlink { count: 18 }),
            super_node: Some(SuperNode {
                id: "sn-1".into(),
                source: SuperNodeSource::Config,
            }),
        }
    }

    #[test]
    fn json_round_trips_and_uses_documented_keys() {
        let t = sample();
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["processingUnits"][3]["osIndex"], 3);
        assert_eq!(v["allowedCpus"], "0-3");
        assert_eq!(v["devices"][0]["pciId"]["vendor"], "0x10de");
        assert_eq!(v["devices"][0]["health"], "Healthy");
        assert_eq!(v["links"][0]["kind"], "nvlink");
        assert_eq!(v["superNode"]["source"], "config");
        let back: NodeTopology = serde_json::from_value(v).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn rejects_inconsistent_json() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["links"] = serde_json::json!([]);
        let err = serde_json::from_value::<NodeTopology>(v).unwrap_err();
        assert!(err.to_string().contains("no link"), "{err}");

        let mut v = serde_json::to_value(sample()).unwrap();
        v["numaNodes"][0]["distances"] = serde_json::json!([10, 20]);
        assert!(serde_json::from_value::<NodeTopology>(v).is_err());

        let mut v = serde_json::to_value(sample()).unwrap();
        v["devices"][1]["id"] = "GPU-0".into();
        assert!(serde_json::from_value::<NodeTopology>(v).is_err());
    }

    #[test]
    fn summary_counts_distinct_packages_and_cores() {
        let s = sample().summary();
        assert_eq!(
            s,
            Summary {
                packages: 1,
                numa_nodes: 1,
                cores: 2,
                pus: 4,
                accelerators: 2
            }
        );
        let v = serde_json::to_value(s).unwrap();
        for key in ["packages", "numa_nodes", "cores", "pus", "accelerators"] {
            assert!(v[key].is_u64(), "{key}");
        }
    }

    #[test]
    fn resource_names_follow_vendor_plugins() {
        let mut d = gpu(0);
        assert_eq!(d.default_resource_name(), "nvidia.com/gpu");
        d.vendor = Vendor::Huawei;
        d.id = "Ascend910-3".into();
        assert_eq!(d.default_resource_name(), "huawei.com/Ascend910");
        d.id = "Ascend310P-0".into();
        assert_eq!(d.default_resource_name(), "huawei.com/Ascend310P");
        d.vendor = Vendor::Metax;
        assert_eq!(d.default_resource_name(), "metax-tech.com/gpu");
    }

    #[test]
    fn vendor_from_pci_ids() {
        assert_eq!(Vendor::from_pci(0x10de), Vendor::Nvidia);
        assert_eq!(Vendor::from_pci(0x19e5), Vendor::Huawei);
        assert_eq!(Vendor::from_pci(0x9999), Vendor::Metax);
        assert_eq!(Vendor::from_pci(0x1a03), Vendor::Other);
    }
}
