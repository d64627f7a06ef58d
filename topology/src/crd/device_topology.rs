//! `DeviceTopology`: one node's accelerators, NUMA nodes, device links and super-node (spec),
//! and each device's health and current user (status).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::health::NodeHealth;
use crate::model::{Health, NodeTopology};

/// The node's hardware as schedulers need it.
// clippy reads the repeated `printcolumn(...)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "topology.fumarole.dev",
    version = "v1alpha1",
    kind = "DeviceTopology",
    plural = "devicetopologies",
    shortname = "dtopo",
    status = "DeviceTopologyStatus",
    printcolumn(
        name = "Accelerators",
        type_ = "integer",
        json_path = ".spec.acceleratorCount"
    ),
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model"),
    printcolumn(
        name = "Super-node",
        type_ = "string",
        json_path = ".spec.superNode.id"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "integer",
        json_path = ".status.healthyCount"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTopologySpec {
    /// Number of accelerators (for `kubectl get`).
    pub accelerator_count: u32,
    /// The most common accelerator model, empty when there is none.
    pub model: String,
    pub numa_nodes: Vec<NumaNodeInfo>,
    pub devices: Vec<DeviceInfo>,
    /// Every device pair `a < b` (indices into `devices`).
    pub links: Vec<LinkInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub super_node: Option<SuperNodeInfo>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NumaNodeInfo {
    pub id: u32,
    /// Linux list format, e.g. `0-55,112-167`.
    pub cpus: String,
    pub memory_bytes: u64,
    pub distances: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    /// The id the device plugin advertises.
    pub id: String,
    pub index: u32,
    /// nvidia | huawei | metax | amd | intel | other
    pub vendor: String,
    /// gpu | npu | other
    pub kind: String,
    pub model: String,
    pub pci_bus_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    pub local_cpus: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// A GPU in MIG mode: its MIG devices, as NVML reports them. Such a GPU is not offered
    /// whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigInfo>,
    /// The device is offered as replicas (time-slicing or MPS) by the node's device plugin,
    /// not whole; absent for a device offered whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<SharingInfo>,
}

/// How the device plugin offers a shared device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharingInfo {
    /// The extended resource its replicas are advertised under (`nvidia.com/gpu`, or
    /// `nvidia.com/gpu.shared` with `renameByDefault`).
    pub resource: String,
    /// timeSlicing | mps
    pub mechanism: String,
    /// Replicas of this device.
    pub replicas: u32,
}

/// One MIG device of a GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigInfo {
    /// `MIG-<uuid>`.
    pub uuid: String,
    /// `1g.10gb`, `3g.40gb`, ...
    pub profile: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkInfo {
    pub a: u32,
    pub b: u32,
    /// Link kind (`nvlink`, `hccs`, `metaxLink`, `fabric`, `pcieSwitch`, `pcieMultiSwitch`,
    /// `pcieHostBridge`, `sameNuma`, `crossNuma`); see docs/node-topology.md.
    pub kind: String,
    /// NVLink lanes, for `nvlink`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    pub weight: u32,
}

impl LinkInfo {
    /// Every pair of `links` (a < b), as published.
    pub fn all(links: &crate::LinkMatrix) -> Vec<LinkInfo> {
        links
            .links()
            .into_iter()
            .map(|l| LinkInfo {
                a: u32::try_from(l.a).unwrap_or(u32::MAX),
                b: u32::try_from(l.b).unwrap_or(u32::MAX),
                kind: match serde_json::to_value(l.class) {
                    Ok(v) => v["kind"].as_str().unwrap_or_default().to_string(),
                    Err(_) => String::new(),
                },
                count: match l.class {
                    crate::LinkClass::Nvlink { count } => Some(count),
                    _ => None,
                },
                weight: l.weight,
            })
            .collect()
    }

    /// The link class this entry was published from ([`LinkInfo::all`] read back); `None` for
    /// a kind this version does not know (a newer agent's), which readers show as written.
    pub fn class(&self) -> Option<crate::LinkClass> {
        let mut v = serde_json::json!({ "kind": self.kind });
        if let Some(count) = self.count {
            v["count"] = count.into();
        }
        serde_json::from_value(v).ok()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuperNodeInfo {
    pub id: String,
    /// nvlinkClique | overrideFile | nodeLabel | config | hardware
    pub source: String,
}

/// Live state: health and the current user of each device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTopologyStatus {
    pub healthy_count: u32,
    /// By device id.
    pub devices: BTreeMap<String, DeviceStatus>,
    /// Co-location state, written by the agent's co-location loops under their own field
    /// manager (`fumarole-agent-colocation`), beside the devices' state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colocation: Option<ColocationStatus>,
    /// How each pod holding devices here uses them, from the agent's per-device figures;
    /// absent where the agent reads none (no vendor library).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodDeviceUsage>,
}

/// A pod's use of the accelerators it holds on the node: the mean of their utilisation over
/// the agent's `--device-usage-window`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodDeviceUsage {
    pub namespace: String,
    pub pod: String,
    /// Devices it holds, whole or a share (replica, MIG device) of each.
    pub devices: u32,
    /// Mean utilisation of those devices over the window, in percent, to the nearest 10 and
    /// moved to another step only once the mean is 7.5 points away (the object is not
    /// rewritten for every small change; `/metrics` has the exact figures). A
    /// shared device's is the whole device's: NVML does not split it by holder.
    pub utilization_percent: u32,
    /// Since when (RFC 3339) that mean has been under the idle threshold (5 %): the pod holds
    /// devices and uses little of them. Absent while it uses them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<String>,
}

/// What `fumarole-agent run --colocation` keeps on the node: QoS, CPU burst, batch resources,
/// pressure and eviction, for the scheduler extension and for people.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ColocationStatus {
    /// The node takes part in co-location (label `volcano.sh/colocation` or
    /// `volcano.sh/oversubscription` is `"true"`).
    pub enabled: bool,
    /// Running pods per `volcano.sh/qos-level`: `LC` (also `HLS`), `LS`, `none`, `BE`.
    #[serde(default)]
    pub qos_level_pods: BTreeMap<String, u32>,
    /// Pods with CPU burst (`volcano.sh/enable-quota-burst`) applied.
    #[serde(default)]
    pub burst_pods: u32,
    /// Batch resources as last written to the Node status; absent while oversubscription is
    /// off for the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_resources: Option<BatchResourcesStatus>,
    /// Resources under pressure (`cpu`, `memory`) and the signal that says so.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pressure: BTreeMap<String, String>,
    /// The node carries the taint `volcano.sh/offline-job-evicting:NoSchedule`.
    #[serde(default)]
    pub evicting: bool,
    /// Offline pods evicted and not gone yet.
    #[serde(default)]
    pub evictions_in_flight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_eviction: Option<EvictionRecord>,
    /// Why the configuration in force is not the newest one (an invalid `colocation-config`
    /// or node annotation): the last good configuration stays in force meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
}

