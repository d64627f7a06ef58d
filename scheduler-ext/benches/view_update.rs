//! The cost of keeping the live cluster view current: one full build of the view against one
//! update from the pods that changed ([`IncrementalView::update_pods`]), at the size of
//! `e2e/benches/live_scale.rs`.
//!
//! The cluster: `--nodes` nodes (5,000: a `DeviceTopology` of 8 NVLink GPUs and a `Node`
//! each, 18 per super-node) and `--pods` unfinished pods (50,000: four fifths bound with
//! their `fumarole.dev/devices` on GPUs 0-5, one fifth pending; with `--gangs G`, G of every
//! 100 pods are in Volcano jobs of 16 one-GPU pods with `gpu-group-size: 8`), read as the
//! live view's pod store holds them ([`PodFacts`]). Then `--events` pod events (2,000) as
//! live_scale makes them (created and deleted by turns; every fourth created one bound to GPU
//! 7 of a node, the others pending; with `--gangs`, a pod of a gang job in place of every
//! other one), taken in `--batch` at a time (1; 5 is what the 50 ms debounce gathers at 100
//! events/s). Each update is timed with the copy of the view handed to the decider (what
//! `live` does), and the view is checked against a full build at the end.
//!
//! ```text
//! cargo bench -p fumarole-scheduler-ext --bench view_update
//! cargo bench -p fumarole-scheduler-ext --bench view_update -- --batch 5 --gangs 10
//! ```
//!
//! Run without cargo's `--bench` flag (`cargo test --benches`) it does a small smoke run.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fumarole_topology::crd::DeviceTopology;
use fumarole_topology::crd::device_topology::SuperNodeInfo;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use scheduler_ext::core::claims::Claims;
use scheduler_ext::core::pod_facts::PodFacts;
use scheduler_ext::core::unit::JobSources;
use scheduler_ext::core::view::{ClusterView, ContextCache, IncrementalView};
use serde_json::json;

const GPUS: u32 = 8;
const SUPER_NODE_SIZE: usize = 18;
const GANG: usize = 16;

struct Args {
    nodes: usize,
    pods: usize,
    events: usize,
    batch: usize,
    gangs: usize,
}

fn args() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    let bench = argv.iter().any(|a| a == "--bench");
    let get = |flag: &str, default: usize, smoke: usize| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(if bench { default } else { smoke })
    };
    Args {
        nodes: get("--nodes", 5000, 100),
        pods: get("--pods", 50_000, 1000),
        events: get("--events", 2000, 100),
        batch: get("--batch", 1, 1).max(1),
        gangs: get("--gangs", 0, 10),
    }
}

fn node_name(i: usize) -> String {
    format!("gpu-{i:05}")
}

fn gpu(node: usize, i: u32) -> String {
    format!("GPU-{node:05}-{i}")
}

fn topology(i: usize) -> DeviceTopology {
    let mut t =
        fumarole_topology::crd::testing::nvlink_node(&node_name(i), GPUS, 280, &[], |g| gpu(i, g));
    t.spec.super_node = Some(SuperNodeInfo {
        id: format!("sn-{}", i / SUPER_NODE_SIZE),
        source: "config".into(),
    });
    t
}

