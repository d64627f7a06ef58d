//! The engine inside a scheduler's process: the scheduler extension's decider, kept current by
//! the same API server watches the extender uses ([`scheduler_ext::live`]), on a small tokio
//! runtime of its own. The scheduler asks it synchronously: judge a task on every node at once,
//! commit an allocation, release one. Device choices are written to the pods from the runtime,
//! so an allocation never waits for the API server; where the scheduler has a hook before its
//! bind (Volcano v1.14's PreBinder), the choice is written there instead, and the bind waits;
//! where the plugin binds itself (kube-scheduler's Bind), the Binding carries it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::Pod;
use scheduler_ext::core::ledger::Commit;
use scheduler_ext::core::request::{RequestError, pod_key};
use scheduler_ext::core::verdict::Unfit;
use scheduler_ext::core::view::ClusterView;
use scheduler_ext::decider::{Asker, PodSource};
use scheduler_ext::live::{self, LiveOptions};
use scheduler_ext::protocol::scale;
use scheduler_ext::service::Service;
use serde::Deserialize;

use crate::kube_conf::KubeSchedulerConf;
use crate::volcano_conf::{Translated, VolcanoConf};

/// How the engine starts: where the API server is, and the scheduler's configuration.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EngineConfig {
    /// The scheduler's `--kubeconfig`; empty: KUBECONFIG, ~/.kube/config or in-cluster.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The scheduler's `--master`, which overrides the kubeconfig's server.
    #[serde(default)]
    pub master: Option<String>,
    /// A kubeconfig's text, in place of `kubeconfig` (kube-scheduler hands its plugins a
    /// client configuration, not the file it came from).
    #[serde(default)]
    pub kubeconfig_yaml: Option<String>,
    /// The fumarole plugins and configurations Volcano's configuration lists (the Volcano
    /// plugin).
    #[serde(default)]
    pub volcano: Option<VolcanoConf>,
    /// The profiles and arguments of kube-scheduler's configuration (the kube-scheduler
    /// plugin). At most one of the two.
    #[serde(default)]
    pub kube_scheduler: Option<KubeSchedulerConf>,
}

impl EngineConfig {
    /// The decider's settings for the scheduler this engine is inside.
    pub fn translate(&self) -> Result<Translated> {
        match (&self.volcano, &self.kube_scheduler) {
            (Some(_), Some(_)) => Err(anyhow!(
                "the engine configuration names both Volcano and kube-scheduler; one engine serves one scheduler"
            )),
            (None, Some(kube)) => kube.translate(),
            (Some(volcano), None) => volcano.translate(),
            (None, None) => VolcanoConf::default().translate(),
        }
    }
}

/// A task's verdict on one node, as the scheduler's predicate and node-order read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Fits = 0,
    /// Not now: another placement could free the room.
    Unschedulable = 2,
    /// Not on this node whatever happens (no devices of the kind).
    Unresolvable = 3,
}

/// What judging a task gives.
#[derive(Clone, Debug, PartialEq)]
pub enum Evaluation {
    /// The task asks for no device fumarole serves: every node passes, none scores.
    NotOurs,
    /// The verdicts on every node of the view, in its order.
    Verdicts(VerdictTable),
}

/// A task's verdicts on every node of the view, in the view's node order: what
/// [`crate::fumarole_task_evaluate_arrays`] hands over as arrays, and
/// [`crate::fumarole_task_evaluate`] as text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VerdictTable {
    /// Lines separated by TABs: `G generation` (names the view's node order), `N name` per
    /// node in that order when the caller's known generation is another, then the distinct
    /// reasons (`R text`).
    pub header: String,
    /// Per node: [`Code`] as a number.
    pub codes: Vec<u8>,
    /// Per node: the score on Volcano's scale (0..100 times `weight`); 0 where it does not fit.
    pub scores: Vec<f64>,
    /// Per node: the index of its reason among the `R` lines, -1 where it fits.
    pub reasons: Vec<i32>,
}

impl VerdictTable {
    /// The whole table as text: the header, then `code TAB score TAB reason` per node (the
    /// reason empty where the node fits).
    pub fn text(&self) -> String {
        let mut out = String::with_capacity(self.header.len() + self.codes.len() * 8);
        out.push_str(&self.header);
        for ((code, score), reason) in self.codes.iter().zip(&self.scores).zip(&self.reasons) {
            // Writing to a String cannot fail.
            let _ = if *reason >= 0 {
                writeln!(out, "{code}\t0\t{reason}")
            } else {
                writeln!(out, "{code}\t{score}\t")
            };
        }
        out
    }
}

