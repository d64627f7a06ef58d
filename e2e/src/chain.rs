//! The device chain, shared by the e2e tests that follow pods from a scheduler to their
//! containers: four dgx-h100 harness nodes in two super-nodes with an agent each
//! ([`start_nodes`]), a mixed workload ([`submission`]) pushed through whichever scheduler the
//! test started, and [`run`], which checks every admitted pod (the scheduler's
//! `fumarole.dev/devices`, the kubelet's allocation, the agent's `NVIDIA_VISIBLE_DEVICES`) and
//! every node (no device given to two running pods) and every unit (one super-node), and
//! returns what it found ([`Findings`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use fumarole_topology::annotation::{self, DEVICES_ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

use crate::cluster::TestCluster;
use crate::fleet::{self, FleetNode};
use crate::harness_node::{HarnessNode, PodRecord};

pub const GPU: &str = "nvidia.com/gpu";
/// The nodes and their super-nodes.
pub const NODES: [(&str, &str); 4] = [
    ("dgx-0", "sn-a"),
    ("dgx-1", "sn-a"),
    ("dgx-2", "sn-b"),
    ("dgx-3", "sn-b"),
];
/// Pods in flight at once (submitted, not yet checked): enough to keep every GPU busy and
/// some pods waiting.
pub const IN_FLIGHT: usize = 12;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    Kube,
    Volcano,
}

impl Scheduler {
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Kube => "default-scheduler",
            Scheduler::Volcano => "volcano",
        }
    }
}

/// Nodes, a harness node and an agent (cluster mode, dgx-h100 fixture, its super-node, and
/// `agent_args`) per node of [`NODES`], once every node's kubelet has its 8 GPUs.
pub async fn start_nodes(cluster: &TestCluster, agent_args: &[&str]) -> Result<Vec<HarnessNode>> {
    let nodes: Vec<FleetNode> = NODES
        .iter()
        .map(|(node, super_node)| FleetNode::new(node, "dgx-h100", GPU, 8).super_node(super_node))
        .collect();
    fleet::start(cluster, &nodes, agent_args).await
}

/// A submission: the objects to create, and the pods they make.
pub struct Submission {
    /// A Volcano Job (for Volcano; deleting it deletes its pods), or none (kube-scheduler).
    pub job: Option<DynamicObject>,
    pub pods: Vec<Pod>,
}

/// The i-th submission: a single pod, or (every 9th) a unit of two 4-GPU pods with
/// gpu-group-size 8. Sizes cycle through 1, 2, 4, 8, 2, 1, 4, 1. Through Volcano each is a
/// Volcano Job (its pods `<job>-main-<i>`), as users submit them; kube-scheduler gets bare
/// pods.
pub fn submission(i: usize, scheduler: Scheduler) -> Result<Submission> {
    const SIZES: [u32; 8] = [1, 2, 4, 8, 2, 1, 4, 1];
    let pod = |name: String, gpus: u32, annotations: serde_json::Value| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "schedulerName": scheduler.name(),
                "containers": [{"name": "main", "image": "example.invalid/none",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                  "limits": {GPU: gpus.to_string()}}}]
            }
        }))?)
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
    Ok(match scheduler {
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
                .collect::<Result<_>>()?,
        },
        Scheduler::Volcano => {
            let template = pod(String::new(), gpus, annotations)?;
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
                    .collect::<Result<_>>()?,
            }
        }
    })
}

/// The seed's `pytorch-demo`: a Volcano Job with the pytorch plugin, master 1 + `workers`, 8
/// GPUs each, `metax-tech.com/gpu-group-size: "<group>"` (and `atomic-gpu-group-size`, when
/// given) on the master's template only, as MetaX's examples write it. The seed's own is 7
/// workers, group 32.
pub fn pytorch_demo(workers: u32, group: u32, atomic: Option<u32>) -> DynamicObject {
    pytorch_demo_asking(GPU, workers, group, atomic)
}

/// [`pytorch_demo`] asking for `resource` (the seed's own asks for `metax-tech.com/gpu`).
pub fn pytorch_demo_asking(
    resource: &str,
    workers: u32,
    group: u32,
    atomic: Option<u32>,
) -> DynamicObject {
    let mut annotations = json!({"metax-tech.com/gpu-group-size": group.to_string()});
    if let Some(a) = atomic {
        annotations["metax-tech.com/atomic-gpu-group-size"] = json!(a.to_string());
    }
    let container = json!({
        "name": "pytorch", "image": "example.invalid/pytorch",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {resource: "8"}}
    });
    let mut job = DynamicObject::new("pytorch-demo", &vcjob_resource()).within("default");
    job.data = json!({"spec": {
        "schedulerName": "volcano",
        "queue": "default",
        "minAvailable": workers + 1,
        "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
        "tasks": [
            {"name": "master", "replicas": 1, "template": {
                "metadata": {"annotations": annotations},
                "spec": {"restartPolicy": "OnFailure", "containers": [container.clone()]}}},
            {"name": "worker", "replicas": workers, "template": {
                "spec": {"restartPolicy": "OnFailure", "containers": [container]}}}
        ]
    }});
    job
}

