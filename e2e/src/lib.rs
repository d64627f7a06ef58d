//! End-to-end test support: a real control plane on loopback, started per test.
//!
//! Start with [`TestCluster::start`]: it runs etcd and kube-apiserver (TLS with a
//! throwaway CA, RBAC, a static admin token) in a temp dir and hands back a
//! [`kube::Client`]. From there a test can install CRDs, create Node objects,
//! act as any user or ServiceAccount, and start kube-scheduler, Volcano, and
//! `kubelet-dm` (the kubelet's own device-plugin code, driven over HTTP; see
//! [`KubeletDm`]), and harness nodes: the kubelet's device manager and topology manager
//! admitting the pods bound to a Node ([`HarnessNode`]). Everything stops and the temp dir goes away when the
//! cluster is dropped, also when the test panics.
//!
//! Every test that starts `fumarole-agent run` does it with an [`agent::AgentBuilder`].
//!
//! The binaries come from `e2e/build-upstream.sh` (see [`upstream`]).

pub mod agent;
pub mod chain;
pub mod cluster;
pub mod colocation;
pub mod deploy;
pub mod dra;
pub mod fault_proxy;
pub mod fleet;
pub mod fumarole;
pub mod harness_node;
pub mod json_api;
pub mod kubelet_dm;
pub mod pki;
pub mod process;
pub mod service_front;
pub mod standin;
pub mod upstream;
pub mod wait;

pub use agent::AgentBuilder;
pub use cluster::{NodeSpec, TestCluster};
pub use harness_node::{HarnessNode, HarnessOptions};
pub use kubelet_dm::KubeletDm;
pub use upstream::Upstream;
