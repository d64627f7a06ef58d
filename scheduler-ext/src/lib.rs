//! fumarole's cluster service: where each accelerator pod should go and which devices it gets,
//! for kube-scheduler (extender API) and Volcano (its `extender` plugin).
//!
//! Layers, each importing only the ones below it:
//!
//! 1. [`core`]: the decision core. Start at [`core::view::ClusterView`] (every node, its devices
//!    and which are free) and [`core::decide`] (plan a pod's gpu-group-size unit over
//!    super-nodes, then judge each node: gpu-aware fit and score, NUMA fit, the devices
//!    `topology::select` would give). Pure: no HTTP, no API client.
//! 2. [`service::Service`]: the one view and ledger every request shares, with
//!    `evaluate` / `commit` / `assign` / `release` / `explain`.
//! 3. [`protocol`]: one module per scheduler protocol, its verbs functions over `&Service`;
//!    [`protocol::scale`] turns the core's 0..1 scores into each scheduler's numbers (a leaf
//!    that imports nothing: the service's `explain` rows show Volcano's number too).
//! 4. [`http`]: the router (protocols, `/ui`, `/healthz`), `/metrics`, TLS.
//!
//! Beside them: [`live`] keeps the service's view current from API server reflectors,
//! [`snapshot`] builds a view from YAML files instead, [`kube_ops`] writes the chosen devices
//! and Bindings, [`hypernode`] publishes Volcano `HyperNode` objects for the super-nodes,
//! [`dead_agents`] removes the co-location taint and batch resources of agents whose heartbeat
//! expired.
//! The binary's subcommands (`serve`, `explain`) only wire these together; [`kubectl`] is the
//! kubectl plugin (`kubectl fumarole explain|node|top`, binary `kubectl-fumarole`), a reader of
//! the same core over a view read once ([`live::read_once`]). The trace simulator
//! that replays jobs through the same core lives in its own crate, `fumarole-sim`.

pub mod cli;
pub mod core;
pub mod dead_agents;
pub mod freshness;
pub mod http;
pub mod hypernode;
pub mod kube_ops;
pub mod kubectl;
pub mod leader;
pub mod live;
pub mod pod_store;
pub mod protocol;
pub mod service;
pub mod snapshot;
pub mod text_table;
