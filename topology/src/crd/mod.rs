//! The Kubernetes objects fumarole publishes or reads, as typed Rust.
//!
//! - [`DeviceTopology`] (`topology.fumarole.dev/v1alpha1`): ours; the CRD is generated from
//!   these types (`fumarole-agent crd`) and kept in `deploy/crds/`.
//! - [`Numatopology`] (`nodeinfo.volcano.sh/v1alpha1`): Volcano's, read by its `numa-aware`
//!   plugin; the CRD belongs to Volcano.
//! - [`NodeResourceTopology`] (`topology.node.k8s.io/v1alpha2`): the node-feature-discovery /
//!   topology-aware-scheduling object; no `spec`, so it is a plain typed document.
//!
//! All are cluster-scoped and named after the node.

pub mod device_topology;
pub mod node_resource_topology;
pub mod numatopology;
#[cfg(feature = "test-support")]
pub mod testing;

pub use device_topology::{
    BatchResourcesStatus, ColocationStatus, DeviceAllocation, DeviceStatus, DeviceTopology,
    DeviceTopologySpec, DeviceTopologyStatus, EvictionRecord, PodDeviceUsage, SharingInfo,
};
pub use node_resource_topology::{Attribute, CostInfo, NodeResourceTopology, ResourceInfo, Zone};
pub use numatopology::{
    ContainerAllocation, CpuInfo, Numatopology, NumatopologySpec, PodAllocation, ResourceInfoNuma,
};
