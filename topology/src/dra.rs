//! How a node's accelerators are named and described in Kubernetes' Dynamic Resource
//! Allocation (`resource.k8s.io/v1`): which driver publishes a device, its name in the node's
//! pool, and its attributes. The exporter renders these into ResourceSlices and the DRA kubelet
//! plugin reads a claim's allocation back through them, so both sides agree by construction.
//!
//! Two drivers, by device class rather than by vendor, so one DeviceClass per class selects
//! every vendor's devices and a claim can still pick a vendor with a CEL selector on
//! `fumarole.dev/vendor`:
//!
//! | driver             | devices                                  |
//! |--------------------|------------------------------------------|
//! | `gpu.fumarole.dev` | NVIDIA, MetaX, AMD, Intel and other GPUs |
//! | `npu.fumarole.dev` | Huawei Ascend NPUs                        |
//!
//! Attributes a device carries (an attribute is left out when its value is unknown, so that a
//! `matchAttribute` over it never pairs two devices that merely both lack it):
//!
//! | attribute                       | type   | meaning                                          |
//! |---------------------------------|--------|--------------------------------------------------|
//! | `fumarole.dev/vendor`           | string | `nvidia`, `huawei`, `metax`, ...                 |
//! | `fumarole.dev/model`            | string | marketing model name                             |
//! | `fumarole.dev/index`            | int    | index among the node's devices of its vendor     |
//! | `fumarole.dev/uuid`             | string | vendor uuid (NVIDIA)                             |
//! | `fumarole.dev/fabricGroup`      | int    | devices joined by NVLink / HCCS / MetaXLink share it |
//! | `fumarole.dev/fabric`           | string | that fabric's link class (`nvlink`, `hccs`, ...) |
//! | `fumarole.dev/superNode`        | string | the node's super-node (NVL72 rack, super-pod)    |
//! | `resource.kubernetes.io/pcieRoot` | string | PCIe root complex, `pci<domain>:<bus>`         |
//! | `resource.kubernetes.io/pciBusID` | string | `dddd:bb:dd.f`                                 |
//! | `resource.kubernetes.io/numaNode` | int    | the NUMA node the device is attached to        |
//! | `fumarole.dev/type`             | string | `device` (whole) or `partition`                  |
//! | `fumarole.dev/profile`          | string | a partition's MIG profile or vNPU template        |
//! | `fumarole.dev/placement`        | int    | its first memory slice (MIG), or instance (vNPU) |
//!
//! Capacity: `memory`, the device memory in bytes, when the vendor library reports it (NVML).
//!
//! Partitionable devices (`draPartitions`, [`partitions`]): the whole device and every
//! placement of every partition in its [`Catalogue`], all consuming counters of one counter
//! set named after the device, so the scheduler never allocates two that overlap (a MIG
//! instance's memory slices, a vNPU's AI cores and memory) nor a partition beside the whole.

use std::collections::BTreeMap;

use crate::link::LinkClass;
use crate::model::{Device, NodeTopology, Vendor};
use crate::share::{Catalogue, Profile};

/// The driver of GPUs of every vendor but Huawei.
pub const GPU_DRIVER: &str = "gpu.fumarole.dev";
/// The driver of Huawei Ascend NPUs.
pub const NPU_DRIVER: &str = "npu.fumarole.dev";
/// Both drivers, in the order their slices are written.
pub const DRIVERS: [&str; 2] = [GPU_DRIVER, NPU_DRIVER];

/// Domain of fumarole's own attributes.
pub const ATTRIBUTE_DOMAIN: &str = "fumarole.dev";
/// Attribute shared by the devices of one fabric group.
pub const FABRIC_GROUP: &str = "fumarole.dev/fabricGroup";
/// Attribute naming the node's super-node.
pub const SUPER_NODE: &str = "fumarole.dev/superNode";
/// Kubernetes' standard PCIe root attribute.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Kubernetes' standard PCI bus id attribute.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Kubernetes' standard NUMA node attribute.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// Capacity name of a device's memory, in bytes.
pub const MEMORY: &str = "memory";
/// Capacity of a device shared among claims (`allowMultipleAllocations`): how many claims may
/// hold it at once; each takes one unless it asks more.
pub const SHARES: &str = "shares";

