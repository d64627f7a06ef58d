//! fumarole's cluster service: where each accelerator pod should go and which devices it gets.
//!
//! Start at [`view::ClusterView`]: the nodes with their published `DeviceTopology` (one
//! [`fumarole_topology::SelectContext`] per node, built once), the devices in use and the
//! devices still free. [`live`] keeps a view current from API server reflectors; [`snapshot`]
//! builds one from YAML files (`kubectl get -o yaml` output) instead. [`ledger`] holds what the
//! service decided that the view does not show yet (devices committed to pods, super-node
//! plans of gpu-group-size units); [`cluster::Cluster`] is the two read together.
//!
//! For one pod: [`request`] reads what it asks for, [`group`] its unit, [`decide`] plans the
//! unit's super-node ([`placement`]) and judges each node: [`score::gpu_aware`] (fit, NUMA fit,
//! `q`, `loss`, score, devices via `topology::select`) and the group checks. [`extender`] is
//! the HTTP server answering kube-scheduler's extender API and (through [`volcano`]) Volcano's
//! `extender` plugin; [`kube_ops`] writes the chosen devices on pods and binds them;
//! [`explain`] prints the verdicts per node; [`hypernode`] publishes Volcano `HyperNode`
//! objects for the super-nodes.
//! [`metrics`] counts and times the requests per verb and serves `/metrics`; [`server`] serves
//! the routes over plain HTTP or HTTPS (rustls) until shutdown. [`simulate`] replays a job
//! trace over a simulated cluster through the same `decide` path and compares the placements
//! with other policies.

pub mod cluster;
pub mod decide;
pub mod explain;
pub mod extender;
pub mod group;
pub mod hypernode;
pub mod kube_ops;
pub mod ledger;
pub mod live;
pub mod metrics;
pub mod placement;
pub mod request;
pub mod score;
pub mod server;
pub mod simulate;
pub mod snapshot;
pub mod ui;
pub mod view;
pub mod volcano;