/// The longest a PreBind waits for the API server to take a device choice.
const PREBIND_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The decider, its runtime and the notes on the configuration.
pub struct Engine {
    svc: Arc<Service>,
    /// `None` without an API server (tests and benches): no watches, no writes.
    runtime: Option<tokio::runtime::Runtime>,
    notes: Vec<String>,
    /// The scheduler calls [`Engine::prebind`] before each bind (Volcano v1.14's PreBinder):
    /// choices are written then, synchronously, not in the background at allocation.
    at_prebind: AtomicBool,
    /// Each pod's writes, one at a time and the last asked for winning.
    writes: Arc<PodWrites>,
    /// Views in force that took in a DeviceTopology change ([`LiveOptions::device_views`]).
    device_views: Arc<AtomicU64>,
}

/// One pod's writes: the number of the last one asked for, and the lock they take turns on.
type Turns = (u64, Arc<tokio::sync::Mutex<()>>);

/// The writes of device choices to pods, in the order the scheduler asked for them, pod by
/// pod. An allocation's write and its undoing's removal (Volcano discards a gang's allocations
/// in the session that made them) are asked for moments apart; run side by side they could
/// land the wrong way round and leave a released choice on a pending pod, a promise that keeps
/// its devices from every other pod. So a pod's writes run one at a time, and one that a later
/// one for the same pod has superseded before it started is skipped.
#[derive(Debug, Default)]
struct PodWrites {
    pods: std::sync::Mutex<HashMap<String, Turns>>,
    asked: AtomicU64,
}

impl PodWrites {
    fn pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, Turns>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks for `write` on `pod` now; the returned future runs it after the pod's earlier
    /// writes, or answers `None` when a later write for the pod was asked for before its turn.
    fn ask<T, W: Future<Output = T>>(
        self: &Arc<Self>,
        pod: &str,
        write: W,
    ) -> impl Future<Output = Option<T>> + use<T, W> {
        let number = self.asked.fetch_add(1, Ordering::Relaxed);
        let turn = {
            let mut pods = self.pods();
            let entry = pods.entry(pod.to_string()).or_default();
            entry.0 = number;
            Arc::clone(&entry.1)
        };
        let this = Arc::clone(self);
        let pod = pod.to_string();
        async move {
            let _turn = turn.lock().await;
            let last =
                |pods: &HashMap<String, Turns>| pods.get(&pod).is_some_and(|e| e.0 == number);
            if !last(&this.pods()) {
                return None;
            }
            let done = write.await;
            let mut pods = this.pods();
            if last(&pods) {
                pods.remove(&pod);
            }
            Some(done)
        }
    }
}

impl Engine {
    /// Starts the watches and waits for the first view.
    pub fn start(config: &EngineConfig) -> Result<Engine> {
        let Translated { settings, notes } = config.translate()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fumarole")
            .enable_all()
            .build()
            .context("starting fumarole's runtime")?;
        let svc = Arc::new(Service::with_settings(ClusterView::default(), settings));
        let device_views = Arc::new(AtomicU64::new(0));
        runtime.block_on(async {
            let client = kube::Client::try_from(kube_config(config).await?)
                .context("building the API client")?;
            let opts = LiveOptions {
                annotate_schedulers: svc
                    .decider()
                    .settings()
                    .scheduler_names
                    .iter()
                    .cloned()
                    .collect(),
                device_views: Arc::clone(&device_views),
                ..LiveOptions::default()
            };
            // The loop lives as long as the runtime.
            drop(live::start(client, Arc::clone(&svc), opts).await?);
            anyhow::Ok(())
        })?;
        Ok(Engine {
            svc,
            runtime: Some(runtime),
            notes,
            at_prebind: AtomicBool::new(false),
            writes: Arc::default(),
            device_views,
        })
    }

    /// An engine over a fixed view (no API server): what the tests and benches judge with.
    pub fn over_view(view: ClusterView, conf: &EngineConfig) -> Result<Engine> {
        let Translated { settings, notes } = conf.translate()?;
        Ok(Engine {
            svc: Arc::new(Service::with_settings(view, settings)),
            runtime: None,
            notes,
            at_prebind: AtomicBool::new(false),
            writes: Arc::default(),
            device_views: Arc::default(),
        })
    }

    /// How many views in force took in a DeviceTopology change: when it moves, pods refused
    /// for want of devices may fit (kube-scheduler's plugin retries them then).
    pub fn device_views(&self) -> u64 {
        self.device_views.load(Ordering::Relaxed)
    }

