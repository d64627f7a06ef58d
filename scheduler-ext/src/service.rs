//! The service: one [`ClusterView`] and one [`Ledger`] shared by every request, and the three
//! things a scheduler asks of them: [`Service::evaluate`] (where could this pod go),
//! [`Service::assign`] (give it devices on this node, recorded and written on the pod) and
//! [`Service::release`] (take them back).
//!
//! The protocols ([`crate::protocol`]) are functions over `&Service`; the live view
//! ([`crate::live`]) replaces the view as the reflectors see changes
//! ([`Service::replace_view`]), which also prunes the ledger. `/ui` reads the last scorings the
//! schedulers asked for ([`Service::decisions`]).
//!
//! Locking: the view is an `Arc` swapped under a short write lock; the ledger sits behind one
//! `RwLock`, and a commit checks and takes devices under its write lock, so two pods never get
//! one device. Of several replicas only the leader commits ([`crate::leader`]); the others
//! answer reads and refuse commits with [`CommitError::NotLeader`].

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::{Duration, Instant, SystemTime};

use fumarole_topology::annotation::ascend;
use k8s_openapi::api::core::v1::Pod;

use crate::core::claims::{ClaimRef, pod_claims};
use crate::core::cluster::Cluster;
use crate::core::decide;
use crate::core::explain::Row;
use crate::core::ledger::{Commit, Ledger};
use crate::core::placement::{PlacementError, PlanInputs, SuperPods};
use crate::core::request::{DeviceRequest, PodRequest, RequestError, pod_key, pod_request_in};
use crate::core::score::Scoring;
use crate::core::unit::{self, UnitFacts};
use crate::core::verdict::{NodeVerdict, Unfit, best_first};
use crate::core::view::ClusterView;
use crate::freshness::Freshness;
use crate::kube_ops::KubeOps;
use crate::leader::Leadership;
use crate::protocol::scale;

/// Whether a commit still chooses the node, or only the devices on a node already bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placing {
    Choose,
    Bound,
}

/// Why a verb refuses the pod a request names.
#[derive(Debug, thiserror::Error)]
pub enum PodCheckError {
    #[error("pod {pod} does not exist")]
    Unknown { pod: String },
    #[error("reading pod {pod}: {source}")]
    Read {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("pod {pod} has uid {actual}, not {claimed} (deleted and created again?)")]
    Uid {
        pod: String,
        actual: String,
        claimed: String,
    },
    #[error("pod {pod} is scheduled by {scheduler:?}, which this service does not serve")]
    NotOurs { pod: String, scheduler: String },
}

/// Why a pod cannot get devices on a node now ([`Service::commit`], [`Service::assign`]).
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The pod's request is unusable.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The pod's gpu-group-size unit fits in no super-node.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The node cannot take the pod.
    #[error("node {node} cannot take pod {pod}: {unfit}")]
    Unfit {
        node: String,
        pod: String,
        unfit: Box<Unfit>,
    },
    /// Writing the choice on the pod failed; the devices were released.
    #[error("annotating pod {pod}: {source}")]
    Annotate {
        pod: String,
        #[source]
        source: kube::Error,
    },
    /// Another replica leads (or none does now): only the leader hands out devices.
    #[error(
        "this replica does not lead (the lease is held by {holder:?}): only the leader hands out devices"
    )]
    NotLeader { holder: String },
}

impl CommitError {
    /// True when group placement refused the node (the pod's unit is planned elsewhere, another
    /// unit reserved the room, or the unit fits nowhere), not the node's devices.
    pub fn is_placement(&self) -> bool {
        match self {
            CommitError::Placement(_) => true,
            CommitError::Unfit { unfit, .. } => {
                matches!(**unfit, Unfit::Unit(_) | Unfit::Placement(_))
            }
            _ => false,
        }
    }
}

/// How the service decides, from flags.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub scorer: Scoring,
    /// How long a commit waits for the view to show its pod bound with its annotation.
    pub commit_ttl: Duration,
    /// How long a unit's plan waits for its next pod.
    pub reservation_ttl: Duration,
    /// The schedulers (`spec.schedulerName`) whose pods the verbs accept.
    pub scheduler_names: BTreeSet<String>,
    /// Huawei's super-pod parameters, for `sp-block` jobs.
    pub super_pods: SuperPods,
    /// Huawei's default for Ascend jobs without `sp-block` (`--whole-job-super-pod`), applied
    /// where the live view is built.
    pub whole_job_super_pod: bool,
    /// `--keep-waiting-reservations`: waiting plans are renewed while their pods are retried
    /// ([`Ledger::keeping_waiting_plans`]) instead of lapsing when their super-node lost the
    /// room or their unit cannot start ([`crate::core::placement::ensure_plan`]).
    pub keep_waiting_reservations: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            scorer: Scoring::default(),
            commit_ttl: Duration::from_secs(120),
            reservation_ttl: Duration::from_secs(300),
            scheduler_names: ["default-scheduler", "volcano"]
                .into_iter()
                .map(String::from)
                .collect(),
            super_pods: SuperPods::default(),
            whole_job_super_pod: false,
            keep_waiting_reservations: false,
        }
    }
}

