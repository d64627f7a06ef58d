//! Volcano's `Numatopology` (`nodeinfo.volcano.sh/v1alpha1`), as resource-exporter publishes
//! it and the scheduler's `numa-aware` plugin reads it. Keys follow Volcano's schema exactly
//! (`policies` keys `CPUManagerPolicy` / `TopologyManagerPolicy`, cpu ids as map keys).

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "nodeinfo.volcano.sh",
    version = "v1alpha1",
    kind = "Numatopology",
    plural = "numatopologies",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct NumatopologySpec {
    /// `CPUManagerPolicy`, `TopologyManagerPolicy` (from the kubelet configuration).
    #[serde(default)]
    pub policies: BTreeMap<String, String>,
    /// Reserved quantities per resource (`cpu`: `"2"`, `memory`: `"1Gi"`).
    #[serde(default)]
    pub res_reserved: BTreeMap<String, String>,
    /// Per resource: free (allocatable) set and capacity. `cpu`: free cpuset, CPU count.
    #[serde(default)]
    pub numares: BTreeMap<String, ResourceInfoNuma>,
    /// Per CPU id: its NUMA node, socket and core.
    #[serde(default)]
    pub cpu_detail: BTreeMap<String, CpuInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_allocations: Vec<PodAllocation>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceInfoNuma {
    pub allocatable: String,
    pub capacity: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub numa: i64,
    pub socket: i64,
    pub core: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAllocation {
    pub uid: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub container_allocations: Vec<ContainerAllocation>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAllocation {
    pub name: String,
    /// `cpu`: cpuset string; other resources: quantity strings.
    pub allocations: BTreeMap<String, String>,
}
