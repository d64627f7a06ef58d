//! What the node's kernel offers, as the rules take it: the cgroup [`Version`] the pods live in
//! and the QoS files a pod's cgroup has ([`Kernel`]). The rules never look: the cgroup layer
//! finds both out (`crate::cgroup`) and passes them in, so every plan is a function of them.

/// The cgroup version pods live in. A hybrid node (v1 controllers plus an empty v2 hierarchy at
/// `unified/`) counts as v1: that is where the cpu and memory controllers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    V1,
    V2,
}

/// The QoS files this kernel has for the pod's cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub version: Version,
    /// openEuler's `cpu.qos_level`.
    pub cpu_qos_level: bool,
    /// openEuler's `memory.qos_level`.
    pub memory_qos_level: bool,
    /// `cpu.idle` (mainline >= 5.15).
    pub cpu_idle: bool,
    /// v2 `memory.high` (the memory controller enabled for the pod).
    pub memory_high: bool,
}
