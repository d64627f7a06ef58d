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
//! for an accelerator; then it chooses the pod's devices on the node ([`crate::decider::Decider::commit`]:
//! judged and chosen under the ledger's lock, so a node that does not pass the filter is
//! refused) and creates the pod's `Binding` carrying them as `fumarole.dev/devices` (the API
//! server copies a Binding's annotations onto the pod: one write); when it fails the devices
//! are released and kube-scheduler gets the error (and retries the pod).

use std::borrow::Cow;
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
use crate::core::verdict::{NodeVerdict, Unfit};
use crate::decider::{Asker, CommitError};
use crate::effects::PodCheckError;
use crate::protocol::{bad_request, json_bytes_response, json_out, json_response, scale};
use crate::service::Service;

/// Route prefix of the kube-scheduler extender verbs (`urlPrefix` in the scheduler config is
/// `http://HOST:PORT/kube-scheduler`).
pub const KUBE_PREFIX: &str = "/kube-scheduler";

/// `ExtenderArgs`, borrowing the node names from the request body.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ExtenderArgs<'a> {
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
        default,
        borrow
    )]
    pub node_names: Option<Vec<NodeName<'a>>>,
}

/// One name of `NodeNames`: a slice of the request body (thousands per request, so not an
/// allocation each), owned only when the JSON string has escapes.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct NodeName<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl AsRef<str> for NodeName<'_> {
    fn as_ref(&self) -> &str {
        &self.0
    }
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
    #[error("malformed ExtenderArgs: not UTF-8: {0}")]
    NotUtf8(#[from] std::str::Utf8Error),
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

/// `ExtenderFilterResult` as this service writes it: names borrowed from the request, each
/// distinct reason rendered once (an all-names request fails thousands of nodes for a handful
/// of reasons).
#[derive(Debug, Default, Serialize)]
pub struct FilterAnswer<'a> {
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none")]
    pub nodes: Option<serde_json::Value>,
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<&'a str>>,
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: FailedNodes<'a>,
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: FailedNodes<'a>,
    #[serde(rename = "Error")]
    pub error: String,
}

/// Failed node -> reason, written as a JSON object sorted by node name.
#[derive(Debug, Default)]
pub struct FailedNodes<'a> {
    /// (node, index into `reasons`), sorted by node, one entry per node.
    nodes: Vec<(&'a str, usize)>,
    reasons: Vec<String>,
}

impl<'a> FailedNodes<'a> {
    /// Sorts and drops repeated names (a name given twice has one verdict).
    fn new(mut nodes: Vec<(&'a str, usize)>, reasons: Vec<String>) -> Self {
        // Stable sort: linear on the sorted lists kube-scheduler usually sends.
        nodes.sort_by(|a, b| a.0.cmp(b.0));
        nodes.dedup_by(|a, b| a.0 == b.0);
        FailedNodes { nodes, reasons }
    }

    pub fn contains(&self, node: &str) -> bool {
        self.nodes.binary_search_by(|(n, _)| (*n).cmp(node)).is_ok()
    }

    /// The reason `node` failed.
    pub fn get(&self, node: &str) -> Option<&str> {
        let i = self.nodes.binary_search_by(|(n, _)| (*n).cmp(node)).ok()?;
        let (_, reason) = self.nodes.get(i)?;
        self.reasons.get(*reason).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Appends the map as JSON, each reason escaped once.
    fn write_json(&self, out: &mut Vec<u8>) {
        let reasons: Vec<Vec<u8>> = self.reasons.iter().map(|r| json_out::quoted(r)).collect();
        out.push(b'{');
        for (i, (node, r)) in self.nodes.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_out::push_str(out, node);
            out.push(b':');
            out.extend_from_slice(reasons.get(*r).map_or(b"\"\"".as_slice(), Vec::as_slice));
        }
        out.push(b'}');
    }
}

impl Serialize for FailedNodes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(
            self.nodes
                .iter()
                .map(|(node, r)| (node, self.reasons.get(*r).map_or("", String::as_str))),
        )
    }
}

