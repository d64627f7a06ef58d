//! What the view reads of one pod, taken once per version of the pod ([`PodFacts::of`]).
//!
//! The live view keeps these instead of the pods: a k8s-openapi `Pod` takes over 4 KiB of
//! memory even trimmed (its structs hold every optional field inline), the facts of a bound
//! pod a few hundred bytes; and a view rebuilt after one pod changed reads only that pod anew.
//! A pod not bound yet is also kept whole ([`PodFacts::unbound`]): the verbs and the UI
//! evaluate it.

use std::sync::Arc;

use fumarole_topology::annotation::{self, DEVICES_ANNOTATION, DEVICES_NODE_ANNOTATION};
use k8s_openapi::api::core::v1::Pod;

use crate::core::request::{RequestFacts, pod_key};
use crate::core::unit::UnitFacts;

/// What the view reads of one pod.
#[derive(Clone, Debug)]
pub struct PodFacts {
    /// `namespace/name` (shared: the view's indexes hold it without copying).
    pub key: Arc<str>,
    pub uid: Option<String>,
    /// `spec.nodeName`.
    pub node: Option<Arc<str>>,
    pub scheduler: Option<String>,
    /// Phase `Succeeded` or `Failed`.
    pub finished: bool,
    /// A deletion timestamp is set.
    pub deleting: bool,
    /// The node the devices were chosen on (`fumarole.dev/devices-node`).
    pub choice_node: Option<Arc<str>>,
    /// The device ids of `fumarole.dev/devices`, or why they cannot be read.
    pub choice: Option<Result<Vec<String>, String>>,
    pub request: RequestFacts,
    pub unit: UnitFacts,
    /// The pod itself, while it is not bound.
    pub unbound: Option<Arc<Pod>>,
    /// Why the defragmentation advisor may not move the pod ([`movability`]); `None`: it may.
    pub pinned: Option<String>,
}

/// Pod annotation: `never` keeps the defragmentation advisor from moving the pod.
pub const DEFRAG_ANNOTATION: &str = "fumarole.dev/defrag";

/// Why moving `pod` elsewhere is not an option, or `None` when it is: a pod marked
/// `fumarole.dev/defrag: never`; a pod no controller owns (deleting it loses it for good); a
/// DaemonSet's or a static pod (owned by a Node), which belong to their node.
pub fn movability(pod: &Pod) -> Option<String> {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEFRAG_ANNOTATION))
        .is_some_and(|v| v.trim() == "never")
    {
        return Some(format!("{DEFRAG_ANNOTATION}: never"));
    }
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    match owner {
        None => Some("no controller would recreate it".into()),
        Some(o) if o.kind == "DaemonSet" || o.kind == "Node" => {
            Some(format!("owned by {} {}: bound to its node", o.kind, o.name))
        }
        Some(_) => None,
    }
}

impl PodFacts {
    pub fn of(pod: &Pod) -> Self {
        let key = pod_key(pod);
        let annotations = pod.metadata.annotations.as_ref();
        let choice = annotations
            .and_then(|a| a.get(DEVICES_ANNOTATION))
            .map(|v| {
                annotation::parse(v)
                    .map(|c| c.into_values().flatten().collect())
                    .map_err(|e| format!("pod {key}: {e}"))
            });
        let spec = pod.spec.as_ref();
        let node = spec.and_then(|s| s.node_name.as_deref()).map(Arc::from);
        PodFacts {
            uid: pod.metadata.uid.clone(),
            scheduler: spec.and_then(|s| s.scheduler_name.clone()),
            finished: matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            choice_node: annotations
                .and_then(|a| a.get(DEVICES_NODE_ANNOTATION))
                .map(|n| Arc::from(n.as_str())),
            choice,
            request: RequestFacts::of(pod),
            unit: UnitFacts::of(pod),
            unbound: node.is_none().then(|| Arc::new(pod.clone())),
            pinned: movability(pod),
            node,
            key: key.into(),
        }
    }

    /// True when the pod is bound and carries a choice of devices made for its node.
    pub fn annotated(&self) -> bool {
        self.node.is_some()
            && self.choice.is_some()
            && self
                .choice_node
                .as_ref()
                .is_none_or(|n| Some(n) == self.node.as_ref())
    }
}
