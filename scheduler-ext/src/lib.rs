//! fumarole's cluster service: where each accelerator pod should go and which devices it gets.
//!
//! Start at [`view::ClusterView`]: the nodes with their published `DeviceTopology` (one
//! [`fumarole_topology::SelectContext`] per node, built once), the devices in use and the
//! devices still free. [`snapshot`] builds a view from YAML files (`kubectl get -o yaml`
//! output) instead of an API server. [`request`] reads a pod's accelerator request;
//! [`score::gpu_aware`] filters and scores nodes for it with `topology::select`; [`explain`]
//! prints that per node; [`extender`] is the HTTP server answering kube-scheduler's extender
//! API and (through [`volcano`]) Volcano's `extender` plugin from a view. [`group`] reads the
//! gpu-group-size annotations (placement over super-nodes is still to come).
//! [`metrics`] counts and times the requests per verb and serves `/metrics`; [`server`] serves
//! the routes over plain HTTP or HTTPS (rustls) until shutdown.

pub mod explain;
pub mod extender;
pub mod group;
pub mod metrics;
pub mod request;
pub mod score;
pub mod server;
pub mod snapshot;
pub mod view;
pub mod volcano;
