//! The HTTP server: the kube-scheduler extender API (`filter`, `prioritize`), the Volcano
//! `extender` plugin's verbs ([`crate::volcano`]) and `/healthz`.
//!
//! Routes: `POST /kube-scheduler/filter`, `POST /kube-scheduler/prioritize`,
//! `POST /volcano/{predicate,prioritize,onSessionOpen,onSessionClose}`, `GET /healthz`.
//! Bodies are the upstream structs with Go field names as keys (`Pod`, `Nodes`, `NodeNames`,
//! `FailedNodes`, `Host`, `Score`, ...); see `../shared/reference/wire-contracts.md`, section 3.
//! `filter` answers in the form it was asked (`NodeNames` when it got `NodeNames`, a `NodeList`
//! in `Nodes` when it got `Nodes`). Pods without an accelerator request pass every node and get
//! score 0; nodes that cannot hold the pod, and nodes the view does not know, are returned in
//! `FailedNodes` with the reason. A body that is not valid `ExtenderArgs` gets 400 and a message.
//!
//! Answers come from a [`ClusterView`] held in [`Service`]; the view can be replaced while
//! serving ([`Service::replace_view`]).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::request::{RequestError, device_request};
use crate::score::gpu_aware::GpuAware;
use crate::view::ClusterView;
use crate::volcano::{self, VOLCANO_PREFIX};

/// Route prefix of the kube-scheduler extender verbs (`urlPrefix` in the scheduler config is
/// `http://HOST:PORT/kube-scheduler`).
pub const KUBE_PREFIX: &str = "/kube-scheduler";

/// Largest request body accepted (a `NodeList` of thousands of nodes is large).
pub const BODY_LIMIT: usize = 64 << 20;

/// `ExtenderArgs`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ExtenderArgs {
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Pod>,
    /// A `NodeList`, kept as JSON so it can be echoed back unchanged (when
    /// `nodeCacheCapable=false`).
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<serde_json::Value>,
    /// Node names (when `nodeCacheCapable=true`).
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default
    )]
    pub node_names: Option<Vec<String>>,
}

/// `ExtenderFilterResult`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    #[serde(rename = "Nodes", default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<serde_json::Value>,
    #[serde(rename = "NodeNames", default, skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// One entry of `HostPriorityList`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}

/// Why an `ExtenderArgs` body is unusable (answered with 400).
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("malformed ExtenderArgs: {0}")]
    Json(#[from] serde_json::Error),
    #[error("ExtenderArgs has no Pod")]
    NoPod,
    #[error("ExtenderArgs has neither NodeNames nor Nodes")]
    NoNodes,
    #[error("ExtenderArgs.Nodes is not a NodeList with items")]
    BadNodeList,
}

/// The state the handlers share: the cluster view and the scoring arguments.
#[derive(Debug)]
pub struct Service {
    view: RwLock<Arc<ClusterView>>,
    pub scorer: GpuAware,
}

impl Service {
    pub fn new(view: ClusterView, scorer: GpuAware) -> Self {
        Service {
            view: RwLock::new(Arc::new(view)),
            scorer,
        }
    }