/// Attribute saying what a published device is: [`WHOLE`] or [`PARTITION`].
pub const TYPE: &str = "fumarole.dev/type";
pub const WHOLE: &str = "device";
pub const PARTITION: &str = "partition";
/// A partition's MIG profile (`3g.40gb`) or vNPU template (`vir04`).
pub const PROFILE: &str = "fumarole.dev/profile";
/// A partition's first memory slice (MIG) or instance number (vNPU).
pub const PLACEMENT: &str = "fumarole.dev/placement";

/// Taint key put on an unhealthy device; its value is the first fault's reason.
pub const UNHEALTHY_TAINT: &str = "fumarole.dev/unhealthy";

/// The driver that publishes `d`.
pub fn driver(d: &Device) -> &'static str {
    driver_of(d.vendor.as_str())
}

/// The driver that publishes devices of `vendor` ([`Vendor::as_str`], as `DeviceTopology`
/// writes it).
pub fn driver_of(vendor: &str) -> &'static str {
    if vendor == Vendor::Huawei.as_str() {
        NPU_DRIVER
    } else {
        GPU_DRIVER
    }
}

/// The device's name in its node's pool: a DNS label, unique per node and driver,
/// `<vendor>-<index>` (`nvidia-0`, `huawei-3`).
pub fn device_name(d: &Device) -> String {
    name_of(d.vendor.as_str(), d.index)
}

/// [`device_name`] of device `index` of `vendor` ([`Vendor::as_str`]).
pub fn name_of(vendor: &str, index: u32) -> String {
    format!("{vendor}-{index}")
}

/// True when `name` (a device name in a pool) is `device` ([`name_of`]) or one of its
/// partitions (`<device>-<profile>-<placement>`, [`partitions`]).
pub fn is_or_partitions(name: &str, device: &str) -> bool {
    name.strip_prefix(device)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
}

/// The device of `t` that `driver` publishes as `name`.
pub fn find<'t>(t: &'t NodeTopology, driver_name: &str, name: &str) -> Option<&'t Device> {
    t.devices
        .iter()
        .find(|d| driver(d) == driver_name && device_name(d) == name)
}

/// One partition of a partitionable device, as published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Its name in the pool: `<device>-<profile>-<placement>` (`nvidia-0-3g-40gb-4`).
    pub name: String,
    pub profile: &'static Profile,
    /// [`Catalogue::placements`]: first memory slice (MIG) or instance number (vNPU).
    pub placement: u32,
    /// What it takes of its device's counter set.
    pub consumes: BTreeMap<String, u64>,
}

/// A partition made on the hardware for a claim: what the container is given and the ids
/// that find it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MadePartition {
    /// A MIG device: its uuid (`MIG-...`, what the container is given) and the GPU and compute
    /// instances behind it.
    Mig {
        uuid: String,
        gpu_instance: u32,
        compute_instance: u32,
    },
    /// An Ascend vNPU: the container is given host `/dev/vdavinci<vdev_id>` as
    /// `/dev/davinci<vdev_id>` (Huawei's container runtime's convention for virtual devices).
    Vnpu { vdev_id: u32 },
}

impl MadePartition {
    /// The id the container is given (its visible-devices value): the MIG device's uuid, the
    /// vNPU's vdev id.
    pub fn visible_id(&self) -> String {
        match self {
            MadePartition::Mig { uuid, .. } => uuid.clone(),
            MadePartition::Vnpu { vdev_id } => vdev_id.to_string(),
        }
    }
}

/// A partitionable device: its counter set (named [`device_name`]) and its partitions. The
/// whole device consumes the whole set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partitioned {
    pub counters: BTreeMap<String, u64>,
    pub partitions: Vec<Partition>,
}

/// Counter of MIG memory slice `k` (a MIG instance takes its placement's slices).
fn memory_slice(k: u32) -> String {
    format!("memory-slice-{k}")
}
/// Counter of a MIG GPU's media extensions (`+me` profiles take them all).
const MEDIA_EXTENSIONS: &str = "media-extensions";
/// Counters of a vNPU chip: its AI cores and memory (MiB).
const AI_CORES: &str = "ai-cores";
const MEMORY_MIB: &str = "memory-mib";