/// Volcano's PodGroup (`scheduling.volcano.sh/v1beta1`).
pub fn podgroup_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "scheduling.volcano.sh",
        "v1beta1",
        "PodGroup",
    ))
}

pub fn vcjob_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "batch.volcano.sh",
        "v1alpha1",
        "Job",
    ))
}

/// What went wrong, by kind, with examples.
#[derive(Debug, Default)]
pub struct Findings {
    /// Pods admitted and checked.
    pub checked: usize,
    /// Units placed.
    pub units: usize,
    /// Wall time of the run.
    pub seconds: f64,
    /// Admitted pods without the scheduler's choice (none written before the node admitted
    /// them: the extension was down past the plugin's wait).
    pub unchosen: Vec<String>,
    /// Admitted pods whose choice, kubelet allocation and env differ.
    pub mismatches: Vec<String>,
    /// Pods the kubelet refused.
    pub rejected: Vec<String>,
    /// A device held by two running pods of a node.
    pub double: Vec<String>,
    /// Units that ran in more than one super-node.
    pub split_units: Vec<String>,
}

impl Findings {
    /// Nothing wrong at all: every pod got exactly its choice.
    pub fn clean(&self) -> bool {
        self.unchosen.is_empty() && self.safe() && self.mismatches.is_empty()
    }

    /// Nothing unsafe: no refusal, no device given twice, no unit split.
    pub fn safe(&self) -> bool {
        self.rejected.is_empty() && self.double.is_empty() && self.split_units.is_empty()
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        format!(
            "{} pods checked ({} units) in {:.0} s ({:.2} pods/s): {} without a choice, {} mismatches, {} rejected, {} devices given twice, {} units split",
            self.checked,
            self.units,
            self.seconds,
            self.checked as f64 / self.seconds.max(f64::EPSILON),
            self.unchosen.len(),
            self.mismatches.len(),
            self.rejected.len(),
            self.double.len(),
            self.split_units.len(),
        )
    }
}

/// For a stall's message: each Volcano Job of `jobs` with its phase and its PodGroup's phase
/// and conditions (the job controller makes a Job's pods only once the scheduler has moved its
/// PodGroup out of Pending), whether a cluster process has exited, then the ends of both
/// Volcano processes' logs.
async fn volcano_states(cluster: &TestCluster, jobs: &BTreeSet<String>) -> String {
    let job_api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), "default", &vcjob_resource());
    let groups: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), "default", &podgroup_resource());
    let groups = groups.list(&Default::default()).await.map(|l| l.items);
    let mut lines = Vec::new();
    for job in jobs {
        let phase = match job_api.get_opt(job).await {
            Ok(Some(j)) => j.data["status"]["state"]["phase"].to_string(),
            Ok(None) => "gone".into(),
            Err(e) => format!("unreadable: {e}"),
        };
        let group = match &groups {
            Ok(groups) => groups
                .iter()
                .find(|g| {
                    g.owner_references()
                        .iter()
                        .any(|o| o.kind == "Job" && &o.name == job)
                })
                .map(|g| {
                    format!(
                        "{} {}",
                        g.data["status"]["phase"], g.data["status"]["conditions"]
                    )
                })
                .unwrap_or_else(|| "none".into()),
            Err(e) => format!("unreadable: {e}"),
        };
        lines.push(format!("job {job}: {phase}, podgroup {group}"));
    }
    if let Ok(groups) = &groups {
        lines.push(format!("{} PodGroups in the namespace", groups.len()));
    }
    lines.push(match cluster.check_processes() {
        Ok(()) => "every cluster process is running".into(),
        Err(e) => format!("{e:#}"),
    });
    for process in ["vc-controller-manager", "vc-scheduler"] {
        if let Ok(tail) = cluster.log_tail(process, 30) {
            lines.push(format!("---- {process} ----\n{tail}"));
        }
    }
    lines.join("\n")
}

/// Every pod of the namespace as `name phase node (deleting)`, for a stall's message.
pub async fn pod_states(pods: &Api<Pod>) -> Vec<String> {
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

async fn delete_if_present(api: &Api<DynamicObject>, name: &str) -> Result<()> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
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
    let line = format!("{name} on {node}: annotation {c:?}, kubelet {a:?}, env {e:?}");
    if c.is_empty() {
        findings.unchosen.push(line);
    } else if c != a || a != e {
        findings.mismatches.push(line);
    }
    a
}

