//! The pods assigned to this node, watched: the device plugins' [`PodSource`] (every pod bound
//! here, with its requests, the scheduler extension's `fumarole.dev/devices` choice and the
//! devices the kubelet reports for it) and the co-location tasks' pod list ([`NodePods::pods`],
//! with [`NodePods::changes`] notified on every change).
//!
//! What the device plugins did with a pod's choice comes back through [`PodSource::report`]:
//! a log line always, a Warning Event on the pod when the container does not get the
//! scheduler's devices or the choice was ignored, and the counter
//! `fumarole_device_choice_total{resource, outcome}`. Pods deleted before they started stay
//! candidates for a while: the kubelet still admits them.
//!
//! Ascend pods also carry Huawei's choice, `huawei.com/<Chip>` ([`BoundPod::ascend_choices`]),
//! and get `huawei.com/AscendReal` (the NPUs mounted) written after `Allocate`
//! ([`PodSource::annotate`]): a merge patch of that one annotation on a pod of this node, the
//! only pod write the agent makes (RBAC `patch` on pods, held to this node's pods and that
//! annotation by `deploy/daemonset/node-scoped-writes.yaml`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use fumarole_colocation::watched::Watched;
use fumarole_device_plugin::admission::{BoundPod, Outcome, PodSource};
use fumarole_device_plugin::annotation::DEVICES_ANNOTATION;
use fumarole_exporter::publish::LatestAllocations;
use fumarole_topology::annotation::ascend;
use fumarole_topology::{pod, quantity};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::Notify;

/// Event reasons for the device choice outcomes users should hear of.
const REASON_IGNORED: &str = "DeviceChoiceIgnored";
const REASON_NOT_HONOURED: &str = "DeviceChoiceNotHonoured";
const REASON_DIFFERS: &str = "DeviceChoiceDiffers";
const REASON_CONFLICT: &str = "DeviceChoiceConflict";
const REASON_MISATTRIBUTED: &str = "DeviceAccountCorrected";

/// How long a pod deleted before it started stays a candidate for admission: the kubelet
/// admits every pod it was told of, deleted or not, and may be behind this watch by the
/// admissions queued before it (each waiting up to the device-choice timeout).
const DELETED_POD_TTL: Duration = Duration::from_secs(60);

pub struct NodePods {
    pods: Watched<Pod>,
    /// Pod uid -> when the watch first delivered it (a sequence number): the order the
    /// kubelet, watching the same pods, admits them in.
    arrivals: Arc<Mutex<Arrivals>>,
    /// Pods deleted before they started, still to be admitted by the kubelet.
    deleted: Arc<Mutex<DeletedPods>>,
    /// The kubelet's allocations, once the publisher reads them: pods that got devices before
    /// a plugin restart.
    allocations: OnceLock<LatestAllocations>,
    /// Writes the Events of [`PodSource::report`].
    recorder: Recorder,
    choices: Option<Arc<crate::plugins::ChoiceMetrics>>,
    /// Writes [`PodSource::annotate`]'s annotations.
    client: Client,
}

impl NodePods {
    /// Starts watching the pods whose `spec.nodeName` is `node`; Events are recorded as
    /// `recorder`'s reporter.
    pub fn watch(
        client: Client,
        node: &str,
        recorder: Recorder,
        choices: Option<Arc<crate::plugins::ChoiceMetrics>>,
    ) -> Arc<Self> {
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let arrivals = Arc::new(Mutex::new(Arrivals::default()));
        let deleted = Arc::new(Mutex::new(DeletedPods::default()));
        let (seen, gone) = (Arc::clone(&arrivals), Arc::clone(&deleted));
        let observe = move |event: &watcher::Event<Pod>| {
            let arrival = lock(&seen).observe(event);
            if let (watcher::Event::Delete(p), Some(arrival)) = (event, arrival)
                && let Some(pod) = bound_pod(p, arrival, &BTreeMap::new())
                && !pod.started
                && !pod.requests.is_empty()
            {
                let pod = BoundPod {
                    deleting: true,
                    ..pod
                };
                lock(&gone).insert(pod, Instant::now());
            }
        };
        Arc::new(Self {
            pods: Watched::spawn_observed(Api::<Pod>::all(client.clone()), config, observe),
            arrivals,
            deleted,
            allocations: OnceLock::new(),
            recorder,
            choices,
            client,
        })
    }

    /// Lets [`PodSource::bound`] read the kubelet's allocations (once).
    pub fn set_allocations(&self, allocations: LatestAllocations) {
        if self.allocations.set(allocations).is_err() {
            tracing::debug!("kubelet allocations already connected");
        }
    }

    /// The node's pods as last seen (empty until the first list).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    /// Notified (one stored permit, for one consumer) whenever a pod is added or changes.
    pub fn changes(&self) -> Arc<Notify> {
        self.pods.changes()
    }

    /// Waits for the first complete list of the node's pods.
    pub async fn ready(&self) {
        self.pods.ready().await;
    }

