//! The next view from the last one and the pods that changed, at the cost of what they
//! touched: the live view's answer to pod events ([`crate::live`]), where a full build at
//! 5,000 nodes and 50,000 pods reads every object again.
//!
//! What one pod adds to a view is its own records (pending, promise, annotation, warning,
//! [`ClusterView::add_pod`]), the devices it holds on one node ([`assumes`]) and, through its
//! job, the job's facts and the units of every pod of the job ([`ClusterView::add_member`]).
//! So a changed pod is taken out and put back in; each node it held devices on gets its
//! assumed mask again from the pods there; and each job it speaks for
//! ([`ClusterView::speaks_for_job`]), or whose known facts it may change, is told again by
//! all its pods, in key order. Jobs no pod speaks for hold nothing and cost nothing (the
//! pods of a Deployment, or of pods named alike). The rest of the view is shared with the
//! last one ([`super::NodeTable`], [`CowMap`]).
//!
//! The result is the full build of the same objects with pods given in key order (the order
//! fixes which of two disagreeing pods a job's error names first); the tests below hold the
//! two equal over generated event sequences.
//!
//! A node's own objects (`DeviceTopology`, `Node`, `Numatopology`) changing is taken in too
//! ([`IncrementalView::update_nodes`]): its view is made again and its pods' devices counted
//! on it, as long as the change stays within the node; one that reaches further (a node
//! joins or leaves, changes super-node, resources or devices, or has an object the view
//! cannot use) asks for a full build. ResourceClaims and PodGroups are not taken in here:
//! the live view builds anew when they change.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use fumarole_topology::crd::{DeviceTopology, Numatopology};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{ClusterView, ContextCache, NodeView, assumes, free_cpus_by_numa, placed_on};
use crate::core::pod_facts::PodFacts;

/// A node's objects as they are now (`None`: there is none).
#[derive(Clone, Copy, Debug)]
pub struct NodeObjects<'a> {
    pub name: &'a str,
    pub topology: Option<&'a DeviceTopology>,
    pub node: Option<&'a ObjectMeta>,
    pub numa: Option<&'a Numatopology>,
}

/// A view and the indexes that let it follow pod changes.
#[derive(Clone, Debug, Default)]
pub struct IncrementalView {
    view: ClusterView,
    /// Each pod as the view last took it in.
    pods: HashMap<Arc<str>, Arc<PodFacts>>,
    /// Node -> the pods whose chosen devices count there ([`assumes`]).
    on_node: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    /// Job -> its pods, in key order.
    of_job: HashMap<String, BTreeSet<Arc<str>>>,
}

/// What one [`IncrementalView::update_pods`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Update {
    /// Pods whose facts changed (a pod told again unchanged is skipped).
    pub pods: usize,
    /// Nodes whose assumed devices were counted again.
    pub nodes: usize,
    /// Jobs told again by all their pods, and how many pods those have.
    pub jobs: usize,
    pub job_pods: usize,
}

impl IncrementalView {
    /// A full build and the pods it was built from (the pods in key order: see the module
    /// doc).
    pub fn new(view: ClusterView, pods: impl IntoIterator<Item = Arc<PodFacts>>) -> Self {
        let mut this = IncrementalView {
            view,
            ..IncrementalView::default()
        };
        for pod in pods {
            this.index(&pod);
            this.pods.insert(Arc::clone(&pod.key), pod);
        }
        this
    }

    /// The view now.
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// Pods the view holds.
    pub fn pods(&self) -> usize {
        self.pods.len()
    }

    fn index(&mut self, pod: &Arc<PodFacts>) {
        if let Some((node, _)) = assumes(pod) {
            self.on_node
                .entry(Arc::clone(node))
                .or_default()
                .insert(Arc::clone(&pod.key));
        }
        self.of_job
            .entry(pod.unit.job.clone())
            .or_default()
            .insert(Arc::clone(&pod.key));
    }

    fn unindex(&mut self, pod: &PodFacts) {
        if let Some((node, _)) = assumes(pod)
            && let Some(pods) = self.on_node.get_mut(node)
        {
            pods.remove(&pod.key);
            if pods.is_empty() {
                self.on_node.remove(node);
            }
        }
        if let Some(pods) = self.of_job.get_mut(&pod.unit.job) {
            pods.remove(&pod.key);
            if pods.is_empty() {
                self.of_job.remove(&pod.unit.job);
            }
        }
    }