/// Pushes `target` pods through `scheduler` (already started, with the extension) over
/// `harness`, checking each as its node admits it and deleting it then (a unit's pods once all
/// are checked), until all are checked or refused; `diagnostics` is printed if the run stalls
/// past `deadline`.
pub async fn run(
    cluster: &TestCluster,
    harness: &[HarnessNode],
    scheduler: Scheduler,
    target: usize,
    deadline: Duration,
    diagnostics: impl Fn() -> String,
) -> Result<Findings> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let jobs: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), "default", &vcjob_resource());
    let groups: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), "default", &podgroup_resource());
    // Pod -> its group: the Volcano Job that made it, or its bare unit; Job -> its PodGroup.
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut job_groups: BTreeMap<String, String> = BTreeMap::new();
    let started = Instant::now();
    let mut findings = Findings::default();
    // Pod name -> unit super-nodes, and which devices each running pod of a node holds.
    let mut unit_super_nodes: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut held: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut in_flight: BTreeSet<String> = BTreeSet::new();
    let mut submitted = 0usize;
    let mut next = 0usize;
    let deadline = started + deadline;
    while findings.checked + findings.rejected.len() < target {
        if Instant::now() >= deadline {
            bail!(
                "chain stalled: {} of {target} pods checked, in flight {in_flight:?}\npods: {:#?}\n{}\n{}",
                findings.checked,
                pod_states(&pods).await,
                volcano_states(
                    cluster,
                    &in_flight
                        .iter()
                        .filter(|_| scheduler == Scheduler::Volcano)
                        .filter_map(|p| owner.get(p).cloned())
                        .collect()
                )
                .await,
                diagnostics()
            );
        }
        while in_flight.len() < IN_FLIGHT && submitted < target {
            let s = submission(next, scheduler)?;
            if let Some(job) = &s.job {
                let created = jobs.create(&PostParams::default(), job).await?;
                // The job controller names the Job's PodGroup `<job>-<uid>`.
                let group = format!("{}-{}", job.name_any(), created.uid().unwrap_or_default());
                job_groups.insert(job.name_any(), group);
                for p in &s.pods {
                    owner.insert(p.name_any(), job.name_any());
                }
            }
            if s.job.is_none() && s.pods.len() > 1 {
                // A unit of bare pods: its pods are deleted together, like a Job's.
                let unit = s.pods[0].name_any();
                let unit = unit.split('-').next().unwrap_or_default().to_string();
                for p in &s.pods {
                    owner.insert(p.name_any(), unit.clone());
                }
            }
            for p in s.pods {
                let name = p.name_any();
                if s.job.is_none() {
                    pods.create(&PostParams::default(), &p).await?;
                }
                in_flight.insert(name);
                submitted += 1;
            }
            next += 1;
        }
        let mut done = Vec::new();
        for (h, (node, super_node)) in harness.iter().zip(NODES) {
            for record in h.pods().await? {
                if !in_flight.contains(&record.name) || record.deleted {
                    continue;
                }
                match record.state.as_str() {
                    "admitted" => {
                        let pod = pods.get(&record.name).await?;
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
            // A unit's pods (a Volcano Job's, or a bare unit's under kube-scheduler) go together
            // once all are checked, as a gang's do: deleting one while its sibling waits would
            // let the sibling be planned afresh, anywhere (a unit with nothing placed has no
            // super-node), and read as a split. Until then they hold their devices.
            let siblings: Vec<String> = match owner.get(&name) {
                Some(group) => owner
                    .iter()
                    .filter(|(_, g)| *g == group)
                    .map(|(p, _)| p.clone())
                    .collect(),
                None => vec![name.clone()],
            };
            if siblings.iter().any(|p| in_flight.contains(p)) {
                continue;
            }
            if let Some(job) = owner.get(&name).filter(|_| scheduler == Scheduler::Volcano) {
                jobs.delete(job, &DeleteParams::default()).await?;
                // A real cluster's garbage collector deletes the PodGroup with its Job
                // (owner reference); this one runs none. Left behind, the scheduler moves an
                // emptied PodGroup back to Pending, enqueues it again, and there it stays
                // (76 of the 87 a 96-pod run left were Inqueue), counted as queue demand by
                // proportion's `inqueue` for good (a CPU and 1 GiB each here): enough of
                // them would keep new Jobs out of the queue, and such a Job gets no pods.
                if let Some(group) = job_groups.remove(job) {
                    delete_if_present(&groups, &group).await?;
                }
            }
            for p in siblings {
                pods.delete(&p, &DeleteParams::default()).await?;
                owner.remove(&p);
                for node_held in held.values_mut() {
                    node_held.remove(&p);
                }
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
    findings.units = unit_super_nodes.len();
    findings.seconds = started.elapsed().as_secs_f64();
    Ok(findings)
}
