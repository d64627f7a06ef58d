//! The Volcano `extender` plugin's verbs: `predicate`, `prioritize`, `onSessionOpen`,
//! `onSessionClose`, under the route prefix [`VOLCANO_PREFIX`].
//!
//! Wire format (Volcano v1.10 `pkg/scheduler/plugins/extender/argument.go`; see
//! `../shared/reference/wire-contracts.md`, section 4): `predicate` gets
//! `{"task": TaskInfo, "node": NodeInfo}` and answers `{"status": "<reason>", "code": n}`
//! (0 Success, 2 Unschedulable, 3 UnschedulableAndUnresolvable); `prioritize` gets
//! `{"task", "nodes": [NodeInfo]}` and answers `{"nodeScore": {node: 0..100·weight},
//! "errorMessage": ""}`. `TaskInfo` and `NodeInfo` are Volcano's internal structs with Go field
//! names; only `TaskInfo.Pod` and `NodeInfo.Name` are read, everything else is ignored.
//!
//! Nodes that cannot hold the task's devices get code 2 (devices may free up); unknown nodes
//! and requests no node can ever satisfy (unknown resource, bad quantity) get code 3. Tasks
//! without an accelerator request pass everywhere with score 0.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::request::{RequestError, device_request};
use crate::score::gpu_aware::GpuAware;
use crate::view::ClusterView;

/// Route prefix of the Volcano verbs (`extender.urlPrefix` is `http://HOST:PORT/volcano`).
pub const VOLCANO_PREFIX: &str = "/volcano";

/// Volcano's `api.Status` codes.
pub mod code {
    pub const SUCCESS: i32 = 0;
    pub const ERROR: i32 = 1;
    pub const UNSCHEDULABLE: i32 = 2;
    pub const UNSCHEDULABLE_AND_UNRESOLVABLE: i32 = 3;
}

/// The part of Volcano's `TaskInfo` we read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TaskInfo {
    #[serde(rename = "Pod", default)]
    pub pod: Option<Pod>,
}

/// The part of Volcano's `NodeInfo` we read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeInfo {
    #[serde(rename = "Name", default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PredicateRequest {
    #[serde(default)]
    pub task: Option<TaskInfo>,
    #[serde(default)]
    pub node: Option<NodeInfo>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredicateResponse {
    /// Volcano reads this as the failure reason; empty means the node fits.
    pub status: String,
    pub code: i32,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PrioritizeRequest {
    #[serde(default)]
    pub task: Option<TaskInfo>,
    #[serde(default)]
    pub nodes: Option<Vec<NodeInfo>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrioritizeResponse {
    pub node_score: BTreeMap<String, f64>,
    pub error_message: String,
}

fn task_pod(task: Option<&TaskInfo>) -> Option<&Pod> {
    task.and_then(|t| t.pod.as_ref())
}

/// The `predicate` verb.
pub fn predicate(view: &ClusterView, g: &GpuAware, req: &PredicateRequest) -> PredicateResponse {
    let Some(pod) = task_pod(req.task.as_ref()) else {
        return PredicateResponse {
            status: "predicate request has no task.Pod".into(),
            code: code::ERROR,
        };
    };
    let Some(node) = req.node.as_ref().filter(|n| !n.name.is_empty()) else {
        return PredicateResponse {
            status: "predicate request has no node.Name".into(),
            code: code::ERROR,
        };
    };
    let dreq = match device_request(pod, &view.resources()) {
        Ok(r) => r,
        Err(RequestError::NoAccelerator { .. }) => return PredicateResponse::default(),
        Err(e) => {
            return PredicateResponse {
                status: e.to_string(),
                code: code::UNSCHEDULABLE_AND_UNRESOLVABLE,
            };
        }
    };
    let v = g.node(view, &node.name, &dreq);
    match v.reason {
        None => PredicateResponse::default(),
        Some(reason) => {
            let unresolvable = view.node(&node.name).is_none_or(|n| !n.has_topology);
            PredicateResponse {
                status: reason,
                code: if unresolvable {
                    code::UNSCHEDULABLE_AND_UNRESOLVABLE
                } else {
                    code::UNSCHEDULABLE
                },
            }
        }
    }
}

/// The `prioritize` verb: `raw · 100 · weight` per node, 0 where the task does not fit or
/// asks for no accelerator.
pub fn prioritize(view: &ClusterView, g: &GpuAware, req: &PrioritizeRequest) -> PrioritizeResponse {
    let Some(pod) = task_pod(req.task.as_ref()) else {
        return PrioritizeResponse {
            node_score: BTreeMap::new(),
            error_message: "prioritize request has no task.Pod".into(),
        };
    };
    let dreq = device_request(pod, &view.resources()).ok();
    let node_score = req
        .nodes
        .iter()
        .flatten()
        .map(|n| {
            let score = dreq
                .as_ref()
                .and_then(|r| g.node(view, &n.name, r).raw)
                .map_or(0.0, |raw| g.volcano(raw));
            (n.name.clone(), score)
        })
        .collect();
    PrioritizeResponse {
        node_score,
        error_message: String::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::path::Path;

    fn view() -> ClusterView {
        crate::snapshot::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx"),
        )
        .unwrap()
    }

    fn task(gpus: &str) -> serde_json::Value {
        serde_json::json!({
            "UID": "u", "Name": "t", "Namespace": "default", "Resreq": {"MilliCPU": 1000},
            "Pod": {"metadata": {"name": "t"}, "spec": {"containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}
        })
    }

    #[test]
    fn predicate_codes() {
        let (v, g) = (view(), GpuAware::default());
        let ask = |gpus: &str, node: &str| {
            let r: PredicateRequest = serde_json::from_value(serde_json::json!({
                "task": task(gpus), "node": {"Name": node, "Idle": {"MilliCPU": 1}}
            }))
            .unwrap();
            predicate(&v, &g, &r)
        };
        assert_eq!(ask("4", "dgx-a"), PredicateResponse::default());
        assert_eq!(
            ask("4", "pcie-a"),
            PredicateResponse {
                status: "needs 4 nvidia.com/gpu, 3 free".into(),
                code: code::UNSCHEDULABLE
            }
        );
        assert_eq!(ask("4", "ghost").code, code::UNSCHEDULABLE_AND_UNRESOLVABLE);
        assert_eq!(ask("4", "cpu-0").code, code::UNSCHEDULABLE_AND_UNRESOLVABLE);
        assert_eq!(ask("x", "dgx-a").code, code::UNSCHEDULABLE_AND_UNRESOLVABLE);
        let no_pod: PredicateRequest =
            serde_json::from_value(serde_json::json!({"node": {"Name": "dgx-a"}})).unwrap();
        assert_eq!(predicate(&v, &g, &no_pod).code, code::ERROR);
    }

    #[test]
    fn prioritize_scores_on_volcano_scale() {
        let v = view();
        let g = GpuAware {
            weight: 2.0,
            loss_weight: 1.0,
        };
        let r: PrioritizeRequest = serde_json::from_value(serde_json::json!({
            "task": task("4"),
            "nodes": [{"Name": "dgx-a"}, {"Name": "dgx-b"}, {"Name": "pcie-a"}]
        }))
        .unwrap();
        let resp = prioritize(&v, &g, &r);
        assert_eq!(resp.error_message, "");
        assert_eq!(resp.node_score["dgx-a"], 200.0);
        assert_eq!(resp.node_score["dgx-b"], 150.0);
        assert_eq!(resp.node_score["pcie-a"], 0.0);
        let json = serde_json::to_value(&resp).unwrap();
        assert!(json.get("nodeScore").is_some() && json.get("errorMessage").is_some());
    }
}
