//! ResourceSlices (`resource.k8s.io/v1`): the node's accelerators as Dynamic Resource
//! Allocation sees them. One pool per driver, named after the node, in one slice; device names
//! and attributes from [`fumarole_topology::dra`], device memory (when known) as capacity
//! [`dra::MEMORY`]; a device several claims may hold (`draShares`) is published with
//! `allowMultipleAllocations` and consumable capacity ([`shared_capacity`]). A device with a
//! disabling fault carries a
//! `NoSchedule` taint ([`dra::UNHEALTHY_TAINT`], value the fault kind), so the scheduler gives
//! it to no new claim while claims already holding it keep it. A partitionable device
//! (`draPartitions`) brings its partitions and a counter set, and its pool several slices.

use std::collections::BTreeMap;

use fumarole_topology::dra::{self, AttributeValue};
use fumarole_topology::{Health, NodeHealth, NodeTopology};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint, ResourcePool,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::objects::label_value;
use super::settings::DraSlices;

/// The name of slice `k` of this node's pool of `driver`: `<node>-<driver>`, then
/// `<node>-<driver>-<k>` (a pool of partitionable devices takes several).
pub fn slice_name(node: &str, driver: &str, k: usize) -> String {
    match k {
        0 => format!("{node}-{driver}"),
        k => format!("{node}-{driver}-{k}"),
    }
}

/// Most devices in one slice when any consumes counters or carries a taint.
const DEVICES_PER_SLICE: usize = 64;
/// Most counter sets in one slice.
const COUNTER_SETS_PER_SLICE: usize = 8;
/// Most slices of one pool the publisher writes (16 MIG GPUs take 9).
pub const MAX_SLICES: usize = 16;

