//! The fumarole topology model: what a node's hardware looks like, as pure data.
//!
//! Start at [`NodeTopology`] (CPUs, NUMA nodes, accelerators, the link matrix, the
//! super-node). [`link`] explains link classes and their weights; [`cpuset`] the Linux list
//! format used wherever CPUs are written down; [`crd`] the Kubernetes objects built from it;
//! [`health`] device and link faults ([`NodeHealth`]) and what they do to a topology;
//! [`annotation`] the pod annotation carrying the scheduler's device choice; [`quantity`] and
//! [`pod`] the Kubernetes quantities and effective pod requests every component reads alike;
//! [`pod_fingerprint`] the pod set fingerprint NodeResourceTopology consumers compare;
//! [`colocation`] what the co-location agent leaves on its Node and its heartbeat Lease;
//! [`every`] a rate limit for warnings about things that retry often;
//! [`share`] one device shared among pods (time-slicing, MPS, MIG, vNPU);
//! [`shapes`] the link matrices of the fixture node shapes and [`baseline`] the NVIDIA-style
//! allocator `select` is compared with. Nothing here does I/O or async work: discovery lives in `fumarole-exporter`,
//! and every function here is a pure function of its inputs.

pub mod annotation;
pub mod baseline;
pub mod colocation;
pub mod cpuset;
pub mod crd;
pub mod dra;
pub mod every;
pub mod health;
pub mod link;
pub mod model;
pub mod pod;
pub mod pod_fingerprint;
pub mod quantity;
pub mod select;
pub mod shapes;
pub mod share;

pub use cpuset::{CpuSet, CpuSetError};
pub use health::{Fault, FaultKind, LinkFault, NodeHealth};
pub use link::{Link, LinkClass, LinkMatrix, LinkMatrixError, pcie_class};
pub use model::{
    Device, DeviceKind, Health, MigInstance, NodeTopology, NumaNode, Package, PciId,
    ProcessingUnit, Summary, SuperNode, SuperNodeSource, TopologyError, Vendor,
};
pub use select::{Method, SelectContext, SelectError, Selection, select};
