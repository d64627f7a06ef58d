//! Starting publishing in `fumarole-agent run` ([`fumarole_exporter::publish`] does the
//! work): the node's super-node from its `--super-node-label`, the DCMI source's answers
//! ([`dcmi_answers`]), what wakes the publish loop early and the kubelet's allocations it
//! reads ([`Publishing::start`]), and the loop itself ([`Publishing::run`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fumarole_exporter::device_health::HealthStream;
use fumarole_exporter::device_health::dcmi::ServerAnswers;
use fumarole_exporter::device_health::dcmi::answers::{ChipInfo, SuperPod};
use fumarole_exporter::discover::DiscoverOptions;
use fumarole_exporter::discover::nvml::NvmlProbe;
use fumarole_exporter::kubelet::KubeletSettings;
use fumarole_exporter::publish::metrics::Metrics;
use fumarole_exporter::publish::{
    self, DraSlices, LatestAllocations, NodeCollector, PublishSettings, Publisher, Sources,
};
use fumarole_topology::crd::{PodDeviceUsage, SharingInfo};
use fumarole_topology::{NodeHealth, SuperNode, SuperNodeSource};
use k8s_openapi::api::core::v1::Node;
use tokio::sync::{Notify, watch};

/// The value of the node's `key` label as its super-node, if the label is set.
pub async fn super_node_from_label(
    client: &kube::Client,
    node: &str,
    key: &str,
) -> Result<Option<SuperNode>> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let found = nodes
        .get_opt(node)
        .await
        .with_context(|| format!("reading Node {node} for --super-node-label"))?;
    let id = found
        .and_then(|n| n.metadata.labels?.get(key).cloned())
        .filter(|v| !v.is_empty());
    if id.is_none() {
        tracing::info!(node, label = key, "super-node label not set on the node");
    }
    Ok(id.map(|id| SuperNode {
        id,
        source: SuperNodeSource::NodeLabel,
    }))
}

/// What publishing hears of the DCMI source's answers about the server.
pub struct DcmiAnswers {
    /// The super-pod answer (A3 hardware).
    super_pod: watch::Receiver<Option<SuperPod>>,
    /// Its chips' chip info (the servertype and npu.chip.name labels).
    chip_info: watch::Receiver<Option<ChipInfo>>,
}

/// The DCMI source's end (give it to the health sources; dropped unused, it tells publishing
/// that nobody will answer) and publishing's.
pub fn dcmi_answers() -> (ServerAnswers, DcmiAnswers) {
    let (super_pod_tx, super_pod) = watch::channel(None);
    let (chip_info_tx, chip_info) = watch::channel(None);
    (
        ServerAnswers {
            super_pod: Some(super_pod_tx),
            chip: Some(chip_info_tx),
        },
        DcmiAnswers {
            super_pod,
            chip_info,
        },
    )
}

/// Publishing, started: its inputs are watched, the loop not yet running.
pub struct Publishing {
    settings: PublishSettings,
    kubelet: KubeletSettings,
    /// Poked when an input changes, so the loop does not wait for the re-check.
    wake: Arc<Notify>,
    allocations: LatestAllocations,
    health: watch::Receiver<NodeHealth>,
    dcmi: DcmiAnswers,
    device_usage: watch::Receiver<Vec<PodDeviceUsage>>,
}

impl Publishing {
    /// Starts watching what publishing reads: the health stream `health` and the DCMI
    /// answers `dcmi` wake the loop when they change; the kubelet's allocations are read every
    /// second (and wake it too).
    pub fn start(
        settings: PublishSettings,
        kubelet: KubeletSettings,
        health: &HealthStream,
        dcmi: DcmiAnswers,
    ) -> Self {
        let wake = Arc::new(Notify::new());
        publish::wake_on_change(health.subscribe(), wake.clone());
        // A late DCMI answer is published at once, not at the next re-check.
        publish::wake_on_change(dcmi.super_pod.clone(), wake.clone());
        publish::wake_on_change(dcmi.chip_info.clone(), wake.clone());
        let allocations =
            publish::watch_allocations(kubelet.paths.clone(), Duration::from_secs(1), wake.clone());
        Self {
            settings,
            kubelet,
            wake,
            allocations,
            health: health.subscribe(),
            dcmi,
            device_usage: watch::channel(Vec::new()).1,
        }
    }

    /// The kubelet's allocations as publishing reads them (the device plugins use them too).
    pub fn allocations(&self) -> &LatestAllocations {
        &self.allocations
    }

    /// Also publishes the ResourceSlices of the devices the DRA plugin serves.
    pub fn with_dra(mut self, slices: Option<DraSlices>) -> Self {
        self.settings.options.dra = slices;
        self
    }

    /// Publishes each holding pod's use of its devices (`DeviceTopology` status `pods`), as
    /// the per-device figures give it, at each round.
    pub fn with_device_usage(mut self, usage: watch::Receiver<Vec<PodDeviceUsage>>) -> Self {
        self.device_usage = usage;
        self
    }

    /// Publishes `sharing` (devices the device plugins offer in replicas) in `DeviceTopology`.
    pub fn with_sharing(mut self, sharing: BTreeMap<String, SharingInfo>) -> Self {
        self.settings.options.sharing = sharing;
        self
    }

    /// Publishes node `node_name`'s objects, discovered with `discover` and `nvml`, and keeps
    /// them current; never returns.
    pub async fn run(
        self,
        client: kube::Client,
        node_name: &str,
        discover: DiscoverOptions,
        nvml: Box<dyn NvmlProbe + Send + Sync>,
        metrics: Arc<Metrics>,
    ) {
        let Self {
            settings,
            kubelet,
            wake,
            allocations,
            health,
            dcmi,
            device_usage,
        } = self;
        let publisher = Publisher::new(
            client,
            node_name,
            &settings.options,
            metrics.clone(),
            wake.clone(),
        );
        let sources = Sources {
            discover,
            nvml,
            kubelet,
            allocations,
            health,
            super_pod: dcmi.super_pod,
            chip_info: dcmi.chip_info,
            device_usage,
        };
        let collector = NodeCollector::new(sources, settings.options, metrics);
        tracing::info!(node = %node_name, recheck = ?settings.recheck, "publishing node topology");
        publish::run(publisher, collector, settings.recheck, wake).await;
    }
}
