//! Deciders over small made-up clusters, for the tests of this crate.

#![allow(clippy::unwrap_used)]
use super::*;
use fumarole_topology::crd::device_topology::SuperNodeInfo;

/// rack-a: a0, a1; rack-b: b0; 8 free GPUs each.
pub fn decider() -> Decider {
    let dts: Vec<_> = [("a0", "rack-a"), ("a1", "rack-a"), ("b0", "rack-b")]
        .into_iter()
        .map(|(name, rack)| {
            let mut t = fumarole_topology::crd::testing::nvlink_node(name, 8, 10, &[], |i| {
                format!("{name}-g{i}")
            });
            t.spec.super_node = Some(SuperNodeInfo {
                id: rack.into(),
                source: "config".into(),
            });
            t
        })
        .collect();
    let view = ClusterView::build(&dts, &[], &[], &[]).unwrap();
    Decider::new(view, Settings::default())
}

pub fn pod(name: &str, gpus: u32, group: Option<u32>) -> Pod {
    let annotations = group.map_or_else(
        || serde_json::json!({}),
        |g| serde_json::json!({"fumarole.dev/gpu-group-size": g.to_string()}),
    );
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    }))
    .unwrap()
}
