//! The objects a node publishes, built from its topology, the kubelet's policies and the
//! current allocations. Pure functions: the publisher decides when to write them.

use std::collections::{BTreeMap, BTreeSet};

use fumarole_topology::crd::device_topology::DeviceAllocation;
use fumarole_topology::crd::node_resource_topology::{Attribute, CostInfo, ResourceInfo, Zone};
use fumarole_topology::crd::numatopology::{
    ContainerAllocation, CpuInfo, PodAllocation, ResourceInfoNuma,
};
use fumarole_topology::crd::{
    DeviceTopologySpec, DeviceTopologyStatus, NodeResourceTopology, NumatopologySpec,
};
use fumarole_topology::{CpuSet, Health, NodeHealth, NodeTopology};

use crate::kubelet::config::KubeletPolicies;
use crate::kubelet::{AllocationSource, Allocations};
use fumarole_topology::quantity::format_cpu;

/// Label keys we own on the Node; everything under this prefix is ours.
pub const LABEL_PREFIX: &str = "fumarole.dev/";

/// CPUs free for exclusive allocation: online, not held exclusively, not reserved for the
/// system (`reservedSystemCPUs` is never handed out by the static CPU manager).
pub fn free_cpus(t: &NodeTopology, policies: &KubeletPolicies, alloc: &Allocations) -> CpuSet {
    t.cpus()
        .difference(&alloc.exclusive_cpus())
        .difference(&policies.reserved_system_cpus)
}

/// Volcano `Numatopology`, with resource-exporter's meaning.
pub fn numatopology(
    t: &NodeTopology,
    policies: &KubeletPolicies,
    alloc: &Allocations,
) -> NumatopologySpec {
    let mut spec = NumatopologySpec::default();
    spec.policies.insert(
        "CPUManagerPolicy".into(),
        policies.cpu_manager_policy.clone(),
    );
    spec.policies.insert(
        "TopologyManagerPolicy".into(),
        policies.topology_manager_policy.clone(),
    );
    if policies.reserved_cpu_millis > 0 {
        spec.res_reserved
            .insert("cpu".into(), format_cpu(policies.reserved_cpu_millis));
    }
    if policies.reserved_memory_bytes > 0 {
        spec.res_reserved
            .insert("memory".into(), policies.reserved_memory_bytes.to_string());
    }
    spec.numares.insert(
        "cpu".into(),
        ResourceInfoNuma {
            allocatable: free_cpus(t, policies, alloc).to_string(),
            capacity: i64::try_from(t.processing_units.len()).unwrap_or(i64::MAX),
        },
    );
    for pu in &t.processing_units {
        let id = |v: Option<u32>| v.map_or(0, i64::from);
        spec.cpu_detail.insert(
            pu.os_index.to_string(),
            CpuInfo {
                numa: id(pu.numa_node),
                socket: id(pu.package_id),
                core: id(pu.core_id),
            },
        );
    }
    spec.pod_allocations = alloc
        .pods
        .iter()
        .map(|p| PodAllocation {
            uid: p.uid.clone().unwrap_or_default(),
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            container_allocations: p
                .containers
                .iter()
                .map(|c| {
                    let mut allocations = BTreeMap::new();
                    if !c.cpus.is_empty() {
                        allocations.insert("cpu".to_string(), c.cpus.to_string());
                    }
                    for (resource, ids) in &c.devices {
                        allocations.insert(resource.clone(), ids.len().to_string());
                    }
                    ContainerAllocation {
                        name: c.name.clone(),
                        allocations,
                    }
                })
                .filter(|c| !c.allocations.is_empty())
                .collect(),
        })
        .filter(|p| !p.container_allocations.is_empty())
        .collect();
    spec
}

/// Device id -> the container holding it, from PodResources (the checkpoint knows no devices).
pub fn device_allocations(
    t: &NodeTopology,
    alloc: &Allocations,
) -> BTreeMap<String, DeviceAllocation> {
    let ours: BTreeSet<&str> = t.devices.iter().map(|d| d.id.as_str()).collect();
    let mut out = BTreeMap::new();
    if alloc.source != AllocationSource::PodResources {
        return out;
    }
    for p in &alloc.pods {
        for c in &p.containers {
            for id in c.devices.values().flatten() {
                if ours.contains(id.as_str()) {
                    out.insert(
                        id.clone(),
                        DeviceAllocation {
                            namespace: p.namespace.clone(),
                            pod: p.name.clone(),
                            container: c.name.clone(),
                        },
                    );
                }
            }
        }
    }
    out
}

