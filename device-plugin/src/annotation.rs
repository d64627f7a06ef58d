//! `fumarole.dev/devices` as the device plugin sees it: the value format (defined once in
//! [`fumarole_topology::annotation`], re-exported here) and where pending pods with the
//! scheduler's choice come from ([`PodSource`]).

pub use fumarole_topology::annotation::{
    AnnotationError, DEVICES_ANNOTATION, DeviceChoice, format, parse,
};

/// A pod assigned to this node that the kubelet has not started yet, with the scheduler's
/// choice for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingPod {
    pub namespace: String,
    pub name: String,
    /// RFC 3339 creation time: older pods are admitted first.
    pub created: String,
    pub devices: DeviceChoice,
}

/// Where the plugin learns about pending pods and their annotations (the agent watches the
/// API server; standalone mode has none).
pub trait PodSource: Send + Sync {
    /// Pending pods on this node carrying a valid annotation, oldest first.
    fn pending(&self) -> Vec<PendingPod>;
}
