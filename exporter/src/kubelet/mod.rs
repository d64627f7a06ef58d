//! What the kubelet knows about this node: its configuration file (CPU / topology manager
//! policies, reservations), the CPU manager checkpoint, and the PodResources API (which
//! containers hold which CPUs and devices).
//!
//! [`AllocationReader`] is where to start: PodResources first, the checkpoint as fallback.
//! [`settings`] holds the flags that say where these are ([`KubeletArgs`]).

pub mod config;
pub mod cpu_manager_state;
pub mod podresources;
pub mod settings;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fumarole_topology::CpuSet;

pub use config::KubeletConfig;
pub use settings::{KubeletArgs, KubeletSettings};

/// Exclusive resources held by one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerAllocation {
    pub name: String,
    pub cpus: CpuSet,
    /// Resource name -> device ids.
    pub devices: BTreeMap<String, Vec<String>>,
    /// Memory pinned to NUMA nodes by the kubelet's memory manager (PodResources only).
    pub memory: Vec<MemoryBlock>,
    /// Devices of the container's DRA claims (PodResources only).
    pub claimed: Vec<ClaimedDevice>,
}

/// A device a DRA driver allocated to one of the container's claims: `device` in the driver's
/// pool (`nvidia-0`, a partition `nvidia-0-3g-40gb-4`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimedDevice {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// One PodResources `memory` block: `bytes` of `resource` (`memory`, `hugepages-2Mi`, ...)
/// taken from the NUMA nodes `numa_nodes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryBlock {
    pub resource: String,
    pub bytes: u64,
    pub numa_nodes: Vec<u32>,
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

    /// For device accounting while PodResources is down: allocations read from the CPU
    /// manager checkpoint (which knows no devices) keep the devices of `last`, the last
    /// PodResources answer. Devices are not freed while the kubelet is away, so reporting them
    /// free would invite over-commitment. CPUs stay the checkpoint's. Anything else is
    /// returned as is.
    pub fn with_devices_of(&self, last: Option<&Allocations>) -> Allocations {
        match last {
            Some(last)
                if self.source == AllocationSource::CpuManagerState
                    && last.source == AllocationSource::PodResources =>
            {
                let devices_only = last.pods.iter().map(|p| PodAllocation {
                    containers: p
                        .containers
                        .iter()
                        .map(|c| ContainerAllocation {
                            cpus: CpuSet::new(),
                            ..c.clone()
                        })
                        .collect(),
                    ..p.clone()
                });
                Allocations {
                    source: AllocationSource::PodResources,
                    pods: self.pods.iter().cloned().chain(devices_only).collect(),
                }
            }
            _ => self.clone(),
        }
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

/// Reads the kubelet's allocations: the PodResources API, falling back to the CPU manager
/// checkpoint. When neither the socket nor the checkpoint exists there is no kubelet, and
/// nothing is allocated. Logs once when PodResources starts failing and once when it answers
/// again, however often it is read.
pub struct AllocationReader {
    paths: KubeletPaths,
    podresources_failing: bool,
}

impl AllocationReader {
    pub fn new(paths: KubeletPaths) -> Self {
        Self {
            paths,
            podresources_failing: false,
        }
    }

    pub async fn read(&mut self) -> Result<Allocations, AllocationError> {
        let paths = &self.paths;
        if !paths.pod_resources_socket.exists() {
            return Ok(
                read_checkpoint(&paths.cpu_manager_state)?.unwrap_or(Allocations {
                    source: AllocationSource::None,
                    pods: Vec::new(),
                }),
            );
        }
        match podresources::list(&paths.pod_resources_socket).await {
            Ok(pods) => {
                if std::mem::replace(&mut self.podresources_failing, false) {
                    tracing::info!(socket = %paths.pod_resources_socket.display(), "PodResources answering again");
                }
                Ok(Allocations {
                    source: AllocationSource::PodResources,
                    pods,
                })
            }
            Err(e) => {
                if !std::mem::replace(&mut self.podresources_failing, true) {
                    tracing::warn!(socket = %paths.pod_resources_socket.display(), error = %e, "PodResources failed; reading the CPU manager checkpoint");
                }
                let both = |checkpoint| AllocationError::Both {
                    socket: paths.pod_resources_socket.clone(),
                    podresources: e.to_string(),
                    checkpoint,
                };
                match read_checkpoint(&paths.cpu_manager_state) {
                    Ok(Some(a)) => Ok(a),
                    Ok(None) => Err(both(cpu_manager_state::StateError::Missing {
                        path: paths.cpu_manager_state.clone(),
                    })),
                    Err(checkpoint) => Err(both(checkpoint)),
                }
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, cpus: &str, gpus: &[&str]) -> PodAllocation {
        let mut devices = BTreeMap::new();
        if !gpus.is_empty() {
            devices.insert(
                "nvidia.com/gpu".to_string(),
                gpus.iter().map(|g| g.to_string()).collect(),
            );
        }
        PodAllocation {
            uid: None,
            name: name.into(),
            namespace: "ml".into(),
            containers: vec![ContainerAllocation {
                name: "main".into(),
                cpus: cpus.parse().unwrap(),
                devices,
                ..Default::default()
            }],
        }
    }

    #[test]
    fn checkpoint_fallback_keeps_the_last_podresources_devices() {
        let last = Allocations {
            source: AllocationSource::PodResources,
            pods: vec![pod("train-0", "4-7", &["GPU-a", "GPU-b"])],
        };
        let checkpoint = Allocations {
            source: AllocationSource::CpuManagerState,
            pods: vec![pod("u1", "10-11", &[])],
        };
        let merged = checkpoint.with_devices_of(Some(&last));
        assert_eq!(merged.source, AllocationSource::PodResources);
        assert_eq!(merged.exclusive_cpus().to_string(), "10-11");
        assert_eq!(
            merged.pods[1].containers[0].devices["nvidia.com/gpu"],
            vec!["GPU-a", "GPU-b"]
        );

        // PodResources itself, or nothing to keep: unchanged.
        assert_eq!(last.with_devices_of(Some(&last)), last);
        assert_eq!(checkpoint.with_devices_of(None), checkpoint);
        let none = Allocations {
            source: AllocationSource::None,
            pods: vec![],
        };
        assert_eq!(none.with_devices_of(Some(&last)), none);
    }
}