/// `DeviceTopology` spec and status. `t` is the topology `health` was applied to
/// (`NodeTopology::with_health`: unhealthy devices, lowered links); `health` gives each
/// device's reason.
pub fn device_topology(
    t: &NodeTopology,
    alloc: &Allocations,
    health: &NodeHealth,
) -> (DeviceTopologySpec, DeviceTopologyStatus) {
    (
        DeviceTopologySpec::from_topology(t),
        DeviceTopologyStatus::with_health(t, &device_allocations(t, alloc), health),
    )
}

/// `NodeResourceTopology`: one `node-N` zone per NUMA node with cpu, memory and accelerator
/// resources, costs from the NUMA distances.
pub fn node_resource_topology(
    t: &NodeTopology,
    policies: &KubeletPolicies,
    alloc: &Allocations,
) -> NodeResourceTopology {
    let exclusive = alloc.exclusive_cpus();
    let allocated_devices = device_allocations(t, alloc);
    let zones = t
        .numa_nodes
        .iter()
        .map(|n| {
            let capacity = n.cpus.len();
            let allocatable = n.cpus.difference(&policies.reserved_system_cpus);
            let available = allocatable.difference(&exclusive);
            let mut resources = vec![
                ResourceInfo {
                    name: "cpu".into(),
                    capacity: capacity.to_string(),
                    allocatable: allocatable.len().to_string(),
                    available: available.len().to_string(),
                },
                ResourceInfo {
                    name: "memory".into(),
                    capacity: n.memory_bytes.to_string(),
                    allocatable: n.memory_bytes.to_string(),
                    available: n.memory_bytes.to_string(),
                },
            ];
            let mut devices: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
            for d in t.devices.iter().filter(|d| d.numa_node == Some(n.id)) {
                let e = devices.entry(d.default_resource_name()).or_default();
                e.0 += 1;
                if d.health == Health::Healthy {
                    e.1 += 1;
                    if !allocated_devices.contains_key(&d.id) {
                        e.2 += 1;
                    }
                }
            }
            resources.extend(devices.into_iter().map(|(name, (c, a, v))| ResourceInfo {
                name,
                capacity: c.to_string(),
                allocatable: a.to_string(),
                available: v.to_string(),
            }));
            let costs = t
                .numa_nodes
                .iter()
                .zip(&n.distances)
                .map(|(m, d)| CostInfo {
                    name: format!("node-{}", m.id),
                    value: i64::from(*d),
                })
                .collect();
            Zone {
                name: format!("node-{}", n.id),
                zone_type: "Node".into(),
                resources,
                costs,
            }
        })
        .collect();
    NodeResourceTopology {
        zones,
        attributes: vec![
            Attribute {
                name: "topologyManagerPolicy".into(),
                value: policies.topology_manager_policy.clone(),
            },
            Attribute {
                name: "topologyManagerScope".into(),
                value: policies.topology_manager_scope.clone(),
            },
        ],
    }
}

