//! Device and link health as one value: [`NodeHealth`], what the node's health sources (device
//! nodes, NVML, DCMI) say right now, and what it does to the topology.
//!
//! Start at [`NodeHealth`]: per device the [`Fault`]s seen (a device with a disabling fault is
//! unhealthy; a degrading one, such as an NVLink lane down, leaves it usable), and per device
//! pair the [`LinkFault`]s that make a fabric link slower than the hardware built it.
//! [`NodeTopology::with_health`] applies both: devices with a disabling fault become
//! [`Health::Unhealthy`], and a degraded pair drops to the class its remaining lanes give
//! ([`degraded_class`]), so `select`, the published `DeviceTopology` and the scheduler
//! extension all stop treating it as fast. Sources merge with [`NodeHealth::merge`]. Pure data
//! and pure functions; the sources that fill it live in `fumarole-exporter`'s `health` module.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::link::{LinkClass, pcie_class};
use crate::model::{Health, NodeTopology};

/// What kind of fault a device or link has. The string form ([`FaultKind::as_str`]) is the
/// `kind` label of `fumarole_device_faults_total` and the prefix of a device's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A critical NVIDIA XID error (NVML event) that is not the application's fault.
    Xid,
    /// An uncorrectable (double-bit) ECC error, or retired pages waiting for a reset (NVML).
    Ecc,
    /// Row remapping pending (a reset is needed) or failed (NVML).
    RowRemap,
    /// The GPU does not answer NVML (`NVML_ERROR_GPU_IS_LOST`).
    FellOffBus,
    /// One or more NVLink lanes of the device are down (degrading, not disabling).
    NvlinkDown,
    /// An Ascend chip reports a major or critical alarm (DCMI).
    DcmiChip,
    /// An Ascend chip's RoCE network port is down or unreachable (DCMI).
    DcmiNetwork,
    /// An Ascend chip reports an HCCS link fault code (degrading, not disabling).
    HccsDown,
    /// A device node of the device is missing under `/dev`.
    DevNodeMissing,
}

impl FaultKind {
    /// The kebab-case name: `xid`, `ecc`, `row-remap`, `fell-off-bus`, `nvlink-down`,
    /// `dcmi-chip`, `dcmi-network`, `hccs-down`, `dev-node-missing`.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Xid => "xid",
            FaultKind::Ecc => "ecc",
            FaultKind::RowRemap => "row-remap",
            FaultKind::FellOffBus => "fell-off-bus",
            FaultKind::NvlinkDown => "nvlink-down",
            FaultKind::DcmiChip => "dcmi-chip",
            FaultKind::DcmiNetwork => "dcmi-network",
            FaultKind::HccsDown => "hccs-down",
            FaultKind::DevNodeMissing => "dev-node-missing",
        }
    }

    /// Whether a fault of this kind takes the device out of use. Link faults only lower the
    /// weights of the device's pairs.
    pub fn disables(self) -> bool {
        !matches!(self, FaultKind::NvlinkDown | FaultKind::HccsDown)
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One fault of one device, as its source describes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Fault {
    pub kind: FaultKind,
    /// What a person reads: `XID 79 (GPU has fallen off the bus)`, `NVLink lanes 3, 5 down`.
    pub reason: String,
}

impl Fault {
    pub fn new(kind: FaultKind, reason: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.reason)
    }
}

/// A fabric link between two devices that is below what the hardware built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkFault {
    /// [`FaultKind::NvlinkDown`] or [`FaultKind::HccsDown`].
    pub kind: FaultKind,
    /// NVLink lanes still up between the pair; `None` (or `Some(0)`) when the fabric link is
    /// down altogether and the pair talks over PCIe.
    pub lanes_up: Option<u32>,
}

/// The node's device and link health at one moment: what one source says, or all of them
/// merged. Devices and pairs not listed are healthy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHealth {
    /// Device id -> its faults, sorted, without duplicates.
    pub devices: BTreeMap<String, Vec<Fault>>,
    /// `(a, b)` device ids with `a < b` -> the fault of their fabric link.
    pub links: BTreeMap<(String, String), LinkFault>,
}

impl NodeHealth {
    /// Adds `fault` to device `id` (once).
    pub fn add(&mut self, id: &str, fault: Fault) {
        let faults = self.devices.entry(id.to_string()).or_default();
        if let Err(at) = faults.binary_search(&fault) {
            faults.insert(at, fault);
        }
    }

    /// Records that the fabric link between `a` and `b` is degraded. When two sources report
    /// the same pair, the fewer lanes win.
    pub fn add_link(&mut self, a: &str, b: &str, fault: LinkFault) {
        let key = pair(a, b);
        match self.links.get_mut(&key) {
            Some(existing) => {
                let fewer = match (existing.lanes_up, fault.lanes_up) {
                    (_, None) => true,
                    (None, Some(_)) => false,
                    (Some(x), Some(y)) => y < x,
                };
                if fewer {
                    *existing = fault;
                }
            }
            None => {
                self.links.insert(key, fault);
            }
        }
    }

