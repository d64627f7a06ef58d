//! Where the agent finds the kubelet's state, as flags ([`KubeletArgs`], flattened into
//! `fumarole-agent run`) and as the typed settings they become ([`KubeletSettings`]): the
//! configuration file, the PodResources socket, the CPU manager checkpoint and a
//! `--reserved-memory` given by flag.

use std::path::PathBuf;

use super::KubeletPaths;
use super::config::{ReservedMemory, parse_reserved_memory_flag};

/// The kubelet's files and sockets, and its memory reservation when set by flag.
#[derive(clap::Args, Clone, Debug)]
pub struct KubeletArgs {
    /// The kubelet configuration file.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/kubelet/config.yaml"
    )]
    kubelet_config: PathBuf,
    /// The kubelet's per-NUMA memory reservation in its `--reserved-memory` syntax
    /// (`0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi`, repeatable), for kubelets that set it by
    /// flag; replaces `reservedMemory` of the kubelet configuration file. NodeResourceTopology's
    /// per-zone allocatable memory subtracts it.
    #[arg(long, value_name = "NUMA:RESOURCE=QUANTITY,...")]
    reserved_memory: Vec<String>,
    /// The kubelet PodResources socket.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pod_resources_socket: PathBuf,
    /// The kubelet CPU manager checkpoint (fallback when PodResources is unavailable).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/kubelet/cpu_manager_state"
    )]
    cpu_manager_state: PathBuf,
}

/// Where the kubelet's state is read from.
#[derive(Clone, Debug, Default)]
pub struct KubeletSettings {
    pub paths: KubeletPaths,
    /// `reservedMemory` given on the agent's command line, replacing the file's; `None`: the
    /// file's.
    pub reserved_memory: Option<Vec<ReservedMemory>>,
}

/// A `--reserved-memory` value that is not in the kubelet's syntax.
#[derive(Debug, thiserror::Error)]
#[error("--reserved-memory {value:?}: {reason}")]
pub struct ReservedMemoryError {
    pub value: String,
    pub reason: String,
}

impl KubeletArgs {
    /// The typed settings; fails on a `--reserved-memory` the kubelet would refuse to parse.
    pub fn settings(&self) -> Result<KubeletSettings, ReservedMemoryError> {
        let reserved_memory = if self.reserved_memory.is_empty() {
            None
        } else {
            let mut all = Vec::new();
            for v in &self.reserved_memory {
                all.extend(parse_reserved_memory_flag(v).map_err(|reason| {
                    ReservedMemoryError {
                        value: v.clone(),
                        reason,
                    }
                })?);
            }
            Some(all)
        };
        Ok(KubeletSettings {
            paths: KubeletPaths {
                config: self.kubelet_config.clone(),
                pod_resources_socket: self.pod_resources_socket.clone(),
                cpu_manager_state: self.cpu_manager_state.clone(),
            },
            reserved_memory,
        })
    }
}
