//! The Volcano `extender` plugin's verbs: `predicate`, `prioritize`, `allocateFunc`,
//! `deallocateFunc`, `onSessionOpen`, `onSessionClose`, under the route prefix
//! [`VOLCANO_PREFIX`].
//!
//! Wire format (Volcano v1.10 `pkg/scheduler/plugins/extender/argument.go`; see
//! `../shared/reference/wire-contracts.md`, section 4): `predicate` gets
//! `{"task": TaskInfo, "node": NodeInfo}` and answers `{"status": "<reason>", "code": n}`
//! (0 Success, 2 Unschedulable, 3 UnschedulableAndUnresolvable); `prioritize` gets
//! `{"task", "nodes": [NodeInfo]}` and answers `{"nodeScore": {node: 0..100·weight},
//! "errorMessage": ""}`. `TaskInfo` and `NodeInfo` are Volcano's internal structs with Go field
//! names; only `TaskInfo.Pod`, `TaskInfo.NodeName` and `NodeInfo.Name` are read, everything
//! else is ignored. `allocateFunc` / `deallocateFunc` get `{"task": TaskInfo}` and answer
//! `{"errorMessage": ""}`: allocate commits the task's devices on `TaskInfo.NodeName` and
//! writes them on the pod (live mode), deallocate releases them and removes the annotation.
//! Volcano versions before these verbs existed (v1.10, which the e2e tests run) bind without
//! telling us; [`crate::live`] then annotates the bound pod afterwards. A body that is not
//! valid JSON of the verb's request gets 400 and a message.
//!
//! Nodes that cannot hold the task's devices get code 2 (devices may free up); unknown nodes
//! and requests no node can ever satisfy (unknown resource, bad quantity) get code 3. Tasks
//! without an accelerator request pass everywhere with score 0.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::Response;
use axum::routing::post;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::core::request::{RequestError, pod_key};
use crate::decider::Asker;
use crate::effects::PodCheckError;
use crate::protocol::{bad_request, json_response, scale};
use crate::service::Service;

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
    /// The node the task is allocated to (`allocateFunc`).
    #[serde(rename = "NodeName", default)]
    pub node_name: String,
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

/// `allocateFunc` / `deallocateFunc` request.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct EventHandlerRequest {
    #[serde(default)]
    pub task: Option<TaskInfo>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventHandlerResponse {
    pub error_message: String,
}

