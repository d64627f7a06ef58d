//! `kubectl fumarole explain POD`: per node, why the pod waits or where it would go.
//!
//! The verdicts are [`crate::decider::Decider::explain`]'s, the ones the extension's filter and prioritize
//! give, over the cluster as one list of each kind reads it now; the table is
//! [`core::explain::table`]'s, with the pod's state (bound, promised, waiting, and what the
//! scheduler last said) after it. `-o wide` adds each node's super-node and free devices.

use anyhow::{Context, Result, bail};
use fumarole_topology::annotation::{self, DEVICES_ANNOTATION, DEVICES_NODE_ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde::Serialize;

use super::config::Connection;
use crate::core::explain::{self as core_explain, Row, num};
use crate::core::request::{DeviceRequest, RequestError};
use crate::core::view::ClusterView;
use crate::decider::{Decider, Settings};
use crate::live;
use crate::protocol::scale;
use crate::text_table as table;

/// Everything `explain` says about one pod.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `namespace/name`.
    pub pod: String,
    pub phase: Option<String>,
    /// `spec.nodeName`.
    pub bound_to: Option<String>,
    /// The node of the pod's `fumarole.dev/devices` choice, when it has one.
    pub devices_node: Option<String>,
    /// The devices in `fumarole.dev/devices`.
    pub devices: Vec<String>,
    /// The message of the pod's `PodScheduled=False` condition (the scheduler's own reason).
    pub scheduler_message: Option<String>,
    pub request: Request,
    /// Best first, as the extension ranks them.
    pub nodes: Vec<NodeRow>,
}

/// What the pod asks for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Request {
    pub resource: String,
    pub count: usize,
}

/// One node's verdict, with where the node sits and how many devices of the pod's resource it
/// has free.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    #[serde(flatten)]
    pub verdict: Row,
    pub super_node: String,
    pub free: u32,
}

/// Reads the pod and the cluster and explains the pod.
pub async fn read(conn: &Connection, name: &str, settings: Settings) -> Result<Explanation> {
    let ns = &conn.namespace;
    let pods: Api<Pod> = Api::namespaced(conn.client.clone(), ns);
    let Some(pod) = pods
        .get_opt(name)
        .await
        .with_context(|| format!("reading pod {ns}/{name}"))?
    else {
        bail!("pod {ns}/{name} not found (no pod {name:?} in namespace {ns:?})");
    };
    let view = live::read_once_with(&conn.client, settings.whole_job_super_pod).await?;
    for w in view.warnings() {
        tracing::warn!("{w}");
    }
    Ok(explain(view, &pod, settings)?)
}

/// The explanation of `pod` in `view`.
pub fn explain(
    view: ClusterView,
    pod: &Pod,
    settings: Settings,
) -> Result<Explanation, RequestError> {
    let decider = Decider::new(view, settings);
    let (req, rows) = decider.explain(pod, scale::shown(decider.scorer()))?;
    let view = decider.view();
    let nodes = rows
        .into_iter()
        .map(|verdict| {
            let nv = view.node(&verdict.node);
            NodeRow {
                super_node: nv.map_or_else(|| verdict.node.clone(), |n| n.group().to_string()),
                free: nv.map_or(0, |n| view.free_mask(n, &req.resource).count_ones()),
                verdict,
            }
        })
        .collect();
    let annotations = pod.metadata.annotations.as_ref();
    let devices: Vec<String> = annotations
        .and_then(|a| a.get(DEVICES_ANNOTATION))
        .and_then(|v| annotation::parse(v).ok())
        .map(|c| c.into_values().flatten().collect())
        .unwrap_or_default();
    let bound_to = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let status = pod.status.as_ref();
    Ok(Explanation {
        pod: req.pod,
        phase: status.and_then(|s| s.phase.clone()),
        // A bound pod's choice is for its node; `devices-node` matters before binding.
        devices_node: annotations
            .and_then(|a| a.get(DEVICES_NODE_ANNOTATION))
            .cloned()
            .or_else(|| bound_to.clone().filter(|_| !devices.is_empty())),
        bound_to,
        devices,
        scheduler_message: status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
            .and_then(|c| c.message.clone()),
        request: Request {
            resource: req.resource,
            count: req.count,
        },
        nodes,
    })
}