impl FilterAnswer<'_> {
    /// The answer as JSON, what serde writes, by hand ([`json_out`]); for an answer in the
    /// `NodeNames` form (one with a `Nodes` list goes through serde).
    pub fn names_json(&self) -> Vec<u8> {
        let listed = self.node_names.as_ref().map_or(0, Vec::len)
            + self.failed_nodes.len()
            + self.failed_and_unresolvable_nodes.len();
        let mut out = Vec::with_capacity(128 + listed * 40);
        out.push(b'{');
        if let Some(names) = &self.node_names {
            out.extend_from_slice(b"\"NodeNames\":[");
            for (i, n) in names.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_out::push_str(&mut out, n);
            }
            out.extend_from_slice(b"],");
        }
        out.extend_from_slice(b"\"FailedNodes\":");
        self.failed_nodes.write_json(&mut out);
        out.extend_from_slice(b",\"FailedAndUnresolvableNodes\":");
        self.failed_and_unresolvable_nodes.write_json(&mut out);
        out.extend_from_slice(b",\"Error\":");
        json_out::push_str(&mut out, &self.error);
        out.push(b'}');
        out
    }
}

/// Each distinct reason once: the index of `unfit`'s text in `reasons`, rendering it when new.
/// `seen` pairs each rendered `Unfit` with its index. Reasons are few per request (one per
/// free count, say), so a scan from the newest is short; past [`REASONS_SCANNED`] distinct
/// ones each is rendered on its own (correct, just slower).
fn reason_index(reasons: &mut Vec<String>, seen: &mut Vec<(Unfit, usize)>, unfit: &Unfit) -> usize {
    if let Some((_, i)) = seen.iter().rev().find(|(u, _)| u == unfit) {
        return *i;
    }
    reasons.push(unfit.to_string());
    let i = reasons.len() - 1;
    if seen.len() < REASONS_SCANNED {
        seen.push((unfit.clone(), i));
    }
    i
}

/// Most distinct reasons [`reason_index`] compares a new one with.
const REASONS_SCANNED: usize = 64;

/// The `filter` verb. A node refused for what no eviction changes (the unit's plan puts its pod
/// elsewhere, no devices of the kind, an unknown node, a request that cannot be read) is in
/// `FailedAndUnresolvableNodes`, so kube-scheduler spends no preemption dry run on it; one short
/// of free devices is in `FailedNodes`.
pub fn filter<'a>(
    svc: &Service,
    args: &'a ExtenderArgs<'_>,
) -> Result<FilterAnswer<'a>, ArgsError> {
    let pod = args.pod.as_ref().ok_or(ArgsError::NoPod)?;
    let names = node_names(args)?;
    let mut failed: Vec<(&str, usize)> = Vec::new();
    let mut unresolvable: Vec<(&str, usize)> = Vec::new();
    let mut reasons = Vec::new();
    // `passed[i]`: names[i] passes.
    let mut passed = vec![true; names.len()];
    match svc.evaluate(pod, &names, Asker::KubeScheduler) {
        // Not an accelerator pod: not ours to judge.
        Err(RequestError::NoAccelerator { .. }) => {}
        Err(e) => {
            reasons.push(e.to_string());
            unresolvable = names.iter().map(|n| (*n, 0)).collect();
            passed.fill(false);
        }
        Ok(mut verdicts) => {
            let mut seen = Vec::new();
            for ((name, v), pass) in names.iter().zip(&verdicts).zip(&mut passed) {
                if let Some(unfit) = &v.unfit {
                    let into = if unfit.resolvable_by_eviction() {
                        &mut failed
                    } else {
                        &mut unresolvable
                    };
                    into.push((name, reason_index(&mut reasons, &mut seen, unfit)));
                    *pass = false;
                }
            }
            // In place: a verdict is large, and an all-names filter has thousands.
            verdicts.retain(NodeVerdict::feasible);
            svc.filters().remember(pod, verdicts);
        }
    }
    let mut out = FilterAnswer {
        failed_nodes: FailedNodes::new(failed, reasons.clone()),
        failed_and_unresolvable_nodes: FailedNodes::new(unresolvable, reasons),
        ..Default::default()
    };
    if args.node_names.is_some() {
        out.node_names = Some(
            names
                .iter()
                .zip(&passed)
                .filter(|(_, pass)| **pass)
                .map(|(n, _)| *n)
                .collect(),
        );
    } else if let Some(list) = &args.nodes {
        let mut list = list.clone();
        if let Some(items) = list.get_mut("items").and_then(|i| i.as_array_mut()) {
            items.retain(|item| {
                item.pointer("/metadata/name")
                    .and_then(|n| n.as_str())
                    .is_some_and(|n| {
                        !out.failed_nodes.contains(n)
                            && !out.failed_and_unresolvable_nodes.contains(n)
                    })
            });
        }
        out.nodes = Some(list);
    }
    Ok(out)
}

