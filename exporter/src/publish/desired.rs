//! What the node's objects should be, as a pure function: [`desired`] takes one
//! [`NodeSnapshot`] (everything [`super::collect`] read this round) and the
//! [`PublishOptions`] (what to publish beside the node's own objects, from
//! [`super::settings`]) and returns the [`Desired`] objects. No I/O, no async, no clock: a
//! hand-built snapshot gives the same objects as a live node in the same state.
//!
//! Start at [`desired`]; the objects themselves are rendered by [`super::objects`],
//! [`super::compat`], [`super::ascend`] and [`super::slices`].

use std::collections::BTreeMap;

use fumarole_topology::crd::{
    DeviceTopologySpec, DeviceTopologyStatus, NodeResourceTopology, NumatopologySpec,
    PodDeviceUsage,
};
use fumarole_topology::{NodeHealth, NodeTopology};
use k8s_openapi::api::resource::v1::ResourceSliceSpec;

use crate::device_health::dcmi::answers::{ChipInfo, SuperPod};
use crate::discover::nvml::NvmlReport;
use crate::kubelet::config::KubeletPolicies;
use crate::kubelet::{AllocationSource, Allocations};

use super::settings::PublishOptions;
use super::{ascend, compat, objects, slices};

/// What the node should look like. `None` keeps the last published object (its inputs could
/// not be read this round).
#[derive(Clone, Debug, Default)]
pub struct Desired {
    pub numatopology: Option<NumatopologySpec>,
    pub node_resource_topology: Option<NodeResourceTopology>,
    pub device_topology: Option<(DeviceTopologySpec, DeviceTopologyStatus)>,
    pub labels: Option<BTreeMap<String, String>>,
    /// The node's ResourceSlices by driver; `None` when no device is served through DRA
    /// (then no slice is written or deleted).
    pub resource_slices: Option<BTreeMap<&'static str, Vec<ResourceSliceSpec>>>,
    /// Huawei's device-info ConfigMap content; `None` when not asked for
    /// (`--ascend-device-info`) or the node has no Ascend device (then nothing is written).
    pub ascend_device_info: Option<ascend::DeviceInfo>,
}

/// One round's reading of the node: everything [`desired`] builds the objects from.
#[derive(Clone, Debug)]
pub struct NodeSnapshot {
    /// The node as discovered (before health and the hardware's super-pod answer apply).
    pub topology: NodeTopology,
    /// NVML's answers from the same discovery, when NVML answered (GFD's labels).
    pub nvml: Option<NvmlReport>,
    /// The node's health stream, as it stood.
    pub health: NodeHealth,
    /// The DCMI source's super-pod answer (A3 hardware), when it has answered.
    pub super_pod: Option<SuperPod>,
    /// The DCMI source's chip info, when it has answered.
    pub chip_info: Option<ChipInfo>,
    /// The kubelet's policies; `None` when its configuration could not be read this round.
    pub policies: Option<KubeletPolicies>,
    /// The kubelet's allocations as read this round; `None` when they could not be read.
    pub allocations: Option<Allocations>,
    /// What device accounting counts as allocated: this round's allocations with the devices
    /// of the last PodResources answer while only the CPU manager checkpoint can be read, or,
    /// when this round's could not be read, the last good ones (`None`: none yet).
    pub device_allocations: Option<Allocations>,
    /// Memory and huge pages per NUMA node from sysfs (empty: zones carry hwloc's sizes).
    pub numa_memory: objects::NumaMemory,
    /// Each holding pod's use of its devices (`DeviceTopology` status `pods`).
    pub device_usage: Vec<PodDeviceUsage>,
}

