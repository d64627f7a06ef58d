//! Sample `DeviceTopology` objects for tests and benchmarks of other crates (feature
//! `test-support`), so each does not grow its own builder.

use crate::crd::device_topology::{DeviceInfo, LinkInfo};
use crate::crd::{
    DeviceAllocation, DeviceStatus, DeviceTopology, DeviceTopologySpec, DeviceTopologyStatus,
};

/// A node of `n` healthy NVIDIA GPUs named by `id`, every pair on NVLink with `weight`, the
/// first half on NUMA node 0 and the rest on NUMA node 1; the `allocated` ones are in use by
/// pod `default/running-<index>`. Callers add what their case needs (super-node, model, ...).
pub fn nvlink_node(
    name: &str,
    n: u32,
    weight: u32,
    allocated: &[u32],
    id: impl Fn(u32) -> String,
) -> DeviceTopology {
    let devices = (0..n)
        .map(|i| DeviceInfo {
            id: id(i),
            index: i,
            vendor: "nvidia".into(),
            kind: "gpu".into(),
            numa_node: Some(u32::from(i >= n / 2)),
            ..Default::default()
        })
        .collect();
    let mut links = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            links.push(LinkInfo {
                a,
                b,
                kind: "nvlink".into(),
                count: None,
                weight,
            });
        }
    }
    let mut t = DeviceTopology::new(
        name,
        DeviceTopologySpec {
            accelerator_count: n,
            devices,
            links,
            ..Default::default()
        },
    );
    t.status = Some(DeviceTopologyStatus {
        healthy_count: n,
        devices: (0..n)
            .map(|i| {
                let allocation = allocated.contains(&i).then(|| DeviceAllocation {
                    namespace: "default".into(),
                    pod: format!("running-{i}"),
                    container: "main".into(),
                });
                (
                    id(i),
                    DeviceStatus {
                        health: "Healthy".into(),
                        reason: None,
                        allocation,
                        shares: Vec::new(),
                    },
                )
            })
            .collect(),
        colocation: None,
        pods: Vec::new(),
    });
    t
}

/// An Atlas 800 training server (`atlas-800-910`): 8 healthy Ascend 910 NPUs `Ascend910-<i>`,
/// HCCS (weight 200) inside the rings 0-3 and 4-7, cross-NUMA (10) between them, ring 0-3 on
/// NUMA node 0; the `allocated` ones are in use by pod `default/running-<index>`.
pub fn atlas_800_910(name: &str, allocated: &[u32]) -> DeviceTopology {
    let mut t = nvlink_node(name, 8, 10, allocated, |i| format!("Ascend910-{i}"));
    t.spec.model = "Ascend 910".into();
    for d in &mut t.spec.devices {
        d.vendor = "huawei".into();
        d.kind = "npu".into();
    }
    for l in &mut t.spec.links {
        if (l.a < 4) == (l.b < 4) {
            l.kind = "hccs".into();
            l.weight = 200;
        } else {
            l.kind = "crossNuma".into();
            l.weight = 10;
        }
    }
    t
}
