//! Reading the node each round: discovery, the health stream, the DCMI source's answers and
//! the kubelet's configuration and allocations, into one [`NodeSnapshot`] that
//! [`super::desired::desired`] turns into the objects. All of publishing's I/O before the
//! writes is here; start at [`NodeCollector::collect`].
//!
//! When the kubelet's configuration or allocations cannot be read, the objects built from
//! them (`Numatopology`, `NodeResourceTopology`) are left as last published (`None` in
//! [`Desired`]) and one log line says why; device status keeps the last good allocations.
//! While PodResources is down and the CPU manager checkpoint stands in (it knows no
//! devices), device accounting keeps the devices of the last PodResources answer.

use std::path::PathBuf;
use std::sync::Arc;

use fumarole_topology::NodeHealth;
use fumarole_topology::crd::PodDeviceUsage;
use tokio::sync::watch;

use crate::device_health::dcmi::answers::{ChipInfo, SuperPod};
use crate::discover::nvml::NvmlProbe;
use crate::discover::{DiscoverOptions, discover_with_nvml};
use crate::kubelet::config::{ConfigError, KubeletPolicies};
use crate::kubelet::{AllocationSource, Allocations, KubeletConfig, KubeletSettings};

use super::LatestAllocations;
use super::desired::{Desired, NodeSnapshot, desired};
use super::metrics::Metrics;
use super::objects;
use super::settings::PublishOptions;

/// How long the first round waits for the DCMI source's super-pod answer.
const SUPER_POD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where a round's facts come from.
pub struct Sources {
    /// What discovery reads (a host, a root, a fixture).
    pub discover: DiscoverOptions,
    /// NVIDIA's answers for discovery.
    pub nvml: Box<dyn NvmlProbe + Send + Sync>,
    /// The kubelet's configuration file and `--reserved-memory`.
    pub kubelet: KubeletSettings,
    /// The kubelet's allocations, as [`super::watch_allocations`] reads them.
    pub allocations: LatestAllocations,
    /// The node's health stream.
    pub health: watch::Receiver<NodeHealth>,
    /// The DCMI source's super-pod answer (A3 hardware); a closed channel when DCMI does not
    /// run.
    pub super_pod: watch::Receiver<Option<SuperPod>>,
    /// The DCMI source's chip info (sent before its super-pod answer), likewise.
    pub chip_info: watch::Receiver<Option<ChipInfo>>,
    /// Each holding pod's use of its devices ([`crate::device_metrics`]); empty when no
    /// vendor library is read.
    pub device_usage: watch::Receiver<Vec<PodDeviceUsage>>,
}

/// Reads the node each round ([`Self::collect`]) and remembers what the keep-last-good rules
/// and the once-per-problem logging need between rounds.
pub struct NodeCollector {
    sources: Sources,
    /// What is built from each snapshot.
    options: PublishOptions,
    metrics: Arc<Metrics>,
    /// Whether the first round has waited for the DCMI source's super-pod answer.
    super_pod_waited: bool,
    /// The allocations device accounting last used.
    last_allocations: Option<Allocations>,
    /// The last allocations read from PodResources (for devices while it is down).
    last_pod_resources: Option<Allocations>,
    /// The last problem logged, so a persisting one is logged once.
    last_problem: Option<String>,
    /// The last NUMA memory read error logged, for the same reason.
    memory_problem: Option<String>,
}

impl NodeCollector {
    /// Reads the node from `sources` and builds its objects with `options`; `metrics` count
    /// discoveries and devices.
    pub fn new(sources: Sources, options: PublishOptions, metrics: Arc<Metrics>) -> Self {
        Self {
            sources,
            options,
            metrics,
            super_pod_waited: false,
            last_allocations: None,
            last_pod_resources: None,
            last_problem: None,
            memory_problem: None,
        }
    }

    /// This round's objects: [`Self::collect`], then [`desired`] (nothing to keep from a
    /// round whose discovery failed: every published object stays).
    pub async fn desired(&mut self) -> Desired {
        let Some(snapshot) = self.collect().await else {
            return Desired::default();
        };
        let desired = desired(&snapshot, &self.options);
        if let Some((_, status)) = &desired.device_topology {
            let healthy = usize::try_from(status.healthy_count).unwrap_or(usize::MAX);
            let allocated = status
                .devices
                .values()
                .filter(|d| d.allocation.is_some())
                .count();
            let shares = status.devices.values().map(|d| d.shares.len()).sum();
            self.metrics.devices(
                healthy,
                status.devices.len().saturating_sub(healthy),
                allocated,
                shares,
            );
        }
        desired
    }

