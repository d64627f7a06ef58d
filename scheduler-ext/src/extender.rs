//! The HTTP server: the kube-scheduler extender API (`filter`, `prioritize`, `bind`), the
//! Volcano `extender` plugin's verbs ([`crate::volcano`]) and `/healthz`.
//!
//! Routes: `POST /kube-scheduler/{filter,prioritize,bind}`,
//! `POST /volcano/{predicate,prioritize,allocateFunc,deallocateFunc,onSessionOpen,onSessionClose}`,
//! `GET /healthz`.
//! Bodies are the upstream structs with Go field names as keys (`Pod`, `Nodes`, `NodeNames`,
//! `FailedNodes`, `Host`, `Score`, ...); see `../shared/reference/wire-contracts.md`, section 3.
//! `filter` answers in the form it was asked (`NodeNames` when it got `NodeNames`, a `NodeList`
//! in `Nodes` when it got `Nodes`). Pods without an accelerator request pass every node and get
//! score 0; nodes that cannot hold the pod, and nodes the view does not know, are returned in
//! `FailedNodes` with the reason. A body that is not valid `ExtenderArgs` gets 400 and a message.
//!
//! `bind` chooses the pod's devices on the node under the ledger's lock, writes them on the pod
//! as `fumarole.dev/devices`, then creates the pod's `Binding`; when either write fails the
//! devices are released and kube-scheduler gets the error (and retries the pod).
//!
//! Answers come from a [`ClusterView`] and the [`Ledger`] held in [`Service`]; the view is
//! replaced while serving ([`Service::replace_view`]) as the reflectors see changes.

use std::collections::VecDeque;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::cluster::Cluster;
use crate::decide;
use crate::kube_ops::KubeOps;
use crate::ledger::{Commit, Ledger};
use crate::request::{PodRequest, RequestError, pod_request};
use crate::score::gpu_aware::{GpuAware, NodeVerdict};
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

/// How the service decides, from flags.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    pub scorer: GpuAware,
    /// How long a commit waits for the view to show its pod bound with its annotation.
    pub commit_ttl: Duration,
    /// How long a unit's plan waits for its next pod.
    pub reservation_ttl: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            scorer: GpuAware::default(),
            commit_ttl: Duration::from_secs(120),
            reservation_ttl: Duration::from_secs(300),
        }
    }
}

/// The state the handlers share: the cluster view, the ledger, the settings and (when serving
/// a live cluster) the API client.
#[derive(Debug)]
pub struct Service {
    view: RwLock<Arc<ClusterView>>,
    ledger: RwLock<Ledger>,
    pub settings: Settings,
    kube: OnceLock<KubeOps>,
    /// The last [`DECISIONS_KEPT`] scorings (prioritize calls), oldest first, for `/ui`: kept
    /// as the verdicts the verb already had, turned into rows only when the page asks.
    decisions: Mutex<VecDeque<Recorded>>,
}

/// A scoring as the verb left it.
#[derive(Debug)]
struct Recorded {
    pod: String,
    at: SystemTime,
    verdicts: Vec<NodeVerdict>,
}

/// How many scorings `/ui` shows.
pub const DECISIONS_KEPT: usize = 10;

/// One scoring of a pod over nodes: what `explain` would say, as the scheduler asked it.
#[derive(Clone, Debug)]
pub struct Decision {
    /// `namespace/name`.
    pub pod: String,
    pub at: SystemTime,
    /// Best first.
    pub rows: Vec<crate::explain::Row>,
}

impl Service {
    /// A service over `view` with default time-to-lives.
    pub fn new(view: ClusterView, scorer: GpuAware) -> Self {
        Self::with_settings(
            view,
            Settings {
                scorer,
                ..Settings::default()
            },
        )
    }

    pub fn with_settings(view: ClusterView, settings: Settings) -> Self {
        Service {
            view: RwLock::new(Arc::new(view)),
            ledger: RwLock::new(Ledger::default()),
            settings,
            kube: OnceLock::new(),
            decisions: Mutex::new(VecDeque::new()),
        }
    }

    /// Connects the service to the API server (for `bind` and the pod annotations); once.
    pub fn set_kube(&self, ops: KubeOps) {
        if self.kube.set(ops).is_err() {
            tracing::warn!("API client already set; keeping the first");
        }
    }