/// The `predicate` verb.
pub fn predicate(svc: &Service, req: &PredicateRequest) -> PredicateResponse {
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
    let verdict = match svc.evaluate(pod, std::slice::from_ref(&node.name), Asker::Volcano) {
        Ok(mut v) => v.pop(),
        Err(RequestError::NoAccelerator { .. }) => return PredicateResponse::default(),
        Err(e) => {
            return PredicateResponse {
                status: e.to_string(),
                code: code::UNSCHEDULABLE_AND_UNRESOLVABLE,
            };
        }
    };
    let reason = verdict.and_then(|v| v.reason());
    tracing::debug!(pod = %pod_key(pod), node = %node.name, reason = ?reason, "Volcano predicate");
    match reason {
        None => PredicateResponse::default(),
        Some(reason) => {
            let view = svc.decider().view();
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
pub fn prioritize(svc: &Service, req: &PrioritizeRequest) -> PrioritizeResponse {
    let Some(pod) = task_pod(req.task.as_ref()) else {
        return PrioritizeResponse {
            node_score: BTreeMap::new(),
            error_message: "prioritize request has no task.Pod".into(),
        };
    };
    let names: Vec<String> = req.nodes.iter().flatten().map(|n| n.name.clone()).collect();
    let verdicts = svc
        .evaluate(pod, &names, Asker::Volcano)
        .unwrap_or_default();
    let weight = svc.decider().scorer().weight;
    let node_score: BTreeMap<String, f64> = names
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let score = verdicts
                .get(i)
                .and_then(|v| v.raw)
                .map_or(0.0, |raw| scale::volcano(raw, weight));
            (n, score)
        })
        .collect();
    tracing::debug!(pod = %pod_key(pod), scores = ?node_score, "Volcano prioritize");
    if !verdicts.is_empty() {
        svc.record_decision(pod, Arc::new(verdicts));
    }
    PrioritizeResponse {
        node_score,
        error_message: String::new(),
    }
}

/// `allocateFunc`: the task is allocated to `TaskInfo.NodeName`; commit its devices and, in
/// live mode, write them on the pod. The pod is re-read from the API server (the body's copy
/// is never trusted): a pod that does not exist, has another uid, belongs to another
/// scheduler or is already bound is refused. Group placement refuses nothing here (the
/// allocation stands either way); while these calls come, Volcano's plans may lapse
/// ([`Asker::Volcano`]).
pub async fn allocate(svc: &Service, req: &EventHandlerRequest) -> EventHandlerResponse {
    let task = req.task.as_ref();
    let Some(claimed) = task_pod(task) else {
        return EventHandlerResponse {
            error_message: "allocateFunc request has no task.Pod".into(),
        };
    };
    let node = task
        .map(|t| t.node_name.as_str())
        .filter(|n| !n.is_empty())
        .or_else(|| claimed.spec.as_ref().and_then(|s| s.node_name.as_deref()));
    let Some(node) = node else {
        return EventHandlerResponse {
            error_message: "allocateFunc request has no task.NodeName".into(),
        };
    };
    svc.decider().allocate_func_called();
    let (ns, name) = ns_name(claimed);
    let live = unbound_pod(svc, &ns, &name, claimed).await;
    let error_message = match live {
        Err(e) => e.to_string(),
        Ok(live) => {
            let pod = live.as_ref().unwrap_or(claimed);
            match svc.assign(pod, node).await {
                Ok(_) => String::new(),
                // A Volcano session goes on with the allocation whatever its event handlers do
                // (v1.10's `Statement.Allocate` fires them and reads no answer), so the pod goes
                // to `node` anyway: record it there, or its unit's next pod would be planned
                // without it and the unit split.
                Err(e) if e.is_placement() => {
                    tracing::warn!(pod = %pod_key(pod), node, refusal = %e,
                        "allocateFunc against group placement: Volcano allocates the pod there anyway; recorded there");
                    match svc.assign_bound(pod, node).await {
                        Ok(_) => String::new(),
                        Err(e) => e.to_string(),
                    }
                }
                Err(e) => e.to_string(),
            }
        }
    };
    if !error_message.is_empty() {
        tracing::warn!(pod = %pod_key(claimed), node, error = %error_message, "allocateFunc refused");
    }
    EventHandlerResponse { error_message }
}

/// `deallocateFunc`: the allocation was undone; release the devices and the annotation. A pod
/// that still exists must be the one named (uid), ours and not bound (Volcano also calls this
/// for a running pod it evicts: its devices are freed when it ends, as the pod watch sees);
/// a deleted one only loses its commit.
pub async fn deallocate(svc: &Service, req: &EventHandlerRequest) -> EventHandlerResponse {
    let Some(claimed) = task_pod(req.task.as_ref()) else {
        return EventHandlerResponse {
            error_message: "deallocateFunc request has no task.Pod".into(),
        };
    };
    let (ns, name) = ns_name(claimed);
    let live = unbound_pod(svc, &ns, &name, claimed).await;
    let exists = match live {
        Ok(_) => true,
        Err(PodCheckError::Unknown { .. }) => false,
        Err(e) => {
            tracing::warn!(pod = %pod_key(claimed), error = %e, "deallocateFunc refused");
            return EventHandlerResponse {
                error_message: e.to_string(),
            };
        }
    };
    if svc.decider().release(&pod_key(claimed)).is_none() {
        return EventHandlerResponse::default();
    }
    let mut error_message = String::new();
    if exists
        && let Some(ops) = svc.effects()
        && let Err(e) = ops.annotate(&ns, &name, None).await
    {
        error_message = format!("removing the annotation of pod {ns}/{name}: {e}");
        tracing::warn!(error = %error_message, "deallocateFunc");
    }
    EventHandlerResponse { error_message }
}

/// The pod `claimed` names, re-read and checked ([`Service::checked_pod`]), unless it is
/// already bound: `allocateFunc` and `deallocateFunc` come before a bind.
async fn unbound_pod(
    svc: &Service,
    ns: &str,
    name: &str,
    claimed: &Pod,
) -> Result<Option<Pod>, PodCheckError> {
    svc.checked_pod(ns, name, claimed.metadata.uid.as_deref())
        .await
        .and_then(|live| live.map(PodCheckError::unbound).transpose())
}

fn ns_name(pod: &Pod) -> (String, String) {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The 400 answer to a body that is not the verb's request.
fn malformed(verb: &str, e: &serde_json::Error) -> Response {
    bad_request("volcano", &format!("malformed Volcano {verb} request: {e}"))
}

async fn predicate_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&predicate(&svc, &req)),
        Err(e) => malformed("predicate", &e),
    }
}

async fn prioritize_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&prioritize(&svc, &req)),
        Err(e) => malformed("prioritize", &e),
    }
}

async fn allocate_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&allocate(&svc, &req).await),
        Err(e) => malformed("allocateFunc", &e),
    }
}

async fn deallocate_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&deallocate(&svc, &req).await),
        Err(e) => malformed("deallocateFunc", &e),
    }
}

/// `onSessionOpen` / `onSessionClose`: Volcano ignores the answer; nothing to do.
async fn session_handler() -> Response {
    json_response(&serde_json::json!({}))
}

/// Largest `prioritize` body: a `NodeInfo` (with the node's tasks) per candidate node.
pub const PRIORITIZE_LIMIT: usize = 64 << 20;
/// Largest `predicate` body: one `TaskInfo` and one `NodeInfo`.
pub const PREDICATE_LIMIT: usize = 8 << 20;
/// Largest `allocateFunc` / `deallocateFunc` body: one `TaskInfo`.
pub const TASK_LIMIT: usize = 4 << 20;