    /// `namespace/name` -> resource -> device ids, from the kubelet's last allocations.
    fn reported(&self) -> BTreeMap<(String, String), BTreeMap<String, Vec<String>>> {
        let mut out: BTreeMap<(String, String), BTreeMap<String, Vec<String>>> = BTreeMap::new();
        let Some(rx) = self.allocations.get() else {
            return out;
        };
        if let Some(Ok(allocations)) = rx.borrow().as_ref() {
            for p in &allocations.pods {
                let devices = out
                    .entry((p.namespace.clone(), p.name.clone()))
                    .or_default();
                for c in &p.containers {
                    for (resource, ids) in &c.devices {
                        devices
                            .entry(resource.clone())
                            .or_default()
                            .extend(ids.iter().cloned());
                    }
                }
            }
        }
        out
    }
}

/// Arrival numbers of the pods the watch delivered, in order.
#[derive(Debug, Default)]
struct Arrivals {
    next: u64,
    by_uid: HashMap<String, u64>,
    /// The pods of a relist in progress: when it is done, the others are gone.
    relisted: Option<HashSet<String>>,
}

impl Arrivals {
    /// The pod's arrival number, numbering it now if the watch has not yet.
    fn of(&mut self, uid: &str) -> u64 {
        if let Some(n) = self.by_uid.get(uid) {
            return *n;
        }
        self.next += 1;
        self.by_uid.insert(uid.to_string(), self.next);
        self.next
    }

    /// Follows the watch: numbers new pods, forgets deleted ones (returning a deleted pod's
    /// number) and, after a relist, those the relist no longer has.
    fn observe(&mut self, event: &watcher::Event<Pod>) -> Option<u64> {
        let uid = |p: &Pod| p.metadata.uid.clone();
        match event {
            watcher::Event::Init => self.relisted = Some(HashSet::new()),
            watcher::Event::InitApply(p) => {
                let uid = uid(p)?;
                self.of(&uid);
                self.relisted.get_or_insert_default().insert(uid);
            }
            watcher::Event::InitDone => {
                if let Some(live) = self.relisted.take() {
                    self.by_uid.retain(|uid, _| live.contains(uid));
                }
            }
            watcher::Event::Apply(p) => {
                self.of(&uid(p)?);
            }
            watcher::Event::Delete(p) => {
                let uid = uid(p)?;
                let n = self.of(&uid);
                self.by_uid.remove(&uid);
                return Some(n);
            }
        }
        None
    }
}

/// Pods deleted before they started: the kubelet, told of them before the deletion, still
/// admits them, in their turn; they stay candidates for [`DELETED_POD_TTL`].
#[derive(Debug, Default)]
struct DeletedPods(HashMap<String, (BoundPod, Instant)>);

impl DeletedPods {
    fn insert(&mut self, pod: BoundPod, now: Instant) {
        tracing::debug!(pod = %pod, "deleted before it started; the kubelet may still admit it");
        self.0.insert(pod.uid.clone(), (pod, now + DELETED_POD_TTL));
    }

    /// The deleted pods still to be admitted, those of `present` (back after a relist) left out.
    fn candidates(&mut self, present: &HashSet<&str>, now: Instant) -> Vec<BoundPod> {
        self.0
            .retain(|uid, (_, until)| *until > now && !present.contains(uid.as_str()));
        self.0.values().map(|(p, _)| p.clone()).collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the device plugins need to know of one pod bound to this node; `None` for a pod
/// without a name.
fn bound_pod(
    p: &Pod,
    arrival: u64,
    reported: &BTreeMap<(String, String), BTreeMap<String, Vec<String>>>,
) -> Option<BoundPod> {
    let meta = &p.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone()?;
    let spec = p.spec.as_ref();
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    // Extended resources: domain-qualified names, outside kubernetes.io.
    let names: std::collections::BTreeSet<&String> = spec
        .into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| [&r.limits, &r.requests])
        .flatten()
        .flat_map(|m| m.keys())
        .filter(|k| k.contains('/') && !k.starts_with("kubernetes.io/"))
        .collect();
    let requests = names
        .into_iter()
        .filter_map(|r| {
            let n = pod::effective_request(spec?, r, quantity::whole).ok()?;
            (n > 0).then(|| (r.clone(), n))
        })
        .collect();
    Some(BoundPod {
        reported: reported
            .get(&(namespace.clone(), name.clone()))
            .cloned()
            .unwrap_or_default(),
        namespace,
        name,
        uid: meta.uid.clone().unwrap_or_default(),
        arrival,
        created: meta
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        scheduler: spec
            .and_then(|s| s.scheduler_name.clone())
            .unwrap_or_else(|| "default-scheduler".into()),
        started: matches!(phase, Some("Running" | "Succeeded" | "Failed")),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
        deleting: meta.deletion_timestamp.is_some(),
        requests,
        choice: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEVICES_ANNOTATION))
            .cloned(),
        ascend_choices: meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| ascend::chip_of(k).is_some())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
}

