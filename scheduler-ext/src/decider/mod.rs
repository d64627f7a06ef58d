//! The decider: one [`ClusterView`] and one [`Ledger`] shared by every request, and what a
//! scheduler asks of them: [`Decider::evaluate`] (where could this pod go),
//! [`Decider::commit`] (choose and record its devices on this node), [`Decider::release`]
//! (take them back) and [`Decider::explain`]; plus the job annotations that go with a choice
//! ([`job_annotations`]). Start at [`Decider`].
//!
//! Synchronous and without I/O: nothing here calls the API server, awaits or needs a runtime,
//! so the same decider can serve the HTTP extender ([`crate::service::Service`] puts it
//! beside the API writes of [`crate::effects`]), `explain`, the kubectl plugin and, through a
//! C ABI, a scheduler's own plugin. Clocks are read (`Instant::now`) as the decisions need.
//!
//! The live view ([`crate::live`]) replaces the view as the reflectors see changes
//! ([`Decider::replace_view`]), which also prunes the ledger. Of several replicas only the
//! leader commits: a [`Fence`] (the leader election, [`crate::controllers::leader`]) refuses
//! commits with [`CommitError::NotLeader`] on the others.
//!
//! Locking: the view is an `Arc` swapped under a short write lock; the ledger sits behind one
//! `RwLock`, and a commit checks and takes devices under its write lock, so two pods never get
//! one device.

mod asker;
mod job_annotations;
mod settings;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

pub use asker::{ALLOCATE_FUNC_FRESH, AllocateClock, Asker};
pub use job_annotations::job_annotations;
pub use settings::Settings;

use crate::core::claims::{ClaimRef, pod_claims};
use crate::core::cluster::Cluster;
use crate::core::decide;
use crate::core::explain::Row;
use crate::core::ledger::{Commit, Ledger};
use crate::core::placement::{self, PlacementError, PlanInputs};
use crate::core::request::{DeviceRequest, PodRequest, RequestError, pod_request_in};
use crate::core::score::Scoring;
use crate::core::verdict::{NodeVerdict, Unfit, best_first};
use crate::core::view::ClusterView;

/// Whether a commit still chooses the node, or only the devices on a node already bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placing {
    Choose,
    Bound,
}

/// Whether the API server knows the pod a request names. A unit's plan made for a
/// [`PodSource::Unknown`] pod (a forged or stale request) is made on a copy of the ledger, so
/// it reserves nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodSource {
    Known,
    Unknown,
}

/// Who may hand out devices now: of several replicas, the leader only.
pub trait Fence: Send + Sync + std::fmt::Debug {
    /// True when this replica may hand out devices.
    fn leads(&self) -> bool;
    /// Who holds the lease, as last read.
    fn holder(&self) -> String;
}

/// Why a pod cannot get devices on a node now ([`Decider::commit`]).
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

/// The view, the ledger and the settings every decision shares.
#[derive(Debug)]
pub struct Decider {
    view: RwLock<Arc<ClusterView>>,
    ledger: RwLock<Ledger>,
    settings: Settings,
    /// Leader election, when on: only the leader commits.
    fence: OnceLock<Arc<dyn Fence>>,
    allocate_clock: AllocateClock,
    /// Counts view replacements.
    generation: AtomicU64,
}