    /// How many times the ledger gave room back (a reservation undone, a plan dropped or
    /// lapsed): when it moves, pods refused for want of room may fit.
    pub fn room_freed(&self) -> u64 {
        self.svc.decider().room_freed()
    }

    /// The arguments of the configuration fumarole does not implement, one line each.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Judges `pod` on every node of the view at once (a unit's pod first gets its super-node
    /// planned): the scheduler then answers its per-node questions from the result. The
    /// verdicts come in the view's node order, named by its generation
    /// ([`ClusterView::names_generation`]); the node names come too when the caller's
    /// `known_generation` is another, so a caller keeps one table of positions for as long as
    /// the nodes stay the same instead of a map per task.
    pub fn evaluate(&self, pod: &Pod, known_generation: u64) -> Result<Evaluation> {
        let decider = self.svc.decider();
        // The scheduler's own cache holds the pod: it is real, so its unit's plan reserves.
        let (view, verdicts) =
            match decider.evaluate_everywhere(pod, Asker::Plugin, PodSource::Known) {
                Ok(v) => v,
                Err(RequestError::NoAccelerator { .. }) => return Ok(Evaluation::NotOurs),
                // Every request error names the pod already.
                Err(e) => return Err(anyhow!("{e}")),
            };
        let generation = view.names_generation();
        let weight = decider.scorer().weight;
        let mut table = VerdictTable {
            header: String::with_capacity(64),
            codes: Vec::with_capacity(verdicts.len()),
            scores: Vec::with_capacity(verdicts.len()),
            reasons: Vec::with_capacity(verdicts.len()),
        };
        let _ = writeln!(table.header, "G\t{generation}");
        if generation != known_generation {
            for nv in view.nodes() {
                let _ = writeln!(table.header, "N\t{}", nv.name);
            }
        }
        // Reasons are formatted once per run of nodes with the same one (a unit's plan gives
        // every node of a super-node the same reason): formatting dominated the call.
        let mut reason_count = 0i32;
        let mut last: Option<&Unfit> = None;
        // `verdicts` follow the view's nodes, one each.
        for (v, nv) in verdicts.iter().zip(view.nodes()) {
            let (code, score, reason) = match &v.unfit {
                None => (
                    Code::Fits,
                    v.raw.map_or(0.0, |raw| scale::volcano(raw, weight)),
                    -1,
                ),
                Some(unfit) => {
                    if last != Some(unfit) {
                        let text = unfit.to_string().replace(['\t', '\n'], " ");
                        let _ = writeln!(table.header, "R\t{text}");
                        reason_count += 1;
                        last = Some(unfit);
                    }
                    // No eviction gives a pod devices a node lacks or keeps for another
                    // scheduler's pool.
                    let code = if nv.has_topology && !matches!(unfit, Unfit::OtherNodePool { .. }) {
                        Code::Unschedulable
                    } else {
                        Code::Unresolvable
                    };
                    (code, 0.0, reason_count - 1)
                }
            };
            table.codes.push(code as u8);
            table.scores.push(score);
            table.reasons.push(reason);
        }
        Ok(Evaluation::Verdicts(table))
    }

    /// The scheduler allocated `pod` to `node`: records its devices in the ledger now, before
    /// the next task is judged, and writes the choice on the pod in the background (unless
    /// choices are written when the pod is bound, [`Self::write_choices_at_prebind`]).
    /// `Ok(false)`: the pod asks for nothing of ours.
    pub fn allocate(&self, pod: Pod, node: &str) -> Result<bool> {
        let Some(commit) = self.commit_where_placed(&pod, node)? else {
            return Ok(false);
        };
        if !self.at_prebind.load(Ordering::Relaxed) {
            self.write_in_background(pod, commit);
        }
        Ok(true)
    }

    /// The scheduler is binding `pod` to `node` and has no hook that waits for a write
    /// (Volcano v1.10, whose plugin calls this at the close of the session that bound the pod):
    /// its choice (the one allocated, or chosen now) is written in the background, after the
    /// pod's earlier writes. `Ok(false)`: the pod asks for nothing of ours, or the view already
    /// shows its choice for `node` (the bind may land before the session closes, and the
    /// writer of bound pods' choices may have written the allocated one meanwhile: choosing
    /// again would count the pod's devices twice).
    pub fn write_choice(&self, pod: Pod, node: &str) -> Result<bool> {
        // The pod is bound to `node` whatever its unit's plan says: only its devices remain.
        let commit = self.svc.decider().commit_bound(&pod, node);
        let Some(commit) = commit.map_err(|e| anyhow!("{e}"))? else {
            return Ok(false);
        };
        self.write_in_background(pod, commit);
        Ok(true)
    }

