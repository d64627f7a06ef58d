//! What the kubelet knows about this node: its configuration file (CPU / topology manager
//! policies, reservations), the CPU manager checkpoint, and the PodResources API (which
//! containers hold which CPUs and devices).
//!
//! [`read_allocations`] is where to start: PodResources first, the checkpoint as fallback.

pub mod config;
pub mod cpu_manager_state;
pub mod podresources;
pub mod quantity;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fumarole_topology::CpuSet;

pub use config::KubeletConfig;

/// Exclusive resources held by one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerAllocation {
    pub name: String,
    pub cpus: CpuSet,
    /// Resource name -> device ids.
    pub devices: BTreeMap<String, Vec<String>>,
}

/// Exclusive resources held by one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodAllocation {
    /// Known from the CPU manager checkpoint; PodResources does not report it.
    pub uid: Option<String>,
    pub name: String,
    pub namespace: String,
    pub containers: Vec<ContainerAllocation>,
}

/// Where the allocations came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocationSource {
    PodResources,
    CpuManagerState,
    /// Neither is available (no kubelet on this node, e.g. a fixture): nothing is allocated.
    None,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocations {
    pub source: AllocationSource,
    pub pods: Vec<PodAllocation>,
}

impl Allocations {
    /// CPUs held exclusively by any container.
    pub fn exclusive_cpus(&self) -> CpuSet {
        self.pods
            .iter()
            .flat_map(|p| &p.containers)
            .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus))
    }
}

/// Where to find the kubelet's state.
#[derive(Clone, Debug)]
pub struct KubeletPaths {
    pub config: PathBuf,
    pub pod_resources_socket: PathBuf,
    pub cpu_manager_state: PathBuf,
}

impl Default for KubeletPaths {
    fn default() -> Self {
        Self {
            config: "/var/lib/kubelet/config.yaml".into(),
            pod_resources_socket: "/var/lib/kubelet/pod-resources/kubelet.sock".into(),
            cpu_manager_state: "/var/lib/kubelet/cpu_manager_state".into(),
        }
    }
}

/// Why allocations could not be read. The caller keeps its last good state.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    #[error("PodResources at {socket} failed ({podresources}) and {checkpoint}")]
    Both {
        socket: PathBuf,
        podresources: String,
        checkpoint: cpu_manager_state::StateError,
    },
    #[error(transparent)]
    Checkpoint(#[from] cpu_manager_state::StateError),
}

/// Allocations from the PodResources API, falling back to the CPU manager checkpoint. When
/// neither the socket nor the checkpoint exists there is no kubelet, and nothing is allocated.
pub async fn read_allocations(paths: &KubeletPaths) -> Result<Allocations, AllocationError> {
    let socket_exists = paths.pod_resources_socket.exists();
    if socket_exists {
        match podresources::list(&paths.pod_resources_socket).await {
            Ok(pods) => {
                return Ok(Allocations {
                    source: AllocationSource::PodResources,
                    pods,
                });
            }
            Err(e) => {
                tracing::warn!(socket = %paths.pod_resources_socket.display(), error = %e, "PodResources failed; reading the CPU manager checkpoint");
                return match read_checkpoint(&paths.cpu_manager_state) {
                    Ok(Some(a)) => Ok(a),
                    Ok(None) => Err(AllocationError::Both {
                        socket: paths.pod_resources_socket.clone(),
                        podresources: e.to_string(),
                        checkpoint: cpu_manager_state::StateError::Missing {
                            path: paths.cpu_manager_state.clone(),
                        },
                    }),
                    Err(checkpoint) => Err(AllocationError::Both {
                        socket: paths.pod_resources_socket.clone(),
                        podresources: e.to_string(),
                        checkpoint,
                    }),
                };
            }
        }
    }
    Ok(
        read_checkpoint(&paths.cpu_manager_state)?.unwrap_or(Allocations {
            source: AllocationSource::None,
            pods: Vec::new(),
        }),
    )
}

fn read_checkpoint(path: &Path) -> Result<Option<Allocations>, cpu_manager_state::StateError> {
    if !path.exists() {
        return Ok(None);
    }
    let state = cpu_manager_state::CpuManagerState::load(path)?;
    Ok(Some(Allocations {
        source: AllocationSource::CpuManagerState,
        pods: state.pod_allocations(),
    }))
}