    /// The faults of device `id` (empty when it has none).
    pub fn faults(&self, id: &str) -> &[Fault] {
        self.devices.get(id).map_or(&[], Vec::as_slice)
    }

    /// False when device `id` has a disabling fault.
    pub fn is_healthy(&self, id: &str) -> bool {
        !self.faults(id).iter().any(|f| f.kind.disables())
    }

    /// The faults of device `id` as one line (`xid: XID 79 (...); nvlink-down: ...`), disabling
    /// ones first; `None` when it has none.
    pub fn reason(&self, id: &str) -> Option<String> {
        let faults = self.faults(id);
        if faults.is_empty() {
            return None;
        }
        let mut ordered: Vec<&Fault> = faults.iter().collect();
        ordered.sort_by_key(|f| !f.kind.disables());
        Some(
            ordered
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    }

    /// Everything the given sources say: a device's faults are the union of theirs, a pair's
    /// link fault the worst one reported.
    pub fn merge<'a>(sources: impl IntoIterator<Item = &'a NodeHealth>) -> NodeHealth {
        let mut out = NodeHealth::default();
        for s in sources {
            for (id, faults) in &s.devices {
                for f in faults {
                    out.add(id, f.clone());
                }
            }
            for ((a, b), l) in &s.links {
                out.add_link(a, b, l.clone());
            }
        }
        out.devices.retain(|_, f| !f.is_empty());
        out
    }
}

/// The key of an unordered device pair.
pub fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

/// The class of a fabric link that is degraded: an NVLink pair keeps the lanes still up (and
/// never gains any), a link with no lanes left, or an HCCS / other fabric link that is down,
/// falls back to `pcie`, the class the PCI tree gives the pair. PCIe classes are not fabric
/// links and stay as they are.
pub fn degraded_class(current: LinkClass, fault: &LinkFault, pcie: LinkClass) -> LinkClass {
    if !current.is_fabric() {
        return current;
    }
    match (current, fault.lanes_up) {
        (LinkClass::Nvlink { count }, Some(up)) if up > 0 => LinkClass::Nvlink {
            count: count.min(up),
        },
        _ => pcie,
    }
}

