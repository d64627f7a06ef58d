//! fumarole's node-side view of the hardware.
//!
//! [`discover`] builds a `fumarole_topology::NodeTopology` from a filesystem root (this host,
//! a dump, a fixture) or an hwloc XML file. [`fixtures`] holds the accelerator nodes the
//! project ships for tests and demos. [`device_health`] is the node's one stream of device and
//! link health (device nodes, NVML, DCMI) that the device plugins and the publisher subscribe
//! to (the model it carries, `NodeHealth`, is `fumarole_topology::health`); [`device_metrics`]
//! samples each device's figures for `/metrics`. [`kubelet`] reads
//! the kubelet's policies and allocations;
//! [`publish`] turns all of it into Kubernetes objects and keeps them current.

pub mod device_health;
pub mod device_metrics;
pub mod discover;
pub mod fixtures;
pub mod kubelet;
pub mod mig;
pub mod publish;
pub mod vnpu;