/// The state every request shares: the cluster view, the ledger, the settings and (when serving
/// a live cluster) the API client.
#[derive(Debug)]
pub struct Service {
    view: RwLock<Arc<ClusterView>>,
    ledger: RwLock<Ledger>,
    pub settings: Settings,
    kube: OnceLock<KubeOps>,
    /// Leader election, when on (live mode with several replicas).
    leadership: OnceLock<Arc<Leadership>>,
    /// How current the live view is, for `/readyz`.
    freshness: OnceLock<Arc<Freshness>>,
    /// The last [`DECISIONS_KEPT`] scorings (prioritize calls), oldest first, for `/ui`: kept
    /// as the verdicts the verb already had, turned into rows only when the page asks.
    decisions: Mutex<VecDeque<Recorded>>,
    /// Counts view replacements and recorded scorings: what `/ui` shows changed when it moves.
    generation: AtomicU64,
    /// When Volcano last called `allocateFunc`: while it does, it tells this service where it
    /// puts each pod, and Volcano's plans may lapse ([`Asker::Volcano`]).
    last_allocate_func: Mutex<Option<Instant>>,
}

/// The scheduler whose question the service answers, for what it tells the service afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asker {
    /// kube-scheduler's `filter` / `prioritize`: it passes only the nodes its own filters kept
    /// (a new plan is made among them), and `bind` tells the service where each pod goes
    /// (and may be refused), so waiting plans may lapse.
    KubeScheduler,
    /// Volcano's `predicate` / `prioritize`. Volcano tells the service where a pod goes only
    /// through `allocateFunc`, which Volcano v1.10 never calls: the pods it allocates in a
    /// session are unknown here until their binds show in the view, so a unit's plan must
    /// not lapse (its next pod would be planned without the first, and the unit split; seen
    /// in e2e `scheduler_ext_ha`). Waiting plans lapse only while `allocateFunc` calls come
    /// ([`ALLOCATE_FUNC_FRESH`]).
    Volcano,
}

/// How long after Volcano's last `allocateFunc` call its plans may still lapse: a Volcano
/// started again without that verb configured stops them lapsing within this (its restart
/// takes longer); a busy Volcano that has the verb allocates far more often.
pub const ALLOCATE_FUNC_FRESH: Duration = Duration::from_secs(60);

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
    pub rows: Vec<Row>,
}

