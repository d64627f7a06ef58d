//! `fumarole-agent run --colocation`: what volcano-agent does on a node, as four tasks that
//! share the configuration and one state report.
//!
//! - [`config`]: the ConfigMap `volcano-agent-configuration` and this Node's labels and
//!   annotations, watched and merged into the [`NodeConfig`] in force; an invalid change keeps
//!   the last good configuration and emits a Warning Event saying why.
//! - [`pods`]: QoS levels and CPU burst written to the pods' cgroups, as far as the
//!   configuration enables them ([`Features`]).
//! - [`node`]: every `monitorInterval`, usage of the kubepods cgroup tree and PSI -> batch
//!   resources on the Node status, the `volcano.sh/offline-job-evicting` taint and evictions of
//!   offline pods through the Eviction API.
//! - [`report`]: what the other three know ([`ColocationStatus`]), written to this node's
//!   `DeviceTopology` status (or, until that object exists, a Node annotation).
//!
//! Start at `run.rs` in the binary, which wires them together.

pub mod config;
pub mod node;
pub mod pods;
pub mod report;

use fumarole_topology::crd::ColocationStatus;
use tokio::sync::watch;

use crate::qos::config::NodeConfig;
pub use pods::{Settings, Summary, Syncer};

/// Which cgroup settings the configuration switches on for the node's pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// `cpuQosConfig.enable`: `volcano.sh/qos-level` on the CPU controller.
    pub cpu_qos: bool,
    /// `memoryQosConfig.enable`: the level on the memory controller.
    pub memory_qos: bool,
    /// `cpuBurstConfig.enable`: `volcano.sh/enable-quota-burst`.
    pub cpu_burst: bool,
}

impl Features {
    pub fn of(config: &NodeConfig) -> Self {
        Self {
            cpu_qos: config.cpu_qos,
            memory_qos: config.memory_qos,
            cpu_burst: config.cpu_burst,
        }
    }

    /// Everything on (tests, and callers without a configuration).
    pub fn all() -> Self {
        Self {
            cpu_qos: true,
            memory_qos: true,
            cpu_burst: true,
        }
    }
}

/// The shared state report: each task fills in its part with `send_if_modified`, the
/// [`report`] task writes it out.
pub type StatusTx = watch::Sender<ColocationStatus>;
