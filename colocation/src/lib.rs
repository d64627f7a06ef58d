//! Co-location on one node: what volcano-agent does for online and offline pods (QoS levels,
//! CPU burst, oversubscription, eviction), in halves a reader tells apart by name:
//!
//! - [`rules`]: the pure half. QoS levels, CPU burst and oversubscription arithmetic, eviction
//!   decisions, the configuration, pod facts, PSI text; no I/O, no async.
//! - [`cgroup`]: the kernel layer. cgroup v1 / v2 and driver detection, pod and container
//!   paths, idempotent reads and writes, usage and pressure files.
//! - [`tasks`]: the tokio tasks of `fumarole-agent run --colocation` that watch the API server,
//!   read the kernel, ask the rules and apply the answers.
//! - [`metrics`]: the `fumarole_colocation_*` metrics, registered into the agent's `/metrics`.
//! - [`watched`]: watched objects (a kube-rs reflector), shared with the agent's pod watch.
//! - [`settings`]: the `--colocation*` and cgroup flags and the typed settings of the tasks.
//!
//! Arrows point one way: `tasks` -> `cgroup` -> `rules`, `settings` -> `cgroup`, and `tasks` ->
//! `metrics`, `watched`.
//! Start at [`tasks`] for what runs, at [`rules::evict::Evictor::round`] and
//! [`rules::config::effective`] for what is decided. Semantics, and where fumarole differs from
//! volcano-agent on purpose, in `../shared/reference/anchor-behaviour.md` and the module docs.
//!
//! A crate of its own so that its tests (the kernel tests in `tests/cgroup_kernel.rs` among
//! them) and the fuzz targets of its parsers build without hwloc, NVML or the exporter.

pub mod cgroup;
pub mod metrics;
pub mod rules;
pub mod settings;
pub mod tasks;
pub mod watched;