impl Service {
    /// A service over `view` with default time-to-lives.
    pub fn new(view: ClusterView, scorer: Scoring) -> Self {
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
            ledger: RwLock::new(if settings.keep_waiting_reservations {
                Ledger::keeping_waiting_plans()
            } else {
                Ledger::default()
            }),
            settings,
            kube: OnceLock::new(),
            leadership: OnceLock::new(),
            freshness: OnceLock::new(),
            decisions: Mutex::new(VecDeque::new()),
            generation: AtomicU64::new(0),
            last_allocate_func: Mutex::new(None),
        }
    }

    /// Connects the service to the API server (for `bind` and the pod annotations); once.
    pub fn set_kube(&self, ops: KubeOps) {
        if self.kube.set(ops).is_err() {
            tracing::warn!("API client already set; keeping the first");
        }
    }

    /// Puts the service under leader election (once).
    pub fn set_leadership(&self, leadership: Arc<Leadership>) {
        if self.leadership.set(leadership).is_err() {
            tracing::warn!("leader election already set; keeping the first");
        }
    }

    /// Leader election, when on.
    pub fn leadership(&self) -> Option<&Arc<Leadership>> {
        self.leadership.get()
    }

    /// True when this replica may hand out devices (always, without leader election).
    pub fn leads(&self) -> bool {
        self.leadership.get().is_none_or(|l| l.leads())
    }

    /// Lets `/readyz` judge the live view's watches (once).
    pub fn set_freshness(&self, freshness: Arc<Freshness>) {
        if self.freshness.set(freshness).is_err() {
            tracing::warn!("view freshness already set; keeping the first");
        }
    }

    /// `Ok` while the view is current (every watch listed, none failing for too long); else
    /// why not.
    pub fn readiness(&self) -> Result<(), String> {
        self.freshness.get().map_or(Ok(()), |f| f.check())
    }

    /// `Ok` when this replica hands out devices; else who does.
    pub fn leader_status(&self) -> Result<(), String> {
        if self.leads() {
            return Ok(());
        }
        let holder = self
            .leadership
            .get()
            .map(|l| l.holder())
            .unwrap_or_default();
        Err(format!("not the leader (the lease is held by {holder:?})"))
    }

    /// Counts a promise found on a pod (`fumarole.dev/devices` for `node`, not bound yet) as a
    /// commit, unless the pod has one: a new leader takes over what the last one handed out,
    /// and the commit time-to-live then ends promises that are never bound.
    pub fn adopt(&self, pod: &str, node: &str, resource: &str, devices: Vec<String>) -> bool {
        let mut ledger = self.ledger_mut();
        if ledger.commit_of(pod).is_some() {
            return false;
        }
        ledger.commit(
            pod,
            Commit {
                node: node.to_string(),
                resource: resource.to_string(),
                devices,
                unit: None,
                at: Instant::now(),
            },
        );
        true
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
            pod: pod_key(pod),
            at: SystemTime::now(),
            verdicts,
        };
        let mut kept = self.decisions_kept();
        if kept.len() == DECISIONS_KEPT {
            kept.pop_front();
        }
        kept.push_back(recorded);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// The recorded scorings, newest first, as `explain` rows (device ids from the current
    /// view).
    pub fn decisions(&self) -> Vec<Decision> {
        let view = self.view();
        let weight = self.scorer().weight;
        let kept = self.decisions_kept();
        kept.iter()
            .rev()
            .map(|r| {
                let mut verdicts = r.verdicts.clone();
                best_first(&mut verdicts);
                Decision {
                    pod: r.pod.clone(),
                    at: r.at,
                    rows: verdicts
                        .into_iter()
                        .map(|v| Row::new(v, |raw| scale::volcano(raw, weight), &view))
                        .collect(),
                }
            })
            .collect()
    }

    /// Moves whenever the view is replaced or a scoring is recorded.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The API client, in live mode.
    pub fn kube(&self) -> Option<&KubeOps> {
        self.kube.get()
    }

    pub fn scorer(&self) -> &Scoring {
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
    /// makes redundant; returns the pods whose commits were dropped, with them.
    pub fn replace_view(&self, view: ClusterView) -> Vec<(String, Commit)> {
        let view = Arc::new(view);
        {
            let mut guard = match self.view.write() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            *guard = Arc::clone(&view);
            self.generation.fetch_add(1, Ordering::Relaxed);
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

    pub(crate) fn ledger(&self) -> RwLockReadGuard<'_, Ledger> {
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
    pub fn evaluate<N: AsRef<str>>(
        &self,
        pod: &Pod,
        nodes: &[N],
        asker: Asker,
    ) -> Result<Vec<NodeVerdict>, RequestError> {
        let view = self.view();
        let req = pod_request_in(pod, &view.resources(), view.jobs(), view.claims())?;
        let reserve = self.kube().is_none_or(|ops| ops.knows(pod));
        // Only a unit's pod plans, so only it asks whether plans may lapse (a lock).
        let (plan_among_nodes, lapse) = match asker {
            Asker::KubeScheduler => (true, true),
            Asker::Volcano => (
                false,
                req.unit.is_some() && self.volcano_reports_allocations(),
            ),
        };
        Ok(self.evaluate_request(&view, &req, nodes, plan_among_nodes, reserve, lapse))
    }

    /// Notes a call of Volcano's `allocateFunc` ([`Asker::Volcano`]).
    pub fn allocate_func_called(&self) {
        *self
            .last_allocate_func
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// True while Volcano calls `allocateFunc` ([`ALLOCATE_FUNC_FRESH`]).
    fn volcano_reports_allocations(&self) -> bool {
        self.last_allocate_func
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < ALLOCATE_FUNC_FRESH)
    }

    /// The pod a request names, as the API server has it: a verb that writes acts on this, never
    /// on the request body's copy. Refused when it does not exist, its uid is not the one
    /// claimed (when one is), or its scheduler is not one this service serves. Without an API
    /// server (a snapshot) the claimed pod is taken as it is.
    pub async fn checked_pod(
        &self,
        namespace: &str,
        name: &str,
        claimed_uid: Option<&str>,
    ) -> Result<Option<Pod>, PodCheckError> {
        let Some(ops) = self.kube() else {
            return Ok(None);
        };
        let key = format!("{namespace}/{name}");
        let pod = match ops.pod(namespace, name).await {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(PodCheckError::Unknown { pod: key });
            }
            Err(source) => return Err(PodCheckError::Read { pod: key, source }),
        };
        let actual = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(claimed) = claimed_uid.filter(|u| !u.is_empty())
            && claimed != actual
        {
            return Err(PodCheckError::Uid {
                pod: key,
                actual,
                claimed: claimed.to_string(),
            });
        }
        if !self.serves(&pod) {
            let scheduler = pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduler_name.clone())
                .unwrap_or_default();
            return Err(PodCheckError::NotOurs {
                pod: key,
                scheduler,
            });
        }
        Ok(Some(pod))
    }

    /// True when `pod` is scheduled by one of the schedulers this service serves.
    pub fn serves(&self, pod: &Pod) -> bool {
        let name = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .unwrap_or("default-scheduler");
        self.settings.scheduler_names.contains(name)
    }

    /// The verdicts for `req` on `nodes`. With `reserve` false (a pod the API server does not
    /// know: a forged or stale request) a unit's plan is made on a copy of the ledger, so it
    /// reserves nothing. `lapse`: see [`crate::core::placement::ensure_plan`].
    fn evaluate_request<N: AsRef<str>>(
        &self,
        view: &ClusterView,
        req: &PodRequest,
        nodes: &[N],
        plan_among_nodes: bool,
        reserve: bool,
        lapse: bool,
    ) -> Vec<NodeVerdict> {
        let now = Instant::now();
        let planned = if req.unit.is_some() {
            let candidates: Option<HashSet<&str>> =
                plan_among_nodes.then(|| nodes.iter().map(AsRef::as_ref).collect());
            let mut shared = self.ledger_mut();
            let mut scratch;
            let ledger: &mut Ledger = if reserve {
                &mut shared
            } else {
                scratch = shared.clone();
                drop(shared);
                &mut scratch
            };
            let inputs = PlanInputs {
                candidates: candidates.as_ref(),
                super_pods: self.settings.super_pods,
                now,
                ttl: self.settings.reservation_ttl,
                lapse,
            };
            match decide::plan(view, ledger, req, inputs) {
                Ok(p) => p,
                Err(e) => {
                    return nodes
                        .iter()
                        .map(|n| NodeVerdict::filtered(n.as_ref(), Unfit::Placement(e.clone())))
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
            nodes.iter().map(AsRef::as_ref),
        )
    }

    /// True when `pod` uses a ResourceClaim asking for devices of fumarole's classes, allocated
    /// or not: the service places such a pod but chooses (and writes) no devices for it.
    pub fn asks_through_claims(&self, pod: &Pod) -> bool {
        let view = self.view();
        pod_claims(pod).iter().any(|r| match r {
            ClaimRef::Claim(key) => view
                .claims()
                .get(key)
                .is_some_and(|c| c.as_ref().is_ok_and(|c| !c.asks.is_empty())),
            ClaimRef::NotGenerated { .. } => false,
        })
    }

    /// Chooses and records the devices `pod` gets on `node`. `Ok(None)` for pods without an
    /// accelerator request and for pods asking through ResourceClaims; `Err` is why the node cannot take the pod now. Committing the same
    /// pod to the same node again returns the earlier choice.
    pub fn commit(&self, pod: &Pod, node: &str) -> Result<Option<Commit>, CommitError> {
        self.commit_as(pod, node, Placing::Choose)
    }

    /// [`Self::commit`] for a pod the scheduler already bound to `node`: only which devices
    /// remains to decide, so neither its unit's super-node nor other units' reservations can
    /// refuse it (the pod is there either way); it fails only when the node lacks the devices.
    pub fn commit_bound(&self, pod: &Pod, node: &str) -> Result<Option<Commit>, CommitError> {
        self.commit_as(pod, node, Placing::Bound)
    }

    fn commit_as(
        &self,
        pod: &Pod,
        node: &str,
        placing: Placing,
    ) -> Result<Option<Commit>, CommitError> {
        let view = self.view();
        let req = match pod_request_in(pod, &view.resources(), view.jobs(), view.claims()) {
            Ok(r) => r,
            Err(RequestError::NoAccelerator { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if req.devices.from_claims() {
            // kube-scheduler's DRA allocator picks the devices of a claim: nothing to choose.
            return Ok(None);
        }
        let key = req.devices.pod.clone();
        if !self.leads() {
            let holder = self
                .leadership
                .get()
                .map(|l| l.holder())
                .unwrap_or_default();
            return Err(CommitError::NotLeader { holder });
        }
        let now = Instant::now();
        let ttl = self.settings.reservation_ttl;
        let mut ledger = self.ledger_mut();
        // The view read under the ledger's lock: a new view is installed before the ledger is
        // pruned against it, so a commit dropped because the view shows its pod is never
        // judged with an older view that does not (both would miss the pod's devices).
        let view = self.view();
        if let Some(c) = ledger.commit_of(&key)
            && c.node == node
        {
            return Ok(Some(c.clone()));
        }
        ledger.release(&key);
        let verdict = match placing {
            Placing::Choose => {
                // lapse: bind and allocateFunc are the scheduler telling where the pod goes.
                let inputs = PlanInputs::new(now, ttl).with_super_pods(self.settings.super_pods);
                let planned = decide::plan(&view, &mut ledger, &req, inputs)?;
                decide::judge(
                    Cluster::new(&view, &ledger, now),
                    &self.settings.scorer,
                    &req,
                    planned.as_deref(),
                    [node],
                )
                .pop()
            }
            Placing::Bound => Some(self.settings.scorer.gpu_aware().node(
                &Cluster::new(&view, &ledger, now),
                node,
                &req,
            )),
        };
        // judge answers once per node asked; an empty answer would be a bug, not a node's fault.
        let v = verdict.unwrap_or_else(|| NodeVerdict::filtered(node, Unfit::UnknownNode));
        if let Some(unfit) = v.unfit {
            return Err(CommitError::Unfit {
                node: node.to_string(),
                pod: key,
                unfit: Box::new(unfit),
            });
        }
        let commit = Commit {
            node: node.to_string(),
            resource: req.devices.resource.clone(),
            devices: v.device_ids(&view),
            unit: req.unit.as_ref().map(|g| (g.key.clone(), g.gpus)),
            at: now,
        };
        ledger.commit(&key, commit.clone());
        if let Some(g) = &req.unit {
            ledger.renew_plan(&g.key, now + ttl);
        }
        Ok(Some(commit))
    }

    /// [`Self::commit`], then (live mode) writes the choice on the pod as
    /// `fumarole.dev/devices`; when the write fails the devices are released. Every path that
    /// gives a pod devices goes through here: kube-scheduler's `bind`, Volcano's `allocateFunc`
    /// and ([`Self::assign_bound`]) the after-the-fact annotation of pods bound without us.
    pub async fn assign(&self, pod: &Pod, node: &str) -> Result<Option<Commit>, CommitError> {
        let c = self.commit(pod, node)?;
        self.write_choice(pod, c).await
    }

    /// [`Self::assign`] for a pod already bound to `node` ([`Self::commit_bound`]).
    pub async fn assign_bound(&self, pod: &Pod, node: &str) -> Result<Option<Commit>, CommitError> {
        let c = self.commit_bound(pod, node)?;
        self.write_choice(pod, c).await
    }

    /// Writes a commit on its pod (live mode), releasing it when the write fails.
    async fn write_choice(
        &self,
        pod: &Pod,
        commit: Option<Commit>,
    ) -> Result<Option<Commit>, CommitError> {
        let Some(c) = commit else {
            return Ok(None);
        };
        if let Some(ops) = self.kube() {
            let key = pod_key(pod);
            let (ns, name) = key.split_once('/').unwrap_or(("default", key.as_str()));
            let job = self.job_annotations(pod, &c);
            if let Err(source) = ops
                .annotate(ns, name, Some((&c.node, &c.choice(), &job)))
                .await
            {
                // As for a Binding: a write whose answer was lost may be on the pod.
                if crate::kube_ops::refused_by_server(&source) {
                    self.release(&key);
                }
                return Err(CommitError::Annotate { pod: key, source });
            }
        }
        Ok(Some(c))
    }

    /// The annotations a training job reads that go on `pod` with `commit`, Huawei's way
    /// ([`ascend::job_annotations`]), for a pod given an Ascend resource only:
    /// `hccl/rankIndex` when its rank is stated by its framework or it is in a group (the rank
    /// group placement uses); for a pod of an `sp-block` job on a node in a super-node
    /// `super-pod-rank` (its block, `rank x NPUs / sp-block`) and `super-pod-id` (the
    /// super-node's id, when that is a `SuperPodID`: a non-negative integer). A key the pod
    /// already carries with another value is left out (logged): the user's or another
    /// scheduler's value stands.
    pub fn job_annotations(&self, pod: &Pod, commit: &Commit) -> BTreeMap<String, String> {
        if ascend::chip_of(&commit.resource).is_none() {
            return BTreeMap::new();
        }
        let view = self.view();
        let facts = UnitFacts::of(pod);
        let npus = u32::try_from(commit.devices.len()).unwrap_or(u32::MAX);
        let spec = unit::unit_spec_of(&facts, npus, view.jobs()).ok().flatten();
        let rank = spec
            .as_ref()
            .map(|s| s.rank)
            .or_else(|| facts.stated_rank(view.jobs()));
        let super_pod = spec.as_ref().filter(|s| s.super_pod).and_then(|s| {
            let super_node = view.node(&commit.node)?.super_node.as_deref()?;
            Some(ascend::SuperPodPlace {
                logical: s.atomic_unit,
                physical: ascend::super_pod_id(super_node),
            })
        });
        let want = ascend::job_annotations(rank, super_pod);
        let have = pod.metadata.annotations.as_ref();
        want.into_iter()
            .filter(|(k, v)| match have.and_then(|a| a.get(k)) {
                Some(set) if set != v => {
                    tracing::info!(pod = %pod_key(pod), key = %k, kept = %set, ours = %v,
                        "the pod already carries this annotation; keeping its value");
                    false
                }
                _ => true,
            })
            .collect()
    }

    /// The verdicts for `pod` on every node of the view, best first, through the same steps as
    /// `filter` (group plans included, made in the service's own ledger).
    pub fn explain(&self, pod: &Pod) -> Result<(DeviceRequest, Vec<Row>), RequestError> {
        let view = self.view();
        let names: Vec<String> = view.nodes().map(|n| n.name.clone()).collect();
        let req = pod_request_in(pod, &view.resources(), view.jobs(), view.claims())?;
        // A diagnostic lets no plan lapse: the scheduler may not have told where it put pods.
        let mut verdicts = self.evaluate_request(&view, &req, &names, false, true, false);
        best_first(&mut verdicts);
        let weight = self.scorer().weight;
        Ok((
            req.devices,
            verdicts
                .into_iter()
                .map(|v| Row::new(v, |raw| scale::volcano(raw, weight), &view))
                .collect(),
        ))
    }

    /// Drops the commit of `pod` (`namespace/name`).
    pub fn release(&self, pod: &str) -> Option<Commit> {
        self.ledger_mut().release(pod)
    }
}

/// Services over small made-up clusters, for the tests of this crate.
#[cfg(test)]
pub(crate) mod testing {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use fumarole_topology::crd::device_topology::SuperNodeInfo;

    /// rack-a: a0, a1; rack-b: b0; 8 free GPUs each.
    pub fn service() -> Service {
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
        Service::new(view, Scoring::default())
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
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::testing::{pod, service};
    use super::*;
    use fumarole_topology::crd::device_topology::SuperNodeInfo;

    /// A unit's reservation keeps a newcomer off the reserved super-node when the service
    /// chooses, but a pod the scheduler already bound there still gets its devices.
    #[test]
    fn a_bound_pod_gets_devices_whatever_the_reservations() {
        let svc = service();
        // Unit job-0/1 of 16 GPUs (two pods of 8) reserves a whole super-node: rack-a.
        let unit = pod("job-0", 8, Some(16));
        let planned = svc.evaluate(&unit, &["a0", "a1"], Asker::Volcano).unwrap();
        assert!(planned[0].feasible(), "{planned:?}");
        let stranger = pod("stranger", 4, None);
        let refused = svc.commit(&stranger, "a0").unwrap_err();
        assert!(refused.to_string().contains("reserved for"), "{refused}");
        let c = svc.commit_bound(&stranger, "a0").unwrap().unwrap();
        assert_eq!(c.devices.len(), 4);
        // Only a node without the devices refuses a bound pod.
        let big = pod("big", 8, None);
        let e = svc.commit_bound(&big, "a0").unwrap_err();
        assert!(
            e.to_string().contains("needs 8 nvidia.com/gpu, 4 free"),
            "{e}"
        );
    }

    /// A unit's plan lapses when its super-node lost the room, but only where the scheduler
    /// tells the service where it put the unit's pods: kube-scheduler (bind), Volcano while it
    /// calls `allocateFunc`. Under Volcano v1.10 (no `allocateFunc`) the first pod may already
    /// be allocated there without the service knowing, so the plan holds.
    #[test]
    fn plans_lapse_only_where_the_scheduler_reports_its_placements() {
        let unit = pod("job-0", 4, Some(8));
        let lost_room = || {
            let svc = service();
            // Best fit: rack-b (b0's 8 GPUs are just enough).
            let v = svc.evaluate(&unit, &["a0", "b0"], Asker::Volcano).unwrap();
            assert!(!v[0].feasible() && v[1].feasible(), "{v:?}");
            // A pod bound outside the plans takes half of b0.
            svc.commit_bound(&pod("stranger", 4, None), "b0").unwrap();
            svc
        };
        let b0_passes =
            |svc: &Service, asker| svc.evaluate(&unit, &["b0"], asker).unwrap()[0].feasible();
        // Volcano without allocateFunc: the plan holds (b0 still has the 4 the pod needs).
        let svc = lost_room();
        assert!(b0_passes(&svc, Asker::Volcano));
        // Volcano calling allocateFunc, and kube-scheduler: it lapses, the unit moves to rack-a.
        let svc = lost_room();
        svc.allocate_func_called();
        assert!(!b0_passes(&svc, Asker::Volcano));
        assert!(!b0_passes(&lost_room(), Asker::KubeScheduler));
        // --keep-waiting-reservations: it holds for everyone.
        let keeping = Service::with_settings(
            service().view().as_ref().clone(),
            Settings {
                keep_waiting_reservations: true,
                ..Settings::default()
            },
        );
        assert!(
            keeping
                .evaluate(&unit, &["b0"], Asker::KubeScheduler)
                .unwrap()[0]
                .feasible()
        );
        keeping
            .commit_bound(&pod("stranger", 4, None), "b0")
            .unwrap();
        assert!(b0_passes(&keeping, Asker::KubeScheduler));
    }

    /// A commit settles (is dropped) once the view shows its pod bound with its devices; a
    /// commit made meanwhile must see either the commit or that view, never neither. Views
    /// are replaced in another thread while pods are committed one after another; no device
    /// may be chosen twice. (Each commit judged with the view it read before taking the
    /// ledger gave some pod a device of the pod settled just then; e2e `scheduler_ext_ha`
    /// under kube-scheduler showed it as the node giving that pod other devices.)
    #[test]
    fn commits_racing_view_replacements_never_choose_a_device_twice() {
        use fumarole_topology::annotation::{DEVICES_ANNOTATION, format};
        let bound = |name: &str, c: &Commit| -> Pod {
            let mut p = pod(name, 1, None);
            p.metadata.annotations = Some(BTreeMap::from([(
                DEVICES_ANNOTATION.to_string(),
                format(&c.choice()),
            )]));
            p.spec.as_mut().unwrap().node_name = Some(c.node.clone());
            p
        };
        let dts: Vec<_> = ["a0", "a1", "b0"]
            .into_iter()
            .map(|name| {
                fumarole_topology::crd::testing::nvlink_node(name, 8, 10, &[], |i| {
                    format!("{name}-g{i}")
                })
            })
            .collect();
        for round in 0..300 {
            // Eight one-GPU pods on a0, each committed while the view that settles the one
            // before is being installed.
            let svc = std::sync::Arc::new(Service::new(
                ClusterView::build(&dts, &[], &[], &[]).unwrap(),
                Scoring::default(),
            ));
            let mut placed: Vec<Pod> = Vec::new();
            let mut given: HashSet<String> = HashSet::new();
            for i in 0..8 {
                let name = format!("p{round}-{i}");
                let c = svc.commit(&pod(&name, 1, None), "a0").unwrap().unwrap();
                for d in &c.devices {
                    assert!(
                        given.insert(d.clone()),
                        "{d} chosen twice (round {round}, {name})"
                    );
                }
                placed.push(bound(&name, &c));
                let view = ClusterView::build(&dts, &[], &[], &placed).unwrap();
                let installer = {
                    let svc = std::sync::Arc::clone(&svc);
                    std::thread::spawn(move || {
                        svc.replace_view(view);
                    })
                };
                // The next commit races the installation.
                if i < 7 {
                    let next = format!("p{round}-{}", i + 1);
                    let c = svc.commit(&pod(&next, 1, None), "a0").unwrap().unwrap();
                    svc.release(&format!("ml/{next}"));
                    for d in &c.devices {
                        assert!(
                            !given.contains(d),
                            "{d} chosen twice (round {round}, {next})"
                        );
                    }
                }
                installer.join().unwrap();
            }
        }
    }

    /// A pod asking through a claim is judged by the same gpu-aware logic as the pod asking
    /// for the extended resource: on `a` (NPUs 0-2 held by an allocated claim) one NPU is the
    /// last of a broken HCCS group, so `a` scores 10 where the untouched `b`, whose whole group
    /// it would break, scores 8 (what `e2e/tests/dra_extension.rs` shows with kube-scheduler).
    /// No device is chosen for it.
    #[test]
    fn claim_pods_are_scored_like_extended_resource_pods_and_get_no_device_choice() {
        use crate::core::claims::Claims;
        use crate::core::claims::testing::{ascend_node, claim, claim_pod};
        use crate::core::view::ContextCache;
        const NPU: &str = "npu.fumarole.dev";
        let holder = claim_pod("holder", &["held"], Some("a"), serde_json::json!({}));
        let view = ClusterView::build_with_jobs(
            &mut ContextCache::default(),
            &[ascend_node("a"), ascend_node("b")],
            &[],
            &[],
            &[crate::core::pod_facts::PodFacts::of(&holder)],
            Claims::new(&[
                claim("held", NPU, 3, Some(("a", &[0, 1, 2]))),
                claim("one", NPU, 1, None),
                claim("five", NPU, 5, None),
            ]),
            crate::core::unit::JobSources::default(),
        )
        .unwrap();
        let svc = Service::new(view, Scoring::default());
        let by_claim = claim_pod("single", &["one"], None, serde_json::json!({}));
        let v = svc
            .evaluate(&by_claim, &["a", "b"], Asker::KubeScheduler)
            .unwrap();
        let (a, b) = (v[0].raw.unwrap(), v[1].raw.unwrap());
        assert_eq!(
            (scale::kube_scheduler(a), scale::kube_scheduler(b)),
            (10, 8),
            "{v:?}"
        );
        // The extended-resource pod of the same size gets the same verdicts.
        let by_resource = pod_asking("huawei.com/Ascend910", 1);
        let e = svc
            .evaluate(&by_resource, &["a", "b"], Asker::KubeScheduler)
            .unwrap();
        assert_eq!((e[0].raw, e[1].raw), (v[0].raw, v[1].raw));
        // Fit counts the held NPUs: a has 5 free, enough for five, not for eight.
        let five = claim_pod("five", &["five"], None, serde_json::json!({}));
        assert!(svc.evaluate(&five, &["a"], Asker::KubeScheduler).unwrap()[0].feasible());
        let eight = pod_asking("huawei.com/Ascend910", 8);
        let r = svc
            .evaluate(&eight, &["a", "b"], Asker::KubeScheduler)
            .unwrap();
        assert!(!r[0].feasible() && r[1].feasible(), "{r:?}");
        assert!(
            r[0].reason().unwrap().contains("5 free"),
            "{:?}",
            r[0].reason()
        );
        // Placed, not given devices: kube-scheduler's DRA allocator picks them.
        assert!(svc.commit(&by_claim, "a").unwrap().is_none());
        assert!(svc.asks_through_claims(&by_claim));
        assert!(svc.asks_through_claims(&holder), "allocated or not");
        assert!(!svc.asks_through_claims(&by_resource));
        assert!(svc.commit(&by_resource, "a").unwrap().is_some());
        // A pod whose claim is missing gets the reason, not a panic.
        let lost = claim_pod("lost", &["gone"], None, serde_json::json!({}));
        let e = svc
            .evaluate(&lost, &["a"], Asker::KubeScheduler)
            .unwrap_err();
        assert!(e.to_string().contains("ml/gone"), "{e}");
    }

    /// Huawei's job annotations for an Ascend pod: the rank group placement uses, the block and
    /// the super-node's id where it is a number; a value the pod already has stands; GPUs and
    /// pods whose rank is only guessed from their name get none.
    #[test]
    fn job_annotations_follow_the_rank_and_the_super_node() {
        let node = |name: &str, super_node: Option<&str>| {
            let mut t = fumarole_topology::crd::testing::atlas_800_910(name, &[]);
            t.spec.super_node = super_node.map(|id| SuperNodeInfo {
                id: id.into(),
                source: "config".into(),
            });
            t
        };
        let worker = |i: u32, extra: serde_json::Value| -> Pod {
            let mut annotations = serde_json::json!({"volcano.sh/task-index": i.to_string()});
            if i == 0 {
                annotations["sp-block"] = "16".into();
            }
            if let (Some(a), Some(extra)) = (annotations.as_object_mut(), extra.as_object()) {
                a.extend(extra.clone());
            }
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("sp-worker-{i}"), "namespace": "ml",
                             "labels": {"volcano.sh/job-name": "sp", "volcano.sh/task-spec": "worker"},
                             "annotations": annotations},
                "spec": {"containers": [{"name": "c",
                    "resources": {"limits": {"huawei.com/Ascend910": "8"}}}]}
            }))
            .unwrap()
        };
        let pods: Vec<Pod> = (0..4).map(|i| worker(i, serde_json::json!({}))).collect();
        let view = ClusterView::build(
            &[
                node("n0", Some("7")),
                node("r0", Some("rack-r")),
                node("solo", None),
            ],
            &[],
            &[],
            &pods,
        )
        .unwrap();
        let svc = Service::new(view, Scoring::default());
        let commit = |node: &str, resource: &str| Commit {
            node: node.into(),
            resource: resource.into(),
            devices: (0..8).map(|i| format!("Ascend910-{i}")).collect(),
            unit: None,
            at: Instant::now(),
        };
        let npu = "huawei.com/Ascend910";
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            svc.job_annotations(&pods[2], &commit("n0", npu)),
            map(&[
                ("hccl/rankIndex", "2"),
                ("super-pod-id", "7"),
                ("super-pod-rank", "1")
            ])
        );
        assert_eq!(
            svc.job_annotations(&pods[1], &commit("r0", npu)),
            map(&[("hccl/rankIndex", "1"), ("super-pod-rank", "0")])
        );
        assert_eq!(
            svc.job_annotations(&pods[3], &commit("solo", npu)),
            map(&[("hccl/rankIndex", "3")])
        );
        // A value already on the pod stands (ours is left out); the same value is written.
        let preset = worker(
            3,
            serde_json::json!({"hccl/rankIndex": "garbled", "super-pod-id": "7"}),
        );
        assert_eq!(
            svc.job_annotations(&preset, &commit("n0", npu)),
            map(&[("super-pod-id", "7"), ("super-pod-rank", "1")])
        );
        // Not an Ascend resource: nothing.
        assert!(
            svc.job_annotations(&pods[2], &commit("n0", "nvidia.com/gpu"))
                .is_empty()
        );
        // A lone pod whose only rank is the number ending its name: no rank written; a
        // StatefulSet's ordinal is a rank.
        let lone = pod_asking(npu, 8);
        assert!(svc.job_annotations(&lone, &commit("solo", npu)).is_empty());
        let mut sts = lone.clone();
        sts.metadata.labels = Some(BTreeMap::from([(
            "apps.kubernetes.io/pod-index".to_string(),
            "4".to_string(),
        )]));
        assert_eq!(
            svc.job_annotations(&sts, &commit("solo", npu)),
            map(&[("hccl/rankIndex", "4")])
        );
    }

    fn pod_asking(resource: &str, n: u32) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("ext-{n}"), "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: n.to_string()}}}]}
        }))
        .unwrap()
    }
}
