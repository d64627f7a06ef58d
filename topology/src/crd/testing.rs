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
                    },
                )
            })
            .collect(),
        colocation: None,
    });
    t
}
