//! The node side of co-location, one round every `monitorInterval` (10 s by default): usage
//! of the kubepods cgroup tree and PSI in, batch resources on the Node status, the
//! `volcano.sh/offline-job-evicting` taint and evictions of offline pods out.
//!
//! The decisions are the pure state machines of [`crate::rules::oversub`] and
//! [`crate::rules::evict`]; this module reads their inputs and applies their outputs:
//!
//! - batch resources: a JSON merge patch of the Node's `status.capacity` and
//!   `status.allocatable` naming only `kubernetes.io/batch-cpu` / `batch-memory` (the kubelet
//!   owns the rest of those maps); `null` removes them when oversubscription is switched off,
//!   and the offline pods that asked for them are evicted;
//! - the taint: the Node's taints as read from the API server, ours added or removed, written
//!   back with the `resourceVersion` it was read at (a conflict is retried next round);
//! - evictions: the Eviction API (so PodDisruptionBudgets hold) with the pod's uid as a
//!   precondition (a pod recreated under the same name is never hit), and an Event on the pod
//!   saying why.
//!
//! Restarts: the evictor starts from the node's current taint and counts offline pods already
//! terminating as evictions in flight; the oversubscription state starts from the batch values
//! the Node status carries, so nothing is rewritten or evicted twice.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use fumarole_topology::colocation::{self, Leftovers};
use fumarole_topology::crd::{BatchResourcesStatus, EvictionRecord};
use fumarole_topology::quantity;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client};
use tokio::sync::watch;

use super::report::StatusTx;
use crate::cgroup::psi_files::{PsiSource, read_psi};
use crate::cgroup::usage::KubepodsUsage;
use crate::cgroup::{Cgroups, Settings};
use crate::metrics::ColocationMetrics;
use crate::rules::config::{ConfigState, NodeConfig};
use crate::rules::evict::{self, Evictor, Sample, TAINT_KEY};
use crate::rules::kernel::Version;
use crate::rules::oversub::{
    BatchResources, CpuMeter, NodeAllocatable, Oversubscription, Usage, oversold,
};
use crate::rules::pod::{BATCH_CPU, BATCH_MEMORY, PodFacts, PodRef, QosClass, is_offline};
use crate::rules::psi::Psi;
use crate::watched::Watched;

/// What the node loop needs besides the API server.
pub struct NodeLoopSettings {
    pub node_name: String,
    /// The cgroup layout, as for the pod loop.
    pub cgroups: Settings,
    /// The node's memory pressure file (`/proc/pressure/memory`).
    pub memory_pressure: PathBuf,
    /// The kubelet's `cpuManagerPolicy` is `static`.
    pub static_cpu_manager: bool,
}

/// Reads the node's usage and applies the oversubscription and eviction decisions.
pub struct NodeLoop {
    settings: NodeLoopSettings,
    client: Client,
    nodes: Api<Node>,
    node: Arc<Watched<Node>>,
    recorder: Recorder,
    metrics: Arc<ColocationMetrics>,
    status: StatusTx,
    cgroups: Option<Cgroups>,
    meter: CpuMeter,
    memory_psi: PsiSource,
    oversub: Oversubscription,
    /// Oversubscription was on in the last round (so switching it off cleans up).
    oversub_on: bool,
    evictor: Option<Evictor>,
    /// Offline pods still to evict because oversubscription was switched off (their eviction
    /// was refused, say by a PodDisruptionBudget); retried every round while they run.
    cleanup: Vec<PodRef>,
    /// Pods that could not be read, by uid, with the message last logged.
    unreadable: BTreeMap<String, String>,
}

impl NodeLoop {
    pub fn new(
        settings: NodeLoopSettings,
        client: Client,
        node: Arc<Watched<Node>>,
        recorder: Recorder,
        metrics: Arc<ColocationMetrics>,
        status: StatusTx,
    ) -> Self {
        let memory_psi = PsiSource::new(settings.memory_pressure.clone());
        Self {
            settings,
            nodes: Api::all(client.clone()),
            client,
            node,
            recorder,
            metrics,
            status,
            cgroups: None,
            meter: CpuMeter::new(),
            memory_psi,
            oversub: Oversubscription::new(),
            oversub_on: false,
            evictor: None,
            cleanup: Vec::new(),
            unreadable: BTreeMap::new(),
        }
    }

