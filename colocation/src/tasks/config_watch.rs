//! The co-location configuration in force for this node, kept current: the ConfigMap
//! `volcano-agent-configuration` (key `colocation-config`, in `--colocation-config-namespace`)
//! and this Node's labels (`volcano.sh/colocation`, `volcano.sh/oversubscription`) and watermark
//! annotations, watched and fed to the [`Resolver`]; the result goes out on a
//! `tokio::sync::watch` channel. A new problem is logged and emitted once as a Warning Event
//! (reason [`INVALID_REASON`]) on the object at fault: the ConfigMap for a bad document, the Node
//! for a bad label or annotation. Start at [`watch`].

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::watch as channel;

use super::report::StatusTx;
use crate::metrics::ColocationMetrics;
use crate::rules::config::{
    CONFIG_KEY, CONFIGMAP_NAME, ConfigState, Document, Fault, Problem, Resolver,
};
use crate::watched::Watched;

/// Event reason for a configuration that was not taken.
pub const INVALID_REASON: &str = "InvalidColocationConfig";

/// Watches the ConfigMap in `namespace` and shares `node`'s watch; the channel holds `None`
/// until both first lists are in, then the configuration in force. The state report learns
/// whether the node takes part and why a configuration was refused.
pub fn watch(
    client: Client,
    namespace: &str,
    node_name: &str,
    node: Arc<Watched<Node>>,
    recorder: Recorder,
    metrics: Arc<ColocationMetrics>,
    status: StatusTx,
) -> channel::Receiver<Option<ConfigState>> {
    let configmaps = Watched::spawn(
        Api::<ConfigMap>::namespaced(client, namespace),
        watcher::Config::default().fields(&format!("metadata.name={CONFIGMAP_NAME}")),
    );
    let (tx, rx) = channel::channel(None);
    let node_name = node_name.to_string();
    let namespace = namespace.to_string();
    tokio::spawn(async move {
        configmaps.ready().await;
        node.ready().await;
        let mut resolver = Resolver::new();
        let mut reported: Option<Problem> = None;
        let (cm_changes, node_changes) = (configmaps.changes(), node.changes());
        loop {
            let cm = configmaps.named(CONFIGMAP_NAME);
            let document = match &cm {
                None => Document::Absent,
                Some(cm) => Document::Present(
                    cm.data
                        .as_ref()
                        .and_then(|d| d.get(CONFIG_KEY))
                        .map(String::as_str),
                ),
            };
            let this_node = node.named(&node_name);
            let meta = this_node.as_ref().map(|n| &n.metadata);
            let empty = BTreeMap::new();
            let labels = meta.and_then(|m| m.labels.as_ref()).unwrap_or(&empty);
            let annotations = meta.and_then(|m| m.annotations.as_ref()).unwrap_or(&empty);
            let state = resolver.resolve(document, labels, annotations);
            metrics.config_valid(state.error.is_none());

            if state.error != reported {
                match &state.error {
                    Some(problem) => {
                        tracing::warn!(error = %problem.message, "co-location config refused");
                        let object = match problem.on {
                            Fault::ConfigMap => cm.as_ref().map(|c| c.object_ref(&())),
                            Fault::Node => this_node.as_ref().map(|n| n.object_ref(&())),
                        };
                        if let Some(object) = object {
                            emit_invalid(&recorder, &object, &problem.message).await;
                        }
                    }
                    None if cm.is_none() => tracing::info!(
                        namespace = %namespace,
                        "co-location config: no ConfigMap {CONFIGMAP_NAME}; built-in defaults"
                    ),
                    None => tracing::info!("co-location config valid again"),
                }
                reported = state.error.clone();
            }
            let mut new_config = false;
            tx.send_if_modified(|current: &mut Option<ConfigState>| {
                new_config = current.as_ref().is_none_or(|c| c.node != state.node);
                if current.as_ref() == Some(&state) {
                    false
                } else {
                    *current = Some(state.clone());
                    true
                }
            });
            if new_config {
                tracing::info!(config = ?state.node, "co-location config in force");
            }
            let error = state.error.as_ref().map(|p| p.message.clone());
            status.send_if_modified(|s| {
                let modified = s.enabled != state.node.colocation || s.config_error != error;
                s.enabled = state.node.colocation;
                s.config_error = error;
                modified
            });
            tokio::select! {
                () = cm_changes.notified() => {}
                () = node_changes.notified() => {}
            }
        }
    });
    rx
}

async fn emit_invalid(recorder: &Recorder, object: &ObjectReference, message: &str) {
    let event = Event {
        type_: EventType::Warning,
        reason: INVALID_REASON.into(),
        // The Events API caps the note at 1 kB.
        note: Some(message.chars().take(1000).collect()),
        action: "LoadColocationConfig".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, object).await {
        tracing::warn!(error = %e, "could not record the Event for the refused co-location config");
    }
}
