//! The configuration in force for one node across changes. Inputs: the ConfigMap
//! `volcano-agent-configuration` (key `colocation-config`) as its watch shows it ([`Document`])
//! and the Node's labels and annotations. [`Resolver`] turns each change into the
//! [`NodeConfig`] in force, keeping the last good document and the last good node configuration
//! when a change is invalid, and says which object is at fault ([`Problem`]) so that the caller
//! can report it there.
//!
//! Without the ConfigMap the built-in defaults (volcano-agent's) apply; a ConfigMap without the
//! key is a problem, not an empty configuration, since it is most likely a typo.

use std::collections::BTreeMap;

use super::keys::{CONFIG_KEY, CONFIGMAP_NAME};
use super::merge::effective;
use super::parse::parse;
use super::settings::NodeConfig;
use super::wire::VolcanoAgentConfig;

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
    document: VolcanoAgentConfig,
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
            Document::Absent => self.document = VolcanoAgentConfig::default(),
            Document::Present(None) => {
                error = Some(Problem {
                    on: Fault::ConfigMap,
                    message: format!(
                        "ConfigMap {CONFIGMAP_NAME} has no key {CONFIG_KEY}; keeping the last good configuration"
                    ),
                });
            }
            Document::Present(Some(text)) => match parse(text) {
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
        match effective(&self.document, labels, annotations) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::rules::config::keys::{COLOCATION_LABEL, CPU_HIGH_WATERMARK_ANNOTATION};

    fn labels(colocation: bool) -> BTreeMap<String, String> {
        BTreeMap::from([(COLOCATION_LABEL.to_string(), colocation.to_string())])
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
            CPU_HIGH_WATERMARK_ANNOTATION.to_string(),
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