    /// Writes `commit` on `pod` in the background, after the pod's earlier writes.
    fn write_in_background(&self, pod: Pod, commit: Commit) {
        if let Some(runtime) = &self.runtime {
            let svc = Arc::clone(&self.svc);
            let key = pod_key(&pod);
            let write = async move {
                if let Err(e) = svc.write_choice(&pod, Some(commit)).await {
                    tracing::warn!(error = %e, "writing a device choice failed");
                }
            };
            runtime.spawn(self.writes.ask(&key, write));
        }
    }

    /// From now on the scheduler says when each pod is bound ([`Self::prebind`] or
    /// [`Self::bind`] before the bind, [`Self::write_choice`] as it binds), and allocations
    /// write nothing themselves: a choice is never written for an allocation undone before its
    /// bind (Volcano discards a gang's allocations when the gang cannot start), so a pod is
    /// never bound while such a choice is still on it.
    pub fn write_choices_at_prebind(&self) {
        self.at_prebind.store(true, Ordering::Relaxed);
    }

    /// The scheduler is about to bind `pod` to `node`: its device choice (the one allocated, or
    /// chosen now if the allocation is gone) is written on the pod before this returns, so the
    /// pod is bound with it. `Err` (the API server refused or did not answer in time): the
    /// scheduler must not bind. `Ok(false)`: the pod asks for nothing of ours.
    pub fn prebind(&self, pod: &Pod, node: &str) -> Result<bool> {
        let Some(commit) = self.commit_where_placed(pod, node)? else {
            return Ok(false);
        };
        let Some(runtime) = &self.runtime else {
            return Ok(true);
        };
        let write = self
            .writes
            .ask(&pod_key(pod), self.svc.write_choice(pod, Some(commit)));
        match runtime.block_on(async { tokio::time::timeout(PREBIND_WRITE_TIMEOUT, write).await }) {
            Ok(Some(Ok(_))) => Ok(true),
            Ok(Some(Err(e))) => Err(anyhow!("writing the device choice: {e}")),
            Ok(None) => Err(anyhow!(
                "the allocation was undone while its device choice waited to be written"
            )),
            Err(_) => Err(anyhow!(
                "writing the device choice: no answer from the API server in {PREBIND_WRITE_TIMEOUT:?}"
            )),
        }
    }

    /// kube-scheduler binds `pod` to `node` through the plugin: its devices (committed at
    /// Reserve, or now if that is gone) travel in the Binding's annotations, so node and
    /// devices reach the pod in one write, as the extender's `bind` does. Returns once the API
    /// server answered (at most 10 s). `Ok(false)`: nothing of ours, for the scheduler's
    /// default binder. A Binding the server refused frees the devices; one whose answer was
    /// lost keeps them until the view shows the pod (it may have been written).
    pub fn bind(&self, pod: &Pod, node: &str) -> Result<bool> {
        let Some(commit) = self.commit_where_placed(pod, node)? else {
            return Ok(false);
        };
        let (Some(runtime), Some(ops)) = (&self.runtime, self.svc.effects()) else {
            return Err(anyhow!("no API server to bind through"));
        };
        let key = pod_key(pod);
        let bound = self
            .writes
            .ask(&key, self.svc.bind(ops, pod, node, Some(&commit)));
        match runtime.block_on(async { tokio::time::timeout(PREBIND_WRITE_TIMEOUT, bound).await }) {
            Ok(Some(Ok(()))) => Ok(true),
            Ok(Some(Err(e))) => Err(anyhow!("binding {key} to {node}: {e}")),
            Ok(None) => Err(anyhow!(
                "the reservation was undone while the bind waited for its turn"
            )),
            Err(_) => Err(anyhow!(
                "binding {key} to {node}: no answer from the API server in {PREBIND_WRITE_TIMEOUT:?}"
            )),
        }
    }

    /// The commit of `pod` on `node`: the one made already (committing again returns it), or
    /// a new one. Group placement refuses nothing here: the scheduler places the pod there
    /// whatever its plugins say, so it is recorded where it goes. `Ok(None)`: nothing of ours.
    fn commit_where_placed(&self, pod: &Pod, node: &str) -> Result<Option<Commit>> {
        let decider = self.svc.decider();
        let commit = match decider.commit(pod, node) {
            Err(e) if e.is_placement() => {
                tracing::warn!(pod = %pod_key(pod), node, refusal = %e,
                    "allocated against group placement: recorded where the scheduler put it");
                decider.commit_bound(pod, node)
            }
            other => other,
        };
        commit.map_err(|e| anyhow!("{e}"))
    }