    /// Takes in the pods that changed: each `namespace/name` with its facts now, `None` when
    /// the pod is gone (deleted, finished).
    pub fn update_pods(
        &mut self,
        changed: impl IntoIterator<Item = (Arc<str>, Option<Arc<PodFacts>>)>,
    ) -> Update {
        let offered_names = Arc::clone(&self.view.offered);
        let offered: BTreeSet<&str> = offered_names.iter().map(String::as_str).collect();
        let mut nodes: HashSet<Arc<str>> = HashSet::new();
        let mut jobs: BTreeSet<String> = BTreeSet::new();
        let mut update = Update::default();
        for (key, now) in changed {
            let before = self.pods.get(&key).cloned();
            if let (Some(a), Some(b)) = (&before, &now)
                && Arc::ptr_eq(a, b)
            {
                continue;
            }
            if before.is_none() && now.is_none() {
                continue;
            }
            update.pods += 1;
            if let Some(before) = before {
                self.view.remove_pod(&key);
                self.unindex(&before);
                self.pods.remove(&key);
                if let Some((node, _)) = assumes(&before) {
                    nodes.insert(Arc::clone(node));
                }
                // A unit member's job is known, so its members are told again.
                if self.view.jobs.knows(&before.unit.job)
                    || self.view.speaks_for_job(&before, &offered)
                {
                    jobs.insert(before.unit.job.clone());
                }
            }
            if let Some(now) = now {
                self.view.add_pod(&now, &offered);
                self.index(&now);
                if let Some((node, _)) = assumes(&now) {
                    nodes.insert(Arc::clone(node));
                }
                if self.view.jobs.knows(&now.unit.job) || self.view.speaks_for_job(&now, &offered) {
                    jobs.insert(now.unit.job.clone());
                }
                // Otherwise it is in no unit: that takes its own group annotations, its
                // PodGroup's or its job's, and it has none of these.
                self.pods.insert(key, now);
            }
        }
        for job in &jobs {
            update.job_pods += self.tell_job(job, &offered);
        }
        update.jobs = jobs.len();
        for node in &nodes {
            self.count_assumed(node);
        }
        update.nodes = nodes.len();
        update
    }

