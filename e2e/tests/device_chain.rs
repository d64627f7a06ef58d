//! The scheduler's choice is the device the container gets, followed per pod from the scheduler
//! to the container: the real kube-scheduler (with the extension as filter, prioritize and
//! bind) or the real Volcano (with the extension as its `extender` plugin, binding without
//! telling it, so the extension writes the choice right after the bind), the fumarole agent in
//! cluster mode on every node, and harness nodes running the kubelet's own device manager and
//! topology manager (`kubelet-node`) that admit every bound pod through the agent's device
//! plugins.
//!
//! A mixed workload (pods of 1, 2, 4 and 8 GPUs, and gpu-group-size units of two 4-GPU pods;
//! Volcano Jobs through Volcano, bare pods through kube-scheduler) flows through 4 dgx-h100
//! nodes in 2 super-nodes: pods are submitted while others run, checked as soon as their node
//! admits them, then deleted. For every pod, the devices in its
//! `fumarole.dev/devices` annotation, the devices the kubelet's device manager allocated, and
//! the `NVIDIA_VISIBLE_DEVICES` the agent's `Allocate` answered must be the same set; no device
//! is given to two running pods of a node; every unit runs in one super-node. Every difference
//! is counted and the test fails on any. `FUMAROLE_CHAIN_PODS` sets how many pods (default 96
//! per scheduler; the run used 240 through each, see docs/testing.md).

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use fumarole_e2e::cluster::{eventually, free_port};
use fumarole_e2e::fumarole::agent_bin;
use fumarole_e2e::harness_node::PodRecord;
use fumarole_e2e::{HarnessNode, NodeSpec, TestCluster};
use fumarole_topology::annotation::{self, DEVICES_ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

const GPU: &str = "nvidia.com/gpu";
const NODES: [(&str, &str); 4] = [
    ("dgx-0", "sn-a"),
    ("dgx-1", "sn-a"),
    ("dgx-2", "sn-b"),
    ("dgx-3", "sn-b"),
];
/// Pods in flight at once (submitted, not yet checked): enough to keep every GPU busy and
/// some pods waiting.
const IN_FLIGHT: usize = 12;

/// How many pods the run pushes through one scheduler.
fn pod_count() -> usize {
    std::env::var("FUMAROLE_CHAIN_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scheduler {
    Kube,
    Volcano,
}

impl Scheduler {
    fn name(self) -> &'static str {
        match self {
            Scheduler::Kube => "default-scheduler",
            Scheduler::Volcano => "volcano",
        }
    }
}

/// The cluster: Nodes, a harness node and an agent (cluster mode, dgx-h100 fixture, its
/// super-node) per node, the extension, and the scheduler.
async fn start(scheduler: Scheduler) -> (TestCluster, Vec<HarnessNode>) {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let mut harness = Vec::new();
    for (node, super_node) in NODES {
        cluster
            .create_node(
                &NodeSpec::new(node)
                    .capacity("cpu", "224")
                    .capacity("memory", "2Ti"),
            )
            .await
            .unwrap();
        let h = cluster.start_harness_node(node).await.unwrap();
        let absent = |f: &str| cluster.root().join(f).display().to_string();
        let args = vec![
            "run".to_string(),
            "--fixture=dgx-h100".into(),
            format!("--node-name={node}"),
            format!("--super-node={super_node}"),
            format!("--device-plugin-dir={}", h.plugin_dir().display()),
            format!("--kubelet-config={}", absent("absent.yaml")),
            format!("--cpu-manager-state={}", absent("absent_state")),
            format!("--pod-resources-socket={}", absent("absent.sock")),
            format!("--metrics-addr=127.0.0.1:{}", free_port().unwrap()),
        ];
        cluster
            .start_program(
                &format!("fumarole-agent-{node}"),
                &agent_bin().unwrap(),
                &args,
                &[],
            )
            .unwrap();
        harness.push(h);
    }
    for h in &harness {
        h.wait_allocatable(GPU, 8, Duration::from_secs(120))
            .await
            .unwrap();
    }
    let port = cluster.start_scheduler_ext(&[]).await.unwrap();
    match scheduler {
        Scheduler::Kube => cluster
            .start_kube_scheduler(&common::kube_scheduler_config(port))
            .await
            .unwrap(),
        Scheduler::Volcano => cluster
            .start_volcano(&common::volcano_conf_with_extender(port))
            .await
            .unwrap(),
    }
    (cluster, harness)
}

/// A submission: the objects to create, and the pods they make.
struct Submission {
    /// A Volcano Job (for Volcano; deleting it deletes its pods), or none (kube-scheduler).
    job: Option<DynamicObject>,
    pods: Vec<Pod>,
}

/// The i-th submission: a single pod, or (every 9th) a unit of two 4-GPU pods with
/// gpu-group-size 8. Sizes cycle through 1, 2, 4, 8, 2, 1, 4, 1. Through Volcano each is a
/// Volcano Job (its pods `<job>-main-<i>`), as users submit them; kube-scheduler gets bare
/// pods.
fn submission(i: usize, scheduler: Scheduler) -> Submission {
    const SIZES: [u32; 8] = [1, 2, 4, 8, 2, 1, 4, 1];
    let pod = |name: String, gpus: u32, annotations: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "schedulerName": scheduler.name(),
                "containers": [{"name": "main", "image": "example.invalid/none",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                  "limits": {GPU: gpus.to_string()}}}]
            }
        }))
        .unwrap()
    };
    let (name, replicas, gpus, annotations) = if i % 9 == 8 {
        (
            format!("unit{i}"),
            2,
            4,
            json!({"fumarole.dev/gpu-group-size": "8"}),
        )
    } else {
        (format!("single{i}"), 1, SIZES[i % SIZES.len()], json!({}))
    };
    match scheduler {
        Scheduler::Kube => Submission {
            job: None,
            pods: (0..replicas)
                .map(|r| {
                    let pod_name = if replicas == 1 {
                        name.clone()
                    } else {
                        format!("{name}-{r}")
                    };
                    pod(pod_name, gpus, annotations.clone())
                })
                .collect(),
        },
        Scheduler::Volcano => {
            let template = pod(String::new(), gpus, annotations);
            let mut job = DynamicObject::new(&name, &vcjob_resource()).within("default");
            job.data = json!({"spec": {
                "schedulerName": "volcano",
                "queue": "default",
                "minAvailable": replicas,
                "tasks": [{"name": "main", "replicas": replicas, "template": {
                    "metadata": {"annotations": template.metadata.annotations},
                    "spec": template.spec,
                }}]
            }});
            Submission {
                job: Some(job),
                pods: (0..replicas)
                    .map(|r| pod(format!("{name}-main-{r}"), gpus, json!({})))
                    .collect(),
            }
        }
    }
}