/// One entry of `HostPriorityList` as this service writes it (the host borrowed from the
/// request).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HostScore<'a> {
    #[serde(rename = "Host")]
    pub host: &'a str,
    #[serde(rename = "Score")]
    pub score: i64,
}

/// A `HostPriorityList` as JSON: what serde writes, by hand ([`json_out`]).
pub fn priorities_json(list: &[HostScore<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + list.len() * 48);
    out.push(b'[');
    for (i, h) in list.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"Host\":");
        json_out::push_str(&mut out, h.host);
        out.extend_from_slice(b",\"Score\":");
        json_out::push_int(&mut out, h.score);
        out.push(b'}');
    }
    out.push(b']');
    out
}

/// The `prioritize` verb: 0..10 per node; 0 for filtered or unknown nodes and for pods
/// without an accelerator request. Nodes this pod's filter just passed keep the filter's
/// verdicts ([`crate::filter_memo`]); any other request is judged afresh.
pub fn prioritize<'a>(
    svc: &Service,
    args: &'a ExtenderArgs<'_>,
) -> Result<Vec<HostScore<'a>>, ArgsError> {
    let pod = args.pod.as_ref().ok_or(ArgsError::NoPod)?;
    let names = node_names(args)?;
    let verdicts = svc.filters().reuse(pod, &names).unwrap_or_else(|| {
        Arc::new(
            svc.evaluate(pod, &names, Asker::KubeScheduler)
                .unwrap_or_default(),
        )
    });
    let answer = names
        .into_iter()
        .enumerate()
        .map(|(i, host)| {
            let score = verdicts
                .get(i)
                .and_then(|v| v.raw)
                .map_or(0, scale::kube_scheduler);
            HostScore { host, score }
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
    let ops = svc.effects().ok_or(BindError::NoApiServer)?;
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
    let decider = svc.decider();
    let commit = decider.commit(&pod, node)?;
    // No commit for a pod asking through ResourceClaims: the scheduler's DRA allocator picked
    // its devices; it is bound without a choice of ours.
    if commit.is_none() && !decider.asks_through_claims(&pod) {
        return Err(BindError::NoAccelerator { pod: key });
    }
    if let Err(source) = svc.bind(ops, &pod, node, commit.as_ref()).await {
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
fn node_names<'a>(args: &'a ExtenderArgs<'_>) -> Result<Vec<&'a str>, ArgsError> {
    if let Some(names) = &args.node_names {
        return Ok(names.iter().map(AsRef::as_ref).collect());
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
                .ok_or(ArgsError::BadNodeList)
        })
        .collect()
}

/// The body checked as UTF-8 once, then parsed as text: parsing bytes would check each of
/// thousands of names on its own.
fn parse_args(body: &[u8]) -> Result<ExtenderArgs<'_>, ArgsError> {
    let text = std::str::from_utf8(body)?;
    Ok(serde_json::from_str(text)?)
}

fn bad_args(e: &ArgsError) -> Response {
    bad_request("kube-scheduler", e)
}

async fn filter_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    let answer = parse_args(&body).and_then(|a| {
        let answer = filter(&svc, &a)?;
        Ok(match answer.nodes {
            Some(_) => json_response(&answer),
            None => json_bytes_response(answer.names_json()),
        })
    });
    answer.unwrap_or_else(|e| bad_args(&e))
}

