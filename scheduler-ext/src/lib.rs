//! fumarole's cluster service: where each accelerator pod should go and which devices it gets,
//! for kube-scheduler (extender API) and Volcano (its `extender` plugin).
//!
//! Layers, each importing only the ones below it:
//!
//! 1. [`core`]: the decision core. Start at [`core::view::ClusterView`] (every node, its devices
//!    and which are free) and [`core::decide`] (plan a pod's gpu-group-size unit over
//!    super-nodes, then judge each node: gpu-aware fit and score, NUMA fit, the devices
//!    `topology::select` would give). Pure: no HTTP, no API client.
//! 2. [`decider`]: the one view and ledger every request shares, with `evaluate` / `commit` /
//!    `release` / `explain` and the job annotations of a choice, and its [`decider::Settings`]
//!    (built by every entry point through [`cli::settings`]). Synchronous, no I/O: no API
//!    client, no runtime.
//! 3. [`effects`]: every API write of a decision (the device choice, the Binding, job
//!    annotations, withdrawals, the leader label). Nothing there decides.
//! 4. [`service::Service`]: the decider, the effects, leader election, the view's freshness,
//!    the `/ui` decision log ([`decision_log`]) and the memo that lets kube-scheduler's
//!    prioritize reuse its filter's verdicts ([`filter_memo`]) put together; `assign` is
//!    commit, write, and release on a refused write.
//! 5. [`protocol`]: one module per scheduler protocol, its verbs functions over `&Service`
//!    (decisions from its decider, writes through the service); [`protocol::scale`] turns the
//!    core's 0..1 scores into each scheduler's numbers, and into the one `explain`, `/ui` and
//!    the kubectl plugin show (the decider and the decision log take it from their callers).
//! 6. [`http`]: the router (protocols, `/ui`, `/healthz`), `/metrics`, TLS.
//!
//! Beside them: [`live`] keeps the decider's view current from API server reflectors,
//! [`snapshot`] builds a view from YAML files instead, and [`controllers`] holds the background
//! loops that write (leader election and terms, after-the-fact annotations, HyperNodes, dead
//! agents' leftovers).
//! The binary's subcommands (`serve`, `explain`) only wire these together; [`kubectl`] is the
//! kubectl plugin (`kubectl fumarole explain|node|top`, binary `kubectl-fumarole`), a reader of
//! the same decider over a view read once ([`live::read_once`]). The trace simulator
//! that replays jobs through the same core lives in its own crate, `fumarole-sim`.

pub mod cli;
pub mod controllers;
pub mod core;
pub mod decider;
pub mod decision_log;
pub mod effects;
pub mod filter_memo;
pub mod freshness;
pub mod http;
pub mod kubectl;
pub mod live;
pub mod pod_store;
pub mod protocol;
pub mod service;
pub mod snapshot;
pub mod text_table;