impl NodeTopology {
    /// This topology as `health` leaves it: a device with a disabling fault is unhealthy (a
    /// device discovery already found unhealthy stays so), and every degraded pair drops to
    /// [`degraded_class`]. Ids `health` names that the topology lacks are ignored.
    pub fn with_health(&self, health: &NodeHealth) -> NodeTopology {
        let mut t = self.clone();
        for d in &mut t.devices {
            if !health.is_healthy(&d.id) {
                d.health = Health::Unhealthy;
            }
        }
        let position: BTreeMap<&str, usize> = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id.as_str(), i))
            .collect();
        for ((a, b), fault) in &health.links {
            let (Some(&i), Some(&j)) = (position.get(a.as_str()), position.get(b.as_str())) else {
                continue;
            };
            let Some(current) = self.links.class(i, j) else {
                continue;
            };
            let (da, db) = (&self.devices[i], &self.devices[j]);
            let pcie = pcie_class(&da.pci_path, da.numa_node, &db.pci_path, db.numa_node);
            t.links.set(i, j, degraded_class(current, fault, pcie));
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuset::CpuSet;
    use crate::model::{Device, DeviceKind, PciId, Vendor};
    use crate::{LinkMatrix, NumaNode};

    /// Four GPUs, NV18 between every pair, two behind each PCIe switch.
    fn four_gpus() -> NodeTopology {
        let gpu = |i: u32| Device {
            id: format!("GPU-{i}"),
            index: i,
            vendor: Vendor::Nvidia,
            kind: DeviceKind::Gpu,
            model: "H100".into(),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
            pci_path: vec!["pci0000:00".into(), format!("0000:00:0{}.0", i / 2)],
            pci_id: PciId {
                vendor: 0x10de,
                device: 0x2330,
                class: 0x0302,
            },
            numa_node: Some(0),
            local_cpus: CpuSet::default(),
            dev_nodes: vec![format!("/dev/nvidia{i}")],
            health: Health::Healthy,
            uuid: None,
            serial: None,
            memory_bytes: None,
            mig: Vec::new(),
        };
        NodeTopology {
            hostname: "n".into(),
            packages: vec![],
            processing_units: vec![],
            allowed_cpus: CpuSet::default(),
            numa_nodes: vec![NumaNode {
                id: 0,
                cpus: CpuSet::default(),
                memory_bytes: 0,
                distances: vec![10],
                kind: None,
            }],
            devices: (0..4).map(gpu).collect(),
            links: LinkMatrix::filled(4, LinkClass::Nvlink { count: 18 }),
            super_node: None,
        }
    }

    fn nv(up: Option<u32>) -> LinkFault {
        LinkFault {
            kind: FaultKind::NvlinkDown,
            lanes_up: up,
        }
    }

    #[test]
    fn weights_drop_with_the_lanes_left_and_fall_to_pcie_without_any() {
        let nv18 = LinkClass::Nvlink { count: 18 };
        let pix = LinkClass::PcieSwitch;
        assert_eq!(
            degraded_class(nv18, &nv(Some(17)), pix),
            LinkClass::Nvlink { count: 17 }
        );
        assert!(degraded_class(nv18, &nv(Some(17)), pix).weight() < nv18.weight());
        assert_eq!(degraded_class(nv18, &nv(Some(0)), pix), pix);
        assert_eq!(degraded_class(nv18, &nv(None), pix), pix);
        // Never more lanes than the pair had.
        assert_eq!(
            degraded_class(LinkClass::Nvlink { count: 4 }, &nv(Some(12)), pix),
            LinkClass::Nvlink { count: 4 }
        );
        let hccs_down = LinkFault {
            kind: FaultKind::HccsDown,
            lanes_up: None,
        };
        assert_eq!(
            degraded_class(LinkClass::Hccs, &hccs_down, LinkClass::CrossNuma),
            LinkClass::CrossNuma
        );
        // PCIe paths are not fabric links: nothing to lower.
        assert_eq!(degraded_class(pix, &nv(None), LinkClass::CrossNuma), pix);
    }

    #[test]
    fn disabling_faults_make_a_device_unhealthy_degrading_ones_do_not() {
        let mut h = NodeHealth::default();
        h.add("g1", Fault::new(FaultKind::NvlinkDown, "lane 3 down"));
        assert!(h.is_healthy("g1"));
        h.add("g1", Fault::new(FaultKind::Xid, "XID 79"));
        h.add("g1", Fault::new(FaultKind::Xid, "XID 79"));
        assert_eq!(h.faults("g1").len(), 2);
        assert!(!h.is_healthy("g1"));
        assert_eq!(
            h.reason("g1").as_deref(),
            Some("xid: XID 79; nvlink-down: lane 3 down")
        );
        assert!(h.is_healthy("g2"));
        assert_eq!(h.reason("g2"), None);
    }

    #[test]
    fn merge_unites_faults_and_keeps_the_worst_link() {
        let mut a = NodeHealth::default();
        a.add("g1", Fault::new(FaultKind::DevNodeMissing, "/dev/nvidia1"));
        a.add_link("g2", "g1", nv(Some(12)));
        let mut b = NodeHealth::default();
        b.add("g1", Fault::new(FaultKind::Xid, "XID 48"));
        b.add_link("g1", "g2", nv(Some(6)));
        b.devices.insert("g3".into(), vec![]);
        let m = NodeHealth::merge([&a, &b]);
        assert_eq!(m.faults("g1").len(), 2);
        assert_eq!(m.links.len(), 1);
        assert_eq!(m.links[&pair("g1", "g2")].lanes_up, Some(6));
        assert!(!m.devices.contains_key("g3"));
        let mut c = NodeHealth::default();
        c.add_link("g1", "g2", nv(None));
        let m = NodeHealth::merge([&m, &c]);
        assert_eq!(m.links[&pair("g1", "g2")].lanes_up, None);
    }

    #[test]
    fn with_health_marks_devices_and_lowers_pairs() {
        let t = four_gpus();
        let ids: Vec<String> = t.devices.iter().map(|d| d.id.clone()).collect();
        let mut h = NodeHealth::default();
        h.add(&ids[3], Fault::new(FaultKind::Xid, "XID 79"));
        h.add_link(&ids[1], &ids[2], nv(Some(17)));
        h.add_link(&ids[0], "not-a-device", nv(None));
        let after = t.with_health(&h);
        assert_eq!(after.devices[3].health, Health::Unhealthy);
        assert_eq!(after.devices[2].health, Health::Healthy);
        assert_eq!(
            after.links.class(1, 2),
            Some(LinkClass::Nvlink { count: 17 })
        );
        assert_eq!(after.links.weight(1, 2), 270);
        assert_eq!(after.links.weight(0, 1), t.links.weight(0, 1));
        // No lanes left: the pair talks over its PCIe path (here: one host bridge).
        h.add_link(&ids[0], &ids[3], nv(None));
        assert_eq!(
            t.with_health(&h).links.class(0, 3),
            Some(LinkClass::PcieHostBridge)
        );
        // Healthy again: the topology as discovered.
        assert_eq!(t.with_health(&NodeHealth::default()), t);
    }
}
