//! The kube-scheduler extender API: `filter`, `prioritize` and `bind` under [`KUBE_PREFIX`].
//!
//! Bodies are the upstream structs with Go field names as keys (`Pod`, `Nodes`, `NodeNames`,
//! `FailedNodes`, `Host`, `Score`, ...); see `../shared/reference/wire-contracts.md`, section 3.
//! `filter` answers in the form it was asked (`NodeNames` when it got `NodeNames`, a `NodeList`
//! in `Nodes` when it got `Nodes`). Pods without an accelerator request pass every node and get
//! score 0; nodes that cannot hold the pod, and nodes the view does not know, are returned in
//! `FailedNodes` with the reason. A body that is not valid `ExtenderArgs` gets 400 and a message.
//!
//! `bind` re-reads the pod from the API server and refuses it unless it is scheduled by a
//! scheduler this service serves, not bound yet, of the uid kube-scheduler named, and asking
//! for an accelerator; then it chooses the pod's devices on the node ([`Service::commit`]:
//! judged and chosen under the ledger's lock, so a node that does not pass the filter is
//! refused) and creates the pod's `Binding` carrying them as `fumarole.dev/devices` (the API
//! server copies a Binding's annotations onto the pod: one write); when it fails the devices
//! are released and kube-scheduler gets the error (and retries the pod).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::Response;
use axum::routing::post;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::core::request::RequestError;
use crate::protocol::{bad_request, json_response};
use crate::service::{CommitError, PodCheckError, Service};

/// Route prefix of the kube-scheduler extender verbs (`urlPrefix` in the scheduler config is
/// `http://HOST:PORT/kube-scheduler`).
pub const KUBE_PREFIX: &str = "/kube-scheduler";

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

/// `ExtenderBindingArgs`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ExtenderBindingArgs {
    #[serde(rename = "PodName", alias = "podName", default)]
    pub pod_name: String,
    #[serde(rename = "PodNamespace", alias = "podNamespace", default)]
    pub pod_namespace: String,
    #[serde(rename = "PodUID", alias = "podUID", default)]
    pub pod_uid: String,
    #[serde(rename = "Node", alias = "node", default)]
    pub node: String,
}

/// `ExtenderBindingResult`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    #[serde(rename = "Error", default)]
    pub error: String,
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

/// Why `bind` failed (the `Error` of `ExtenderBindingResult`).
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("ExtenderBindingArgs needs PodName and Node")]
    Incomplete,
    #[error("bind needs the API server; this service was started on a cluster snapshot")]
    NoApiServer,
    #[error(transparent)]
    Pod(#[from] PodCheckError),
    #[error("pod {pod} is already bound to {node}")]
    AlreadyBound { pod: String, node: String },
    #[error(
        "pod {pod} requests no accelerator: this extender binds only accelerator pods (set managedResources in the extender configuration)"
    )]
    NoAccelerator { pod: String },
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error("binding pod {pod} to {node}: {source}")]
    Binding {
        pod: String,
        node: String,
        #[source]
        source: kube::Error,
    },
}