fn vcjob_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "batch.volcano.sh",
        "v1alpha1",
        "Job",
    ))
}

/// What went wrong, by kind, with examples.
#[derive(Default)]
struct Findings {
    checked: usize,
    mismatches: Vec<String>,
    rejected: Vec<String>,
    double: Vec<String>,
    split_units: Vec<String>,
}

impl Findings {
    fn clean(&self) -> bool {
        self.mismatches.is_empty()
            && self.rejected.is_empty()
            && self.double.is_empty()
            && self.split_units.is_empty()
    }
}

/// Every pod of the namespace as `name phase node (deleting)`, for a stall's message.
async fn pod_states(pods: &Api<Pod>) -> Vec<String> {
    pods.list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .map(|p| {
                    format!(
                        "{} {:?} on {:?}{}",
                        p.name_any(),
                        p.status.as_ref().and_then(|s| s.phase.clone()),
                        p.spec.as_ref().and_then(|s| s.node_name.clone()),
                        if p.metadata.deletion_timestamp.is_some() {
                            " (deleting)"
                        } else {
                            ""
                        }
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn sorted(v: &[String]) -> Vec<String> {
    let mut v = v.to_vec();
    v.sort();
    v
}

/// Compares one admitted pod's three device lists.
fn check(pod: &Pod, node: &str, record: &PodRecord, findings: &mut Findings) -> Vec<String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let chosen = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEVICES_ANNOTATION))
        .and_then(|v| annotation::parse(v).ok())
        .and_then(|c| c.get(GPU).cloned())
        .unwrap_or_default();
    let allocated = record.devices(GPU);
    let env: Vec<String> = record
        .container("main")
        .and_then(|c| c.options.as_ref())
        .and_then(|o| o.envs.get("NVIDIA_VISIBLE_DEVICES"))
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let (c, a, e) = (sorted(&chosen), sorted(&allocated), sorted(&env));
    if c.is_empty() || c != a || a != e {
        findings.mismatches.push(format!(
            "{name} on {node}: annotation {c:?}, kubelet {a:?}, env {e:?}"
        ));
    }
    a
}

async fn run_chain(scheduler: Scheduler) {
    let (cluster, harness) = start(scheduler).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let jobs: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), "default", &vcjob_resource());
    // Pod -> the Volcano Job that made it.
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let target = pod_count();
    let started = Instant::now();
    let mut findings = Findings::default();
    // Pod name -> unit super-nodes, and which devices each running pod of a node holds.
    let mut unit_super_nodes: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut held: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut in_flight: BTreeSet<String> = BTreeSet::new();
    let mut submitted = 0usize;
    let mut next = 0usize;
    let deadline = started + Duration::from_secs(60 + 6 * target as u64);
    while findings.checked + findings.rejected.len() < target {
        if Instant::now() >= deadline {
            panic!(
                "chain stalled: {} of {target} pods checked, in flight {in_flight:?}\npods: {:#?}\nscheduler-ext:\n{}",
                findings.checked,
                pod_states(&pods).await,
                cluster.log_tail("fumarole-scheduler-ext", 40).unwrap()
            );
        }
        while in_flight.len() < IN_FLIGHT && submitted < target {
            let s = submission(next, scheduler);
            if let Some(job) = &s.job {
                jobs.create(&PostParams::default(), job).await.unwrap();
                for p in &s.pods {
                    owner.insert(p.metadata.name.clone().unwrap(), job.name_any());
                }
            }
            for p in s.pods {
                let name = p.metadata.name.clone().unwrap();
                if s.job.is_none() {
                    pods.create(&PostParams::default(), &p).await.unwrap();
                }
                in_flight.insert(name);
                submitted += 1;
            }
            next += 1;
        }
        let mut done = Vec::new();
        for (h, (node, super_node)) in harness.iter().zip(NODES) {
            for record in h.pods().await.unwrap() {
                if !in_flight.contains(&record.name) || record.deleted {
                    continue;
                }
                match record.state.as_str() {
                    "admitted" => {
                        let pod = pods.get(&record.name).await.unwrap();
                        let devices = check(&pod, node, &record, &mut findings);
                        let node_held = held.entry(node.to_string()).or_default();
                        for (other, theirs) in node_held.iter() {
                            if let Some(d) = devices.iter().find(|d| theirs.contains(d)) {
                                findings
                                    .double
                                    .push(format!("{d} on {node}: {} and {other}", record.name));
                            }
                        }
                        node_held.insert(record.name.clone(), devices);
                        if record.name.starts_with("unit") {
                            let unit = record.name.split('-').next().unwrap_or_default();
                            unit_super_nodes
                                .entry(unit.to_string())
                                .or_default()
                                .insert(super_node);
                        }
                        findings.checked += 1;
                        done.push(record.name.clone());
                    }
                    "rejected" => {
                        findings.rejected.push(format!(
                            "{} on {node}: {} {}",
                            record.name, record.reason, record.message
                        ));
                        done.push(record.name.clone());
                    }
                    _ => {}
                }
            }
        }
        for name in done {
            in_flight.remove(&name);
            for node_held in held.values_mut() {
                node_held.remove(&name);
            }
            // A Volcano Job goes when all its pods are checked; its pods are deleted too (the
            // test cluster runs no garbage collector to follow the owner references).
            if let Some(job) = owner.get(&name) {
                let siblings: Vec<String> = owner
                    .iter()
                    .filter(|(_, j)| *j == job)
                    .map(|(p, _)| p.clone())
                    .collect();
                if siblings.iter().all(|p| !in_flight.contains(p)) {
                    jobs.delete(job, &DeleteParams::default()).await.unwrap();
                    for p in siblings {
                        pods.delete(&p, &DeleteParams::default()).await.unwrap();
                    }
                }
            } else {
                pods.delete(&name, &DeleteParams::default()).await.unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for (unit, super_nodes) in &unit_super_nodes {
        if super_nodes.len() > 1 {
            findings
                .split_units
                .push(format!("{unit} spans {super_nodes:?}"));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "device chain through {}: {} pods checked ({} units) in {seconds:.0} s ({:.2} pods/s): {} mismatches, {} rejected, {} devices given twice, {} units split",
        scheduler.name(),
        findings.checked,
        unit_super_nodes.len(),
        findings.checked as f64 / seconds,
        findings.mismatches.len(),
        findings.rejected.len(),
        findings.double.len(),
        findings.split_units.len(),
    );
    assert!(
        findings.clean(),
        "mismatches: {:?}\nrejected: {:?}\ngiven twice: {:?}\nsplit units: {:?}",
        findings.mismatches,
        findings.rejected,
        findings.double,
        findings.split_units
    );
    // Every Warning the agents recorded about the pods' devices would be a difference.
    let warnings = eventually(
        "no device-choice Warning Events",
        Duration::from_secs(5),
        || {
            let client = cluster.client();
            async move {
                let events: Api<k8s_openapi::api::events::v1::Event> =
                    Api::namespaced(client, "default");
                let found: Vec<String> = events
                    .list(&Default::default())
                    .await?
                    .items
                    .into_iter()
                    .filter(|e| {
                        e.reason
                            .as_deref()
                            .is_some_and(|r| r.starts_with("DeviceChoice"))
                    })
                    .map(|e| format!("{:?}: {:?}", e.reason, e.note))
                    .collect();
                Ok(Some(found))
            }
        },
    )
    .await
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_scheduler_choice_is_what_every_container_gets() {
    run_chain(Scheduler::Kube).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn volcano_choice_is_what_every_container_gets() {
    run_chain(Scheduler::Volcano).await;
}