async fn prioritize_handler(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    let answer = parse_args(&body)
        .and_then(|a| prioritize(&svc, &a).map(|list| json_bytes_response(priorities_json(&list))));
    answer.unwrap_or_else(|e| bad_args(&e))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn not_enough(free: usize) -> Unfit {
        Unfit::NotEnoughFree {
            need: 4,
            resource: "nvidia.com/gpu".into(),
            free,
        }
    }

    #[test]
    fn each_reason_is_rendered_once_and_failed_nodes_come_out_sorted() {
        let mut reasons = Vec::new();
        let mut seen = Vec::new();
        let mut failed = Vec::new();
        for (node, unfit) in [
            ("n-2", not_enough(2)),
            ("n-0", not_enough(1)),
            ("n-1", not_enough(2)),
            ("ghost", Unfit::UnknownNode),
            ("n-0", not_enough(1)),
        ] {
            failed.push((node, reason_index(&mut reasons, &mut seen, &unfit)));
        }
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        let failed = FailedNodes::new(failed, reasons);
        assert_eq!(failed.len(), 4);
        assert!(failed.contains("n-1") && !failed.contains("n-3"));
        assert_eq!(failed.get("n-1"), Some("needs 4 nvidia.com/gpu, 2 free"));
        let json = serde_json::to_string(&failed).unwrap();
        assert_eq!(
            json,
            r#"{"ghost":"unknown node: no DeviceTopology or Node object in the cluster view","n-0":"needs 4 nvidia.com/gpu, 1 free","n-1":"needs 4 nvidia.com/gpu, 2 free","n-2":"needs 4 nvidia.com/gpu, 2 free"}"#
        );
        // Read back as the upstream type, it is the map the old BTreeMap wrote.
        let answer = FilterAnswer {
            node_names: Some(vec!["n-3"]),
            failed_nodes: failed,
            ..Default::default()
        };
        assert_eq!(answer.names_json(), serde_json::to_vec(&answer).unwrap());
        let back: ExtenderFilterResult = serde_json::from_slice(&answer.names_json()).unwrap();
        assert_eq!(back.node_names, Some(vec!["n-3".to_string()]));
        assert_eq!(back.failed_nodes.len(), 4);
        assert_eq!(back.failed_nodes["n-2"], "needs 4 nvidia.com/gpu, 2 free");
        assert!(back.nodes.is_none() && back.error.is_empty());
    }

    /// The answers written by hand are the bytes serde writes, for names and reasons that need
    /// escapes too, and for empty lists.
    #[test]
    fn answers_written_by_hand_are_what_serde_writes() {
        let odd = [
            "n-\"quoted\"",
            "back\\slash",
            "tab\tname",
            "ノード-1",
            "plain-0",
        ];
        let mut reasons = vec!["needs 1 \"gpu\", 0 free\n".to_string()];
        reasons.push(String::new());
        let failed = FailedNodes::new(vec![(odd[0], 0), (odd[1], 1)], reasons.clone());
        let unresolvable = FailedNodes::new(vec![(odd[2], 0)], reasons);
        for answer in [
            FilterAnswer {
                node_names: Some(vec![odd[3], odd[4]]),
                failed_nodes: failed,
                failed_and_unresolvable_nodes: unresolvable,
                error: "an \"error\"".into(),
                ..Default::default()
            },
            FilterAnswer {
                node_names: Some(Vec::new()),
                ..Default::default()
            },
            FilterAnswer::default(),
        ] {
            let by_hand = answer.names_json();
            assert_eq!(
                String::from_utf8(by_hand).unwrap(),
                serde_json::to_string(&answer).unwrap()
            );
        }
        for list in [
            vec![],
            vec![
                HostScore {
                    host: odd[0],
                    score: 0,
                },
                HostScore {
                    host: odd[3],
                    score: 10,
                },
                HostScore {
                    host: odd[4],
                    score: -3,
                },
            ],
        ] {
            assert_eq!(
                String::from_utf8(priorities_json(&list)).unwrap(),
                serde_json::to_string(&list).unwrap()
            );
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_a_clear_error() {
        let err = parse_args(b"{\"NodeNames\":[\"n-\xff\"]}").unwrap_err();
        assert!(matches!(err, ArgsError::NotUtf8(_)), "{err}");
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }

    #[test]
    fn past_the_scan_limit_reasons_are_still_right() {
        let mut reasons = Vec::new();
        let mut seen = Vec::new();
        let indices: Vec<usize> = (0..REASONS_SCANNED + 3)
            .map(|free| reason_index(&mut reasons, &mut seen, &not_enough(free)))
            .collect();
        let again = reason_index(&mut reasons, &mut seen, &not_enough(REASONS_SCANNED + 1));
        assert_eq!(reasons[again], not_enough(REASONS_SCANNED + 1).to_string());
        assert_eq!(reasons[indices[3]], not_enough(3).to_string());
        assert_eq!(
            reason_index(&mut reasons, &mut seen, &not_enough(3)),
            indices[3]
        );
    }

    #[test]
    fn node_names_borrow_the_body_and_unescape_when_needed() {
        let body = br#"{"NodeNames":["n-0","n\u002d1"]}"#;
        let args = parse_args(body).unwrap();
        let names = args.node_names.as_ref().unwrap();
        assert!(matches!(names[0].0, Cow::Borrowed("n-0")));
        assert_eq!(names[1].as_ref(), "n-1");
        assert_eq!(node_names(&args).unwrap(), ["n-0", "n-1"]);
    }
}