/// The `filter` verb.
pub fn filter(svc: &Service, args: &ExtenderArgs) -> Result<ExtenderFilterResult, ArgsError> {
    let pod = args.pod.as_ref().ok_or(ArgsError::NoPod)?;
    let names = node_names(args)?;
    let mut failed = BTreeMap::new();
    match svc.evaluate(pod, &names, true) {
        // Not an accelerator pod: not ours to judge.
        Err(RequestError::NoAccelerator { .. }) => {}
        Err(e) => {
            for n in &names {
                failed.insert(n.clone(), e.to_string());
            }
        }
        Ok(verdicts) => {
            for v in verdicts {
                if let Some(unfit) = v.unfit {
                    failed.insert(v.node, unfit.to_string());
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
pub fn prioritize(svc: &Service, args: &ExtenderArgs) -> Result<Vec<HostPriority>, ArgsError> {
    let pod = args.pod.as_ref().ok_or(ArgsError::NoPod)?;
    let names = node_names(args)?;
    let verdicts = svc.evaluate(pod, &names, true).unwrap_or_default();
    let scorer = svc.scorer();
    let answer = names
        .into_iter()
        .enumerate()
        .map(|(i, host)| {
            let score = verdicts
                .get(i)
                .and_then(|v| v.raw)
                .map_or(0, |raw| scorer.kube(raw));
            HostPriority { host, score }
        })
        .collect();
    if !verdicts.is_empty() {
        svc.record_decision(pod, verdicts);
    }
    Ok(answer)
}

/// The `bind` verb: choose the pod's devices, then create its Binding, which carries them.
pub async fn bind(svc: &Service, args: &ExtenderBindingArgs) -> Result<(), BindError> {
    let (ns, name, node) = (&args.pod_namespace, &args.pod_name, &args.node);
    if name.is_empty() || node.is_empty() {
        return Err(BindError::Incomplete);
    }
    let ns = if ns.is_empty() {
        "default"
    } else {
        ns.as_str()
    };
    let key = format!("{ns}/{name}");
    let ops = svc.kube().ok_or(BindError::NoApiServer)?;
    // Act on the pod as the API server has it, never on what the request says.
    let pod: Pod = svc
        .checked_pod(ns, name, Some(&args.pod_uid))
        .await?
        .ok_or(BindError::NoApiServer)?;
    if let Some(bound) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        return Err(BindError::AlreadyBound {
            pod: key,
            node: bound,
        });
    }
    let Some(commit) = svc.commit(&pod, node)? else {
        return Err(BindError::NoAccelerator { pod: key });
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if let Err(source) = ops.bind(ns, name, uid, node, &commit.choice()).await {
        svc.release(&key);
        return Err(BindError::Binding {
            pod: key,
            node: node.clone(),
            source,
        });
    }
    tracing::info!(pod = %key, node = %node, "bound");
    Ok(())
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

fn parse_args(body: &[u8]) -> Result<ExtenderArgs, ArgsError> {
    Ok(serde_json::from_slice(body)?)
}

fn bad_args(e: &ArgsError) -> Response {
    bad_request("kube-scheduler", e)
}

async fn filter_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match parse_args(&body).and_then(|a| filter(&svc, &a)) {
        Ok(r) => json_response(&r),
        Err(e) => bad_args(&e),
    }
}

async fn prioritize_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match parse_args(&body).and_then(|a| prioritize(&svc, &a)) {
        Ok(r) => json_response(&r),
        Err(e) => bad_args(&e),
    }
}

async fn bind_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    let args: ExtenderBindingArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return bad_args(&ArgsError::Json(e)),
    };
    let error = match bind(&svc, &args).await {
        Ok(()) => String::new(),
        Err(e) => {
            tracing::warn!(pod = %args.pod_name, node = %args.node, error = %e, "bind failed");
            e.to_string()
        }
    };
    json_response(&ExtenderBindingResult { error })
}

/// Largest `filter` / `prioritize` body: a whole `NodeList` of thousands of nodes when
/// `nodeCacheCapable` is false (about 10 KiB a node; `NodeNames` alone are far smaller).
pub const ARGS_LIMIT: usize = 64 << 20;
/// Largest `bind` body: four names.
pub const BIND_LIMIT: usize = 64 << 10;

/// The routes of this protocol, under [`KUBE_PREFIX`], each with its body limit.
pub fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route(
            &format!("{KUBE_PREFIX}/filter"),
            post(filter_handler).layer(DefaultBodyLimit::max(ARGS_LIMIT)),
        )
        .route(
            &format!("{KUBE_PREFIX}/prioritize"),
            post(prioritize_handler).layer(DefaultBodyLimit::max(ARGS_LIMIT)),
        )
        .route(
            &format!("{KUBE_PREFIX}/bind"),
            post(bind_handler).layer(DefaultBodyLimit::max(BIND_LIMIT)),
        )
}
