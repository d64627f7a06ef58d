//! The objects a node publishes, built from its topology, the kubelet's policies and the
//! current allocations. Pure functions: the publisher decides when to write them.

use std::collections::{BTreeMap, BTreeSet};

use fumarole_topology::crd::device_topology::{DeviceAllocation, ShareAllocation, SharingInfo};
use fumarole_topology::crd::node_resource_topology::{Attribute, CostInfo, ResourceInfo, Zone};
use fumarole_topology::crd::numatopology::{
    ContainerAllocation, CpuInfo, PodAllocation, ResourceInfoNuma,
};
use fumarole_topology::crd::{
    DeviceTopologySpec, DeviceTopologyStatus, NodeResourceTopology, NumatopologySpec,
};
use fumarole_topology::share::replica_of;
use fumarole_topology::{CpuSet, Health, NodeHealth, NodeTopology, pod_fingerprint};

use crate::discover::memory::{ZoneMemory, hugepages_resource};
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

/// Who holds the node's device shares, by device id: the ids the kubelet gave a container
/// (PodResources) that are a device's replicas (`<id>::<n>`) or MIG devices (`MIG-<uuid>`),
/// in the kubelet's order. Whole devices are [`device_allocations`]'.
pub fn share_allocations(
    t: &NodeTopology,
    alloc: &Allocations,
) -> BTreeMap<String, Vec<ShareAllocation>> {
    let mut out: BTreeMap<String, Vec<ShareAllocation>> = BTreeMap::new();
    if alloc.source != AllocationSource::PodResources {
        return out;
    }
    let ours: BTreeSet<&str> = t.devices.iter().map(|d| d.id.as_str()).collect();
    let mig: BTreeMap<&str, &str> = t
        .devices
        .iter()
        .flat_map(|d| d.mig.iter().map(|m| (m.uuid.as_str(), d.id.as_str())))
        .collect();
    for p in &alloc.pods {
        for c in &p.containers {
            for id in c.devices.values().flatten() {
                let device = replica_of(id)
                    .map(|(device, _)| device)
                    .filter(|device| ours.contains(device))
                    .or_else(|| mig.get(id.as_str()).copied());
                if let Some(device) = device {
                    out.entry(device.to_string())
                        .or_default()
                        .push(ShareAllocation {
                            share: id.clone(),
                            namespace: p.namespace.clone(),
                            pod: p.name.clone(),
                            container: c.name.clone(),
                        });
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
    sharing: &BTreeMap<String, SharingInfo>,
) -> (DeviceTopologySpec, DeviceTopologyStatus) {
    (
        DeviceTopologySpec::from_topology(t).with_sharing(sharing),
        DeviceTopologyStatus::with_health(t, &device_allocations(t, alloc), health)
            .with_shares(share_allocations(t, alloc)),
    )
}

/// Memory facts for NodeResourceTopology zones: NUMA node -> its memory and huge pages from
/// sysfs ([`crate::discover::memory`]). A node missing here gets hwloc's memory size and no
/// huge pages.
pub type NumaMemory = BTreeMap<u32, ZoneMemory>;

/// Bytes of each memory resource pods hold per NUMA node, from PodResources `memory` blocks.
/// A block over several nodes is taken from them in id order, each up to what it has
/// allocatable, the rest from the last: the order the kubelet's memory manager fills a NUMA
/// group in (node-feature-discovery accounts the same way).
fn memory_held(
    alloc: &Allocations,
    allocatable: &BTreeMap<(u32, String), u64>,
) -> BTreeMap<(u32, String), u64> {
    let mut held: BTreeMap<(u32, String), u64> = BTreeMap::new();
    let blocks = alloc
        .pods
        .iter()
        .flat_map(|p| &p.containers)
        .flat_map(|c| &c.memory);
    for b in blocks {
        let mut nodes = b.numa_nodes.clone();
        nodes.sort_unstable();
        nodes.dedup();
        let mut left = b.bytes;
        for (i, node) in nodes.iter().enumerate() {
            let key = (*node, b.resource.clone());
            let used = held.get(&key).copied().unwrap_or(0);
            let room = allocatable
                .get(&key)
                .copied()
                .unwrap_or(0)
                .saturating_sub(used);
            let take = if i + 1 == nodes.len() {
                left
            } else {
                left.min(room)
            };
            *held.entry(key).or_default() = used.saturating_add(take);
            left -= take;
        }
    }
    held
}

/// `NodeResourceTopology`: one `node-N` zone per NUMA node with cpu, memory, huge pages and
/// accelerator resources, costs from the NUMA distances, the kubelet's topology manager policy
/// and scope, and the pod set fingerprint when `pods_fingerprint` is given.
///
/// Memory per zone: capacity is the node's `MemTotal`; allocatable is that minus its huge pages
/// and the kubelet's `reservedMemory` for the node (the memory manager's static policy
/// arithmetic); huge pages per size: capacity the pages' bytes, allocatable that minus their
/// `reservedMemory`. Available is allocatable minus the PodResources `memory` blocks on the
/// node ([`memory_held`]).
pub fn node_resource_topology(
    t: &NodeTopology,
    policies: &KubeletPolicies,
    alloc: &Allocations,
    memory: &NumaMemory,
    pods_fingerprint: Option<&str>,
) -> NodeResourceTopology {
    let exclusive = alloc.exclusive_cpus();
    let allocated_devices = device_allocations(t, alloc);
    let no_reservation = BTreeMap::new();
    // (node, resource) -> (capacity, allocatable) of the memory resources.
    let mut memory_resources: BTreeMap<(u32, String), (u64, u64)> = BTreeMap::new();
    for n in &t.numa_nodes {
        let reserved = policies
            .reserved_memory
            .get(&n.id)
            .unwrap_or(&no_reservation);
        let kept = |resource: &str| reserved.get(resource).copied().unwrap_or(0);
        let zone = memory.get(&n.id);
        let (total, huge) = zone.map_or((n.memory_bytes, 0), |z| {
            (z.total_bytes, z.hugepages_bytes())
        });
        memory_resources.insert(
            (n.id, "memory".into()),
            (
                total,
                total.saturating_sub(huge).saturating_sub(kept("memory")),
            ),
        );
        for (size, pages) in zone.map(|z| &z.hugepages).into_iter().flatten() {
            let name = hugepages_resource(*size);
            let capacity = size.saturating_mul(*pages);
            let allocatable = capacity.saturating_sub(kept(&name));
            memory_resources.insert((n.id, name), (capacity, allocatable));
        }
    }
    let allocatable: BTreeMap<(u32, String), u64> = memory_resources
        .iter()
        .map(|(k, (_, a))| (k.clone(), *a))
        .collect();
    let held = memory_held(alloc, &allocatable);
    let zones = t
        .numa_nodes
        .iter()
        .map(|n| {
            let capacity = n.cpus.len();
            let allocatable = n.cpus.difference(&policies.reserved_system_cpus);
            let available = allocatable.difference(&exclusive);
            let mut resources = vec![ResourceInfo {
                name: "cpu".into(),
                capacity: capacity.to_string(),
                allocatable: allocatable.len().to_string(),
                available: available.len().to_string(),
            }];
            let mut zone_memory: Vec<_> = memory_resources
                .range((n.id, String::new())..)
                .take_while(|((node, _), _)| *node == n.id)
                .collect();
            // `memory` first, then huge pages by name.
            zone_memory.sort_by_key(|((_, name), _)| (name != "memory", name.clone()));
            resources.extend(zone_memory.into_iter().map(
                |((node, name), (capacity, allocatable))| {
                    let used = held.get(&(*node, name.clone())).copied().unwrap_or(0);
                    ResourceInfo {
                        name: name.clone(),
                        capacity: capacity.to_string(),
                        allocatable: allocatable.to_string(),
                        available: allocatable.saturating_sub(used).to_string(),
                    }
                },
            ));
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
    let mut attributes = vec![
        Attribute {
            name: "topologyManagerPolicy".into(),
            value: policies.topology_manager_policy.clone(),
        },
        Attribute {
            name: "topologyManagerScope".into(),
            value: policies.topology_manager_scope.clone(),
        },
    ];
    if let Some(fp) = pods_fingerprint {
        attributes.push(Attribute {
            name: pod_fingerprint::ATTRIBUTE.into(),
            value: fp.to_string(),
        });
    }
    NodeResourceTopology { zones, attributes }
}

/// The pod set fingerprint node-feature-discovery publishes: every pod PodResources lists, by
/// namespace and name; none when PodResources was not read (the CPU manager checkpoint knows
/// no pod names) or lists no pod (NFD leaves the attribute out then too).
pub fn pods_fingerprint(alloc: &Allocations) -> Option<String> {
    if alloc.source != AllocationSource::PodResources || alloc.pods.is_empty() {
        return None;
    }
    Some(pod_fingerprint::fingerprint(
        alloc
            .pods
            .iter()
            .map(|p| (p.namespace.as_str(), p.name.as_str())),
    ))
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
            reserved_memory: BTreeMap::new(),
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
                    ..Default::default()
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
        let nrt =
            node_resource_topology(&node(), &policies(), &held("4-5"), &NumaMemory::new(), None);
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
        // Without sysfs facts a zone's memory is hwloc's, all of it free.
        let mem = nrt.zones[0]
            .resources
            .iter()
            .find(|r| r.name == "memory")
            .unwrap();
        assert_eq!(
            (
                mem.capacity.as_str(),
                mem.allocatable.as_str(),
                mem.available.as_str()
            ),
            ("1073741824", "1073741824", "1073741824")
        );
        // No PodResources, no fingerprint.
        assert_eq!(pods_fingerprint(&held("4-5")), None);
        assert_eq!(nrt.attributes.len(), 2);
    }

    fn block(resource: &str, bytes: u64, nodes: &[u32]) -> crate::kubelet::MemoryBlock {
        crate::kubelet::MemoryBlock {
            resource: resource.into(),
            bytes,
            numa_nodes: nodes.to_vec(),
        }
    }

    /// (capacity, allocatable, available) of `name` in zone `z`.
    fn amounts(nrt: &NodeResourceTopology, z: usize, name: &str) -> (u64, u64, u64) {
        let r = nrt.zones[z]
            .resources
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no {name} in zone {z}: {:?}", nrt.zones[z]));
        (
            r.capacity.parse().unwrap(),
            r.allocatable.parse().unwrap(),
            r.available.parse().unwrap(),
        )
    }

    #[test]
    fn nrt_memory_per_zone_follows_the_memory_managers_arithmetic() {
        const GI: u64 = 1 << 30;
        const MI: u64 = 1 << 20;
        let memory = NumaMemory::from([
            (
                0,
                ZoneMemory {
                    total_bytes: 64 * GI,
                    hugepages: BTreeMap::from([(2 * MI, 1024), (GI, 4)]),
                },
            ),
            (
                1,
                ZoneMemory {
                    total_bytes: 64 * GI,
                    hugepages: BTreeMap::from([(2 * MI, 0)]),
                },
            ),
        ]);
        let mut p = policies();
        p.reserved_memory = BTreeMap::from([
            (
                0,
                BTreeMap::from([
                    ("memory".to_string(), GI),
                    ("hugepages-1Gi".to_string(), GI),
                ]),
            ),
            (1, BTreeMap::from([("memory".to_string(), 2 * GI)])),
        ]);
        let mut alloc = Allocations {
            source: AllocationSource::PodResources,
            pods: vec![
                Pod {
                    uid: None,
                    name: "db-0".into(),
                    namespace: "prod".into(),
                    containers: vec![Held {
                        name: "main".into(),
                        cpus: CpuSet::parse("1-2").unwrap(),
                        devices: BTreeMap::new(),
                        memory: vec![
                            block("memory", 10 * GI, &[0]),
                            block("hugepages-1Gi", 2 * GI, &[0]),
                        ],
                        claimed: vec![],
                    }],
                },
                Pod {
                    uid: None,
                    name: "web".into(),
                    namespace: "prod".into(),
                    containers: vec![],
                },
            ],
        };
        let fp = pods_fingerprint(&alloc);
        let nrt = node_resource_topology(&node(), &p, &alloc, &memory, fp.as_deref());
        // node 0: 64Gi, 2Gi of 2Mi pages and 4Gi of 1Gi pages, 1Gi reserved -> 57Gi.
        assert_eq!(amounts(&nrt, 0, "memory"), (64 * GI, 57 * GI, 47 * GI));
        assert_eq!(amounts(&nrt, 0, "hugepages-1Gi"), (4 * GI, 3 * GI, GI));
        assert_eq!(amounts(&nrt, 0, "hugepages-2Mi"), (2 * GI, 2 * GI, 2 * GI));
        assert_eq!(amounts(&nrt, 1, "memory"), (64 * GI, 62 * GI, 62 * GI));
        assert_eq!(amounts(&nrt, 1, "hugepages-2Mi"), (0, 0, 0));
        let names: Vec<&str> = nrt.zones[0]
            .resources
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(names, ["cpu", "memory", "hugepages-1Gi", "hugepages-2Mi"]);
        assert_eq!(
            nrt.attributes[2],
            Attribute {
                name: "nodeTopologyPodsFingerprint".into(),
                value: pod_fingerprint::fingerprint([("prod", "db-0"), ("prod", "web")]),
            }
        );

        // A block over a NUMA group fills node 0 first, the rest from node 1.
        alloc.pods[0].containers[0].memory = vec![block("memory", 60 * GI, &[1, 0])];
        let nrt = node_resource_topology(&node(), &p, &alloc, &memory, None);
        assert_eq!(amounts(&nrt, 0, "memory").2, 0);
        assert_eq!(amounts(&nrt, 1, "memory").2, 62 * GI - 3 * GI);
        assert_eq!(nrt.attributes.len(), 2);
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