/// The pools node `dra.node` publishes, by driver, each as its slices: every device of `t`
/// in `dra.devices` (those the DRA kubelet plugin serves), and for a partitionable one
/// (`dra.partitioned`) its partitions too, with its counter set in a slice of counter sets
/// after the device slices. A driver with none of them gets no pool. `t` is the topology
/// `health` was applied to. The pool's generation is the publisher's to set (0 here).
pub fn resource_slices(
    t: &NodeTopology,
    health: &NodeHealth,
    dra: &DraSlices,
) -> BTreeMap<&'static str, Vec<ResourceSliceSpec>> {
    let groups = t.links.fabric_groups();
    let mut devices: BTreeMap<&'static str, Vec<Device>> = BTreeMap::new();
    let mut counter_sets: BTreeMap<&'static str, Vec<CounterSet>> = BTreeMap::new();
    for (i, d) in t.devices.iter().enumerate() {
        if !dra.devices.contains(&d.id) {
            continue;
        }
        let attributes = |a: BTreeMap<String, AttributeValue>| {
            Some(a.into_iter().map(|(n, v)| (n, attribute(v))).collect())
        };
        let taints = (d.health == Health::Unhealthy).then(|| {
            let kind = health
                .faults(&d.id)
                .iter()
                .find(|f| f.kind.disables())
                .map_or("unhealthy", |f| f.kind.as_str());
            vec![DeviceTaint {
                key: dra::UNHEALTHY_TAINT.into(),
                value: Some(label_value(kind)),
                effect: "NoSchedule".into(),
                time_added: None,
            }]
        });
        let shared = dra.shares.get(&d.id).copied();
        let capacity = match shared {
            Some(n) => Some(shared_capacity(n, d.memory_bytes)),
            None => d.memory_bytes.map(|bytes| {
                BTreeMap::from([(
                    dra::MEMORY.to_string(),
                    DeviceCapacity {
                        value: Quantity(bytes.to_string()),
                        request_policy: None,
                    },
                )])
            }),
        };
        let partitioned = dra
            .partitioned
            .contains(&d.id)
            .then(|| dra::partitions(d))
            .flatten();
        let set = dra::device_name(d);
        let out = devices.entry(dra::driver(d)).or_default();
        out.push(Device {
            name: dra::device_name(d),
            attributes: attributes(dra::attributes(t, i, &groups)),
            capacity,
            taints: taints.clone(),
            allow_multiple_allocations: shared.map(|_| true),
            consumes_counters: partitioned
                .as_ref()
                .map(|p| vec![consumption(&set, &p.counters)]),
            ..Default::default()
        });
        let Some(p) = partitioned else { continue };
        // Every partition of an unhealthy device carries its taint.
        out.extend(p.partitions.iter().map(|part| Device {
            name: part.name.clone(),
            attributes: attributes(dra::partition_attributes(t, i, &groups, part)),
            taints: taints.clone(),
            consumes_counters: Some(vec![consumption(&set, &part.consumes)]),
            ..Default::default()
        }));
        counter_sets
            .entry(dra::driver(d))
            .or_default()
            .push(CounterSet {
                name: set,
                counters: counters(&p.counters),
            });
    }
    devices
        .into_iter()
        .map(|(driver, devices)| {
            let sets = counter_sets.remove(driver).unwrap_or_default();
            let mut specs: Vec<ResourceSliceSpec> = if sets.is_empty() {
                vec![slice_spec(driver, &dra.node, Some(devices), None)]
            } else {
                let counter_slices: Vec<ResourceSliceSpec> = sets
                    .chunks(COUNTER_SETS_PER_SLICE)
                    .map(|c| slice_spec(driver, &dra.node, None, Some(c.to_vec())))
                    .collect();
                let mut device_slices: Vec<ResourceSliceSpec> = devices
                    .chunks(DEVICES_PER_SLICE)
                    .map(|c| slice_spec(driver, &dra.node, Some(c.to_vec()), None))
                    .collect();
                // Past the limit the last devices are left out, never a counter set they use.
                let room = MAX_SLICES.saturating_sub(counter_slices.len());
                if device_slices.len() > room {
                    tracing::warn!(
                        driver,
                        slices = device_slices.len() + counter_slices.len(),
                        "more slices than the publisher writes; the last devices are left out"
                    );
                    device_slices.truncate(room);
                }
                device_slices.extend(counter_slices);
                device_slices
            };
            let count = i64::try_from(specs.len()).unwrap_or(i64::MAX);
            for spec in &mut specs {
                spec.pool.resource_slice_count = count;
            }
            (driver, specs)
        })
        .collect()
}

fn slice_spec(
    driver: &str,
    node: &str,
    devices: Option<Vec<Device>>,
    shared_counters: Option<Vec<CounterSet>>,
) -> ResourceSliceSpec {
    ResourceSliceSpec {
        driver: driver.into(),
        node_name: Some(node.into()),
        pool: ResourcePool {
            name: node.into(),
            generation: 0,
            resource_slice_count: 1,
        },
        devices,
        shared_counters,
        ..Default::default()
    }
}

fn counters(values: &BTreeMap<String, u64>) -> BTreeMap<String, Counter> {
    values
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Counter {
                    value: Quantity(v.to_string()),
                },
            )
        })
        .collect()
}

fn consumption(set: &str, values: &BTreeMap<String, u64>) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: set.into(),
        counters: counters(values),
        compatibility_groups: None,
    }
}

