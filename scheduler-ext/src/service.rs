//! The service: what one running extender puts together, each part in its own module:
//!
//! - the [`Decider`] (view, ledger, evaluate / commit / release / explain; synchronous, no I/O);
//! - the [`Effects`] (the API writes; live mode only);
//! - leader election ([`crate::controllers::leader`]) and the view's freshness
//!   ([`crate::freshness`]), for `/readyz` and `/leaderz`;
//! - the `/ui` decision log ([`crate::decision_log`]);
//! - the memo of kube-scheduler's last filters, for the prioritize after each
//!   ([`crate::filter_memo`]).
//!
//! What needs both a decision and a write is composed here: [`Service::assign`] (the decider
//! commits, the effects write the choice on the pod, and a write the API server refused is
//! released), [`Service::withdraw`] and [`Service::checked_pod`]. The protocols
//! ([`crate::protocol`]) are functions over `&Service`: they ask [`Service::decider`] for
//! decisions and come here for writes.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::Pod;

use crate::controllers::leader::Leadership;
use crate::core::ledger::Commit;
use crate::core::request::{RequestError, pod_key};
use crate::core::score::Scoring;
use crate::core::verdict::NodeVerdict;
use crate::core::view::ClusterView;
use crate::decider::{Asker, CommitError, Decider, PodSource, Settings};
use crate::decision_log::{Decision, DecisionLog};
use crate::effects::{self, Effects, PodCheckError, Withdrawal};
use crate::filter_memo::FilterMemo;
use crate::freshness::Freshness;

