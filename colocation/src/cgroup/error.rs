//! Errors of the cgroup layer, one enum for every file of it, each variant saying what to do
//! about it (retry next sync, fall back, skip the pod).

use std::io;
use std::path::PathBuf;

/// Errors of the cgroup layer; each names the file or the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cgroup directory does not exist: the pod or container is gone or not created yet.
    /// Retry on the next sync; there is nothing to undo.
    #[error("cgroup {dir} does not exist")]
    NoCgroup { dir: PathBuf },
    /// The cgroup exists but this kernel has no such file (`cpu.qos_level` outside openEuler,
    /// `cpu.idle` before 5.15): callers fall back to another file or skip the feature.
    #[error("{file} is not supported by this kernel (not in {dir})")]
    Unsupported { dir: PathBuf, file: String },
    /// Reading failed for another reason (permissions, I/O); retrying may help.
    #[error("reading {path}: {reason}")]
    Read { path: PathBuf, reason: io::Error },
    /// The kernel refused the value (`EINVAL` for a burst above the quota, for `cpu.shares` on
    /// an idle group ...); retrying the same value will not help.
    #[error("writing {value:?} to {path}: {reason}")]
    Write {
        path: PathBuf,
        value: String,
        reason: io::Error,
    },
    /// A file's content is not in the format the kernel documents.
    #[error("{path}: unexpected content {content:?}: {reason}")]
    Content {
        path: PathBuf,
        content: String,
        reason: &'static str,
    },
    /// Neither cgroup v2 at the root nor v1 controllers below it.
    #[error("no cgroup filesystem mounted at or below {root} (per {mountinfo})")]
    NotMounted { root: PathBuf, mountinfo: PathBuf },
    /// The kubelet's driver is neither configured nor visible in the cgroup tree.
    #[error(
        "cannot tell the kubelet's cgroup driver: {reason}; set cgroupDriver in the kubelet config"
    )]
    Driver { reason: String },
    /// Bad input from the API or configuration: a container id, pod uid, QoS class, driver
    /// name or cgroup root that does not parse. The pod (or setting) is skipped.
    #[error("{what} {value:?}: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: String,
    },
}

impl Error {
    /// Whether the kernel lacks the file, so the caller may fall back instead of failing.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(super) fn invalid(what: &'static str, value: &str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        what,
        value: value.to_string(),
        reason: reason.into(),
    }
}
