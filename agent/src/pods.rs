//! The pods assigned to this node, watched: the device plugins' [`PodSource`] (pending pods with
//! the scheduler extension's `fumarole.dev/devices` choice) and the co-location tasks' pod list
//! ([`NodePods::pods`], with [`NodePods::changes`] notified on every change).

use std::sync::Arc;

use fumarole_colocation::watched::Watched;
use fumarole_device_plugin::annotation::{self, DEVICES_ANNOTATION, PendingPod, PodSource};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::Notify;

pub struct NodePods {
    pods: Watched<Pod>,
}

impl NodePods {
    /// Starts watching the pods whose `spec.nodeName` is `node`.
    pub fn watch(client: Client, node: &str) -> Arc<Self> {
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        Arc::new(Self {
            pods: Watched::spawn(Api::<Pod>::all(client), config),
        })
    }

    /// The node's pods as last seen (empty until the first list).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    /// Notified (one stored permit, for one consumer) whenever a pod is added or changes.
    pub fn changes(&self) -> Arc<Notify> {
        self.pods.changes()
    }

    /// Waits for the first complete list of the node's pods.
    pub async fn ready(&self) {
        self.pods.ready().await;
    }
}

impl PodSource for NodePods {
    fn pending(&self) -> Vec<PendingPod> {
        let mut pods: Vec<PendingPod> = self
            .pods
            .state()
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                phase.is_none_or(|ph| ph == "Pending")
            })
            .filter_map(|p| {
                let value = p.metadata.annotations.as_ref()?.get(DEVICES_ANNOTATION)?;
                let name = format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default()
                );
                match annotation::parse(value) {
                    Ok(devices) => Some(PendingPod {
                        namespace: p.metadata.namespace.clone().unwrap_or_default(),
                        name: p.metadata.name.clone().unwrap_or_default(),
                        created: p
                            .metadata
                            .creation_timestamp
                            .as_ref()
                            .map(|t| t.0.to_string())
                            .unwrap_or_default(),
                        devices,
                    }),
                    Err(e) => {
                        tracing::warn!(pod = %name, error = %e, "ignoring the pod's device choice");
                        None
                    }
                }
            })
            .collect();
        pods.sort_by(|a, b| a.created.cmp(&b.created).then(a.name.cmp(&b.name)));
        pods
    }
}