/// The capacity of a device `n` claims may hold at once: [`dra::SHARES`] of `n`, of which a
/// claim takes one unless it asks more (in whole shares), and the device's memory when known,
/// of which a claim that does not ask takes an `n`th (rounded down to MiB; asks are rounded up
/// to MiB). The scheduler's allocator keeps the sums within the values.
pub fn shared_capacity(n: u32, memory_bytes: Option<u64>) -> BTreeMap<String, DeviceCapacity> {
    let policy = |default: u64, step: u64| CapacityRequestPolicy {
        default: Some(Quantity(default.to_string())),
        valid_range: Some(CapacityRequestPolicyRange {
            min: Quantity(step.to_string()),
            max: None,
            step: Some(Quantity(step.to_string())),
        }),
        valid_values: None,
    };
    let mut capacity = BTreeMap::from([(
        dra::SHARES.to_string(),
        DeviceCapacity {
            value: Quantity(n.to_string()),
            request_policy: Some(policy(1, 1)),
        },
    )]);
    const MIB: u64 = 1 << 20;
    if let Some(bytes) = memory_bytes.filter(|b| *b >= MIB * u64::from(n)) {
        let part = bytes / u64::from(n) / MIB * MIB;
        capacity.insert(
            dra::MEMORY.to_string(),
            DeviceCapacity {
                value: Quantity(bytes.to_string()),
                request_policy: Some(policy(part, MIB)),
            },
        );
    }
    capacity
}

