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
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
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
/// Lease that is not a heartbeat or lacks either.
pub fn heartbeat_of(lease: &Lease) -> Option<(String, std::time::Duration)> {
    let node = lease.metadata.labels.as_ref()?.get(HEARTBEAT_LABEL)?;
    let seconds = lease.spec.as_ref()?.lease_duration_seconds?;
    let seconds = u64::try_from(seconds).ok().filter(|s| *s > 0)?;
    Some((node.clone(), std::time::Duration::from_secs(seconds)))
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
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t.key == TAINT_KEY && t.effect == TAINT_EFFECT)
            });
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
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Taint};
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
        let mut unlabelled = lease;
        unlabelled.metadata.labels = None;
        assert_eq!(heartbeat_of(&unlabelled), None);
    }
}
