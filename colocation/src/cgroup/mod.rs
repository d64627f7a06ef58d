//! The kernel layer of co-location: which cgroup version and kubelet driver the node runs, where
//! a pod's and a container's cgroup lives, idempotent access to their files, and the usage and
//! pressure files the node loop reads. The rules ([`crate::rules`]) decide; this layer reads what
//! they need and writes what they return, and nothing else touches cgroup files.
//!
//! - [`detect`]: cgroup v1 / v2 from the mount table, the kubelet's driver ([`Settings`]).
//! - [`layout`]: pod and container paths for containerd, CRI-O and docker under both drivers
//!   ([`Layout`]); pure.
//! - [`files`]: reads, and writes only values that differ, logged on change only ([`Cgroups`]).
//! - [`level_files`]: the QoS files a pod's cgroup has and the level plan written to them.
//! - [`burst_files`]: CFS quotas read, burst written.
//! - [`batch_files`]: a BestEffort pod's batch resources written as its limits.
//! - [`usage`]: CPU time and memory working set of the kubepods tree.
//! - [`psi_files`]: pressure files.
//! - [`error`]: what can go wrong, and what to do about it.
//!
//! Start at [`Cgroups`].

pub mod batch_files;
pub mod burst_files;
pub mod detect;
pub mod error;
pub mod files;
pub mod layout;
pub mod level_files;
pub mod psi_files;
pub mod usage;

pub use detect::{DEFAULT_MOUNTINFO, DEFAULT_ROOT, Settings, detect_version};
pub use error::{Error, Result};
pub use files::{Applied, Cgroups, Changed};
pub use layout::{CgroupPath, ContainerId, Driver, Layout, Runtime};