/// `kubernetes.io/batch-cpu` and `kubernetes.io/batch-memory` as published.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchResourcesStatus {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// The last offline pod evicted for pressure (or because oversubscription was switched off).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRecord {
    pub namespace: String,
    pub pod: String,
    pub reason: String,
    /// RFC 3339.
    pub time: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatus {
    /// Healthy | Unhealthy
    pub health: String,
    /// Why: the device's faults as `kind: what` (`xid: XID 79 (GPU has fallen off the bus)`,
    /// `nvlink-down: NVLink lane 5 down`), disabling ones first; absent when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<DeviceAllocation>,
    /// The device's shares held by containers (time-sliced or MPS replicas, MIG devices),
    /// each named by the id the kubelet allocated; absent when none is held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareAllocation>,
}

/// The container a device is allocated to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAllocation {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// One share of a device and the container holding it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShareAllocation {
    /// The id the kubelet allocated: `<uuid>::<n>` for a replica, `MIG-<uuid>` for a MIG device.
    pub share: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl ShareAllocation {
    /// Who holds the share: `namespace/pod/container`.
    pub fn holder(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.pod, self.container)
    }
}

/// A shared device's use as people read it: `2 shares: ns/pod/container, ...`.
pub fn shares_in_use<S: AsRef<str>>(holders: &[S]) -> String {
    let names: Vec<&str> = holders.iter().map(AsRef::as_ref).collect();
    format!("{} shares: {}", holders.len(), names.join(", "))
}

fn camel<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

