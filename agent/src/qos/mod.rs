//! Co-location on the node, what volcano-agent does (semantics in
//! `../shared/reference/anchor-behaviour.md`):
//!
//! - [`cgroup`]: the cgroup layer: v1 / v2 and driver detection, pod and container paths for
//!   containerd, CRI-O and docker, idempotent writes logged on change only.
//! - [`level`]: QoS levels from `volcano.sh/qos-level` and what each level writes.
//! - [`burst`]: CPU burst from `volcano.sh/enable-quota-burst` / `volcano.sh/quota-burst-time`.
//! - [`config`]: the `volcano-agent-configuration` ConfigMap (`colocation-config`).
//! - [`oversub`]: batch resources for offline pods.
//! - [`evict`]: watermarks, pressure (PSI) and which offline pod to evict.

pub mod burst;
pub mod cgroup;
pub mod config;
pub mod evict;
pub mod level;
pub mod oversub;
