//! The co-location configuration in force for this node, kept current.
//!
//! Inputs: the ConfigMap `volcano-agent-configuration` (key `colocation-config`, in
//! `--colocation-config-namespace`) and this Node's labels (`volcano.sh/colocation`,
//! `volcano.sh/oversubscription`) and watermark annotations. [`Resolver`] is the pure part: it
//! turns each change into the [`NodeConfig`] in force, keeping the last good document and the
//! last good node configuration when a change is invalid. [`watch`] feeds it from watches and
//! publishes the result on a `tokio::sync::watch` channel; a new problem is logged and emitted
//! once as a Warning Event (reason [`INVALID_REASON`]) on the object at fault: the ConfigMap
//! for a bad document, the Node for a bad label or annotation.
//!
//! Without the ConfigMap the built-in defaults (volcano-agent's) apply; a ConfigMap without the
//! key is a problem, not an empty configuration, since it is most likely a typo.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::watch as channel;

use super::StatusTx;
use crate::qos::config::{self as qos_config, CONFIG_KEY, CONFIGMAP_NAME, NodeConfig};
use crate::watched::Watched;
use fumarole_exporter::publish::metrics::Metrics;

/// Event reason for a configuration that was not taken.
pub const INVALID_REASON: &str = "InvalidColocationConfig";

/// The configuration in force and, while a newer one is refused, why.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigState {
    pub node: NodeConfig,
    pub error: Option<Problem>,
}

/// A refused configuration: which object is at fault and the message (for the Event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub on: Fault,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    ConfigMap,
    Node,
}

/// What the ConfigMap watch shows.
#[derive(Clone, Copy, Debug)]
pub enum Document<'a> {
    /// No ConfigMap: built-in defaults.
    Absent,
    /// The ConfigMap exists; `None` when it lacks [`CONFIG_KEY`].
    Present(Option<&'a str>),
}

/// Turns inputs into the configuration in force; see the module docs.
#[derive(Debug, Default)]
pub struct Resolver {
    document: qos_config::VolcanoAgentConfig,
    node: Option<NodeConfig>,
    warnings: Vec<String>,
}

impl Resolver {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn resolve(
        &mut self,
        document: Document<'_>,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> ConfigState {
        let mut error = None;
        match document {
            Document::Absent => self.document = qos_config::VolcanoAgentConfig::default(),
            Document::Present(None) => {
                error = Some(Problem {
                    on: Fault::ConfigMap,
                    message: format!(
                        "ConfigMap {CONFIGMAP_NAME} has no key {CONFIG_KEY}; keeping the last good configuration"
                    ),
                });
            }
            Document::Present(Some(text)) => match qos_config::parse(text) {
                Ok(parsed) => {
                    if parsed.warnings != self.warnings {
                        for warning in &parsed.warnings {
                            tracing::warn!(warning = %warning, "co-location config: ignored");
                        }
                        self.warnings = parsed.warnings;
                    }
                    self.document = parsed.config;
                }
                Err(e) => {
                    error = Some(Problem {
                        on: Fault::ConfigMap,
                        message: format!("{e}; keeping the last good configuration"),
                    });
                }
            },
        }
        match qos_config::effective(&self.document, labels, annotations) {
            Ok(node) => self.node = Some(node),
            Err(e) => {
                // A document error was already reported and the last good document is valid, so
                // this one comes from the node's labels or annotations.
                error.get_or_insert(Problem {
                    on: Fault::Node,
                    message: format!("{e}; keeping the last good configuration"),
                });
            }
        }
        ConfigState {
            node: self.node.clone().unwrap_or_default(),
            error,
        }
    }
}

/// Watches the ConfigMap in `namespace` and shares `node`'s watch; the channel holds `None`
/// until both first lists are in, then the configuration in force. The state report learns
/// whether the node takes part and why a configuration was refused.
pub fn watch(
    client: Client,
    namespace: &str,
    node_name: &str,
    node: Arc<Watched<Node>>,
    recorder: Recorder,
    metrics: Arc<Metrics>,
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
            metrics
                .colocation_node()
                .config_valid(state.error.is_none());

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn labels(colocation: bool) -> BTreeMap<String, String> {
        BTreeMap::from([(
            qos_config::COLOCATION_LABEL.to_string(),
            colocation.to_string(),
        )])
    }

    #[test]
    fn the_readme_example_is_valid() {
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let section = &readme[readme.find("### Configuration").unwrap()..];
        let start = section.find("```json\n").unwrap() + "```json\n".len();
        let json = &section[start..start + section[start..].find("```").unwrap()];
        let parsed = qos_config::parse(json).unwrap();
        assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
        let node = qos_config::effective(
            &parsed.config,
            &BTreeMap::from([
                ("pool".to_string(), "gpu".to_string()),
                (qos_config::COLOCATION_LABEL.to_string(), "true".to_string()),
            ]),
            &BTreeMap::new(),
        )
        .unwrap();
        assert!(node.cpu_qos && node.cpu_burst && !node.memory_qos);
        assert_eq!(node.eviction.cpu.high, 90);
    }

    #[test]
    fn invalid_changes_keep_the_last_good_configuration() {
        let mut r = Resolver::new();
        let none = BTreeMap::new();
        let defaults = r.resolve(Document::Absent, &labels(true), &none);
        assert!(defaults.error.is_none());
        assert!(!defaults.node.cpu_qos);

        let on = r#"{"globalConfig": {"cpuQosConfig": {"enable": true}}}"#;
        let good = r.resolve(Document::Present(Some(on)), &labels(true), &none);
        assert!(good.error.is_none());
        assert!(good.node.cpu_qos);

        let bad = r.resolve(
            Document::Present(Some(
                r#"{"globalConfig": {"cpuQosConfig": {"enable": "yes"}}}"#,
            )),
            &labels(true),
            &none,
        );
        assert_eq!(bad.node, good.node);
        let problem = bad.error.unwrap();
        assert_eq!(problem.on, Fault::ConfigMap);
        assert!(
            problem.message.contains("globalConfig.cpuQosConfig.enable"),
            "{}",
            problem.message
        );

        // A missing key is a problem too, not an empty configuration.
        let missing = r.resolve(Document::Present(None), &labels(true), &none);
        assert_eq!(missing.node, good.node);
        assert!(missing.error.unwrap().message.contains(CONFIG_KEY));

        // A bad node annotation: the node is at fault, the document stays as it was.
        let annotations = BTreeMap::from([(
            qos_config::CPU_HIGH_WATERMARK_ANNOTATION.to_string(),
            "eighty".to_string(),
        )]);
        let bad_node = r.resolve(Document::Present(Some(on)), &labels(true), &annotations);
        assert_eq!(bad_node.node, good.node);
        assert_eq!(bad_node.error.unwrap().on, Fault::Node);

        // The label goes: co-location off, from the good document.
        let off = r.resolve(Document::Present(Some(on)), &labels(false), &none);
        assert!(off.error.is_none());
        assert!(!off.node.colocation && !off.node.cpu_qos);
    }
}