/// The routes of this protocol, under [`VOLCANO_PREFIX`], each with its body limit (the
/// session verbs read no body).
pub fn routes() -> Router<Arc<Service>> {
    let at = |verb: &str| format!("{VOLCANO_PREFIX}/{verb}");
    let limit = DefaultBodyLimit::max;
    Router::new()
        .route(
            &at("predicate"),
            post(predicate_handler).layer(limit(PREDICATE_LIMIT)),
        )
        .route(
            &at("prioritize"),
            post(prioritize_handler).layer(limit(PRIORITIZE_LIMIT)),
        )
        .route(
            &at("allocateFunc"),
            post(allocate_handler).layer(limit(TASK_LIMIT)),
        )
        .route(
            &at("deallocateFunc"),
            post(deallocate_handler).layer(limit(TASK_LIMIT)),
        )
        .route(&at("onSessionOpen"), post(session_handler))
        .route(&at("onSessionClose"), post(session_handler))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::core::score::Scoring;
    use std::path::Path;

    fn service(g: Scoring) -> Service {
        let view = crate::snapshot::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx"),
        )
        .unwrap();
        Service::new(view, g)
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
        let svc = service(Scoring::default());
        let ask = |gpus: &str, node: &str| {
            let r: PredicateRequest = serde_json::from_value(serde_json::json!({
                "task": task(gpus), "node": {"Name": node, "Idle": {"MilliCPU": 1}}
            }))
            .unwrap();
            predicate(&svc, &r)
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
        assert_eq!(predicate(&svc, &no_pod).code, code::ERROR);
    }

    /// Volcano's allocation stands whatever `allocateFunc` answers. When it allocates a unit's
    /// pod outside the super-node planned for the unit (the plan moved after the predicate,
    /// or a failover lost it), the pod is recorded where it went, the plan follows it, and
    /// the unit's next pod is kept there: the unit is not split, and the super-node it left
    /// holds no reservation for it.
    #[tokio::test]
    async fn a_pod_allocated_outside_its_plan_holds_its_unit_where_it_went() {
        use crate::decider::testing::{decider, pod};
        let svc = Service::over(decider());
        let ask = |p: &Pod, node: &str| {
            let r: PredicateRequest = serde_json::from_value(serde_json::json!({
                "task": {"Pod": p}, "node": {"Name": node}
            }))
            .unwrap();
            predicate(&svc, &r)
        };
        // A unit of two 4-GPU pods (gpu-group-size 8): planned on rack-b (best fit: its 8
        // GPUs are just enough).
        let (first, second) = (pod("job-0", 4, Some(8)), pod("job-1", 4, Some(8)));
        assert_eq!(ask(&first, "b0"), PredicateResponse::default());
        assert_eq!(ask(&first, "a0").code, code::UNSCHEDULABLE);
        // Volcano allocates it to a0 (rack-a) all the same.
        let req: EventHandlerRequest = serde_json::from_value(serde_json::json!({
            "task": {"Pod": first, "NodeName": "a0"}
        }))
        .unwrap();
        assert_eq!(allocate(&svc, &req).await, EventHandlerResponse::default());
        assert_eq!(
            svc.decider().ledger().commit_of("ml/job-0").unwrap().node,
            "a0"
        );
        // The second pod follows it to rack-a.
        assert_eq!(ask(&second, "a0"), PredicateResponse::default());
        assert_eq!(ask(&second, "a1"), PredicateResponse::default());
        let elsewhere = ask(&second, "b0");
        assert_eq!(elsewhere.code, code::UNSCHEDULABLE);
        assert!(elsewhere.status.contains("rack-a"), "{}", elsewhere.status);
        // rack-b holds nothing for the unit: a stranger takes its whole node.
        assert_eq!(
            ask(&pod("stranger", 8, None), "b0"),
            PredicateResponse::default()
        );
        // A node short of devices is still refused.
        let big = serde_json::from_value(serde_json::json!({
            "task": {"Pod": pod("big", 8, None), "NodeName": "a0"}
        }))
        .unwrap();
        assert!(allocate(&svc, &big).await.error_message.contains("4 free"));
    }

    #[test]
    fn prioritize_scores_on_volcano_scale() {
        let svc = service(Scoring {
            super_node_weight: 0.0,
            weight: 2.0,
            loss_weight: 1.0,
        });
        let r: PrioritizeRequest = serde_json::from_value(serde_json::json!({
            "task": task("4"),
            "nodes": [{"Name": "dgx-a"}, {"Name": "dgx-b"}, {"Name": "pcie-a"}]
        }))
        .unwrap();
        let resp = prioritize(&svc, &r);
        assert_eq!(resp.error_message, "");
        assert_eq!(resp.node_score["dgx-a"], 200.0);
        assert_eq!(resp.node_score["dgx-b"], 150.0);
        assert_eq!(resp.node_score["pcie-a"], 0.0);
        let json = serde_json::to_value(&resp).unwrap();
        assert!(json.get("nodeScore").is_some() && json.get("errorMessage").is_some());
    }
}
