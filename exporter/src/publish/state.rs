//! The node's desired objects, rebuilt each round from discovery and the kubelet's state.
//!
//! When the kubelet's configuration or allocations cannot be read, the objects built from
//! them (`Numatopology`, `NodeResourceTopology`) are left as last published (`None` in
//! [`Desired`]) and one log line says why; device status keeps the last good allocations.
//! While PodResources is down and the CPU manager checkpoint stands in (it knows no
//! devices), device accounting keeps the devices of the last PodResources answer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use fumarole_topology::NodeHealth;
use fumarole_topology::crd::{
    DeviceTopologySpec, DeviceTopologyStatus, NodeResourceTopology, NumatopologySpec,
};
use k8s_openapi::api::resource::v1::ResourceSliceSpec;
use tokio::sync::watch;

use crate::discover::nvml::NvmlProbe;
use crate::discover::{DiscoverOptions, discover_with_nvml};
use crate::health::dcmi::answers::{ChipInfo, SuperPod};
use crate::kubelet::config::{ConfigError, KubeletPolicies, ReservedMemory};
use crate::kubelet::{AllocationSource, Allocations, KubeletConfig, KubeletPaths};

use super::LatestAllocations;
use super::metrics::Metrics;
use super::{ascend, compat, objects, slices};

/// How long the first round waits for the DCMI source's super-pod answer.
const SUPER_POD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the node should look like. `None` keeps the last published object (its inputs could
/// not be read this round).
#[derive(Clone, Debug, Default)]
pub struct Desired {
    pub numatopology: Option<NumatopologySpec>,
    pub node_resource_topology: Option<NodeResourceTopology>,
    pub device_topology: Option<(DeviceTopologySpec, DeviceTopologyStatus)>,
    pub labels: Option<BTreeMap<String, String>>,
    /// The node's ResourceSlices by driver; `None` when no device is served through DRA
    /// (then no slice is written or deleted).
    pub resource_slices: Option<BTreeMap<&'static str, ResourceSliceSpec>>,
    /// Huawei's device-info ConfigMap content; `None` when not asked for
    /// (`--ascend-device-info`) or the node has no Ascend device (then nothing is written).
    pub ascend_device_info: Option<ascend::DeviceInfo>,
}

pub struct NodeState {
    pub discover: DiscoverOptions,
    pub nvml: Box<dyn NvmlProbe + Send + Sync>,
    pub kubelet: KubeletPaths,
    pub metrics: Arc<Metrics>,
    allocations: LatestAllocations,
    health: Option<watch::Receiver<NodeHealth>>,
    /// The node's name and the ids of the devices the DRA kubelet plugin serves.
    dra: Option<(String, BTreeSet<String>)>,
    /// Also publish the GFD- and Ascend-compatible labels ([`compat`]).
    compat_labels: bool,
    /// Also publish Huawei's device-info ConfigMap and the Ascend labels ([`ascend`]).
    ascend_device_info: bool,
    /// The DCMI source's super-pod answer (A3 hardware), when DCMI runs.
    super_pod: Option<watch::Receiver<Option<SuperPod>>>,
    /// Whether the first round has waited for the DCMI source's super-pod answer.
    super_pod_waited: bool,
    /// The DCMI source's chip info (sent before its super-pod answer), when DCMI runs.
    chip_info: Option<watch::Receiver<Option<ChipInfo>>>,
    last_allocations: Option<Allocations>,
    /// The last allocations read from PodResources (for devices while it is down).
    last_pod_resources: Option<Allocations>,
    /// The last problem logged, so a persisting one is logged once.
    last_problem: Option<String>,
    /// The last NUMA memory read error logged, for the same reason.
    memory_problem: Option<String>,
    /// `reservedMemory` given on the agent's command line, replacing the file's.
    reserved_memory: Option<Vec<ReservedMemory>>,
}

impl NodeState {
    pub fn new(
        discover: DiscoverOptions,
        nvml: Box<dyn NvmlProbe + Send + Sync>,
        kubelet: KubeletPaths,
        allocations: LatestAllocations,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            discover,
            nvml,
            kubelet,
            allocations,
            metrics,
            health: None,
            dra: None,
            compat_labels: false,
            ascend_device_info: false,
            super_pod: None,
            super_pod_waited: false,
            chip_info: None,
            last_allocations: None,
            last_pod_resources: None,
            last_problem: None,
            memory_problem: None,
            reserved_memory: None,
        }
    }

    /// Builds every object with the health `health` carries (see the module doc).
    pub fn with_health(mut self, health: watch::Receiver<NodeHealth>) -> Self {
        self.health = Some(health);
        self
    }

    /// Publishes ResourceSlices for node `node` listing the devices whose ids are in
    /// `served` (those the DRA kubelet plugin serves).
    pub fn with_dra(mut self, node: &str, served: BTreeSet<String>) -> Self {
        self.dra = Some((node.to_string(), served));
        self
    }

    /// Also publishes the labels other projects' tools select nodes by ([`compat::labels`]):
    /// NVIDIA gpu-feature-discovery's and Ascend's `accelerator`.
    pub fn with_compat_labels(mut self, on: bool) -> Self {
        self.compat_labels = on;
        self
    }

    /// Also publishes what Huawei's Ascend scheduler plugin reads: the device-info ConfigMap
    /// and the Ascend labels ([`ascend`]).
    pub fn with_ascend_device_info(mut self, on: bool) -> Self {
        self.ascend_device_info = on;
        self
    }

    /// The hardware's super-pod answer (the DCMI source's): the node's super-node when nobody
    /// set one, its server index in the device-info ConfigMap, and the A3 label.
    pub fn with_super_pod(mut self, super_pod: watch::Receiver<Option<SuperPod>>) -> Self {
        self.super_pod = Some(super_pod);
        self
    }

    /// The chips' DCMI chip info (the DCMI source's): the `servertype` and
    /// `node.kubernetes.io/npu.chip.name` labels ([`ascend::chip_labels`]).
    pub fn with_chip_info(mut self, chip_info: watch::Receiver<Option<ChipInfo>>) -> Self {
        self.chip_info = Some(chip_info);
        self
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
        let path: &PathBuf = &self.kubelet.config;
        // Kubelets configured by flags alone have no file: their defaults apply.
        let mut config = if path.exists() {
            KubeletConfig::read(path)?
        } else {
            KubeletConfig::default()
        };
        if let Some(reserved) = &self.reserved_memory {
            config.reserved_memory = reserved.clone();
        }
        config.policies().map_err(|reason| ConfigError::Invalid {
            path: path.clone(),
            reason,
        })
    }

    /// The kubelet's per-NUMA memory reservation as given to the agent (`--reserved-memory`,
    /// for kubelets that set it by flag); it replaces the configuration file's
    /// `reservedMemory`.
    pub fn with_reserved_memory(mut self, reserved: Option<Vec<ReservedMemory>>) -> Self {
        self.reserved_memory = reserved;
        self
    }

    /// Memory and huge pages per NUMA node from the root's sysfs. Unreadable files are logged
    /// (once per change) and the zones fall back to hwloc's memory sizes.
    fn numa_memory(&mut self) -> objects::NumaMemory {
        let Some(root) = self.discover.source.root() else {
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

    pub async fn desired(&mut self) -> Desired {
        // Discovery reads sysfs synchronously (about 15 ms on an 8-GPU node).
        let discovered =
            tokio::task::block_in_place(|| discover_with_nvml(&self.discover, self.nvml.as_ref()));
        self.metrics.discovery(discovered.is_ok());
        let (topology, nvml) = match discovered {
            Ok((t, nvml)) => (Ok(t), nvml),
            Err(e) => (Err(e), None),
        };
        let health = self
            .health
            .as_ref()
            .map(|h| h.borrow().clone())
            .unwrap_or_default();
        // The first round waits (a little) for the hardware's super-pod answer, so an agent start
        // does not publish the node without its super-node and then with it.
        if let Some(rx) = self.super_pod.as_mut()
            && !self.super_pod_waited
        {
            self.super_pod_waited = true;
            // A closed channel (no DCMI source) returns at once.
            if tokio::time::timeout(SUPER_POD_WAIT, rx.changed())
                .await
                .is_err()
            {
                tracing::warn!(wait = ?SUPER_POD_WAIT, "DCMI has not answered the super-pod question yet; publishing without it for now");
            }
        }
        let hardware: Option<SuperPod> = self.super_pod.as_ref().and_then(|r| *r.borrow());
        let chip_info: Option<ChipInfo> = self.chip_info.as_ref().and_then(|r| r.borrow().clone());
        let topology = match topology {
            Ok(t) => {
                let mut t = t.with_health(&health);
                t.super_node =
                    ascend::hardware_super_node(t.super_node.as_ref(), hardware.as_ref());
                t
            }
            Err(e) => {
                tracing::warn!(error = %e, "discovery failed; keeping every published object");
                return Desired::default();
            }
        };
        let policies = self.policies();
        let allocations: Result<Allocations, String> =
            match self.allocations.wait_for(Option::is_some).await {
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
        let allocations = allocations.map(|a| {
            let devices = a.with_devices_of(self.last_pod_resources.as_ref());
            if a.source == AllocationSource::PodResources {
                self.last_pod_resources = Some(a.clone());
            }
            (a, devices)
        });
        if let Ok((_, devices)) = &allocations {
            self.last_allocations = Some(devices.clone());
        }
        let (numatopology, node_resource_topology) = match (&policies, &allocations) {
            (Ok(p), Ok((a, devices))) => (
                Some(objects::numatopology(&topology, p, a)),
                Some(objects::node_resource_topology(
                    &topology,
                    p,
                    devices,
                    &self.numa_memory(),
                    objects::pods_fingerprint(a).as_deref(),
                )),
            ),
            _ => (None, None),
        };
        let device_topology = self
            .last_allocations
            .as_ref()
            .map(|a| objects::device_topology(&topology, a, &health))
            .or_else(|| {
                let none = Allocations {
                    source: crate::kubelet::AllocationSource::None,
                    pods: vec![],
                };
                Some(objects::device_topology(&topology, &none, &health))
            });
        if let Some((_, status)) = &device_topology {
            let healthy = usize::try_from(status.healthy_count).unwrap_or(usize::MAX);
            let allocated = status
                .devices
                .values()
                .filter(|d| d.allocation.is_some())
                .count();
            self.metrics.devices(
                healthy,
                status.devices.len().saturating_sub(healthy),
                allocated,
            );
        }
        Desired {
            numatopology,
            node_resource_topology,
            device_topology,
            labels: Some({
                let mut labels = objects::labels(&topology);
                if self.compat_labels {
                    labels.extend(compat::labels(&topology, nvml.as_ref(), hardware.as_ref()));
                }
                if self.ascend_device_info {
                    labels.extend(ascend::labels(
                        &topology,
                        hardware.as_ref(),
                        chip_info.as_ref(),
                    ));
                }
                labels
            }),
            ascend_device_info: self
                .ascend_device_info
                .then(|| ascend::device_info(&topology, &health, hardware.as_ref()))
                .flatten(),
            resource_slices: self
                .dra
                .as_ref()
                .map(|(node, served)| slices::resource_slices(node, &topology, &health, served)),
        }
    }
}
