//! What the co-location agent leaves on its Node, and the heartbeat that says it is alive.
//!
//! Under pressure the agent taints its Node ([`TAINT_KEY`]) and it publishes batch resources
//! ([`BATCH_CPU`], [`BATCH_MEMORY`]) in the Node status. Both are only right while the agent
//! runs: a dead agent's taint would keep offline pods off the node forever, its batch capacity
//! would be handed out with nobody enforcing it. So the agent renews a heartbeat Lease
//! ([`lease_name`]) and the scheduler extension's leader removes both from a node whose Lease
//! has expired ([`Leftovers`]). The agent writes them, the extension removes them: both read
//! the names from here.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Taint key put on the node under pressure (value `"true"`, effect [`TAINT_EFFECT`]).
pub const TAINT_KEY: &str = "volcano.sh/offline-job-evicting";
/// Effect of the taint: new offline pods are not scheduled, running ones stay.
pub const TAINT_EFFECT: &str = "NoSchedule";
/// Batch CPU resource name (millicores as the quantity's value).
pub const BATCH_CPU: &str = "kubernetes.io/batch-cpu";
/// Batch memory resource name (bytes).
pub const BATCH_MEMORY: &str = "kubernetes.io/batch-memory";

/// Label on every heartbeat Lease (value: the node's name), so the extension watches only them.
pub const HEARTBEAT_LABEL: &str = "fumarole.dev/agent-heartbeat";

/// The heartbeat Lease of `node`'s agent.
pub fn lease_name(node: &str) -> String {
    format!("fumarole-agent-{node}")
}

/// The heartbeat as the agent applies it: held by the node, renewed `now`, owned by the Node
/// (so it goes with the Node).
pub fn heartbeat_lease(
    node: &str,
    node_uid: &str,
    namespace: &str,
    duration_s: i32,
    now: MicroTime,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(node)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(HEARTBEAT_LABEL.into(), node.into())])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid: node_uid.into(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.into()),
            lease_duration_seconds: Some(duration_s),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }),
    }
}

/// The node a heartbeat Lease speaks for and how long it lasts without renewal; `None` for a
/// Lease that is not a heartbeat or lacks either, and for one whose label names another node
/// than its name does (an agent may write only its own node's Lease, checked by name: a label
/// naming a victim must not aim the dead-agent clean-up at it).
pub fn heartbeat_of(lease: &Lease) -> Option<(String, std::time::Duration)> {
    let node = lease.metadata.labels.as_ref()?.get(HEARTBEAT_LABEL)?;
    if lease.metadata.name.as_deref() != Some(lease_name(node).as_str()) {
        return None;
    }
    let seconds = lease.spec.as_ref()?.lease_duration_seconds?;
    let seconds = u64::try_from(seconds).ok().filter(|s| *s > 0)?;
    Some((node.clone(), std::time::Duration::from_secs(seconds)))
}

fn is_ours(t: &Taint) -> bool {
    t.key == TAINT_KEY && t.effect == TAINT_EFFECT
}

/// The merge patch that adds (`want`) or removes our taint from `node`'s taints as read,
/// carrying the resourceVersion read so that a concurrent change of the taints is refused, not
/// overwritten; `None` when the node is already so.
pub fn taint_patch(node: &Node, want: bool) -> Option<Value> {
    let mut taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if taints.iter().any(is_ours) == want {
        return None;
    }
    if want {
        taints.push(Taint {
            key: TAINT_KEY.into(),
            value: Some("true".into()),
            effect: TAINT_EFFECT.into(),
            time_added: None,
        });
    } else {
        taints.retain(|t| !is_ours(t));
    }
    Some(json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": taints},
    }))
}

/// The status merge patch that sets both batch resources (millicores, bytes) in `capacity`
/// and `allocatable`, or with `None` removes both (the kubelet owns the rest of those maps).
pub fn batch_patch(value: Option<(u64, u64)>) -> Value {
    let resources = match value {
        Some((cpu_millis, memory_bytes)) => json!({
            BATCH_CPU: cpu_millis.to_string(),
            BATCH_MEMORY: memory_bytes.to_string(),
        }),
        None => json!({ BATCH_CPU: Value::Null, BATCH_MEMORY: Value::Null }),
    };
    json!({"status": {"capacity": resources, "allocatable": resources}})
}