    /// Rounds until the task is dropped: each waits the configuration's `monitorInterval`.
    /// Nothing happens before the first configuration and the first lists of the node and its
    /// pods.
    pub async fn run(
        mut self,
        pods: impl Fn() -> Vec<Arc<Pod>>,
        mut config: watch::Receiver<Option<ConfigState>>,
    ) {
        self.node.ready().await;
        loop {
            let current = config.borrow_and_update().as_ref().map(|c| c.node.clone());
            let Some(node_config) = current else {
                if config.changed().await.is_err() {
                    return;
                }
                continue;
            };
            self.round(&node_config, &pods()).await;
            tokio::time::sleep(node_config.eviction.monitor_interval).await;
        }
    }

    /// One round over the node as the watch shows it.
    pub async fn round(&mut self, config: &NodeConfig, pods: &[Arc<Pod>]) {
        let name = self.settings.node_name.clone();
        let Some(node) = self.node.named(&name) else {
            tracing::debug!(node = %name, "co-location: Node not seen yet");
            return;
        };
        let facts = self.pod_facts(pods);
        let allocatable = match allocatable(&node, self.settings.static_cpu_manager) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "co-location: no usable allocatable; round skipped");
                return;
            }
        };
        let usage = self.usage();
        if let Some(u) = usage {
            let m = &self.metrics;
            if let Some(p) = evict::percent(u.cpu_millis, allocatable.cpu_millis) {
                m.usage("cpu", p);
            }
            if let Some(p) = evict::percent(u.memory_bytes, allocatable.memory_bytes) {
                m.usage("memory", p);
            }
        }
        self.oversubscribe(config, &node, &allocatable, &facts, usage)
            .await;
        self.evict_round(config, &node, &allocatable, &facts, usage, pods)
            .await;
    }

    fn pod_facts(&mut self, pods: &[Arc<Pod>]) -> Vec<PodFacts> {
        let mut facts = Vec::with_capacity(pods.len());
        let mut seen = BTreeSet::new();
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            seen.insert(uid.clone());
            match PodFacts::from_pod(pod) {
                Ok(f) => {
                    self.unreadable.remove(&uid);
                    facts.push(f);
                }
                Err(e) => {
                    let message = e.to_string();
                    if self.unreadable.get(&uid) != Some(&message) {
                        tracing::warn!(error = %message, "co-location: pod left out of oversubscription and eviction");
                        self.unreadable.insert(uid, message);
                    }
                }
            }
        }
        self.unreadable.retain(|uid, _| seen.contains(uid));
        facts
    }

    /// The kubepods tree's CPU (millicores since the last round; `None` on the first) and
    /// memory working set; `None` while the cgroups cannot be read.
    fn usage(&mut self) -> Option<Usage> {
        if self.cgroups.is_none() {
            self.cgroups = self
                .settings
                .cgroups
                .detect()
                .inspect_err(|e| tracing::debug!(error = %e, "co-location: no cgroup layout yet"))
                .ok();
        }
        let cgroups = self.cgroups.as_ref()?;
        let tree = KubepodsUsage::of(cgroups);
        let read = tree
            .cpu_ns()
            .and_then(|cpu| Ok((cpu, tree.memory_bytes()?)));
        match read {
            Ok((cpu_ns, memory_bytes)) => {
                let cpu_millis = self.meter.sample(cpu_ns, Instant::now())?;
                Some(Usage {
                    cpu_millis,
                    memory_bytes,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "co-location: kubepods usage unreadable; round without usage");
                None
            }
        }
    }

    async fn oversubscribe(
        &mut self,
        config: &NodeConfig,
        node: &Node,
        allocatable: &NodeAllocatable,
        pods: &[PodFacts],
        usage: Option<Usage>,
    ) {
        let on_node = batch_on_node(node);
        if config.oversubscription.enabled {
            if !self.oversub_on {
                // Fresh start or switched on again: what the node carries counts as written.
                self.oversub = Oversubscription::resume(on_node);
                self.oversub_on = true;
            } else if on_node.is_none() && self.oversub.last_published().is_some() {
                // Removed by someone else (the scheduler extension, after this agent's
                // heartbeat lapsed): what the node carries is nothing, so write it again.
                self.oversub.publish_failed(None);
            }
            let Some(usage) = usage else {
                return;
            };
            let sample = oversold(allocatable, pods, usage, &config.oversubscription);
            if let Some(value) = self.oversub.observe(sample) {
                match self.write_batch(Some(value)).await {
                    Ok(()) => {
                        tracing::info!(
                            cpu_millis = value.cpu_millis,
                            memory_bytes = value.memory_bytes,
                            "co-location: batch resources published"
                        );
                        self.report_batch(Some(value));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "co-location: publishing batch resources failed; next round");
                        self.oversub.publish_failed(on_node);
                    }
                }
            } else if on_node.is_some() {
                self.report_batch(on_node);
            }
        } else if self.oversub_on || on_node.is_some() {
            let cleanup = self.oversub.disable(pods);
            if let Err(e) = self.write_batch(None).await {
                tracing::warn!(error = %e, "co-location: removing batch resources failed; next round");
                return;
            }
            tracing::info!("co-location: oversubscription off; batch resources removed");
            self.oversub_on = false;
            self.report_batch(None);
            self.cleanup = cleanup.evict;
        }
        self.evict_batch_users(pods).await;
    }

    /// Evicts the offline pods left on batch resources that no longer exist; those refused stay
    /// for the next round, those gone or no longer evictable are dropped.
    async fn evict_batch_users(&mut self, pods: &[PodFacts]) {
        let reason =
            "oversubscription switched off: the batch resources it was admitted on are gone";
        let mut refused = Vec::new();
        for pod in std::mem::take(&mut self.cleanup) {
            let running = pods.iter().any(|p| p.pod == pod && p.evictable());
            if running && !self.evict(&pod, reason, "oversubscription-off").await {
                refused.push(pod);
            }
        }
        self.cleanup = refused;
    }

    async fn evict_round(
        &mut self,
        config: &NodeConfig,
        node: &Node,
        allocatable: &NodeAllocatable,
        facts: &[PodFacts],
        usage: Option<Usage>,
        pods: &[Arc<Pod>],
    ) {
        let sample = Sample {
            cpu_percent: usage.and_then(|u| evict::percent(u.cpu_millis, allocatable.cpu_millis)),
            memory_percent: usage
                .and_then(|u| evict::percent(u.memory_bytes, allocatable.memory_bytes)),
            cpu_psi: self.cgroups.as_ref().and_then(|c| online_cpu_psi(c, pods)),
            memory_psi: if config.eviction.enabled {
                self.memory_psi.read()
            } else {
                None
            },
        };
        let tainted = Leftovers::of(node).taint;
        let evictor = self
            .evictor
            .get_or_insert_with(|| Evictor::new(config.eviction, tainted, facts));
        evictor.set_settings(config.eviction);
        // Someone may have added or removed the taint: the next decision starts from the node.
        evictor.observe_taint(tainted);
        let decision = evictor.round(&sample, facts);
        if let Some(want) = decision.taint {
            match self.set_taint(want).await {
                Ok(true) => tracing::info!(
                    taint = TAINT_KEY,
                    added = want,
                    pressure = ?decision.pressure,
                    "co-location: node taint changed"
                ),
                // The watch had not shown our last change yet.
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "co-location: changing the node taint failed; next round");
                    if let Some(evictor) = self.evictor.as_mut() {
                        evictor.observe_taint(!want);
                    }
                }
            }
        }
        if let (Some(pod), Some(reason)) = (&decision.evict, &decision.reason)
            && !self.evict(pod, reason, "pressure").await
            && let Some(evictor) = self.evictor.as_mut()
        {
            evictor.eviction_failed(pod);
        }
        let m = &self.metrics;
        m.pressure("cpu", decision.pressure.cpu.is_some());
        m.pressure("memory", decision.pressure.memory.is_some());
        let Some(evictor) = self.evictor.as_ref() else {
            return;
        };
        m.evicting(evictor.tainted());
        let mut pressure = BTreeMap::new();
        if let Some(signal) = decision.pressure.cpu {
            pressure.insert("cpu".to_string(), signal.to_string());
        }
        if let Some(signal) = decision.pressure.memory {
            pressure.insert("memory".to_string(), signal.to_string());
        }
        let evicting = evictor.tainted();
        let in_flight = u32::try_from(evictor.in_flight().count()).unwrap_or(u32::MAX);
        self.status.send_if_modified(|s| {
            let modified = s.pressure != pressure
                || s.evicting != evicting
                || s.evictions_in_flight != in_flight;
            s.pressure = pressure;
            s.evicting = evicting;
            s.evictions_in_flight = in_flight;
            modified
        });
    }

    fn report_batch(&self, value: Option<BatchResources>) {
        let value = value.map(|v| BatchResourcesStatus {
            cpu_millis: v.cpu_millis,
            memory_bytes: v.memory_bytes,
        });
        let m = &self.metrics;
        match &value {
            Some(v) => m.batch(v.cpu_millis, v.memory_bytes),
            None => m.batch(0, 0),
        }
        self.status.send_if_modified(|s| {
            let modified = s.batch_resources != value;
            s.batch_resources = value;
            modified
        });
    }

    /// Sets (or with `None` removes) both batch resources in `capacity` and `allocatable`.
    async fn write_batch(&self, value: Option<BatchResources>) -> kube::Result<()> {
        let patch = colocation::batch_patch(value.map(|v| (v.cpu_millis, v.memory_bytes)));
        self.nodes
            .patch_status(
                &self.settings.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(drop)
    }

    /// Adds or removes our taint on the Node as the API server has it now; false when it was
    /// already so.
    async fn set_taint(&self, want: bool) -> kube::Result<bool> {
        let name = &self.settings.node_name;
        let node = self.nodes.get(name).await?;
        let Some(patch) = colocation::taint_patch(&node, want) else {
            return Ok(false);
        };
        self.nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| true)
    }

    /// Evicts `pod` through the Eviction API; false when the API server refused or failed
    /// (a pod already gone counts as evicted).
    async fn evict(&mut self, pod: &PodRef, reason: &str, kind: &str) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(pod.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            }),
            ..EvictParams::default()
        };
        match api.evict(&pod.name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %pod, reason, "co-location: offline pod evicted");
                self.metrics.eviction(kind);
                let event = Event {
                    type_: EventType::Warning,
                    reason: "Evicted".into(),
                    note: Some(format!("fumarole-agent evicted the offline pod: {reason}")),
                    action: "Evict".into(),
                    secondary: None,
                };
                let object = fumarole_topology::pod::reference(&pod.namespace, &pod.name, &pod.uid);
                if let Err(e) = self.recorder.publish(&event, &object).await {
                    tracing::warn!(pod = %pod, error = %e, "could not record the eviction Event");
                }
                let record = EvictionRecord {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    reason: reason.to_string(),
                    time: k8s_openapi::jiff::Timestamp::now().to_string(),
                };
                self.status.send_modify(|s| s.last_eviction = Some(record));
                true
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                // Gone, or a pod of the same name with another uid: nothing of ours to evict.
                tracing::info!(pod = %pod, "co-location: pod to evict is already gone");
                true
            }
            Err(e) => {
                tracing::warn!(pod = %pod, error = %e, "co-location: eviction refused; trying another pod next round");
                self.metrics.eviction_failure();
                false
            }
        }
    }
}