impl Decider {
    /// A decider over `view`, deciding as `settings` say.
    pub fn new(view: ClusterView, settings: Settings) -> Self {
        Decider {
            view: RwLock::new(Arc::new(view)),
            ledger: RwLock::new(
                if settings.keep_waiting_reservations {
                    Ledger::keeping_waiting_plans()
                } else {
                    Ledger::default()
                }
                .in_node_pool(settings.node_pool.clone()),
            ),
            settings,
            fence: OnceLock::new(),
            allocate_clock: AllocateClock::default(),
            generation: AtomicU64::new(0),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn scorer(&self) -> &Scoring {
        &self.settings.scorer
    }

    /// Lets only the leader commit (once).
    pub fn set_fence(&self, fence: Arc<dyn Fence>) {
        if self.fence.set(fence).is_err() {
            tracing::warn!("leader election already set; keeping the first");
        }
    }

    /// True when this replica may hand out devices (always, without leader election).
    pub fn leads(&self) -> bool {
        self.fence.get().is_none_or(|f| f.leads())
    }

    /// Who holds the lease (empty without leader election).
    pub fn holder(&self) -> String {
        self.fence.get().map(|f| f.holder()).unwrap_or_default()
    }

    /// Moves whenever the view is replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
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

    /// Runs `f` over the view and the ledger as one request would see them.
    pub fn with_cluster<R>(&self, f: impl FnOnce(Cluster<'_>) -> R) -> R {
        let view = self.view();
        let ledger = self.ledger();
        f(Cluster::new(&view, &ledger, Instant::now()))
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
                share: false,
            },
        );
        true
    }

    /// The verdicts for `pod` on `nodes`, in order, for a pod the API server knows
    /// ([`Self::evaluate_from`]).
    pub fn evaluate<N: AsRef<str>>(
        &self,
        pod: &Pod,
        nodes: &[N],
        asker: Asker,
    ) -> Result<Vec<NodeVerdict>, RequestError> {
        self.evaluate_from(pod, nodes, asker, PodSource::Known)
    }

    /// The verdicts for `pod` on `nodes`, in order. A pod of a gpu-group-size unit first gets
    /// its sub-unit's super-node planned (among `nodes` when `asker` is kube-scheduler, else
    /// the whole view; reserving only for a [`PodSource::Known`] pod); when no super-node can
    /// take it every node gets that reason.
    pub fn evaluate_from<N: AsRef<str>>(
        &self,
        pod: &Pod,
        nodes: &[N],
        asker: Asker,
        source: PodSource,
    ) -> Result<Vec<NodeVerdict>, RequestError> {
        let view = self.view();
        let req = pod_request_in(pod, &view.resources(), view.jobs(), view.claims())?;
        let reserve = source == PodSource::Known;
        let plan_among_nodes = asker == Asker::KubeScheduler;
        let lapse = self.may_lapse(asker, &req);
        Ok(self.evaluate_request(&view, &req, nodes, plan_among_nodes, reserve, lapse))
    }

    /// Whether `asker`'s call may let `req`'s unit's plan lapse (see
    /// [`crate::core::placement::ensure_plan`]). Only a unit's pod plans, so only it asks the
    /// allocate clock (a lock).
    fn may_lapse(&self, asker: Asker, req: &PodRequest) -> bool {
        match asker {
            Asker::KubeScheduler => true,
            Asker::Volcano => req.unit.is_some() && self.allocate_clock.fresh(),
            Asker::Plugin => req.unit.is_some(),
        }
    }

    /// [`Self::evaluate_from`] on every node of the current view, in the view's order (no
    /// node looked up by name), with that view: its [`ClusterView::names_generation`] names the
    /// order of the verdicts.
    pub fn evaluate_everywhere(
        &self,
        pod: &Pod,
        asker: Asker,
        source: PodSource,
    ) -> Result<(Arc<ClusterView>, Vec<NodeVerdict>), RequestError> {
        let view = self.view();
        let req = pod_request_in(pod, &view.resources(), view.jobs(), view.claims())?;
        let reserve = source == PodSource::Known;
        let lapse = self.may_lapse(asker, &req);
        // Every node is a candidate, so the plan needs no candidate set.
        let now = Instant::now();
        let planned = match self.plan_for(&view, &req, None, reserve, lapse, now) {
            Ok(p) => p,
            Err(e) => {
                let verdicts = view
                    .nodes()
                    .map(|n| NodeVerdict::filtered(&n.name, Unfit::Placement(e.clone())))
                    .collect();
                return Ok((view, verdicts));
            }
        };
        let ledger = self.ledger();
        let verdicts = decide::judge_nodes(
            Cluster::new(&view, &ledger, now),
            &self.settings.scorer,
            &req,
            planned.as_deref(),
            view.nodes().map(|n| (n.name.as_str(), Some(n))),
        );
        Ok((view, verdicts))
    }

    /// The scheduler's other filters refused every node fumarole found fit for `pod` (a taint
    /// on every node of its unit's super-node, say, which fumarole does not judge): when
    /// nothing of the pod's sub-unit is placed or committed, its plan is given up and its
    /// super-node avoided for the sub-unit for one reservation time-to-live, so the next try
    /// plans it elsewhere. Returns that super-node; `None` for a pod outside any unit, a unit
    /// with no plan, or one already started there (moving it would split it).
    pub fn give_up_plan(&self, pod: &Pod) -> Result<Option<String>, RequestError> {
        let view = self.view();
        let req = pod_request_in(pod, &view.resources(), view.jobs(), view.claims())?;
        let Some(unit) = &req.unit else {
            return Ok(None);
        };
        let now = Instant::now();
        let mut ledger = self.ledger_mut();
        if !placement::placed(&Cluster::new(&view, &ledger, now), &unit.key).is_empty() {
            return Ok(None);
        }
        Ok(ledger.give_up_plan(&unit.key, now + self.settings.reservation_ttl))
    }

    /// How many times the ledger gave room back so far (a commit released, a plan dropped):
    /// when it moves, pods refused for want of room may fit ([`Ledger::room_freed`]).
    pub fn room_freed(&self) -> u64 {
        self.ledger().room_freed()
    }

    /// Notes a call of Volcano's `allocateFunc` ([`Asker::Volcano`]).
    pub fn allocate_func_called(&self) {
        self.allocate_clock.called();
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
        let candidates: Option<HashSet<&str>> = (plan_among_nodes && req.unit.is_some())
            .then(|| nodes.iter().map(AsRef::as_ref).collect());
        let planned = match self.plan_for(view, req, candidates.as_ref(), reserve, lapse, now) {
            Ok(p) => p,
            Err(e) => {
                return nodes
                    .iter()
                    .map(|n| NodeVerdict::filtered(n.as_ref(), Unfit::Placement(e.clone())))
                    .collect();
            }
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

    /// The super-node of `req`'s unit (`None` outside any unit), planned among `candidates`
    /// (`None`: every node) when it has none yet. With `reserve` false the plan is made on a
    /// copy of the ledger, so it reserves nothing.
    fn plan_for(
        &self,
        view: &ClusterView,
        req: &PodRequest,
        candidates: Option<&HashSet<&str>>,
        reserve: bool,
        lapse: bool,
        now: Instant,
    ) -> Result<Option<String>, PlacementError> {
        if req.unit.is_none() {
            return Ok(None);
        }
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
            candidates,
            super_pods: self.settings.super_pods,
            now,
            ttl: self.settings.reservation_ttl,
            lapse,
        };
        decide::plan(view, ledger, req, inputs)
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
    /// accelerator request and for pods asking through ResourceClaims; `Err` is why the node
    /// cannot take the pod now. Committing the same pod to the same node again returns the
    /// earlier choice.
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
            return Err(CommitError::NotLeader {
                holder: self.holder(),
            });
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
        // A bound pod whose choice for this node the view already shows (written since the
        // caller read the pod, its commit then settled): nothing to choose. Read under the
        // ledger's lock, so a commit pruned against this view is never chosen again.
        if placing == Placing::Bound && view.annotated_on(&key) == Some(node) {
            return Ok(None);
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
        let share = view
            .node(node)
            .is_some_and(|nv| nv.offers_shares(&req.devices.resource));
        let commit = Commit {
            node: node.to_string(),
            resource: req.devices.resource.clone(),
            devices: v.device_ids(&view),
            unit: req.unit.as_ref().map(|g| (g.key.clone(), g.gpus)),
            at: now,
            share,
        };
        ledger.commit(&key, commit.clone());
        if let Some(g) = &req.unit {
            ledger.renew_plan(&g.key, now + ttl);
        }
        Ok(Some(commit))
    }

    /// The job annotations to write on `pod` with `commit` ([`job_annotations`]).
    pub fn job_annotations(&self, pod: &Pod, commit: &Commit) -> BTreeMap<String, Option<String>> {
        job_annotations(&self.view(), pod, commit)
    }

    /// The verdicts for `pod` on every node of the view, best first, through the same steps as
    /// `filter` (group plans included, made in the decider's own ledger), with scores on the
    /// caller's `scale` (`protocol::scale::shown`).
    pub fn explain(
        &self,
        pod: &Pod,
        scale: impl Fn(f64) -> f64,
    ) -> Result<(DeviceRequest, Vec<Row>), RequestError> {
        let view = self.view();
        let names: Vec<String> = view.nodes().map(|n| n.name.clone()).collect();
        let req = pod_request_in(pod, &view.resources(), view.jobs(), view.claims())?;
        // A diagnostic lets no plan lapse: the scheduler may not have told where it put pods.
        let mut verdicts = self.evaluate_request(&view, &req, &names, false, true, false);
        best_first(&mut verdicts);
        Ok((
            req.devices,
            verdicts
                .into_iter()
                .map(|v| Row::new(v, &scale, &view))
                .collect(),
        ))
    }

    /// Drops the commit of `pod` (`namespace/name`).
    pub fn release(&self, pod: &str) -> Option<Commit> {
        self.ledger_mut().release(pod)
    }
}