    /// Runs `f` over the view and the ledger as one request would see them.
    pub fn with_cluster<R>(&self, f: impl FnOnce(Cluster<'_>) -> R) -> R {
        let view = self.view();
        let ledger = self.ledger();
        f(Cluster::new(&view, &ledger, Instant::now()))
    }

    /// Remembers a scoring of `pod` (the last [`DECISIONS_KEPT`] are kept). On the prioritize
    /// path: it only moves the verdicts in; sorting and naming devices wait for `/ui`.
    pub fn record_decision(&self, pod: &Pod, verdicts: Vec<NodeVerdict>) {
        let recorded = Recorded {
            pod: crate::request::pod_key(pod),
            at: SystemTime::now(),
            verdicts,
        };
        let mut kept = self.decisions_kept();
        if kept.len() == DECISIONS_KEPT {
            kept.pop_front();
        }
        kept.push_back(recorded);
    }

    /// The recorded scorings, newest first, as `explain` rows (device ids from the current
    /// view).
    pub fn decisions(&self) -> Vec<Decision> {
        let view = self.view();
        let kept = self.decisions_kept();
        kept.iter()
            .rev()
            .map(|r| {
                let mut verdicts = r.verdicts.clone();
                crate::score::gpu_aware::best_first(&mut verdicts);
                Decision {
                    pod: r.pod.clone(),
                    at: r.at,
                    rows: verdicts
                        .into_iter()
                        .map(|v| crate::explain::Row::new(v, self.scorer(), &view))
                        .collect(),
                }
            })
            .collect()
    }

    /// The API client, in live mode.
    pub fn kube(&self) -> Option<&KubeOps> {
        self.kube.get()
    }

    pub fn scorer(&self) -> &GpuAware {
        &self.settings.scorer
    }

    /// The current view.
    pub fn view(&self) -> Arc<ClusterView> {
        match self.view.read() {
            Ok(v) => Arc::clone(&v),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the view (new snapshot, reflector update) and drops the commits and plans it
    /// makes redundant; returns the pods whose commits were dropped.
    pub fn replace_view(&self, view: ClusterView) -> Vec<String> {
        let view = Arc::new(view);
        {
            let mut guard = match self.view.write() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            *guard = Arc::clone(&view);
        }
        self.ledger_mut()
            .prune(&view, Instant::now(), self.settings.commit_ttl)
    }

    fn decisions_kept(&self) -> MutexGuard<'_, VecDeque<Recorded>> {
        match self.decisions.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn ledger(&self) -> RwLockReadGuard<'_, Ledger> {
        match self.ledger.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn ledger_mut(&self) -> RwLockWriteGuard<'_, Ledger> {
        match self.ledger.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The verdicts for `pod` on `nodes`, in order. A pod of a gpu-group-size unit first gets
    /// its sub-unit's super-node planned (among `nodes` when `plan_among_nodes`, else the whole
    /// view); when no super-node can take it every node gets that reason.
    pub fn evaluate(
        &self,
        pod: &Pod,
        nodes: &[String],
        plan_among_nodes: bool,
    ) -> Result<Vec<NodeVerdict>, RequestError> {
        let view = self.view();
        let req = pod_request(pod, &view.resources())?;
        Ok(self.evaluate_request(&view, &req, nodes, plan_among_nodes))
    }

    fn evaluate_request(
        &self,
        view: &ClusterView,
        req: &PodRequest,
        nodes: &[String],
        plan_among_nodes: bool,
    ) -> Vec<NodeVerdict> {
        let now = Instant::now();
        let planned = if req.group.is_some() {
            let candidates: Option<HashSet<&str>> =
                plan_among_nodes.then(|| nodes.iter().map(String::as_str).collect());
            let mut ledger = self.ledger_mut();
            match decide::plan(
                view,
                &mut ledger,
                req,
                candidates.as_ref(),
                now,
                self.settings.reservation_ttl,
            ) {
                Ok(p) => p,
                Err(reason) => {
                    return nodes
                        .iter()
                        .map(|n| NodeVerdict::filtered(n, reason.clone()))
                        .collect();
                }
            }
        } else {
            None
        };
        let ledger = self.ledger();
        decide::judge(
            Cluster::new(view, &ledger, now),
            &self.settings.scorer,
            req,
            planned.as_deref(),
            nodes.iter().map(String::as_str),
        )
    }

    /// Chooses and records the devices `pod` gets on `node` (bind, `allocateFunc`). `Ok(None)`
    /// for pods without an accelerator request; `Err` is why the node cannot take the pod now.
    /// Committing the same pod to the same node again returns the earlier choice.
    pub fn commit(&self, pod: &Pod, node: &str) -> Result<Option<Commit>, String> {
        let view = self.view();
        let req = match pod_request(pod, &view.resources()) {
            Ok(r) => r,
            Err(RequestError::NoAccelerator { .. }) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let key = req.devices.pod.clone();
        let now = Instant::now();
        let ttl = self.settings.reservation_ttl;
        let mut ledger = self.ledger_mut();
        if let Some(c) = ledger.commit_of(&key)
            && c.node == node
        {
            return Ok(Some(c.clone()));
        }
        ledger.release(&key);
        let planned = decide::plan(&view, &mut ledger, &req, None, now, ttl)?;
        let verdict = decide::judge(
            Cluster::new(&view, &ledger, now),
            &self.settings.scorer,
            &req,
            planned.as_deref(),
            [node],
        )
        .pop();
        let Some(v) = verdict else {
            return Err(format!("no verdict for node {node}"));
        };
        if let Some(reason) = v.reason {
            return Err(format!("node {node} cannot take pod {key}: {reason}"));
        }
        let commit = Commit {
            node: node.to_string(),
            resource: req.devices.resource.clone(),
            devices: v.device_ids(&view),
            unit: req.group.as_ref().map(|g| (g.key.clone(), g.gpus)),
            at: now,
        };
        ledger.commit(&key, commit.clone());
        if let Some(g) = &req.group {
            ledger.renew_plan(&g.key, now + ttl);
        }
        Ok(Some(commit))
    }

    /// Drops the commit of `pod` (`namespace/name`).
    pub fn release(&self, pod: &str) -> Option<Commit> {
        self.ledger_mut().release(pod)
    }

    /// The `filter` verb.
    pub fn filter(&self, args: &ExtenderArgs) -> Result<ExtenderFilterResult, ArgsError> {
        let pod = args.pod.as_ref().ok_or(ArgsError::NoPod)?;
        let names = node_names(args)?;
        let mut failed = BTreeMap::new();
        match self.evaluate(pod, &names, true) {
            // Not an accelerator pod: not ours to judge.
            Err(RequestError::NoAccelerator { .. }) => {}
            Err(e) => {
                for n in &names {
                    failed.insert(n.clone(), e.to_string());
                }
            }
            Ok(verdicts) => {
                for v in verdicts {
                    if let Some(reason) = v.reason {
                        failed.insert(v.node, reason);
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
        let verdicts = self.evaluate(pod, &names, true).unwrap_or_default();
        let scorer = &self.settings.scorer;
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
            self.record_decision(pod, verdicts);
        }
        Ok(answer)
    }

    /// The `bind` verb: commit the devices, annotate the pod, create its Binding.
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> Result<(), String> {
        let (ns, name, node) = (&args.pod_namespace, &args.pod_name, &args.node);
        if name.is_empty() || node.is_empty() {
            return Err("ExtenderBindingArgs needs PodName and Node".into());
        }
        let ns = if ns.is_empty() {
            "default"
        } else {
            ns.as_str()
        };
        let ops = self
            .kube()
            .ok_or("bind needs the API server; this service was started on a cluster snapshot")?;
        let pod = ops
            .pod(ns, name)
            .await
            .map_err(|e| format!("reading pod {ns}/{name}: {e}"))?;
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if !args.pod_uid.is_empty() && uid != args.pod_uid {
            return Err(format!(
                "pod {ns}/{name} has uid {uid}, not {} (deleted and created again?)",
                args.pod_uid
            ));
        }
        let key = format!("{ns}/{name}");
        if let Some(c) = self.commit(&pod, node)?
            && let Err(e) = ops.annotate(ns, name, Some(&c.choice())).await
        {
            self.release(&key);
            return Err(format!("annotating pod {key}: {e}"));
        }
        if let Err(e) = ops.bind(ns, name, uid, node).await {
            self.release(&key);
            return Err(format!("binding pod {key} to {node}: {e}"));
        }
        tracing::info!(pod = %key, node = %node, "bound");
        Ok(())
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

async fn bind(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    let args: ExtenderBindingArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return bad_request(&ArgsError::Json(e));
        }
    };
    let error = match svc.bind(&args).await {
        Ok(()) => String::new(),
        Err(e) => {
            tracing::warn!(pod = %args.pod_name, node = %args.node, error = %e, "bind failed");
            e
        }
    };
    json_response(&ExtenderBindingResult { error })
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
        Ok(req) => json_response(&volcano::predicate(&svc, &req)),
        Err(e) => volcano_bad_request("predicate", &e),
    }
}

async fn volcano_prioritize(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&volcano::prioritize(&svc, &req)),
        Err(e) => volcano_bad_request("prioritize", &e),
    }
}

async fn volcano_allocate(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&volcano::allocate(&svc, &req).await),
        Err(e) => volcano_bad_request("allocateFunc", &e),
    }
}

async fn volcano_deallocate(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    match serde_json::from_slice(&body) {
        Ok(req) => json_response(&volcano::deallocate(&svc, &req).await),
        Err(e) => volcano_bad_request("deallocateFunc", &e),
    }
}

/// `onSessionOpen` / `onSessionClose`: Volcano ignores the answer; nothing to do.
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
        .route("/ui", get(crate::ui::page))
        .route(&format!("{KUBE_PREFIX}/filter"), post(filter))
        .route(&format!("{KUBE_PREFIX}/prioritize"), post(prioritize))
        .route(&format!("{KUBE_PREFIX}/bind"), post(bind))
        .route(
            &format!("{VOLCANO_PREFIX}/predicate"),
            post(volcano_predicate),
        )
        .route(
            &format!("{VOLCANO_PREFIX}/prioritize"),
            post(volcano_prioritize),
        )
        .route(
            &format!("{VOLCANO_PREFIX}/allocateFunc"),
            post(volcano_allocate),
        )
        .route(
            &format!("{VOLCANO_PREFIX}/deallocateFunc"),
            post(volcano_deallocate),
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