    /// Reads the node once; `None` when discovery failed (logged).
    pub async fn collect(&mut self) -> Option<NodeSnapshot> {
        // Discovery reads sysfs synchronously (about 15 ms on an 8-GPU node).
        let discovered = tokio::task::block_in_place(|| {
            discover_with_nvml(&self.sources.discover, self.sources.nvml.as_ref())
        });
        self.metrics.discovery(discovered.is_ok());
        let health = self.sources.health.borrow().clone();
        // The first round waits (a little) for the hardware's super-pod answer, so an agent start
        // does not publish the node without its super-node and then with it.
        if !self.super_pod_waited {
            self.super_pod_waited = true;
            // A closed channel (no DCMI source) returns at once.
            if tokio::time::timeout(SUPER_POD_WAIT, self.sources.super_pod.changed())
                .await
                .is_err()
            {
                tracing::warn!(wait = ?SUPER_POD_WAIT, "DCMI has not answered the super-pod question yet; publishing without it for now");
            }
        }
        let super_pod: Option<SuperPod> = *self.sources.super_pod.borrow();
        let chip_info: Option<ChipInfo> = self.sources.chip_info.borrow().clone();
        let (topology, nvml) = match discovered {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "discovery failed; keeping every published object");
                return None;
            }
        };
        let policies = self.policies();
        let allocations: Result<Allocations, String> =
            match self.sources.allocations.wait_for(Option::is_some).await {
                Ok(latest) => latest
                    .clone()
                    .unwrap_or_else(|| Err("allocations not read yet".into())),
                Err(_) => Err("the allocation watch stopped".into()),
            };
        let problem = match (&policies, &allocations) {
            (Err(e), _) => Some(e.to_string()),
            (_, Err(e)) => Some(e.clone()),
            _ => None,
        };
        self.problem(problem);
        // Device accounting (DeviceTopology status, NodeResourceTopology device
        // availability) keeps the last PodResources answer's devices while only the
        // checkpoint can be read.
        if let Ok(a) = &allocations {
            let devices = a.with_devices_of(self.last_pod_resources.as_ref());
            if a.source == AllocationSource::PodResources {
                self.last_pod_resources = Some(a.clone());
            }
            self.last_allocations = Some(devices);
        }
        // Read only when the kubelet objects are built from it (and its problems logged then).
        let numa_memory = if policies.is_ok() && allocations.is_ok() {
            self.numa_memory()
        } else {
            objects::NumaMemory::new()
        };
        Some(NodeSnapshot {
            topology,
            nvml,
            health,
            super_pod,
            chip_info,
            policies: policies.ok(),
            allocations: allocations.ok(),
            device_allocations: self.last_allocations.clone(),
            numa_memory,
            device_usage: self.sources.device_usage.borrow().clone(),
        })
    }

    fn problem(&mut self, problem: Option<String>) {
        if problem != self.last_problem {
            match &problem {
                Some(p) => tracing::warn!(
                    "{p}; keeping the last published Numatopology and NodeResourceTopology"
                ),
                None if self.last_problem.is_some() => {
                    tracing::info!("kubelet state readable again")
                }
                None => {}
            }
            self.last_problem = problem;
        }
    }

    fn policies(&self) -> Result<KubeletPolicies, ConfigError> {
        let path: &PathBuf = &self.sources.kubelet.paths.config;
        // Kubelets configured by flags alone have no file: their defaults apply.
        let mut config = if path.exists() {
            KubeletConfig::read(path)?
        } else {
            KubeletConfig::default()
        };
        if let Some(reserved) = &self.sources.kubelet.reserved_memory {
            config.reserved_memory = reserved.clone();
        }
        config.policies().map_err(|reason| ConfigError::Invalid {
            path: path.clone(),
            reason,
        })
    }

    /// Memory and huge pages per NUMA node from the root's sysfs. Unreadable files are logged
    /// (once per change) and the zones fall back to hwloc's memory sizes.
    fn numa_memory(&mut self) -> objects::NumaMemory {
        let Some(root) = self.sources.discover.source.root() else {
            return objects::NumaMemory::new();
        };
        match crate::discover::memory::numa_memory(root) {
            Ok(m) => {
                self.memory_problem = None;
                m
            }
            Err(e) => {
                let message = e.to_string();
                if self.memory_problem.as_deref() != Some(message.as_str()) {
                    tracing::warn!(error = %message, "NUMA memory unreadable; zones carry hwloc's memory sizes");
                    self.memory_problem = Some(message);
                }
                objects::NumaMemory::new()
            }
        }
    }
}