/// The node's objects from `snapshot` with `options` (see the module doc).
pub fn desired(snapshot: &NodeSnapshot, options: &PublishOptions) -> Desired {
    let NodeSnapshot {
        topology,
        nvml,
        health,
        super_pod,
        chip_info,
        policies,
        allocations,
        device_allocations,
        numa_memory,
        device_usage,
    } = snapshot;
    let mut topology = topology.with_health(health);
    topology.super_node =
        ascend::hardware_super_node(topology.super_node.as_ref(), super_pod.as_ref());
    let (numatopology, node_resource_topology) = match (policies, allocations) {
        (Some(p), Some(a)) => (
            Some(objects::numatopology(&topology, p, a)),
            Some(objects::node_resource_topology(
                &topology,
                p,
                // The collector sets both whenever this round's allocations were read.
                device_allocations.as_ref().unwrap_or(a),
                numa_memory,
                objects::pods_fingerprint(a).as_deref(),
            )),
        ),
        _ => (None, None),
    };
    let none = Allocations {
        source: AllocationSource::None,
        pods: vec![],
    };
    let (spec, mut status) = objects::device_topology(
        &topology,
        device_allocations.as_ref().unwrap_or(&none),
        health,
        &options.sharing,
    );
    status.pods = device_usage.clone();
    let device_topology = Some((spec, status));
    let mut labels = objects::labels(&topology);
    if options.compat_labels {
        labels.extend(compat::labels(&topology, nvml.as_ref(), super_pod.as_ref()));
    }
    if options.ascend_device_info {
        labels.extend(ascend::labels(
            &topology,
            super_pod.as_ref(),
            chip_info.as_ref(),
        ));
    }
    Desired {
        numatopology,
        node_resource_topology,
        device_topology,
        labels: Some(labels),
        ascend_device_info: options
            .ascend_device_info
            .then(|| ascend::device_info(&topology, health, super_pod.as_ref()))
            .flatten(),
        resource_slices: options
            .dra
            .as_ref()
            .map(|d| slices::resource_slices(&topology, health, d)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::discover::memory::ZoneMemory;
    use crate::discover::nvml::NvmlGpu;
    use crate::kubelet::{ContainerAllocation, PodAllocation};
    use crate::publish::settings::DraSlices;
    use fumarole_topology::model::{Device, DeviceKind, PciId};
    use fumarole_topology::{
        CpuSet, Fault, FaultKind, Health, LinkClass, LinkMatrix, NumaNode, ProcessingUnit, Vendor,
    };
    use std::collections::BTreeSet;

    fn device(id: &str, index: u32, vendor: Vendor, model: &str) -> Device {
        Device {
            id: id.into(),
            index,
            vendor,
            kind: DeviceKind::Gpu,
            model: model.into(),
            pci_bus_id: format!("0000:{:02x}:00.0", index + 1),
            pci_path: vec![],
            pci_id: PciId {
                vendor: if vendor == Vendor::Nvidia {
                    0x10de
                } else {
                    0x19e5
                },
                device: 0x2330,
                class: 0x0302,
            },
            numa_node: Some(0),
            local_cpus: CpuSet::parse("0-3").unwrap(),
            dev_nodes: vec![],
            health: Health::Healthy,
            uuid: None,
            serial: None,
            memory_bytes: Some(80 << 30),
            mig: Vec::new(),
        }
    }

    /// A small node with one NVIDIA GPU and two Ascend NPUs, so that every input of
    /// [`desired`] (NVML's answers, DCMI's super-pod and chip info) shows in some object.
    fn topology() -> NodeTopology {
        let processing_units = (0..4)
            .map(|i| ProcessingUnit {
                os_index: i,
                core: Some(i),
                core_id: Some(i),
                package_id: Some(0),
                die_id: None,
                numa_node: Some(0),
            })
            .collect();
        let devices = vec![
            device("GPU-0", 0, Vendor::Nvidia, "NVIDIA H100"),
            device("Ascend910-0", 1, Vendor::Huawei, "Ascend910"),
            device("Ascend910-1", 2, Vendor::Huawei, "Ascend910"),
        ];
        NodeTopology {
            hostname: "n1".into(),
            packages: vec![],
            processing_units,
            allowed_cpus: CpuSet::parse("0-3").unwrap(),
            numa_nodes: vec![NumaNode {
                id: 0,
                cpus: CpuSet::parse("0-3").unwrap(),
                memory_bytes: 1 << 30,
                distances: vec![10],
                kind: None,
            }],
            links: LinkMatrix::filled(devices.len(), LinkClass::PcieHostBridge),
            devices,
            super_node: None,
        }
    }

    fn allocations(source: AllocationSource, devices: &[&str]) -> Allocations {
        Allocations {
            source,
            pods: vec![PodAllocation {
                uid: Some("u1".into()),
                name: "p".into(),
                namespace: "default".into(),
                containers: vec![ContainerAllocation {
                    name: "c".into(),
                    cpus: CpuSet::parse("2-3").unwrap(),
                    devices: BTreeMap::from([(
                        "huawei.com/Ascend910".to_string(),
                        devices.iter().map(|d| d.to_string()).collect(),
                    )]),
                    ..Default::default()
                }],
            }],
        }
    }

    /// Shares held through PodResources (a replica `<id>::<n>`, a MIG device) are listed under
    /// their device in `DeviceTopology`; whole devices keep `allocation`; other ids are ignored.
    #[test]
    fn device_topology_lists_who_holds_each_share() {
        let mut t = topology();
        t.devices[0].mig = vec![fumarole_topology::MigInstance {
            uuid: "MIG-7".into(),
            profile: "1g.10gb".into(),
            memory_bytes: None,
        }];
        let alloc = allocations(
            AllocationSource::PodResources,
            &["GPU-0::1", "MIG-7", "Ascend910-0", "nope::0", "GPU-0::x"],
        );
        let (_, status) =
            objects::device_topology(&t, &alloc, &NodeHealth::default(), &BTreeMap::new());
        let gpu = &status.devices["GPU-0"];
        assert!(gpu.allocation.is_none());
        let shares: Vec<(&str, &str, &str)> = gpu
            .shares
            .iter()
            .map(|s| (s.share.as_str(), s.pod.as_str(), s.container.as_str()))
            .collect();
        assert_eq!(shares, [("GPU-0::1", "p", "c"), ("MIG-7", "p", "c")]);
        assert!(status.devices["Ascend910-0"].allocation.is_some());
        assert!(status.devices["Ascend910-0"].shares.is_empty());
        // The CPU manager's state alone names no device holder: nothing is shown.
        let cpu_state = allocations(AllocationSource::CpuManagerState, &["GPU-0::1"]);
        let (_, status) =
            objects::device_topology(&t, &cpu_state, &NodeHealth::default(), &BTreeMap::new());
        assert!(status.devices["GPU-0"].shares.is_empty());
    }

    /// A device the device plugin serves in replicas says so in the spec; the others do not.
    #[test]
    fn device_topology_says_which_devices_are_offered_in_replicas() {
        let t = topology();
        let offer = fumarole_topology::crd::SharingInfo {
            resource: "nvidia.com/gpu.shared".into(),
            mechanism: "mps".into(),
            replicas: 4,
        };
        let sharing = BTreeMap::from([("GPU-0".to_string(), offer.clone())]);
        let none = allocations(AllocationSource::PodResources, &[]);
        let (spec, _) = objects::device_topology(&t, &none, &NodeHealth::default(), &sharing);
        let offers: Vec<(&str, Option<&fumarole_topology::crd::SharingInfo>)> = spec
            .devices
            .iter()
            .map(|d| (d.id.as_str(), d.sharing.as_ref()))
            .collect();
        assert_eq!(
            offers,
            [
                ("GPU-0", Some(&offer)),
                ("Ascend910-0", None),
                ("Ascend910-1", None)
            ]
        );
    }

    /// A snapshot with every field set to something that changes the objects.
    fn snapshot() -> NodeSnapshot {
        let mut health = NodeHealth::default();
        health.add("Ascend910-1", Fault::new(FaultKind::DcmiChip, "chip"));
        NodeSnapshot {
            topology: topology(),
            nvml: Some(NvmlReport {
                driver_version: Some("550.54.15".into()),
                cuda_driver_version: Some(12040),
                gpus: vec![NvmlGpu {
                    pci_bus_id: "0000:01:00.0".into(),
                    index: 0,
                    ..NvmlGpu::default()
                }],
            }),
            health,
            super_pod: Some(SuperPod {
                member: Some((7, 3)),
            }),
            chip_info: Some(ChipInfo {
                chip_type: "Ascend".into(),
                name: "910B3".into(),
                version: "V1".into(),
                ai_cores: 20,
            }),
            policies: Some(KubeletPolicies {
                cpu_manager_policy: "static".into(),
                topology_manager_policy: "single-numa-node".into(),
                topology_manager_scope: "container".into(),
                reserved_cpu_millis: 1000,
                reserved_memory_bytes: 1 << 20,
                reserved_system_cpus: CpuSet::parse("0").unwrap(),
                reserved_memory: BTreeMap::new(),
            }),
            allocations: Some(allocations(AllocationSource::CpuManagerState, &[])),
            device_allocations: Some(allocations(
                AllocationSource::PodResources,
                &["Ascend910-0"],
            )),
            numa_memory: objects::NumaMemory::from([(
                0,
                ZoneMemory {
                    total_bytes: 3 << 30,
                    hugepages: BTreeMap::from([(2 << 20, 16)]),
                },
            )]),
            device_usage: vec![PodDeviceUsage {
                namespace: "ml".into(),
                pod: "train-0".into(),
                devices: 1,
                utilization_percent: 0,
                idle_since: Some("2026-11-29T20:00:00Z".into()),
            }],
        }
    }

    fn options() -> PublishOptions {
        PublishOptions {
            compat_labels: true,
            ascend_device_info: true,
            dra: Some(DraSlices {
                node: "n1".into(),
                devices: BTreeSet::from(["GPU-0".to_string()]),
                shares: BTreeMap::new(),
                partitioned: BTreeSet::new(),
            }),
            sharing: BTreeMap::new(),
        }
    }

    /// The objects as text, to tell two results apart.
    fn text(d: &Desired) -> String {
        format!("{d:?}")
    }

    #[test]
    fn every_input_shows_in_the_objects() {
        let d = desired(&snapshot(), &options());
        let labels = d.labels.as_ref().unwrap();
        // NVML's answers: GFD's driver label.
        assert_eq!(labels["nvidia.com/cuda.driver-version.full"], "550.54.15");
        // DCMI's chip info: Huawei's chip name label.
        assert_eq!(labels["node.kubernetes.io/npu.chip.name"], "910B3");
        // DCMI's super-pod answer: the node's super-node, and its server index.
        let (spec, status) = d.device_topology.as_ref().unwrap();
        assert_eq!(spec.super_node.as_ref().unwrap().id, "7");
        let info = d.ascend_device_info.as_ref().unwrap();
        assert_eq!((info.super_pod_id, info.server_index), (7, 3));
        // Health: one NPU down.
        assert_eq!(status.healthy_count, 2);
        assert_eq!(
            info.lists["huawei.com/Ascend910-Unhealthy"],
            "Ascend910-1".to_string()
        );
        // Device accounting counts the device allocations, not this round's checkpoint.
        assert!(status.devices["Ascend910-0"].allocation.is_some());
        // Policies and allocations: both kubelet objects.
        assert!(d.numatopology.is_some());
        assert!(d.node_resource_topology.is_some());
        // DRA: the served device's slice.
        assert!(d.resource_slices.as_ref().is_some_and(|s| !s.is_empty()));
    }

    /// Clearing any one field of the snapshot changes the objects: no input is dropped on
    /// the way.
    #[test]
    fn no_field_is_ignored() {
        let full = text(&desired(&snapshot(), &options()));
        type Clear = fn(&mut NodeSnapshot);
        let clears: [(&str, Clear); 9] = [
            ("topology", |s| {
                s.topology.devices[0].model = "NVIDIA A100".into()
            }),
            ("nvml", |s| s.nvml = None),
            ("health", |s| s.health = NodeHealth::default()),
            ("super_pod", |s| s.super_pod = None),
            ("chip_info", |s| s.chip_info = None),
            ("policies", |s| s.policies = None),
            ("allocations", |s| s.allocations = None),
            ("device_allocations", |s| s.device_allocations = None),
            ("numa_memory", |s| s.numa_memory.clear()),
        ];
        for (field, clear) in clears {
            let mut s = snapshot();
            clear(&mut s);
            assert_ne!(
                text(&desired(&s, &options())),
                full,
                "{field} made no difference"
            );
        }
        type Unset = fn(&mut PublishOptions);
        let opts: [(&str, Unset); 3] = [
            ("compat_labels", |o| o.compat_labels = false),
            ("ascend_device_info", |o| o.ascend_device_info = false),
            ("dra", |o| o.dra = None),
        ];
        for (field, clear) in opts {
            let mut o = options();
            clear(&mut o);
            assert_ne!(
                text(&desired(&snapshot(), &o)),
                full,
                "{field} made no difference"
            );
        }
    }

    #[test]
    fn unread_kubelet_state_keeps_its_objects() {
        let mut s = snapshot();
        s.policies = None;
        let d = desired(&s, &options());
        assert!(d.numatopology.is_none() && d.node_resource_topology.is_none());
        // Device status stays, with no allocation at all before the first reading.
        s.device_allocations = None;
        let d = desired(&s, &options());
        let (_, status) = d.device_topology.unwrap();
        assert!(status.devices.values().all(|d| d.allocation.is_none()));
    }
}