/// `d` as a partitionable device, when its model has a [`Catalogue`].
pub fn partitions(d: &Device) -> Option<Partitioned> {
    let c = Catalogue::for_model(&d.model)?;
    let counters: BTreeMap<String, u64> = if c.placed {
        (0..c.total.memory)
            .map(memory_slice)
            .chain([MEDIA_EXTENSIONS.to_string()])
            .map(|k| (k, 1))
            .collect()
    } else {
        BTreeMap::from([
            (AI_CORES.to_string(), u64::from(c.total.compute)),
            (MEMORY_MIB.to_string(), u64::from(c.total.memory)),
        ])
    };
    let parent = device_name(d);
    let partitions = c
        .profiles
        .iter()
        .flat_map(|p| c.placements(p).into_iter().map(move |at| (p, at)))
        .map(|(p, at)| {
            let consumes = if c.placed {
                let mut m: BTreeMap<String, u64> = (at..at + p.uses.memory)
                    .map(|k| (memory_slice(k), 1))
                    .collect();
                if p.name.ends_with("+me") {
                    m.insert(MEDIA_EXTENSIONS.into(), 1);
                }
                m
            } else {
                BTreeMap::from([
                    (AI_CORES.to_string(), u64::from(p.uses.compute)),
                    (MEMORY_MIB.to_string(), u64::from(p.uses.memory)),
                ])
            };
            Partition {
                name: format!("{parent}-{}-{at}", label(p.name)),
                profile: p,
                placement: at,
                consumes,
            }
        })
        .collect();
    Some(Partitioned {
        counters,
        partitions,
    })
}

/// A profile's name as part of a DNS label: `1g.10gb+me` -> `1g-10gb-me`.
fn label(profile: &str) -> String {
    profile
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// The partitionable device of `t` and the partition `driver` publishes as `name`.
pub fn find_partition<'t>(
    t: &'t NodeTopology,
    driver_name: &str,
    name: &str,
) -> Option<(&'t Device, Partition)> {
    t.devices
        .iter()
        .filter(|d| driver(d) == driver_name && is_or_partitions(name, &device_name(d)))
        .find_map(|d| {
            let p = partitions(d)?
                .partitions
                .into_iter()
                .find(|p| p.name == name)?;
            Some((d, p))
        })
}

/// One attribute value, as `resource.k8s.io/v1` `DeviceAttribute` holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttributeValue {
    Int(i64),
    String(String),
}

/// The fabric class joining device `i` to the rest of its group (the first fabric link found).
fn fabric_kind(t: &NodeTopology, i: usize) -> Option<&'static str> {
    (0..t.devices.len())
        .filter(|&o| o != i)
        .find_map(|o| t.links.class(i, o).filter(|c| c.is_fabric()))
        .map(|c| match c {
            LinkClass::Nvlink { .. } => "nvlink",
            LinkClass::Hccs => "hccs",
            LinkClass::MetaxLink => "metaxLink",
            _ => "fabric",
        })
}