/// Why a pod cannot get devices on a node now ([`Service::assign`]).
#[derive(Debug, thiserror::Error)]
pub enum AssignError {
    /// The decider refused.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// Writing the choice on the pod failed; the devices were released.
    #[error("annotating pod {pod}: {source}")]
    Annotate {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

impl AssignError {
    /// True when group placement refused the node ([`CommitError::is_placement`]).
    pub fn is_placement(&self) -> bool {
        matches!(self, AssignError::Commit(e) if e.is_placement())
    }
}

/// The decider and what runs around it (see the module's documentation).
#[derive(Debug)]
pub struct Service {
    decider: Decider,
    effects: OnceLock<Effects>,
    /// Leader election, when on (live mode with several replicas).
    leadership: OnceLock<Arc<Leadership>>,
    /// How current the live view is, for `/readyz`.
    freshness: OnceLock<Arc<Freshness>>,
    decisions: DecisionLog,
    filters: FilterMemo,
}

impl Service {
    /// A service over `view` with default settings but the scorer.
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
        Self::over(Decider::new(view, settings))
    }

    /// A service around `decider`.
    pub fn over(decider: Decider) -> Self {
        Service {
            decider,
            effects: OnceLock::new(),
            leadership: OnceLock::new(),
            freshness: OnceLock::new(),
            decisions: DecisionLog::default(),
            filters: FilterMemo::default(),
        }
    }

    /// The decisions: view, ledger, evaluate / commit / release / explain.
    pub fn decider(&self) -> &Decider {
        &self.decider
    }

    /// Connects the service to the API server (for `bind` and the pod annotations); once.
    pub fn set_effects(&self, effects: Effects) {
        if self.effects.set(effects).is_err() {
            tracing::warn!("API client already set; keeping the first");
        }
    }

    /// The API writes, in live mode.
    pub fn effects(&self) -> Option<&Effects> {
        self.effects.get()
    }

    /// Puts the service under leader election (once): only the leader commits.
    pub fn set_leadership(&self, leadership: Arc<Leadership>) {
        if self.leadership.set(Arc::clone(&leadership)).is_err() {
            tracing::warn!("leader election already set; keeping the first");
            return;
        }
        self.decider.set_fence(leadership);
    }

    /// Leader election, when on.
    pub fn leadership(&self) -> Option<&Arc<Leadership>> {
        self.leadership.get()
    }

    /// True when this replica may hand out devices (always, without leader election).
    pub fn leads(&self) -> bool {
        self.decider.leads()
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
        let holder = self.decider.holder();
        Err(format!("not the leader (the lease is held by {holder:?})"))
    }

    /// Remembers a scoring of `pod` for `/ui` ([`DecisionLog::record`]).
    pub fn record_decision(&self, pod: &Pod, verdicts: Arc<Vec<NodeVerdict>>) {
        self.decisions.record(pod, verdicts);
    }

    /// The memo of kube-scheduler's last filters ([`FilterMemo`]).
    pub fn filters(&self) -> &FilterMemo {
        &self.filters
    }

    /// The recorded scorings, newest first, as `explain` rows (device ids from the current
    /// view, scores on `scale`).
    pub fn decisions(&self, scale: impl Fn(f64) -> f64) -> Vec<Decision> {
        let view = self.decider.view();
        self.decisions.decisions(&view, scale)
    }

    /// Moves whenever the view is replaced or a scoring is recorded: what `/ui` shows changed.
    pub fn generation(&self) -> u64 {
        self.decider
            .generation()
            .wrapping_add(self.decisions.generation())
    }

    /// The decider's verdicts for `pod` on `nodes` ([`Decider::evaluate_from`]); a pod the
    /// live pod store does not know (a forged or stale request) reserves nothing.
    pub fn evaluate<N: AsRef<str>>(
        &self,
        pod: &Pod,
        nodes: &[N],
        asker: Asker,
    ) -> Result<Vec<NodeVerdict>, RequestError> {
        let source = if self.effects().is_none_or(|e| e.knows(pod)) {
            PodSource::Known
        } else {
            PodSource::Unknown
        };
        self.decider.evaluate_from(pod, nodes, asker, source)
    }

    /// The pod a request names, as the API server has it ([`Effects::checked_pod`], with the
    /// decider's schedulers). Without an API server (a snapshot) `None`: the claimed pod is
    /// taken as it is.
    pub async fn checked_pod(
        &self,
        namespace: &str,
        name: &str,
        claimed_uid: Option<&str>,
    ) -> Result<Option<Pod>, PodCheckError> {
        let Some(effects) = self.effects() else {
            return Ok(None);
        };
        let serves = |pod: &Pod| self.decider.serves(pod);
        effects
            .checked_pod(namespace, name, claimed_uid, serves)
            .await
            .map(Some)
    }

    /// [`Decider::commit`], then (live mode) writes the choice on the pod as
    /// `fumarole.dev/devices`; when the API server refuses the write the devices are released.
    /// Every path that gives a pod devices goes through here: Volcano's `allocateFunc` and
    /// ([`Self::assign_bound`]) the after-the-fact annotation of pods bound without us;
    /// kube-scheduler's `bind` writes the choice with the Binding instead.
    pub async fn assign(&self, pod: &Pod, node: &str) -> Result<Option<Commit>, AssignError> {
        let c = self.decider.commit(pod, node)?;
        self.write_choice(pod, c).await
    }

    /// [`Self::assign`] for a pod already bound to `node` ([`Decider::commit_bound`]).
    pub async fn assign_bound(&self, pod: &Pod, node: &str) -> Result<Option<Commit>, AssignError> {
        let c = self.decider.commit_bound(pod, node)?;
        self.write_choice(pod, c).await
    }

    /// Writes a commit on its pod (live mode), releasing it when the API server refused the
    /// write.
    pub async fn write_choice(
        &self,
        pod: &Pod,
        commit: Option<Commit>,
    ) -> Result<Option<Commit>, AssignError> {
        let Some(c) = commit else {
            return Ok(None);
        };
        // A share's replica is the device plugin's pick: there is no choice to write.
        if let Some(effects) = self.effects().filter(|_| !c.share) {
            let key = pod_key(pod);
            let (ns, name) = key.split_once('/').unwrap_or(("default", key.as_str()));
            let job = self.decider.job_annotations(pod, &c);
            if let Err(source) = effects
                .annotate(ns, name, Some((&c.node, &c.choice(), &job)))
                .await
            {
                // As for a Binding: a write whose answer was lost may be on the pod.
                if effects::refused_by_server(&source) {
                    self.decider.release(&key);
                }
                return Err(AssignError::Annotate { pod: key, source });
            }
        }
        Ok(Some(c))
    }

    /// Creates `pod`'s Binding to `node` through `ops`, carrying `commit`'s device choice and
    /// the job annotations (`None`: a pod whose devices come from ResourceClaims, bound without
    /// a choice of ours; a share commit carries none either). A Binding whose answer was lost may have been written, and it carries
    /// the devices: they stay committed until the view shows the pod bound with them, the pod
    /// goes, or `--commit-ttl` passes; a retry on another node replaces the commit. Only a
    /// refusal by the API server frees them now. kube-scheduler's `bind` verb and its plugin's
    /// Bind both bind through here.
    pub async fn bind(
        &self,
        ops: &Effects,
        pod: &Pod,
        node: &str,
        commit: Option<&Commit>,
    ) -> Result<(), kube::Error> {
        let key = pod_key(pod);
        let (ns, name) = key.split_once('/').unwrap_or(("default", key.as_str()));
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let (choice, job) = match commit {
            Some(c) if !c.share => (Some(c.choice()), self.decider.job_annotations(pod, c)),
            _ => (None, Default::default()),
        };
        let bound = ops.bind(ns, name, uid, node, choice.as_ref(), &job).await;
        if let Err(e) = &bound
            && effects::refused_by_server(e)
        {
            self.decider.release(&key);
        }
        bound
    }

    /// Removes a promise whose commit timed out from its pod ([`Effects::withdraw`]). When the
    /// write fails the commit is taken back, to try again when it times out.
    pub async fn withdraw(&self, pod: &str, commit: Commit) {
        let node = commit.node.as_str();
        let Some(effects) = self.effects() else {
            return;
        };
        match effects.withdraw(pod, node).await {
            Ok(Withdrawal::Withdrawn) => tracing::info!(
                pod,
                node,
                "promise never bound within the commit time-to-live: withdrawn"
            ),
            Ok(Withdrawal::Moot) => {}
            Err(e) => {
                tracing::warn!(pod, node, error = %e, "withdrawing a timed-out promise failed; trying again after the commit time-to-live");
                self.decider
                    .adopt(pod, node, &commit.resource, commit.devices);
            }
        }
    }
}
