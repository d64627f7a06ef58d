//! The tokio tasks of `fumarole-agent run --colocation`: what volcano-agent does on a node, as
//! four tasks that read the world, ask the rules ([`crate::rules`]) and apply the answers through
//! the cgroup layer ([`crate::cgroup`]) and the API server. They share the configuration and one
//! state report.
//!
//! - [`config_watch`]: the ConfigMap `volcano-agent-configuration` and this Node's labels and
//!   annotations, watched and resolved into the configuration in force; an invalid change keeps
//!   the last good configuration and emits a Warning Event saying why.
//! - [`pod_cgroups`]: QoS levels and CPU burst written to the pods' cgroups, as far as the
//!   configuration enables them, and a BestEffort pod's batch resources as its limits.
//! - [`node_loop`]: every `monitorInterval`, usage of the kubepods cgroup tree and PSI -> batch
//!   resources on the Node status, the `volcano.sh/offline-job-evicting` taint and evictions of
//!   offline pods through the Eviction API.
//! - [`heartbeat`]: a Lease renewed while the agent runs; once it expires the scheduler
//!   extension removes the taint and batch resources this agent left.
//! - [`report`]: what the other three know (`ColocationStatus`), written to this node's
//!   `DeviceTopology` status (or, until that object exists, a Node annotation).
//!
//! Start at `agent/src/run/colocation.rs`, which wires them together.

pub mod config_watch;
pub mod heartbeat;
pub mod node_loop;
pub mod pod_cgroups;
pub mod report;