impl DeviceTopologySpec {
    /// The spec for a discovered node.
    pub fn from_topology(t: &NodeTopology) -> Self {
        let mut models: BTreeMap<&str, u32> = BTreeMap::new();
        for d in &t.devices {
            *models.entry(d.model.as_str()).or_default() += 1;
        }
        // Most common model; ties go to the first name in order, for a stable value.
        let model = models
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(m, _)| (*m).to_string())
            .unwrap_or_default();
        DeviceTopologySpec {
            accelerator_count: u32::try_from(t.devices.len()).unwrap_or(u32::MAX),
            model,
            numa_nodes: t
                .numa_nodes
                .iter()
                .map(|n| NumaNodeInfo {
                    id: n.id,
                    cpus: n.cpus.to_string(),
                    memory_bytes: n.memory_bytes,
                    distances: n.distances.clone(),
                })
                .collect(),
            devices: t
                .devices
                .iter()
                .map(|d| DeviceInfo {
                    id: d.id.clone(),
                    index: d.index,
                    vendor: d.vendor.as_str().to_string(),
                    kind: camel(&d.kind),
                    model: d.model.clone(),
                    pci_bus_id: d.pci_bus_id.clone(),
                    numa_node: d.numa_node,
                    local_cpus: d.local_cpus.to_string(),
                    uuid: d.uuid.clone(),
                    mig: d
                        .mig
                        .iter()
                        .map(|m| MigInfo {
                            uuid: m.uuid.clone(),
                            profile: m.profile.clone(),
                        })
                        .collect(),
                    sharing: None,
                })
                .collect(),
            links: LinkInfo::all(&t.links),
            super_node: t.super_node.as_ref().map(|s| SuperNodeInfo {
                id: s.id.clone(),
                source: camel(&s.source),
            }),
        }
    }

    /// This spec with each device of `offers` (by id) marked as offered in replicas.
    pub fn with_sharing(mut self, offers: &BTreeMap<String, SharingInfo>) -> Self {
        for d in &mut self.devices {
            d.sharing = offers.get(&d.id).cloned();
        }
        self
    }
}

impl DeviceTopologyStatus {
    /// Each device's held shares from `shares` (by device id); other devices keep none.
    pub fn with_shares(mut self, mut shares: BTreeMap<String, Vec<ShareAllocation>>) -> Self {
        for (id, status) in &mut self.devices {
            status.shares = shares.remove(id).unwrap_or_default();
        }
        self
    }

    /// Status from each device's health and the allocations known for it (by device id).
    pub fn new(t: &NodeTopology, allocations: &BTreeMap<String, DeviceAllocation>) -> Self {
        Self::with_health(t, allocations, &NodeHealth::default())
    }

    /// Like [`DeviceTopologyStatus::new`], with each device's faults from `health` as its
    /// reason. `t` is the topology `health` was applied to
    /// ([`NodeTopology::with_health`]); a device unhealthy with no fault reported lost a device
    /// node (discovery's rule).
    pub fn with_health(
        t: &NodeTopology,
        allocations: &BTreeMap<String, DeviceAllocation>,
        health: &NodeHealth,
    ) -> Self {
        let devices: BTreeMap<String, DeviceStatus> = t
            .devices
            .iter()
            .map(|d| {
                let reason = health.reason(&d.id).or_else(|| {
                    (d.health == Health::Unhealthy)
                        .then(|| "dev-node-missing: a device node is missing".to_string())
                });
                let status = DeviceStatus {
                    health: camel(&d.health),
                    reason,
                    allocation: allocations.get(&d.id).cloned(),
                    shares: Vec::new(),
                };
                (d.id.clone(), status)
            })
            .collect();
        let healthy = t
            .devices
            .iter()
            .filter(|d| d.health == Health::Healthy)
            .count();
        DeviceTopologyStatus {
            healthy_count: u32::try_from(healthy).unwrap_or(u32::MAX),
            devices,
            colocation: None,
            pods: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_has_printer_columns_and_status() {
        let crd = DeviceTopology::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("devicetopologies.topology.fumarole.dev")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        let v = &crd.spec.versions[0];
        let cols: Vec<&str> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            ["Accelerators", "Model", "Super-node", "Healthy", "Age"]
        );
        assert!(v.subresources.as_ref().unwrap().status.is_some());
    }

    #[test]
    fn links_read_back_to_their_classes() {
        let classes = [
            crate::LinkClass::Nvlink { count: 18 },
            crate::LinkClass::Hccs,
            crate::LinkClass::PcieSwitch,
            crate::LinkClass::CrossNuma,
        ];
        for c in classes {
            let info = LinkInfo {
                a: 0,
                b: 1,
                kind: match serde_json::to_value(c).unwrap()["kind"].as_str() {
                    Some(k) => k.to_string(),
                    None => panic!("{c:?} has no kind"),
                },
                count: match c {
                    crate::LinkClass::Nvlink { count } => Some(count),
                    _ => None,
                },
                weight: c.weight(),
            };
            assert_eq!(info.class(), Some(c));
        }
        let unknown = LinkInfo {
            kind: "warpDrive".into(),
            ..LinkInfo::default()
        };
        assert_eq!(unknown.class(), None);
    }
}