    /// The scheduler's other filters refused every node fumarole found fit for `pod`: gives up
    /// its unit's plan ([`scheduler_ext::decider::Decider::give_up_plan`]), so the next try
    /// plans the unit on another super-node. The super-node given up, or `None` when there was
    /// nothing to give up (a pod asking for no device of ours has none either).
    pub fn give_up_plan(&self, pod: &Pod) -> Result<Option<String>> {
        match self.svc.decider().give_up_plan(pod) {
            Err(RequestError::NoAccelerator { .. }) => Ok(None),
            other => other.map_err(|e| anyhow!("{e}")),
        }
    }

    /// The scheduler undid `pod`'s allocation: its devices go back to the free pool now, and
    /// the choice is taken off the pod in the background. `Ok(false)`: nothing was held.
    pub fn deallocate(&self, pod: &Pod) -> bool {
        let key = pod_key(pod);
        if self.svc.decider().release(&key).is_none() {
            return false;
        }
        if let Some(runtime) = &self.runtime
            && let Some(effects) = self.svc.effects().cloned()
        {
            let pod = key.clone();
            let remove = async move {
                let (ns, name) = key.split_once('/').unwrap_or(("default", key.as_str()));
                if let Err(e) = effects.annotate(ns, name, None).await {
                    tracing::warn!(pod = %key, error = %e, "removing a device choice failed");
                }
            };
            runtime.spawn(self.writes.ask(&pod, remove));
        }
        true
    }
}

/// The client configuration: the kubeconfig (or the usual inference), `master` over its
/// server, and no retries inside the client (as the extender: writes fail fast, watches back
/// off on their own).
async fn kube_config(config: &EngineConfig) -> Result<kube::Config> {
    let mut kc = match &config.kubeconfig {
        _ if config.kubeconfig_yaml.is_some() => {
            let text = config.kubeconfig_yaml.as_deref().unwrap_or_default();
            let file = kube::config::Kubeconfig::from_yaml(text)
                .context("reading the scheduler's client configuration")?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .context("the scheduler's client configuration")?
        }
        Some(path) if !path.as_os_str().is_empty() => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        _ => kube::Config::infer()
            .await
            .context("finding the API server (KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    if let Some(master) = config.master.as_deref().filter(|m| !m.is_empty()) {
        kc.cluster_url = master
            .parse()
            .with_context(|| format!("--master {master:?} is not a URL"))?;
    }
    kc.default_retry = false;
    Ok(kc)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A write that takes `ms` and then records `what`.
    async fn write(log: Arc<std::sync::Mutex<Vec<&'static str>>>, what: &'static str, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        log.lock().unwrap().push(what);
    }

    #[tokio::test]
    async fn a_pods_writes_land_in_the_order_asked_and_the_superseded_are_skipped() {
        let writes = Arc::new(PodWrites::default());
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        // A slow write, then its removal: the removal waits for it and lands last.
        let set = tokio::spawn(writes.ask("ns/a", write(log.clone(), "set a", 50)));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let remove = tokio::spawn(writes.ask("ns/a", write(log.clone(), "remove a", 0)));
        // Another pod does not wait for pod a.
        let other = tokio::spawn(writes.ask("ns/b", write(log.clone(), "set b", 0)));
        assert_eq!(other.await.unwrap(), Some(()));
        assert_eq!(set.await.unwrap(), Some(()));
        assert_eq!(remove.await.unwrap(), Some(()));
        assert_eq!(*log.lock().unwrap(), ["set b", "set a", "remove a"]);
        // Three asked while the first runs: the middle one is superseded before its turn.
        log.lock().unwrap().clear();
        let first = tokio::spawn(writes.ask("ns/a", write(log.clone(), "set a", 50)));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second = tokio::spawn(writes.ask("ns/a", write(log.clone(), "remove a", 0)));
        let third = tokio::spawn(writes.ask("ns/a", write(log.clone(), "set a again", 0)));
        assert_eq!(first.await.unwrap(), Some(()));
        assert_eq!(second.await.unwrap(), None);
        assert_eq!(third.await.unwrap(), Some(()));
        assert_eq!(*log.lock().unwrap(), ["set a", "set a again"]);
        // Nothing is kept once a pod's last write is done.
        assert!(writes.pods().is_empty());
    }
}