/// What the agent left on a Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leftovers {
    pub taint: bool,
    /// Either batch resource in `status.capacity` or `status.allocatable`.
    pub batch: bool,
}

impl Leftovers {
    pub fn of(node: &Node) -> Self {
        let taint = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(is_ours));
        let status = node.status.as_ref();
        let batch = [
            status.and_then(|s| s.capacity.as_ref()),
            status.and_then(|s| s.allocatable.as_ref()),
        ]
        .into_iter()
        .flatten()
        .any(|m| m.contains_key(BATCH_CPU) || m.contains_key(BATCH_MEMORY));
        Leftovers { taint, batch }
    }

    pub fn any(self) -> bool {
        self.taint || self.batch
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn leftovers_are_our_taint_and_either_batch_resource() {
        let mut node = Node::default();
        assert!(!Leftovers::of(&node).any());
        node.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: TAINT_KEY.into(),
                effect: "NoExecute".into(),
                ..Taint::default()
            }]),
            ..NodeSpec::default()
        });
        // Same key, another effect: not ours.
        assert!(!Leftovers::of(&node).taint);
        node.spec.as_mut().unwrap().taints.as_mut().unwrap()[0].effect = TAINT_EFFECT.into();
        assert!(Leftovers::of(&node).taint);
        node.status = Some(NodeStatus {
            allocatable: Some(BTreeMap::from([(
                BATCH_MEMORY.into(),
                Quantity("1".into()),
            )])),
            ..NodeStatus::default()
        });
        assert_eq!(
            Leftovers::of(&node),
            Leftovers {
                taint: true,
                batch: true
            }
        );
    }

    #[test]
    fn the_taint_patch_touches_only_our_taint() {
        let mut node = Node::default();
        node.metadata.resource_version = Some("7".into());
        node.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "dedicated".into(),
                effect: TAINT_EFFECT.into(),
                ..Taint::default()
            }]),
            ..NodeSpec::default()
        });
        assert_eq!(taint_patch(&node, false), None);
        let add = taint_patch(&node, true).unwrap();
        assert_eq!(add["metadata"]["resourceVersion"], "7");
        assert_eq!(add["spec"]["taints"][0]["key"], "dedicated");
        assert_eq!(add["spec"]["taints"][1]["key"], TAINT_KEY);
        let tainted: Vec<Taint> = serde_json::from_value(add["spec"]["taints"].clone()).unwrap();
        node.spec.as_mut().unwrap().taints = Some(tainted);
        assert_eq!(taint_patch(&node, true), None);
        let remove = taint_patch(&node, false).unwrap();
        assert_eq!(remove["spec"]["taints"].as_array().unwrap().len(), 1);
        assert_eq!(
            batch_patch(None)["status"]["allocatable"][BATCH_CPU],
            Value::Null
        );
        assert_eq!(
            batch_patch(Some((1500, 2)))["status"]["capacity"][BATCH_CPU],
            "1500"
        );
    }

    #[test]
    fn a_heartbeat_names_its_node_and_duration() {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let lease = heartbeat_lease("n1", "uid-1", "ns", 40, now);
        assert_eq!(lease.metadata.name.as_deref(), Some("fumarole-agent-n1"));
        assert_eq!(
            heartbeat_of(&lease),
            Some(("n1".into(), std::time::Duration::from_secs(40)))
        );
        let owner = &lease.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-1"));
        let mut zero = lease.clone();
        zero.spec.as_mut().unwrap().lease_duration_seconds = Some(0);
        assert_eq!(heartbeat_of(&zero), None);
        let mut aimed = lease.clone();
        aimed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HEARTBEAT_LABEL.into(), "victim".into());
        assert_eq!(heartbeat_of(&aimed), None);
        let mut unlabelled = lease;
        unlabelled.metadata.labels = None;
        assert_eq!(heartbeat_of(&unlabelled), None);
    }
}