/// The node's allocatable CPU and memory from its status.
fn allocatable(node: &Node, static_cpu_manager: bool) -> Result<NodeAllocatable, String> {
    let status = node.status.as_ref();
    let get = |name: &str| {
        status
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(name))
            .map(|q| q.0.clone())
            .ok_or_else(|| format!("status.allocatable has no {name}"))
    };
    let cpu = get("cpu")?;
    let memory = get("memory")?;
    Ok(NodeAllocatable {
        cpu_millis: quantity::cpu_millis(&cpu).map_err(|e| format!("allocatable cpu: {e}"))?,
        memory_bytes: quantity::units(&memory).map_err(|e| format!("allocatable memory: {e}"))?,
        static_cpu_manager,
    })
}

/// The batch resources the Node status carries (both, or `None`).
fn batch_on_node(node: &Node) -> Option<BatchResources> {
    let capacity = node.status.as_ref()?.capacity.as_ref()?;
    let cpu = capacity.get(BATCH_CPU)?;
    let memory = capacity.get(BATCH_MEMORY)?;
    Some(BatchResources {
        cpu_millis: quantity::units(&cpu.0).ok()?,
        memory_bytes: quantity::units(&memory.0).ok()?,
    })
}

/// The worst CPU pressure among the online pods' cgroups (cgroup v2 `cpu.pressure`): offline
/// pods wait for CPU by design, so only online stalls count. `None` on v1 or without PSI.
fn online_cpu_psi(cgroups: &Cgroups, pods: &[Arc<Pod>]) -> Option<Psi> {
    if cgroups.version() != Version::V2 {
        return None;
    }
    let mut worst: Option<Psi> = None;
    for pod in pods {
        let offline = is_offline(pod);
        let status = pod.status.as_ref();
        let (Some(uid), Some(class)) = (
            pod.metadata.uid.as_deref(),
            status.and_then(|s| s.qos_class.as_deref()),
        ) else {
            continue;
        };
        if offline || status.and_then(|s| s.phase.as_deref()) != Some("Running") {
            continue;
        }
        let Some(path) = class
            .parse::<QosClass>()
            .ok()
            .and_then(|qos| cgroups.layout().pod(qos, uid).ok())
        else {
            continue;
        };
        if let Ok(psi) = read_psi(&cgroups.dir("cpu", &path).join("cpu.pressure")) {
            worst = Some(worst.map_or(psi, |w| w.worst(psi)));
        }
    }
    worst
}