fn attribute(value: AttributeValue) -> DeviceAttribute {
    match value {
        AttributeValue::Int(i) => DeviceAttribute {
            int: Some(i),
            ..Default::default()
        },
        AttributeValue::String(s) => DeviceAttribute {
            string: Some(s),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::collections::BTreeSet;

    use fumarole_topology::model::{Device as TopoDevice, DeviceKind, PciId, Vendor};
    use fumarole_topology::{CpuSet, Fault, FaultKind, LinkMatrix, shapes};

    /// A node of `n` devices of `vendor` with the links of a fixture shape.
    fn node(vendor: Vendor, links: LinkMatrix) -> NodeTopology {
        let devices = (0..links.len())
            .map(|i| {
                let i = u32::try_from(i).unwrap();
                TopoDevice {
                    id: format!("{}-{i}", vendor.as_str()),
                    index: i,
                    vendor,
                    kind: DeviceKind::Gpu,
                    model: "model".into(),
                    pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
                    pci_path: vec![format!("pci0000:{:02x}", i / 2)],
                    pci_id: PciId {
                        vendor: 0,
                        device: 0,
                        class: 0x0302,
                    },
                    numa_node: Some(i / 4),
                    local_cpus: CpuSet::default(),
                    dev_nodes: vec![],
                    health: Health::Healthy,
                    uuid: None,
                    serial: None,
                    memory_bytes: None,
                    mig: Vec::new(),
                }
            })
            .collect();
        NodeTopology {
            hostname: "n1".into(),
            packages: vec![],
            processing_units: vec![],
            allowed_cpus: CpuSet::default(),
            numa_nodes: vec![],
            devices,
            links,
            super_node: None,
        }
    }

    /// The pools of node `n1`, each of one slice, as before partitions.
    fn single(
        t: &NodeTopology,
        health: &NodeHealth,
        served: &BTreeSet<String>,
        shares: &BTreeMap<String, u32>,
    ) -> BTreeMap<&'static str, ResourceSliceSpec> {
        let dra = DraSlices {
            node: "n1".into(),
            devices: served.clone(),
            shares: shares.clone(),
            partitioned: BTreeSet::new(),
        };
        resource_slices(t, health, &dra)
            .into_iter()
            .map(|(driver, mut specs)| {
                assert_eq!(specs.len(), 1);
                (driver, specs.remove(0))
            })
            .collect()
    }

    fn dgx() -> NodeTopology {
        node(Vendor::Nvidia, shapes::dgx_h100())
    }

    fn all(t: &NodeTopology) -> BTreeSet<String> {
        t.devices.iter().map(|d| d.id.clone()).collect()
    }

    #[test]
    fn one_pool_per_driver_with_every_served_device() {
        let t = dgx();
        let slices = single(&t, &NodeHealth::default(), &all(&t), &BTreeMap::new());
        assert_eq!(
            slices.keys().copied().collect::<Vec<_>>(),
            [dra::GPU_DRIVER]
        );
        let spec = &slices[dra::GPU_DRIVER];
        assert_eq!(spec.pool.name, "n1");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        let devices = spec.devices.as_ref().unwrap();
        assert_eq!(devices.len(), 8);
        assert_eq!(devices[0].name, "nvidia-0");
        let a = devices[0].attributes.as_ref().unwrap();
        // NVSwitch: all eight in one fabric group.
        assert!(
            devices
                .iter()
                .all(|d| d.attributes.as_ref().unwrap()[dra::FABRIC_GROUP].int == Some(0))
        );
        assert!(
            a[dra::PCIE_ROOT]
                .string
                .as_deref()
                .unwrap()
                .starts_with("pci")
        );
        assert!(devices.iter().all(|d| d.taints.is_none()));
        // Memory only where the vendor library said.
        assert!(devices.iter().all(|d| d.capacity.is_none()));
        let mut t = dgx();
        t.devices[1].memory_bytes = Some(81_559 << 20);
        let slices = single(&t, &NodeHealth::default(), &all(&t), &BTreeMap::new());
        let devices = slices[dra::GPU_DRIVER].devices.as_ref().unwrap();
        assert_eq!(
            devices[1].capacity.as_ref().unwrap()[dra::MEMORY].value.0,
            "85520809984"
        );
        assert!(devices[0].capacity.is_none());
        // Shared among 4 claims: one share each by default, a quarter of the memory when known.
        let shares = BTreeMap::from([(t.devices[1].id.clone(), 4), (t.devices[2].id.clone(), 4)]);
        let slices = single(&t, &NodeHealth::default(), &all(&t), &shares);
        let devices = slices[dra::GPU_DRIVER].devices.as_ref().unwrap();
        assert_eq!(devices[1].allow_multiple_allocations, Some(true));
        assert_eq!(devices[0].allow_multiple_allocations, None);
        let cap = devices[1].capacity.as_ref().unwrap();
        assert_eq!(cap[dra::SHARES].value.0, "4");
        let policy = cap[dra::SHARES].request_policy.as_ref().unwrap();
        assert_eq!(policy.default.as_ref().unwrap().0, "1");
        let memory = cap[dra::MEMORY].request_policy.as_ref().unwrap();
        assert_eq!(
            memory.default.as_ref().unwrap().0,
            (20_389u64 << 20).to_string()
        );
        assert_eq!(
            memory
                .valid_range
                .as_ref()
                .unwrap()
                .step
                .as_ref()
                .unwrap()
                .0,
            "1048576"
        );
        let cap = devices[2].capacity.as_ref().unwrap();
        assert!(
            cap.contains_key(dra::SHARES) && !cap.contains_key(dra::MEMORY),
            "memory unknown"
        );
        // Serving none: no slice at all.
        assert!(
            single(
                &t,
                &NodeHealth::default(),
                &BTreeSet::new(),
                &BTreeMap::new()
            )
            .is_empty()
        );
    }

    #[test]
    fn only_served_devices_and_unhealthy_ones_tainted() {
        let t = dgx();
        let mut health = NodeHealth::default();
        let sick = t.devices[3].id.clone();
        health.add(
            &sick,
            Fault::new(FaultKind::Xid, "XID 79 (GPU has fallen off the bus)"),
        );
        let t = t.with_health(&health);
        let served: BTreeSet<String> = t.devices[2..6].iter().map(|d| d.id.clone()).collect();
        let slices = single(&t, &health, &served, &BTreeMap::new());
        let devices = slices[dra::GPU_DRIVER].devices.clone().unwrap();
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["nvidia-2", "nvidia-3", "nvidia-4", "nvidia-5"]);
        let taints = devices[1].taints.as_ref().unwrap();
        assert_eq!(taints[0].key, dra::UNHEALTHY_TAINT);
        assert_eq!(taints[0].value.as_deref(), Some("xid"));
        assert_eq!(taints[0].effect, "NoSchedule");
        assert!(devices[0].taints.is_none());
    }

    #[test]
    fn ascend_goes_to_the_npu_driver() {
        let t = node(Vendor::Huawei, shapes::atlas_800_910());
        let slices = single(&t, &NodeHealth::default(), &all(&t), &BTreeMap::new());
        assert_eq!(
            slices.keys().copied().collect::<Vec<_>>(),
            [dra::NPU_DRIVER]
        );
        let devices = slices[dra::NPU_DRIVER].devices.as_ref().unwrap();
        assert_eq!(devices[0].name, "huawei-0");
        // HCCS groups 0-3 and 4-7.
        let group = |i: usize| devices[i].attributes.as_ref().unwrap()[dra::FABRIC_GROUP].int;
        assert_eq!(
            (0..8).map(group).collect::<Vec<_>>(),
            [0, 0, 0, 0, 4, 4, 4, 4].map(Some)
        );
        assert_eq!(slice_name("n1", dra::NPU_DRIVER, 0), "n1-npu.fumarole.dev");
        assert_eq!(
            slice_name("n1", dra::NPU_DRIVER, 2),
            "n1-npu.fumarole.dev-2"
        );
    }

    #[test]
    fn mig_gpus_bring_their_partitions_and_counter_sets_in_more_slices() {
        let mut t = dgx();
        for d in &mut t.devices {
            d.model = "NVIDIA H100 80GB HBM3".into();
        }
        let mut health = NodeHealth::default();
        health.add(&t.devices[7].id, Fault::new(FaultKind::Xid, "XID 79"));
        let t = t.with_health(&health);
        let dra = DraSlices {
            node: "n1".into(),
            devices: all(&t),
            shares: BTreeMap::new(),
            partitioned: t.devices.iter().map(|d| d.id.clone()).collect(),
        };
        let pools = resource_slices(&t, &health, &dra);
        let specs = &pools[dra::GPU_DRIVER];
        // 8 x (1 whole + 25 partitions) = 208 devices in 4 slices of at most 64, and the 8
        // counter sets in one slice of their own.
        assert_eq!(specs.len(), 5);
        assert!(specs.iter().all(|s| s.pool.resource_slice_count == 5));
        let devices: Vec<&Device> = specs
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .collect();
        assert_eq!(devices.len(), 208);
        assert!(
            specs[..4]
                .iter()
                .all(|s| s.devices.as_ref().unwrap().len() <= 64 && s.shared_counters.is_none())
        );
        let sets = specs[4].shared_counters.as_ref().unwrap();
        assert!(specs[4].devices.is_none());
        assert_eq!(sets.len(), 8);
        assert_eq!(sets[0].name, "nvidia-0");
        assert_eq!(sets[0].counters.len(), 9);
        // The whole GPU takes its whole set; a partition its placement's slices.
        let by_name = |n: &str| *devices.iter().find(|d| d.name == n).unwrap();
        let whole = by_name("nvidia-0").consumes_counters.as_ref().unwrap();
        assert_eq!(
            (whole[0].counter_set.as_str(), whole[0].counters.len()),
            ("nvidia-0", 9)
        );
        let part = by_name("nvidia-0-2g-20gb-2");
        let taken = part.consumes_counters.as_ref().unwrap();
        assert_eq!(
            taken[0].counters.keys().collect::<Vec<_>>(),
            ["memory-slice-2", "memory-slice-3"]
        );
        let a = part.attributes.as_ref().unwrap();
        assert_eq!(a[dra::TYPE].string.as_deref(), Some(dra::PARTITION));
        assert_eq!(a[dra::PROFILE].string.as_deref(), Some("2g.20gb"));
        assert_eq!(
            by_name("nvidia-0").attributes.as_ref().unwrap()[dra::TYPE]
                .string
                .as_deref(),
            Some(dra::WHOLE)
        );
        // A sick GPU's partitions are tainted with it.
        assert!(by_name("nvidia-7-1g-10gb-3").taints.is_some());
        assert!(part.taints.is_none());
    }
}