/// The table (`wide`: with super-node and free-device columns), then the pod's state.
pub fn table(e: &Explanation, wide: bool) -> String {
    let req = DeviceRequest {
        pod: e.pod.clone(),
        resource: e.request.resource.clone(),
        count: e.request.count,
    };
    let mut out = if wide {
        wide_table(e, &req)
    } else {
        let rows: Vec<Row> = e.nodes.iter().map(|n| n.verdict.clone()).collect();
        core_explain::table(&req, &rows)
    };
    out.push('\n');
    out.push_str(&state(e));
    out
}

fn wide_table(e: &Explanation, req: &DeviceRequest) -> String {
    let mut rows = vec![
        [
            "NODE",
            "SUPER-NODE",
            "FREE",
            "FEASIBLE",
            "Q",
            "LOSS",
            "SCORE",
            "DEVICES / REASON",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for n in &e.nodes {
        let v = &n.verdict;
        rows.push(vec![
            v.node.clone(),
            n.super_node.clone(),
            n.free.to_string(),
            if v.feasible { "yes" } else { "no" }.into(),
            num(v.q, 3),
            num(v.loss, 3),
            num(v.score, 1),
            v.reason.clone().unwrap_or_else(|| v.devices.join(",")),
        ]);
    }
    format!(
        "pod {} requests {} {}\n{}",
        req.pod,
        req.count,
        req.resource,
        table::render(&rows)
    )
}

/// Where the pod is and what that means for the rows above.
fn state(e: &Explanation) -> String {
    let mut out = String::new();
    let devices = e.devices.join(",");
    match (&e.bound_to, &e.devices_node) {
        (Some(node), _) if !e.devices.is_empty() => out.push_str(&format!(
            "Bound to {node} with {devices} ({DEVICES_ANNOTATION}); the rows say where it would go if placed now.\n"
        )),
        (Some(node), _) => out.push_str(&format!(
            "Bound to {node}, no {DEVICES_ANNOTATION} choice; the rows say where it would go if placed now.\n"
        )),
        (None, Some(node)) if !e.devices.is_empty() => out.push_str(&format!(
            "Not bound yet; {devices} promised on {node} ({DEVICES_ANNOTATION}).\n"
        )),
        (None, _) => match e.nodes.iter().find(|n| n.verdict.feasible) {
            Some(best) => out.push_str(&format!(
                "Not bound yet; {} of {} nodes fit, best {} with {}.\n",
                e.nodes.iter().filter(|n| n.verdict.feasible).count(),
                e.nodes.len(),
                best.verdict.node,
                best.verdict.devices.join(",")
            )),
            None => out.push_str(&format!(
                "Waits: no node fits {} {} (0 of {} nodes).\n",
                e.request.count,
                e.request.resource,
                e.nodes.len()
            )),
        },
    }
    if let Some(m) = &e.scheduler_message {
        out.push_str(&format!("Scheduler: {m}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fumarole_topology::crd::device_topology::SuperNodeInfo;
    use fumarole_topology::crd::testing;

    fn view(pods: &[Pod]) -> ClusterView {
        let dts: Vec<_> = [("a0", "rack-a", vec![0, 1, 2, 3]), ("b0", "rack-b", vec![])]
            .into_iter()
            .map(|(name, rack, used)| {
                let mut t = testing::nvlink_node(name, 8, 180, &used, |i| format!("{name}-gpu{i}"));
                t.spec.super_node = Some(SuperNodeInfo {
                    id: rack.into(),
                    source: "config".into(),
                });
                t
            })
            .collect();
        ClusterView::build(&dts, &[], [], pods).unwrap()
    }

    fn pod(name: &str, gpus: u32, extra: serde_json::Value) -> Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
        });
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in extra {
                match v.get_mut(k) {
                    Some(serde_json::Value::Object(o)) => {
                        o.extend(x.as_object().cloned().unwrap_or_default())
                    }
                    _ => {
                        v.insert(k.clone(), x.clone());
                    }
                }
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_pod_that_fits_nowhere_waits() {
        let p = pod(
            "big",
            16,
            serde_json::json!({"status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False",
                "message": "0/2 nodes are available"}]}}),
        );
        let e = explain(view(&[]), &p, Settings::default()).unwrap();
        assert_eq!(e.pod, "ml/big");
        assert!(e.nodes.iter().all(|n| !n.verdict.feasible));
        assert_eq!(
            table(&e, false),
            "\
pod ml/big requests 16 nvidia.com/gpu
NODE  FEASIBLE  Q  LOSS  SCORE  DEVICES / REASON
a0    no        -  -     -      needs 16 nvidia.com/gpu, 4 free
b0    no        -  -     -      needs 16 nvidia.com/gpu, 8 free

Waits: no node fits 16 nvidia.com/gpu (0 of 2 nodes).
Scheduler: 0/2 nodes are available
"
        );
        let wide = table(&e, true);
        assert!(
            wide.contains("NODE  SUPER-NODE  FREE  FEASIBLE  Q  LOSS  SCORE  DEVICES / REASON\n"),
            "{wide}"
        );
        assert!(wide.contains("\na0    rack-a      4     no"), "{wide}");
    }

    #[test]
    fn a_pod_that_fits_names_the_best_node() {
        let e = explain(
            view(&[]),
            &pod("two", 2, serde_json::json!({})),
            Settings::default(),
        )
        .unwrap();
        let text = table(&e, false);
        assert!(
            text.contains("Not bound yet; 2 of 2 nodes fit, best "),
            "{text}"
        );
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["request"]["count"], 2);
        assert_eq!(v["nodes"][0]["feasible"], true);
        assert_eq!(v["nodes"][0]["devices"].as_array().unwrap().len(), 2);
        let keys: Vec<&String> = v["nodes"][0].as_object().unwrap().keys().collect();
        for k in [
            "node",
            "feasible",
            "reason",
            "q",
            "loss",
            "score",
            "devices",
            "superNode",
            "free",
        ] {
            assert!(keys.iter().any(|x| *x == k), "{k} missing: {keys:?}");
        }
    }

    #[test]
    fn a_bound_pod_says_where_and_with_what() {
        let p = pod(
            "run",
            2,
            serde_json::json!({
                "metadata": {"annotations": {
                    DEVICES_ANNOTATION: r#"{"nvidia.com/gpu":["b0-gpu0","b0-gpu1"]}"#}},
                "spec": {"nodeName": "b0"},
                "status": {"phase": "Running"}}),
        );
        let e = explain(view(std::slice::from_ref(&p)), &p, Settings::default()).unwrap();
        assert_eq!(e.bound_to.as_deref(), Some("b0"));
        assert_eq!(e.devices_node.as_deref(), Some("b0"));
        assert_eq!(e.devices, ["b0-gpu0", "b0-gpu1"]);
        let b0 = e.nodes.iter().find(|n| n.verdict.node == "b0").unwrap();
        assert_eq!(b0.free, 6, "its own devices count as used");
        let text = table(&e, false);
        assert!(
            text.contains("Bound to b0 with b0-gpu0,b0-gpu1 (fumarole.dev/devices)"),
            "{text}"
        );
    }

    #[test]
    fn a_pod_without_accelerators_is_an_error() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ml"},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .unwrap();
        let e = explain(view(&[]), &p, Settings::default()).unwrap_err();
        assert!(e.to_string().contains("requests no accelerator"), "{e}");
    }
}