/// A label value: at most 63 characters of `[A-Za-z0-9._-]`, starting and ending with an
/// alphanumeric; other characters become `-`.
pub fn label_value(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Node labels under `fumarole.dev/`: super-node, accelerator vendor, model and count.
pub fn labels(t: &NodeTopology) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(
        format!("{LABEL_PREFIX}accelerator-count"),
        t.devices.len().to_string(),
    );
    if let Some(first) = t.devices.first() {
        labels.insert(
            format!("{LABEL_PREFIX}accelerator-vendor"),
            first.vendor.as_str().to_string(),
        );
        let spec = DeviceTopologySpec::from_topology(t);
        labels.insert(
            format!("{LABEL_PREFIX}accelerator-model"),
            label_value(&spec.model),
        );
    }
    if let Some(sn) = &t.super_node {
        labels.insert(format!("{LABEL_PREFIX}super-node"), label_value(&sn.id));
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::{ContainerAllocation as Held, PodAllocation as Pod};
    use fumarole_topology::{LinkMatrix, NumaNode, ProcessingUnit};

    fn node() -> NodeTopology {
        let pus = (0..8)
            .map(|i| ProcessingUnit {
                os_index: i,
                core: Some(i),
                core_id: Some(i % 4),
                package_id: Some(i / 4),
                die_id: None,
                numa_node: Some(i / 4),
            })
            .collect();
        let numa = |id: u32, cpus: &str, distances: Vec<u32>| NumaNode {
            id,
            cpus: CpuSet::parse(cpus).unwrap(),
            memory_bytes: 1 << 30,
            distances,
            kind: None,
        };
        NodeTopology {
            hostname: "n1".into(),
            packages: vec![],
            processing_units: pus,
            allowed_cpus: CpuSet::parse("0-7").unwrap(),
            numa_nodes: vec![numa(0, "0-3", vec![10, 21]), numa(1, "4-7", vec![21, 10])],
            devices: vec![],
            links: LinkMatrix::filled(0, fumarole_topology::LinkClass::CrossNuma),
            super_node: None,
        }
    }

    fn policies() -> KubeletPolicies {
        KubeletPolicies {
            cpu_manager_policy: "static".into(),
            topology_manager_policy: "single-numa-node".into(),
            topology_manager_scope: "container".into(),
            reserved_cpu_millis: 1000,
            reserved_memory_bytes: 1 << 20,
            reserved_system_cpus: CpuSet::parse("0").unwrap(),
        }
    }

    fn held(cpus: &str) -> Allocations {
        Allocations {
            source: AllocationSource::CpuManagerState,
            pods: vec![Pod {
                uid: Some("u1".into()),
                name: String::new(),
                namespace: String::new(),
                containers: vec![Held {
                    name: "c".into(),
                    cpus: CpuSet::parse(cpus).unwrap(),
                    devices: BTreeMap::new(),
                }],
            }],
        }
    }

    #[test]
    fn numatopology_has_resource_exporter_meaning() {
        let spec = numatopology(&node(), &policies(), &held("4-5"));
        assert_eq!(spec.policies["CPUManagerPolicy"], "static");
        assert_eq!(spec.policies["TopologyManagerPolicy"], "single-numa-node");
        assert_eq!(spec.res_reserved["cpu"], "1");
        assert_eq!(
            spec.numares["cpu"],
            ResourceInfoNuma {
                allocatable: "1-3,6-7".into(),
                capacity: 8
            }
        );
        assert_eq!(
            spec.cpu_detail["5"],
            CpuInfo {
                numa: 1,
                socket: 1,
                core: 1
            }
        );
        assert_eq!(spec.pod_allocations[0].uid, "u1");
        assert_eq!(
            spec.pod_allocations[0].container_allocations[0].allocations["cpu"],
            "4-5"
        );
    }

    #[test]
    fn nrt_zones_count_reserved_and_held_cpus() {
        let nrt = node_resource_topology(&node(), &policies(), &held("4-5"));
        let cpu = |z: usize| {
            nrt.zones[z]
                .resources
                .iter()
                .find(|r| r.name == "cpu")
                .unwrap()
                .clone()
        };
        assert_eq!(
            (
                cpu(0).capacity.as_str(),
                cpu(0).allocatable.as_str(),
                cpu(0).available.as_str()
            ),
            ("4", "3", "3")
        );
        assert_eq!(
            (
                cpu(1).capacity.as_str(),
                cpu(1).allocatable.as_str(),
                cpu(1).available.as_str()
            ),
            ("4", "4", "2")
        );
        assert_eq!(nrt.zones[1].name, "node-1");
        assert_eq!(
            nrt.zones[0].costs[1],
            CostInfo {
                name: "node-1".into(),
                value: 21
            }
        );
        assert_eq!(nrt.attributes[0].value, "single-numa-node");
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(
            label_value("NVIDIA H100 80GB HBM3"),
            "NVIDIA-H100-80GB-HBM3"
        );
        assert_eq!(label_value("(weird)"), "weird");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
        let l = labels(&node());
        assert_eq!(l["fumarole.dev/accelerator-count"], "0");
        assert!(!l.contains_key("fumarole.dev/accelerator-vendor"));
    }
}