impl PodSource for NodePods {
    fn bound(&self) -> Vec<BoundPod> {
        let reported = self.reported();
        let pods = self.pods.state();
        let present: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let deleted = lock(&self.deleted).candidates(&present, Instant::now());
        let mut arrivals = lock(&self.arrivals);
        pods.iter()
            .filter_map(|p| {
                let arrival = arrivals.of(p.metadata.uid.as_deref()?);
                bound_pod(p, arrival, &reported)
            })
            .chain(deleted)
            .collect()
    }

    fn report(&self, pod: &BoundPod, resource: &str, outcome: &Outcome) {
        if let Some(m) = &self.choices {
            m.count(resource, outcome);
        }
        if !outcome.is_warning() {
            tracing::info!(pod = %pod, resource, "{outcome}");
            return;
        }
        tracing::warn!(pod = %pod, resource, "{outcome}");
        let reason = match outcome {
            Outcome::Invalid { .. } => REASON_IGNORED,
            Outcome::Differs { .. } => REASON_DIFFERS,
            Outcome::Overruled { .. } => REASON_CONFLICT,
            Outcome::Misattributed { .. } => REASON_MISATTRIBUTED,
            _ => REASON_NOT_HONOURED,
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            // The Events API caps the note at 1 kB.
            note: Some(
                format!("{resource}: {outcome}")
                    .chars()
                    .take(1000)
                    .collect(),
            ),
            action: "AllocateDevices".into(),
            secondary: None,
        };
        let object = pod::reference(&pod.namespace, &pod.name, &pod.uid);
        let recorder = self.recorder.clone();
        let who = pod.to_string();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &object).await {
                tracing::warn!(pod = %who, error = %e, "recording the device choice Event failed");
            }
        });
    }

    fn annotate(&self, pod: &BoundPod, key: &str, value: &str) {
        tracing::info!(pod = %pod, key, value, "annotating the pod");
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        // The uid precondition: never annotate a newer pod of the same name.
        let patch = serde_json::json!({"metadata": {"uid": pod.uid, "annotations": {key: value}}});
        let (name, who, key) = (pod.name.clone(), pod.to_string(), key.to_string());
        tokio::spawn(async move {
            let params = PatchParams {
                field_manager: Some("fumarole-agent".into()),
                ..Default::default()
            };
            if let Err(e) = api.patch(&name, &params, &Patch::Merge(&patch)).await {
                tracing::warn!(pod = %who, key, error = %e, "annotating the pod failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": uid, "uid": uid}})).unwrap()
    }

    #[test]
    fn arrivals_follow_the_watch_through_deletes_and_relists() {
        let mut a = Arrivals::default();
        a.observe(&watcher::Event::Apply(pod("a")));
        a.observe(&watcher::Event::Apply(pod("b")));
        assert_eq!(a.observe(&watcher::Event::Delete(pod("a"))), Some(1));
        assert_eq!(a.of("b"), 2);
        // A relist that no longer has b (deleted while the watch was down) forgets it.
        a.observe(&watcher::Event::Apply(pod("c")));
        a.observe(&watcher::Event::Init);
        a.observe(&watcher::Event::InitApply(pod("c")));
        a.observe(&watcher::Event::InitApply(pod("d")));
        a.observe(&watcher::Event::InitDone);
        assert_eq!(a.by_uid.keys().count(), 2);
        assert_eq!((a.of("c"), a.of("d")), (3, 4));
        assert_eq!(a.of("b"), 5);
    }

    #[test]
    fn huaweis_choice_annotations_are_read_per_ascend_resource() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u", "annotations": {
                "huawei.com/Ascend910": "Ascend910-2,Ascend910-3",
                "huawei.com/Ascend310P": "Ascend310P-0",
                "huawei.com/AscendReal": "Ascend910-2,Ascend910-3",
                "predicate-time": "1700000000000000000",
                "fumarole.dev/devices": "{}"}},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"huawei.com/Ascend910": "2"}}}]}
        }))
        .unwrap();
        let b = bound_pod(&p, 1, &BTreeMap::new()).unwrap();
        assert_eq!(
            b.ascend_choices.keys().collect::<Vec<_>>(),
            ["huawei.com/Ascend310P", "huawei.com/Ascend910"]
        );
        assert_eq!(
            b.ascend_choices["huawei.com/Ascend910"],
            "Ascend910-2,Ascend910-3"
        );
        assert_eq!(b.choice.as_deref(), Some("{}"));
        assert_eq!(b.requests["huawei.com/Ascend910"], 2);
    }

    #[test]
    fn deleted_pods_stay_candidates_for_a_while_unless_back() {
        let now = Instant::now();
        let mut d = DeletedPods::default();
        let gone = |uid: &str| BoundPod {
            uid: uid.into(),
            deleting: true,
            ..Default::default()
        };
        d.insert(gone("x"), now);
        d.insert(gone("y"), now);
        let none = HashSet::new();
        assert_eq!(d.candidates(&none, now).len(), 2);
        let back = HashSet::from(["y"]);
        let left = d.candidates(&back, now + Duration::from_secs(1));
        assert_eq!(left, vec![gone("x")]);
        assert!(d.candidates(&none, now + DELETED_POD_TTL).is_empty());
    }
}