    /// The current view.
    pub fn view(&self) -> Arc<ClusterView> {
        match self.view.read() {
            Ok(v) => Arc::clone(&v),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the view (new snapshot, reflector update).
    pub fn replace_view(&self, view: ClusterView) {
        let mut guard = match self.view.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = Arc::new(view);
    }

    /// The `filter` verb.
    pub fn filter(&self, args: &ExtenderArgs) -> Result<ExtenderFilterResult, ArgsError> {
        let pod = args.pod.as_ref().ok_or(ArgsError::NoPod)?;
        let names = node_names(args)?;
        let view = self.view();
        let mut failed = BTreeMap::new();
        match device_request(pod, &view.resources()) {
            // Not an accelerator pod: not ours to judge.
            Err(RequestError::NoAccelerator { .. }) => {}
            Err(e) => {
                for n in &names {
                    failed.insert(n.clone(), e.to_string());
                }
            }
            Ok(req) => {
                for n in &names {
                    let v = self.scorer.node(&view, n, &req);
                    if let Some(reason) = v.reason {
                        failed.insert(n.clone(), reason);
                    }
                }
            }
        }
        let mut out = ExtenderFilterResult {
            failed_nodes: failed,
            ..Default::default()
        };
        if let Some(given) = &args.node_names {
            out.node_names = Some(
                given
                    .iter()
                    .filter(|n| !out.failed_nodes.contains_key(*n))
                    .cloned()
                    .collect(),
            );
        } else if let Some(list) = &args.nodes {
            let mut list = list.clone();
            if let Some(items) = list.get_mut("items").and_then(|i| i.as_array_mut()) {
                items.retain(|item| {
                    item.pointer("/metadata/name")
                        .and_then(|n| n.as_str())
                        .is_some_and(|n| !out.failed_nodes.contains_key(n))
                });
            }
            out.nodes = Some(list);
        }
        Ok(out)
    }

    /// The `prioritize` verb: 0..10 per node; 0 for filtered or unknown nodes and for pods
    /// without an accelerator request.
    pub fn prioritize(&self, args: &ExtenderArgs) -> Result<Vec<HostPriority>, ArgsError> {
        let pod = args.pod.as_ref().ok_or(ArgsError::NoPod)?;
        let names = node_names(args)?;
        let view = self.view();
        let req = device_request(pod, &view.resources()).ok();
        Ok(names
            .into_iter()
            .map(|n| {
                let score = req
                    .as_ref()
                    .and_then(|r| self.scorer.node(&view, &n, r).raw)
                    .map_or(0, |raw| self.scorer.kube(raw));
                HostPriority { host: n, score }
            })
            .collect())
    }
}

/// The node names of the request, from `NodeNames` or else the `NodeList`.
fn node_names(args: &ExtenderArgs) -> Result<Vec<String>, ArgsError> {
    if let Some(names) = &args.node_names {
        return Ok(names.clone());
    }
    let list = args.nodes.as_ref().ok_or(ArgsError::NoNodes)?;
    let items = match list.get("items") {
        Some(serde_json::Value::Array(items)) => items,
        // Go encodes an empty slice as null.
        Some(serde_json::Value::Null) | None if list.is_object() => return Ok(Vec::new()),
        _ => return Err(ArgsError::BadNodeList),
    };
    items
        .iter()
        .map(|i| {
            i.pointer("/metadata/name")
                .and_then(|n| n.as_str())
                .map(str::to_string)
                .ok_or(ArgsError::BadNodeList)
        })
        .collect()
}

fn json_response<T: Serialize>(value: &T) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn bad_request(e: &ArgsError) -> Response {
    tracing::warn!(error = %e, "bad extender request");
    (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
}

fn parse_args(body: &[u8]) -> Result<ExtenderArgs, ArgsError> {
    Ok(serde_json::from_slice(body)?)
}

async fn filter(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match parse_args(&body).and_then(|a| svc.filter(&a)) {
        Ok(r) => json_response(&r),
        Err(e) => bad_request(&e),
    }
}

async fn prioritize(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match parse_args(&body).and_then(|a| svc.prioritize(&a)) {
        Ok(r) => json_response(&r),
        Err(e) => bad_request(&e),
    }
}

fn volcano_bad_request(verb: &str, e: &serde_json::Error) -> Response {
    tracing::warn!(error = %e, verb, "bad Volcano extender request");
    (
        StatusCode::BAD_REQUEST,
        format!("malformed Volcano {verb} request: {e}\n"),
    )
        .into_response()
}

async fn volcano_predicate(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&volcano::predicate(&svc.view(), &svc.scorer, &req)),
        Err(e) => volcano_bad_request("predicate", &e),
    }
}

async fn volcano_prioritize(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&volcano::prioritize(&svc.view(), &svc.scorer, &req)),
        Err(e) => volcano_bad_request("prioritize", &e),
    }
}

/// `onSessionOpen` / `onSessionClose`: Volcano ignores the answer; nothing to do yet.
async fn volcano_session() -> Response {
    json_response(&serde_json::json!({}))
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Serves [`router`] on `listener` until the future is dropped or the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, svc: Arc<Service>) -> std::io::Result<()> {
    axum::serve(listener, router(svc)).await
}

/// The HTTP routes over `svc`.
pub fn router(svc: Arc<Service>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(&format!("{KUBE_PREFIX}/filter"), post(filter))
        .route(&format!("{KUBE_PREFIX}/prioritize"), post(prioritize))
        .route(
            &format!("{VOLCANO_PREFIX}/predicate"),
            post(volcano_predicate),
        )
        .route(
            &format!("{VOLCANO_PREFIX}/prioritize"),
            post(volcano_prioritize),
        )
        .route(
            &format!("{VOLCANO_PREFIX}/onSessionOpen"),
            post(volcano_session),
        )
        .route(
            &format!("{VOLCANO_PREFIX}/onSessionClose"),
            post(volcano_session),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(svc)
}