/// A 1-GPU pod: bound to `node` with device `g` chosen, or pending; `gang`: pod `rank` of a
/// Volcano job with `gpu-group-size: 8`.
fn pod(name: &str, bound: Option<(usize, u32)>, gang: Option<(usize, usize)>) -> PodFacts {
    let (node, mut annotations) = match bound {
        Some((n, g)) => (
            Some(node_name(n)),
            json!({
                "fumarole.dev/devices": json!({"nvidia.com/gpu": [gpu(n, g)]}).to_string(),
                "fumarole.dev/devices-node": node_name(n),
            }),
        ),
        None => (None, json!({})),
    };
    let mut labels = json!({});
    if let Some((job, rank)) = gang {
        labels = json!({"volcano.sh/job-name": format!("gang-{job}"),
            "volcano.sh/task-spec": "worker"});
        annotations["volcano.sh/task-index"] = rank.to_string().into();
        annotations["fumarole.dev/gpu-group-size"] = "8".into();
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels,
            "annotations": annotations},
        "spec": {"nodeName": node, "schedulerName": "none",
            "containers": [{"name": "main",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap_or_default();
    PodFacts::of(&pod)
}

type Pods = BTreeMap<Arc<str>, Arc<PodFacts>>;

fn full_build(
    contexts: &mut ContextCache,
    topologies: &[DeviceTopology],
    nodes: &[ObjectMeta],
    pods: &Pods,
) -> ClusterView {
    ClusterView::build_with_jobs(
        contexts,
        topologies,
        &[],
        nodes,
        pods.values().map(AsRef::as_ref),
        Claims::default(),
        JobSources::default(),
    )
    .unwrap_or_default()
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let a = args();
    let topologies: Vec<DeviceTopology> = (0..a.nodes).map(topology).collect();
    let nodes: Vec<ObjectMeta> = (0..a.nodes)
        .map(|i| ObjectMeta {
            name: Some(node_name(i)),
            labels: Some(
                [(
                    "fumarole.dev/super-node".to_string(),
                    format!("sn-{}", i / SUPER_NODE_SIZE),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        })
        .collect();
    let per_node = 6;
    let bound_target = a.pods * 4 / 5;
    let slots = (a.nodes - 1).max(1) * per_node;
    let mut pods: Pods = BTreeMap::new();
    let mut gang_pods = 0;
    for i in 0..a.pods {
        let bound = (i < bound_target).then(|| {
            let slot = i % slots;
            (slot / per_node, (slot % per_node) as u32)
        });
        let gang = (i % 100 < a.gangs).then(|| {
            gang_pods += 1;
            (gang_pods / GANG, gang_pods % GANG)
        });
        let p = Arc::new(pod(&format!("p-{i:06}"), bound, gang));
        pods.insert(Arc::clone(&p.key), p);
    }

    let mut contexts = ContextCache::default();
    let mut builds = Vec::new();
    let mut view = ClusterView::default();
    for _ in 0..5 {
        let started = Instant::now();
        view = full_build(&mut contexts, &topologies, &nodes, &pods);
        builds.push(started.elapsed());
    }
    builds.sort();
    let mut live = IncrementalView::new(view, pods.values().cloned());

    // Churn as live_scale makes it.
    let mut alive: VecDeque<Arc<str>> = VecDeque::new();
    let mut took = Vec::new();
    let mut touched = (0usize, 0usize, 0usize);
    let mut batch = Vec::new();
    let mut churn_gangs = 0;
    for i in 0..a.events {
        if i % 2 == 0 || alive.len() < 100 {
            let name = format!("churn-{i:07}");
            let bound = (i % 4 == 0).then(|| ((i / 4) % (a.nodes - 1).max(1), GPUS - 1));
            let gang = (a.gangs > 0 && i % 4 == 2).then(|| {
                churn_gangs += 1;
                (1_000_000 + churn_gangs / GANG, churn_gangs % GANG)
            });
            let p = Arc::new(pod(&name, bound, gang));
            alive.push_back(Arc::clone(&p.key));
            pods.insert(Arc::clone(&p.key), Arc::clone(&p));
            batch.push((Arc::clone(&p.key), Some(p)));
        } else if let Some(key) = alive.pop_front() {
            pods.remove(&key);
            batch.push((key, None));
        }
        if batch.len() >= a.batch {
            let started = Instant::now();
            let u = live.update_pods(std::mem::take(&mut batch));
            // What the live loop hands the decider (the last one is dropped meanwhile).
            let published = live.view().clone();
            took.push(started.elapsed());
            drop(published);
            touched.0 += u.nodes;
            touched.1 += u.jobs;
            touched.2 += u.job_pods;
        }
    }
    took.sort();
    let updates = took.len().max(1);

    // The view followed the events: it holds what a full build of the same pods holds.
    let check = full_build(&mut contexts, &topologies, &nodes, &pods);
    let same = check
        .nodes()
        .zip(live.view().nodes())
        .all(|(a, b)| a.name == b.name && a.assumed_mask == b.assumed_mask)
        && check.pending().len() == live.view().pending().len()
        && check.promised().count() == live.view().promised().count();
    assert!(same, "the updated view differs from a full build");

    println!(
        "nodes {} pods {} (gangs {} %) events {} in updates of {}",
        a.nodes, a.pods, a.gangs, a.events, a.batch
    );
    println!(
        "full build: median {:.1?}, min {:.1?} (5 builds)",
        percentile(&builds, 0.5),
        builds[0]
    );
    println!(
        "update with the copy handed over: p50 {:.1?}, p99 {:.1?}, max {:.1?} ({} updates); per update {:.2} nodes recounted, {:.2} jobs retold ({:.1} pods)",
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        took.last().copied().unwrap_or_default(),
        took.len(),
        touched.0 as f64 / updates as f64,
        touched.1 as f64 / updates as f64,
        touched.2 as f64 / updates as f64,
    );
    let total: Duration = took.iter().sum();
    println!(
        "all {} events: {:.1?} of updates, against {:.1?} for one full build per update",
        a.events,
        total,
        percentile(&builds, 0.5) * updates as u32
    );
}
