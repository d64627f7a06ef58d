//! Volcano `HyperNode` objects (`topology.volcano.sh/v1alpha1`) for the super-nodes, so
//! Volcano's own network-topology-aware scheduling sees the groups the agents found.
//!
//! One HyperNode per published super-node (nodes alone in their group get none): name
//! `fumarole-<super-node id>` (made a valid object name), tier 1, `tierName: super-node`,
//! members the nodes by exact name, label `app.kubernetes.io/managed-by:
//! fumarole-scheduler-ext`. Written by server-side apply; HyperNodes with our label whose
//! super-node is gone are deleted. Others' HyperNodes are never touched.

use std::collections::BTreeMap;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::core::view::ClusterView;
use crate::effects::FIELD_MANAGER;

/// The label marking HyperNodes this service owns.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", FIELD_MANAGER);

/// Tier of a super-node HyperNode (tier 1 groups nodes directly).
pub const TIER: u32 = 1;

/// The HyperNode kind.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "topology.volcano.sh",
        "v1alpha1",
        "HyperNode",
    ))
}

/// A valid object name for a super-node id: lower case, `[a-z0-9.-]`, at most 253 characters,
/// alphanumeric at both ends.
pub fn object_name(super_node: &str) -> String {
    let mut s: String = format!("fumarole-{super_node}")
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(253);
    s.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// HyperNode name -> its member nodes, for the view's published super-nodes.
pub fn desired(view: &ClusterView) -> BTreeMap<String, Vec<String>> {
    view.super_nodes()
        .iter()
        .filter(|(_, nodes)| {
            nodes
                .iter()
                .any(|n| view.node(n).is_some_and(|nv| nv.super_node.is_some()))
        })
        .map(|(sn, nodes)| (object_name(sn), nodes.clone()))
        .collect()
}

/// The object for one HyperNode.
pub fn object(name: &str, super_node_nodes: &[String]) -> DynamicObject {
    let mut o = DynamicObject::new(name, &resource());
    o.metadata.labels = Some([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())].into());
    o.data = json!({
        "spec": {
            "tier": TIER,
            "tierName": "super-node",
            "members": super_node_nodes
                .iter()
                .map(|n| json!({"type": "Node", "selector": {"exactMatch": {"name": n}}}))
                .collect::<Vec<_>>(),
        }
    });
    o
}

/// Publishes `want` (from [`desired`]) unless it is what `last` says was published; `last`
/// then holds what is out there (`None` after a failure, so the next call tries again). Run by
/// the live view's leader after each rebuild.
pub async fn publish(
    client: &kube::Client,
    want: BTreeMap<String, Vec<String>>,
    last: &mut Option<BTreeMap<String, Vec<String>>>,
) {
    if last.as_ref() == Some(&want) {
        return;
    }
    match sync(client, &want).await {
        Ok(()) => {
            tracing::info!(count = want.len(), "HyperNodes published");
            *last = Some(want);
        }
        Err(e) => {
            tracing::warn!(error = %e, "publishing HyperNodes failed; retrying on the next change");
            *last = None;
        }
    }
}

/// Brings the cluster's HyperNodes in line with `want` (from [`desired`]).
pub async fn sync(
    client: &kube::Client,
    want: &BTreeMap<String, Vec<String>>,
) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for (name, nodes) in want {
        let mut o = object(name, nodes);
        o.types = Some(kube::api::TypeMeta {
            api_version: "topology.volcano.sh/v1alpha1".into(),
            kind: "HyperNode".into(),
        });
        api.patch(name, &pp, &Patch::Apply(&o)).await?;
    }
    let ours = api
        .list_metadata(&ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)))
        .await?;
    for o in ours.items {
        if let Some(name) = o.metadata.name
            && !want.contains_key(&name)
        {
            api.delete(&name, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn names_are_valid_object_names() {
        assert_eq!(object_name("rack-a"), "fumarole-rack-a");
        assert_eq!(
            object_name("NVL72/Clique_3:uuid"),
            "fumarole-nvl72-clique-3-uuid"
        );
        assert_eq!(object_name("x!!"), "fumarole-x");
        assert!(object_name(&"a".repeat(400)).len() <= 253);
    }

    #[test]
    fn object_lists_members_by_exact_name() {
        let o = object("fumarole-rack-a", &["a0".into(), "a1".into()]);
        assert_eq!(o.data["spec"]["tier"], 1);
        assert_eq!(
            o.data["spec"]["members"][1]["selector"]["exactMatch"]["name"],
            "a1"
        );
        assert_eq!(o.metadata.labels.unwrap()[MANAGED_BY.0], FIELD_MANAGER);
    }
}
