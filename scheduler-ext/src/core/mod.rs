//! The decision core: where a pod may go and which devices it gets, as pure functions of the
//! cluster's objects and this service's own commitments. No HTTP, no API client, no clock of
//! its own (callers pass `now`); the live service, `explain` and the trace simulator all decide
//! through it.
//!
//! Start at [`view::ClusterView`] (the nodes and their free devices, built from published
//! objects), then [`decide`]: [`decide::plan`] places a pod's gpu-group-size unit over
//! super-nodes ([`placement`]) and [`decide::judge`] gives each node a [`verdict::NodeVerdict`]
//! through [`score::gpu_aware`] and the unit checks. A pod's ask is read by [`request`] (its
//! unit by [`unit`](mod@unit)); what the service decided that the view does not show yet is the
//! [`ledger`]; [`cluster::Cluster`] is the view and the ledger read together. [`explain`] lays
//! verdicts out for people.
//!
//! Imports inside the core point one way: `claims`, `unit` <- `request` <- `view` <- `ledger` <-
//! `cluster` <- `score`, `placement` <- `verdict` <- `decide`, `explain`; [`defrag`] (moves that
//! make room for a waiting unit) reads `cluster`, `unit`, `request` and `placement`.

pub mod claims;
pub mod cluster;
pub mod cow;
pub mod decide;
pub mod defrag;
pub mod explain;
pub mod ledger;
pub mod placement;
pub mod pod_facts;
pub mod request;
pub mod score;
pub mod unit;
pub mod verdict;
pub mod view;