    /// Takes in nodes whose objects changed. Returns how many node views were made again, or
    /// why the view must be built in full instead (the view is then partly updated: build
    /// it in full).
    pub fn update_nodes<'a>(
        &mut self,
        contexts: &mut ContextCache,
        changed: impl IntoIterator<Item = NodeObjects<'a>>,
    ) -> Result<usize, &'static str> {
        let mut made = 0;
        for objects in changed {
            let name = objects.name;
            let Some(i) = self.view.index.get(name) else {
                if objects.topology.is_some() || objects.node.is_some() {
                    return Err("a node joined");
                }
                // Neither before nor now (a Numatopology alone makes no node).
                continue;
            };
            let mut nv = match (objects.topology, objects.node) {
                (Some(dt), _) => {
                    NodeView::with_contexts(dt, contexts).map_err(|_| "a topology is unusable")?
                }
                (None, Some(_)) => NodeView::bare(name.to_string()),
                (None, None) => return Err("a node left"),
            };
            if let Some(meta) = objects.node {
                nv.label(meta);
            }
            if let Some(nt) = objects.numa {
                nv.free_cpus =
                    Some(free_cpus_by_numa(nt).map_err(|_| "a Numatopology is unusable")?);
            }
            let Some(old) = self.view.nodes.get(i) else {
                return Err("the node table is short");
            };
            let prefix = format!("Numatopology {name}:");
            if old.group() != nv.group() {
                return Err("a node changed super-node");
            }
            // Whole and shared resources: the view's offered names follow both.
            let names = |n: &NodeView| {
                let whole = n.resource_masks.iter().map(|(r, _)| r.clone());
                let shared = n.share_rooms.iter().map(|r| r.resource.clone());
                whole.chain(shared).collect::<Vec<_>>()
            };
            if names(old) != names(&nv) {
                return Err("a node changed resources");
            }
            if old.dra_names != nv.dra_names {
                return Err("a node changed devices");
            }
            if self
                .view
                .node_warnings
                .iter()
                .any(|w| w.starts_with(&prefix))
            {
                return Err("a Numatopology was unusable");
            }
            // Claims name devices by their DRA name, which did not change.
            nv.claimed_mask = old.claimed_mask;
            for pod in &old.reported {
                if let Some(n) = self.view.reported.get_mut(pod.as_str()) {
                    *n -= 1;
                    if *n == 0 {
                        self.view.reported.remove(pod.as_str());
                    }
                }
            }
            for pod in &nv.reported {
                *self.view.reported.get_or_default(pod.clone()) += 1;
            }
            if let Some(slot) = self.view.nodes.get_mut(i) {
                *slot = nv;
            }
            self.count_assumed(name);
            made += 1;
        }
        Ok(made)
    }

    /// Forgets what the view knows of `job` and has its pods tell it again, in key order, as
    /// the full build does for every job: facts, device totals, then unit members. Returns
    /// the job's pods.
    fn tell_job(&mut self, job: &str, offered: &BTreeSet<&str>) -> usize {
        self.view.jobs.forget(job);
        self.view.members.remove(job);
        let pods: Vec<Arc<PodFacts>> = self
            .of_job
            .get(job)
            .into_iter()
            .flatten()
            .filter_map(|key| self.pods.get(key).cloned())
            .collect();
        for pod in &pods {
            self.view.unit_warnings.remove(&pod.key);
            self.view.jobs.add_facts(&pod.unit);
            self.view.jobs.add_pod_group(&pod.unit);
        }
        for pod in &pods {
            self.view.count_devices(pod, offered);
        }
        for pod in &pods {
            if let Some(node) = placed_on(pod) {
                self.view.add_member(pod, node, offered);
            }
        }
        pods.len()
    }

    /// Counts again the devices the pods hold on `node`.
    fn count_assumed(&mut self, node: &str) {
        let Some(i) = self.view.index.get(node) else {
            return;
        };
        let Some(nv) = self.view.nodes.get(i) else {
            return;
        };
        let mask = self
            .on_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|key| self.pods.get(key))
            .filter_map(|pod| assumes(pod))
            .fold(0, |m, (_, ids)| m | nv.mask_of_ids(ids));
        // Read before the node view is copied: most updates leave the mask as it was.
        if mask != nv.assumed_mask
            && let Some(nv) = self.view.nodes.get_mut(i)
        {
            nv.assumed_mask = mask;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::core::claims::Claims;
    use crate::core::unit::{JobSources, PodGroupSizes};
    use crate::core::view::{ContextCache, Member};

    fn nodes() -> Vec<DeviceTopology> {
        let mut nodes: Vec<DeviceTopology> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                fumarole_topology::crd::testing::nvlink_node(n, 4, 10, &[], |i| format!("GPU-{i}"))
            })
            .collect();
        nodes.push(fumarole_topology::crd::testing::atlas_800_910("npu", &[]));
        nodes
    }

    fn pick<'a>(rng: &mut fastrand::Rng, from: &[&'a str]) -> &'a str {
        from[rng.usize(..from.len())]
    }

    /// A random version of the pod `ns/name`: bound or not, a choice of devices (good, for
    /// another node, garbled) or none, a Volcano job and task or a job by name, group
    /// annotations (some garbled), a PodGroup with sp-block, finished, being deleted.
    fn random_pod(rng: &mut fastrand::Rng, ns: &str, name: &str) -> Pod {
        let mut annotations = serde_json::Map::new();
        let mut labels = serde_json::Map::new();
        match rng.u8(..4) {
            0 => {}
            1 | 2 => {
                labels.insert(
                    "volcano.sh/job-name".into(),
                    pick(rng, &["j1", "j2"]).into(),
                );
                labels.insert(
                    "volcano.sh/task-spec".into(),
                    pick(rng, &["master", "worker"]).into(),
                );
                annotations.insert(
                    "volcano.sh/task-index".into(),
                    rng.u8(..3).to_string().into(),
                );
            }
            _ => {
                annotations.insert(
                    "scheduling.k8s.io/group-name".into(),
                    pick(rng, &["pg-sp", "pg-none"]).into(),
                );
            }
        }
        match rng.u8(..6) {
            0 => {
                annotations.insert(
                    "fumarole.dev/gpu-group-size".into(),
                    pick(rng, &["2", "4", "8"]).into(),
                );
            }
            1 => {
                annotations.insert("fumarole.dev/gpu-group-size".into(), "x".into());
            }
            2 => {
                annotations.insert("sp-block".into(), pick(rng, &["8", "16"]).into());
            }
            _ => {}
        }
        let npu = rng.u8(..4) == 0;
        let node = match rng.u8(..5) {
            0 | 1 => None,
            _ if npu => Some("npu"),
            _ => Some(pick(rng, &["a", "b", "c", "ghost"])),
        };
        match rng.u8(..5) {
            0 | 1 => {}
            2 => {
                annotations.insert("fumarole.dev/devices".into(), "{garbled".into());
            }
            _ => {
                let ids: Vec<String> = (0..rng.usize(1..3))
                    .map(|_| {
                        if npu {
                            format!("Ascend910-{}", rng.u8(..8))
                        } else {
                            format!("GPU-{}", rng.u8(..4))
                        }
                    })
                    .collect();
                let resource = if npu {
                    "huawei.com/Ascend910"
                } else {
                    "nvidia.com/gpu"
                };
                annotations.insert(
                    "fumarole.dev/devices".into(),
                    serde_json::json!({ resource: ids }).to_string().into(),
                );
                if rng.bool() {
                    let for_node = match node {
                        Some(n) if rng.u8(..4) > 0 => n,
                        _ => pick(rng, &["a", "b", "npu"]),
                    };
                    annotations.insert("fumarole.dev/devices-node".into(), for_node.into());
                }
            }
        }
        let resource = if npu {
            "huawei.com/Ascend910"
        } else {
            "nvidia.com/gpu"
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                "annotations": annotations,
                "deletionTimestamp": (rng.u8(..8) == 0).then_some("2026-01-01T00:00:00Z")},
            "spec": {"nodeName": node, "containers": [{"name": "c",
                "resources": {"limits": {resource: pick(rng, &["1", "2", "4"])}}}]},
            "status": {"phase": pick(rng, &["Pending", "Running", "Running", "Failed"])}
        }))
        .unwrap()
    }

    fn sources(whole_job_super_pod: bool) -> JobSources {
        let sp: BTreeMap<String, String> = [("sp-block".to_string(), "8".to_string())].into();
        let none = BTreeMap::new();
        JobSources {
            pod_groups: PodGroupSizes::new([("ml", "pg-sp", &sp), ("ml", "pg-none", &none)]),
            whole_job_super_pod,
        }
    }

    /// The full build of `pods`, in key order.
    fn full(pods: &BTreeMap<Arc<str>, Arc<PodFacts>>, whole_job: bool) -> ClusterView {
        ClusterView::build_with_jobs(
            &mut ContextCache::default(),
            &nodes(),
            &[],
            &[],
            pods.values().map(AsRef::as_ref),
            Claims::default(),
            sources(whole_job),
        )
        .unwrap()
    }

    type Members = BTreeMap<(String, u32, u32), Vec<Member>>;

    /// Node masks, pending pods, annotations, promises, unit members, jobs, warnings.
    type Answers = (
        Vec<(String, u64, u64)>,
        Vec<String>,
        Vec<(String, String)>,
        Vec<(String, String)>,
        Members,
        BTreeMap<String, String>,
        Vec<String>,
    );

    /// Everything a view answers, written out to compare.
    fn answers(view: &ClusterView) -> Answers {
        let masks = view
            .nodes()
            .map(|n| (n.name.clone(), n.assumed_mask, n.available_mask))
            .collect();
        let pending = view
            .pending()
            .iter()
            .map(|p| crate::core::request::pod_key(p))
            .collect();
        let mut annotated: Vec<(String, String)> = view
            .annotated
            .iter()
            .map(|(p, n)| (p.to_string(), n.to_string()))
            .collect();
        annotated.sort();
        let mut promised: Vec<(String, String)> = view
            .promised()
            .map(|(p, n)| (p.to_string(), n.to_string()))
            .collect();
        promised.sort();
        let members = view
            .members
            .iter()
            .flat_map(|(job, units)| {
                units
                    .iter()
                    .map(|(&(u, a), m)| ((job.clone(), u, a), m.clone()))
            })
            .collect();
        let warnings = view.warnings().into_iter().map(String::from).collect();
        (
            masks,
            pending,
            annotated,
            promised,
            members,
            view.jobs.written_out(),
            warnings,
        )
    }

    /// After every batch of generated pod events the incremental view answers as the full
    /// build of the same pods: free masks, pending pods, annotations and promises, unit
    /// members, jobs, warnings.
    #[test]
    fn pod_events_give_the_full_build_of_the_same_pods() {
        let names = ["w-0", "w-1", "w-2", "w-3", "x-1", "x-2", "solo", "other-7"];
        let mut seen = (0, 0, 0, 0);
        for seed in 0..60u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let whole_job = seed % 3 == 0;
            let mut pods: BTreeMap<Arc<str>, Arc<PodFacts>> = BTreeMap::new();
            let mut live = IncrementalView::new(full(&pods, whole_job), []);
            for step in 0..40 {
                let mut changed = Vec::new();
                for _ in 0..rng.usize(1..5) {
                    let ns = pick(&mut rng, &["ml", "ml", "web"]);
                    let key: Arc<str> = format!("{ns}/{}", pick(&mut rng, &names)).into();
                    let now = if rng.u8(..4) == 0 {
                        pods.remove(&key);
                        None
                    } else {
                        let name = key.split_once('/').unwrap().1;
                        let facts = Arc::new(PodFacts::of(&random_pod(&mut rng, ns, name)));
                        pods.insert(Arc::clone(&key), Arc::clone(&facts));
                        Some(facts)
                    };
                    changed.push((key, now));
                }
                // A pod told again unchanged changes nothing.
                if let Some(pod) = pods.values().next() {
                    changed.push((Arc::clone(&pod.key), Some(Arc::clone(pod))));
                }
                live.update_pods(changed);
                let want = answers(&full(&pods, whole_job));
                let got = answers(live.view());
                assert_eq!(got, want, "seed {seed}, step {step}");
                seen.0 += usize::from(want.0.iter().any(|(_, assumed, _)| *assumed != 0));
                seen.1 += usize::from(!want.1.is_empty());
                seen.2 += usize::from(!want.4.is_empty());
                seen.3 += usize::from(!want.6.is_empty());
            }
            // Every pod as it is now, in one update from nothing, also gives the full build.
            let mut again = IncrementalView::new(full(&BTreeMap::new(), whole_job), []);
            again.update_pods(
                pods.iter()
                    .map(|(k, p)| (Arc::clone(k), Some(Arc::clone(p)))),
            );
            assert_eq!(answers(again.view()), answers(&full(&pods, whole_job)));
        }
        // The generated events reached every part of the view.
        assert!(
            seen.0 > 100 && seen.1 > 100 && seen.2 > 100 && seen.3 > 100,
            "{seen:?}"
        );
    }

    /// A node's objects changing (device health, allocations reported in status, labels, the
    /// Node object coming and going) among pod events: where the update takes them in, the
    /// view is the full build of the same objects; where it asks for a full build (a node's
    /// super-node changed), it says why.
    #[test]
    fn node_events_give_the_full_build_of_the_same_objects() {
        let names = ["w-0", "w-1", "x-1", "solo"];
        let (mut taken, mut refused) = (0, 0);
        for seed in 0..40u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut topologies: BTreeMap<String, DeviceTopology> = nodes()
                .into_iter()
                .map(|t| (t.metadata.name.clone().unwrap(), t))
                .collect();
            let mut metas: BTreeMap<String, ObjectMeta> = BTreeMap::new();
            let mut pods: BTreeMap<Arc<str>, Arc<PodFacts>> = BTreeMap::new();
            let build = |t: &BTreeMap<String, DeviceTopology>,
                         m: &BTreeMap<String, ObjectMeta>,
                         p: &BTreeMap<Arc<str>, Arc<PodFacts>>| {
                ClusterView::build_with_jobs(
                    &mut ContextCache::default(),
                    t.values(),
                    &[],
                    m.values(),
                    p.values().map(AsRef::as_ref),
                    Claims::default(),
                    sources(false),
                )
                .unwrap()
            };
            let mut live = IncrementalView::new(build(&topologies, &metas, &pods), []);
            let mut contexts = ContextCache::default();
            for step in 0..40 {
                let name = pick(&mut rng, &["a", "b", "c", "npu"]).to_string();
                let t = topologies.get_mut(&name).unwrap();
                let status = t.status.as_mut().unwrap();
                let ids: Vec<String> = status.devices.keys().cloned().collect();
                let device = status
                    .devices
                    .get_mut(&ids[rng.usize(..ids.len())])
                    .unwrap();
                match rng.u8(..4) {
                    0 => {
                        device.health = pick(&mut rng, &["Healthy", "Unhealthy"]).into();
                    }
                    1 => {
                        device.allocation = rng.bool().then(|| {
                            serde_json::from_value(serde_json::json!({
                                "namespace": "ml", "pod": pick(&mut rng, &names), "container": "c"}))
                            .unwrap()
                        });
                    }
                    2 => {
                        let labels: BTreeMap<String, String> = match rng.u8(..5) {
                            0 => [("fumarole.dev/super-node".into(), "s1".into())].into(),
                            _ => [("x".into(), rng.u8(..3).to_string())].into(),
                        };
                        metas.insert(
                            name.clone(),
                            ObjectMeta {
                                name: Some(name.clone()),
                                labels: Some(labels),
                                ..ObjectMeta::default()
                            },
                        );
                    }
                    _ => {
                        metas.remove(&name);
                    }
                }
                // A pod event in the same round.
                let key: Arc<str> = format!("ml/{}", pick(&mut rng, &names)).into();
                let facts = Arc::new(PodFacts::of(&random_pod(
                    &mut rng,
                    "ml",
                    key.split_once('/').unwrap().1,
                )));
                pods.insert(Arc::clone(&key), Arc::clone(&facts));
                let objects = NodeObjects {
                    name: &name,
                    topology: topologies.get(&name),
                    node: metas.get(&name),
                    numa: None,
                };
                match live.update_nodes(&mut contexts, [objects]) {
                    Ok(n) => {
                        assert_eq!(n, 1);
                        taken += 1;
                        live.update_pods([(key, Some(facts))]);
                    }
                    Err(why) => {
                        assert_eq!(why, "a node changed super-node", "seed {seed}, step {step}");
                        refused += 1;
                        live = IncrementalView::new(
                            build(&topologies, &metas, &pods),
                            pods.values().cloned(),
                        );
                    }
                }
                let want = build(&topologies, &metas, &pods);
                let nodes = |v: &ClusterView| -> Vec<String> {
                    v.nodes()
                        .map(|n| {
                            format!(
                                "{} {} {} {} {:?} {} {:?}",
                                n.name,
                                n.available_mask,
                                n.unhealthy_mask,
                                n.assumed_mask,
                                n.labels,
                                n.group(),
                                n.reported
                            )
                        })
                        .collect()
                };
                assert_eq!(nodes(live.view()), nodes(&want), "seed {seed}, step {step}");
                assert_eq!(
                    answers(live.view()),
                    answers(&want),
                    "seed {seed}, step {step}"
                );
                for pod in names {
                    let key = format!("ml/{pod}");
                    assert_eq!(live.view().reported(&key), want.reported(&key));
                }
            }
        }
        assert!(taken > 1000 && refused > 10, "{taken} {refused}");
    }

    /// A pod event copies the node chunk and map shards it touches; the last view keeps its
    /// own answers, and what the event did not touch is shared.
    #[test]
    fn an_update_leaves_the_last_view_as_it_was() {
        let mut rng = fastrand::Rng::with_seed(1);
        // Pods anywhere but on node c.
        let pods: BTreeMap<Arc<str>, Arc<PodFacts>> = (0..50)
            .map(|i| {
                let p = Arc::new(PodFacts::of(&random_pod(&mut rng, "ml", &format!("p-{i}"))));
                (Arc::clone(&p.key), p)
            })
            .filter(|(_, p)| assumes(p).is_none_or(|(node, _)| &**node != "c"))
            .collect();
        let mut live = IncrementalView::new(full(&pods, false), pods.values().cloned());
        let before = live.view().clone();
        let want_before = answers(&before);
        let bound: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "new", "namespace": "ml", "annotations": {
                "fumarole.dev/devices": r#"{"nvidia.com/gpu":["GPU-3"]}"#}},
            "spec": {"nodeName": "c", "containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .unwrap();
        let facts = Arc::new(PodFacts::of(&bound));
        let update = live.update_pods([(Arc::clone(&facts.key), Some(facts))]);
        assert_eq!((update.pods, update.nodes, update.jobs), (1, 1, 0));
        assert_eq!(answers(&before), want_before);
        assert_eq!(before.node("c").unwrap().assumed_mask, 0);
        assert_eq!(live.view().node("c").unwrap().assumed_mask, 0b1000);
        assert_eq!(live.view().annotated_on("ml/new"), Some("c"));
        assert_eq!(before.annotated_on("ml/new"), None);
        // Nodes a and b did not change: the same node view.
        for n in ["a", "b"] {
            assert!(std::ptr::eq(
                live.view().node(n).unwrap(),
                before.node(n).unwrap()
            ));
        }
    }
}