/// The attributes of device `i` of `t`; `groups` is `t.links.fabric_groups()`
/// ([`crate::LinkMatrix::fabric_groups`]).
pub fn attributes(
    t: &NodeTopology,
    i: usize,
    groups: &[Option<usize>],
) -> BTreeMap<String, AttributeValue> {
    let mut out = BTreeMap::new();
    let Some(d) = t.devices.get(i) else {
        return out;
    };
    let mut put = |name: &str, value: AttributeValue| {
        out.insert(name.to_string(), value);
    };
    let ours = |name: &str| format!("{ATTRIBUTE_DOMAIN}/{name}");
    put(TYPE, AttributeValue::String(WHOLE.into()));
    put(
        &ours("vendor"),
        AttributeValue::String(d.vendor.as_str().into()),
    );
    if !d.model.is_empty() {
        put(&ours("model"), AttributeValue::String(d.model.clone()));
    }
    put(&ours("index"), AttributeValue::Int(i64::from(d.index)));
    if let Some(uuid) = &d.uuid {
        put(&ours("uuid"), AttributeValue::String(uuid.clone()));
    }
    if let Some(Some(g)) = groups.get(i) {
        put(
            FABRIC_GROUP,
            AttributeValue::Int(i64::try_from(*g).unwrap_or(i64::MAX)),
        );
        if let Some(kind) = fabric_kind(t, i) {
            put(&ours("fabric"), AttributeValue::String(kind.into()));
        }
    }
    if let Some(s) = &t.super_node {
        put(SUPER_NODE, AttributeValue::String(s.id.clone()));
    }
    if let Some(root) = d.pci_path.first().filter(|r| r.starts_with("pci")) {
        put(PCIE_ROOT, AttributeValue::String(root.clone()));
    }
    if !d.pci_bus_id.is_empty() {
        put(PCI_BUS_ID, AttributeValue::String(d.pci_bus_id.clone()));
    }
    if let Some(numa) = d.numa_node {
        put(NUMA_NODE, AttributeValue::Int(i64::from(numa)));
    }
    out
}

/// The attributes of partition `p` of device `i`: the device's own ([`attributes`]), so a
/// claim keeps partitions to one fabric group or PCIe root as it keeps whole devices, with
/// [`TYPE`] `partition`, its [`PROFILE`] and [`PLACEMENT`].
pub fn partition_attributes(
    t: &NodeTopology,
    i: usize,
    groups: &[Option<usize>],
    p: &Partition,
) -> BTreeMap<String, AttributeValue> {
    let mut out = attributes(t, i, groups);
    out.insert(TYPE.into(), AttributeValue::String(PARTITION.into()));
    out.insert(
        PROFILE.into(),
        AttributeValue::String(p.profile.name.into()),
    );
    out.insert(
        PLACEMENT.into(),
        AttributeValue::Int(i64::from(p.placement)),
    );
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::LinkMatrix;
    use crate::model::tests::{gpu, sample};

    /// Four GPUs: 0-1 and 2-3 NVLinked pairs, PCIe between the pairs; GPU 3 on NUMA node 1
    /// and with no known NUMA node for GPU 2.
    fn two_pairs() -> NodeTopology {
        let mut t = sample();
        t.devices = (0..4).map(gpu).collect();
        t.devices[2].numa_node = None;
        t.devices[3].numa_node = Some(1);
        t.links = LinkMatrix::from_fn(4, |a, b| {
            if a / 2 == b / 2 {
                LinkClass::Nvlink { count: 4 }
            } else {
                LinkClass::SameNuma
            }
        });
        t
    }

    #[test]
    fn names_are_dns_labels_and_found_again() {
        let t = two_pairs();
        for d in &t.devices {
            let name = device_name(d);
            assert!(name.len() <= 63);
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
            assert_eq!(find(&t, driver(d), &name).map(|f| &f.id), Some(&d.id));
            assert!(find(&t, NPU_DRIVER, &name).is_none());
        }
    }

    #[test]
    fn ascend_is_npu_everything_else_gpu() {
        let mut d = gpu(0);
        assert_eq!(driver(&d), GPU_DRIVER);
        d.vendor = Vendor::Metax;
        assert_eq!(driver(&d), GPU_DRIVER);
        d.vendor = Vendor::Huawei;
        assert_eq!(driver(&d), NPU_DRIVER);
        assert_eq!(device_name(&d), "huawei-0");
    }

    #[test]
    fn fabric_groups_are_the_fabric_components() {
        let t = two_pairs();
        assert_eq!(
            t.links.fabric_groups(),
            vec![Some(0), Some(0), Some(2), Some(2)]
        );
        // A lowered link splits a group; a device with no fabric link has none.
        let mut t = two_pairs();
        t.links.set(2, 3, LinkClass::SameNuma);
        assert_eq!(t.links.fabric_groups(), vec![Some(0), Some(0), None, None]);
        // A chain is one group even where its ends are not linked directly.
        let mut t = two_pairs();
        t.links.set(1, 2, LinkClass::Hccs);
        assert_eq!(t.links.fabric_groups(), vec![Some(0); 4]);
    }

    #[test]
    fn a_mig_gpu_offers_every_placement_on_its_memory_slices() {
        let mut t = two_pairs();
        t.devices[1].model = "NVIDIA H100 80GB HBM3".into();
        let d = &t.devices[1];
        let p = partitions(d).unwrap();
        assert_eq!(
            p.counters.len(),
            9,
            "8 memory slices and the media extensions"
        );
        assert_eq!(p.partitions.len(), 7 + 7 + 4 + 3 + 2 + 1 + 1);
        let by_name = |n: &str| p.partitions.iter().find(|x| x.name == n).unwrap();
        let p3g = by_name("nvidia-1-3g-40gb-4");
        assert_eq!(
            p3g.consumes.keys().collect::<Vec<_>>(),
            [
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                "memory-slice-7"
            ]
        );
        assert_eq!(by_name("nvidia-1-1g-10gb-me-6").consumes.len(), 2);
        for x in &p.partitions {
            assert!(x.name.len() <= 63 && !x.name.contains('.'), "{}", x.name);
            assert!(x.consumes.keys().all(|k| p.counters.contains_key(k)));
        }
        let (found, fp) = find_partition(&t, GPU_DRIVER, "nvidia-1-3g-40gb-4").unwrap();
        assert_eq!((found.index, fp.placement), (1, 4));
        assert!(find_partition(&t, GPU_DRIVER, "nvidia-1-3g-40gb-2").is_none());
        assert!(
            find_partition(&t, GPU_DRIVER, "nvidia-0-3g-40gb-4").is_none(),
            "no catalogue"
        );
        let a = partition_attributes(&t, 1, &t.links.fabric_groups(), p3g);
        assert_eq!(a[TYPE], AttributeValue::String(PARTITION.into()));
        assert_eq!(a[PROFILE], AttributeValue::String("3g.40gb".into()));
        assert_eq!(a[PLACEMENT], AttributeValue::Int(4));
        assert_eq!(a[FABRIC_GROUP], AttributeValue::Int(0));
    }

    #[test]
    fn a_vnpu_chip_counts_ai_cores_and_memory() {
        let mut d = gpu(0);
        d.vendor = Vendor::Huawei;
        d.model = "Ascend910B".into();
        let p = partitions(&d).unwrap();
        assert_eq!(p.counters["ai-cores"], 24);
        assert_eq!(p.partitions.len(), 4 + 2);
        let last = p.partitions.last().unwrap();
        assert_eq!(last.name, "huawei-0-vir12-3c-32g-1");
        assert_eq!(last.consumes["memory-mib"], 32768);
    }

    #[test]
    fn attributes_say_only_what_is_known() {
        let t = two_pairs();
        let groups = t.links.fabric_groups();
        let a = attributes(&t, 3, &groups);
        let s = |v: &str| AttributeValue::String(v.into());
        assert_eq!(a["fumarole.dev/vendor"], s("nvidia"));
        assert_eq!(a["fumarole.dev/index"], AttributeValue::Int(3));
        assert_eq!(a["fumarole.dev/uuid"], s("GPU-3"));
        assert_eq!(a[FABRIC_GROUP], AttributeValue::Int(2));
        assert_eq!(a["fumarole.dev/fabric"], s("nvlink"));
        assert_eq!(a[SUPER_NODE], s("sn-1"));
        assert_eq!(a[PCIE_ROOT], s("pci0000:00"));
        assert_eq!(a[PCI_BUS_ID], s("0000:04:00.0"));
        assert_eq!(a[NUMA_NODE], AttributeValue::Int(1));
        // No NUMA node, no super-node, no fabric: no attribute rather than a shared default.
        let mut t = two_pairs();
        t.super_node = None;
        t.links.set(2, 3, LinkClass::SameNuma);
        let a = attributes(&t, 2, &t.links.fabric_groups());
        for missing in [NUMA_NODE, SUPER_NODE, FABRIC_GROUP, "fumarole.dev/fabric"] {
            assert!(!a.contains_key(missing), "{missing}");
        }
        assert!(attributes(&t, 9, &[]).is_empty());
    }
}
