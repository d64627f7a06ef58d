//! gpu-podaffinity input: a pod's model-parallel unit, read from its annotations and its job.
//! (A *unit*, not a group: Volcano's PodGroup is another object, read here only for its
//! `sp-block`; see below.)
//!
//! Annotations (each also under the `fumarole.dev/` prefix; both spellings present must agree):
//! - `metax-tech.com/gpu-group-size`: GPUs of one model-parallel unit; a positive multiple of
//!   the pod's GPU count. Without it the pod takes no part in group placement.
//! - `metax-tech.com/atomic-gpu-group-size`: GPUs that must share one super-node; defaults to
//!   the group size; a multiple of the pod's GPU count that divides the group size.
//!
//! **The unit is the job.** Users annotate one pod template of a job (MetaX's own examples
//! annotate only the master's); the annotations then hold for every pod of the job
//! ([`Jobs`]: what the view knows about each job from all of its pods). A pod's own
//! annotations win; pods of one job that carry different values are an error.
//!
//! **Ranks are the framework's.** A pod's rank orders the pods of its whole job, across its
//! tasks, the way the job's framework numbers them ([`rank`]):
//! 1. the literal `RANK` environment variable of its first container that sets one: what
//!    Volcano's `pytorch` plugin (master 0, worker i as i+1) and Kubeflow's training-operator
//!    (PyTorchJob: the same) write into the pods;
//! 2. DLRover ElasticJob's `elasticjob.dlrover/rank-index` label;
//! 3. Kubeflow's `training.kubeflow.org/replica-index` (replica type `worker` after the one
//!    `master`);
//! 4. Volcano's `volcano.sh/task-index` plus the pods of the job's tasks ordered before the
//!    pod's task (a task named `master`, `chief` or `launcher` first, then by name; pods counted
//!    in the view): one task alone numbers as before;
//! 5. a StatefulSet's `apps.kubernetes.io/pod-index` label;
//! 6. the trailing number of the pod's name (`job-worker-3` -> 3).
//!
//! **Huawei's super-pod jobs.** `sp-block` (NPUs per logical super-pod, which must lie whole in
//! one physical super-pod, i.e. one super-node) is read as an alias: it is the atomic size, and
//! the group size too when no gpu-group-size is given, so an `sp-block` job is a unit job whose
//! units MUST each share a super-node. Such a job is a [`UnitSpec::super_pod`] job: placement
//! keeps the reserve nodes free and honours `sp-fit` ([`SP_FIT`]). The job's total devices
//! (over the pods the view holds) must be a multiple of `sp-block`.
//!
//! **Volcano Jobs and PodGroups.** Huawei's users annotate the Volcano Job, whose annotations
//! Volcano copies to the job's PodGroup (not to its pods); pods name their PodGroup in
//! `scheduling.k8s.io/group-name` ([`POD_GROUP_NAME`]). A PodGroup's `sp-block` and `sp-fit`
//! ([`PodGroupSizes`]) count for its job like one more pod carrying them: a pod's own
//! annotations win, and a pod with its own values that differ leaves the job's other pods
//! with the "pods of job … disagree" error.
//!
//! **Huawei's default, on request.** Huawei reads a super-pod job without `sp-block` as one
//! logical super-pod. With [`JobSources::whole_job_super_pod`] (the extension's
//! `--whole-job-super-pod`, which needs `--super-pod-size`) a job of more than one pod asking
//! for an Ascend resource (`huawei.com/Ascend…`) with no group annotation anywhere (its pods,
//! its PodGroup) is such a job: `sp-block` = the job's NPUs (its unfinished pods the view holds),
//! every pod in block 0. Off by default: the job key also groups a Deployment's or
//! StatefulSet's pods, which the rule would then tie to one super-node.
//!
//! Consecutive ranks form units: pod `rank` with `g` GPUs is in unit `rank·g / group_size` and
//! atomic sub-unit `rank·g / atomic_size`.
//!
//! Pods of one job share a job key ([`job_key`]): namespace plus Volcano's
//! `volcano.sh/job-name`, else the Kubeflow `training.kubeflow.org/job-name`, else DLRover's
//! `elasticjob.dlrover/name`, else the controlling owner, else the pod name without its
//! trailing number. A unit is identified by [`UnitKey`]; a pod's place in its unit is a
//! [`UnitMember`]; [`crate::core::placement`] places units over super-nodes.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;

use crate::core::cow::CowMap;

/// The group-size annotation and its alias.
pub const GROUP_SIZE: [&str; 2] = [
    "metax-tech.com/gpu-group-size",
    "fumarole.dev/gpu-group-size",
];
/// The atomic group-size annotation and its alias.
pub const ATOMIC_GROUP_SIZE: [&str; 2] = [
    "metax-tech.com/atomic-gpu-group-size",
    "fumarole.dev/atomic-gpu-group-size",
];
/// Huawei's job annotation: NPUs per logical super-pod (an alias of the atomic group size, and
/// of the group size when that is not given).
pub const SP_BLOCK: &str = "sp-block";
/// Huawei's job annotation choosing the physical super-pod: `idlest` asks for the one with the
/// most room instead of the fullest one that fits.
pub const SP_FIT: &str = "sp-fit";
/// The one `sp-fit` value besides the default.
pub const SP_FIT_IDLEST: &str = "idlest";

/// The environment variable PyTorch launchers read the global rank from.
pub const RANK_ENV: &str = "RANK";
/// Volcano's task index annotation (index of the pod within its task).
pub const VOLCANO_TASK_INDEX: &str = "volcano.sh/task-index";
/// Kubeflow training-operator replica index and type.
pub const KUBEFLOW_REPLICA_INDEX: &str = "training.kubeflow.org/replica-index";
pub const KUBEFLOW_REPLICA_TYPE: &str = "training.kubeflow.org/replica-type";
/// DLRover ElasticJob's job name and rank labels.
pub const DLROVER_JOB_NAME: &str = "elasticjob.dlrover/name";
pub const DLROVER_RANK_INDEX: &str = "elasticjob.dlrover/rank-index";
/// A StatefulSet pod's ordinal (Kubernetes 1.28 and later).
pub const STATEFULSET_POD_INDEX: &str = "apps.kubernetes.io/pod-index";

/// Volcano's job name and task spec annotations (also labels on Volcano's pods).
pub const VOLCANO_JOB_NAME: &str = "volcano.sh/job-name";
pub const VOLCANO_TASK_SPEC: &str = "volcano.sh/task-spec";
/// Kubeflow training-operator job name label.
pub const KUBEFLOW_JOB_NAME: &str = "training.kubeflow.org/job-name";

/// The PodGroup a pod belongs to (annotation Volcano and the PodGroup controller set).
pub const POD_GROUP_NAME: &str = "scheduling.k8s.io/group-name";

/// Task names that lead their job's rank order (Volcano's pytorch and MPI plugins, Kubeflow).
const LEADING_TASKS: [&str; 3] = ["master", "chief", "launcher"];

/// Why a pod's group annotations are unusable (the pod is unschedulable with this reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("{key}: {value:?} is not a positive integer")]
    NotInteger { key: String, value: String },
    #[error("{a} = {va:?} and {b} = {vb:?} disagree")]
    Conflict {
        a: String,
        va: String,
        b: String,
        vb: String,
    },
    #[error("{key} = {size} is not a multiple of the pod's {gpus} GPUs")]
    NotMultiple { key: String, size: u32, gpus: u32 },
    #[error("atomic group size {atomic} does not divide the group size {group}")]
    AtomicNotDivisor { atomic: u32, group: u32 },
    #[error(
        "{key} is set without {GROUP_SIZE0}",
        GROUP_SIZE0 = GROUP_SIZE[0]
    )]
    AtomicWithoutGroup { key: String },
    #[error(
        "pod {pod} has no rank: no {RANK_ENV} env, no {VOLCANO_TASK_INDEX}, no {KUBEFLOW_REPLICA_INDEX}, no {DLROVER_RANK_INDEX}, no {STATEFULSET_POD_INDEX} and no number at the end of its name"
    )]
    NoRank { pod: String },
    /// `sp-fit` with a value other than `idlest`.
    #[error("{SP_FIT}: {value:?} is not understood (only {SP_FIT_IDLEST:?}, or no annotation)")]
    BadSpFit { value: String },
    /// The job's devices do not divide into whole super-pod blocks.
    #[error(
        "job {job} requests {total} devices in all (pods seen so far), not a multiple of {SP_BLOCK} = {block}"
    )]
    JobNotMultiple { job: String, total: u32, block: u32 },
    /// Pods of one job carry different group annotations.
    #[error("pods of job {job} disagree on their group annotations: {a} and {b}")]
    JobConflict { job: String, a: String, b: String },
}

/// A pod's unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitSpec {
    pub group_size: u32,
    pub atomic_size: u32,
    pub rank: u32,
    /// `rank·gpus / group_size`.
    pub unit: u32,
    /// `rank·gpus / atomic_size`.
    pub atomic_unit: u32,
    /// The sizes came from Huawei's `sp-block`: placement keeps the super-node's reserve nodes
    /// free and may prefer the idlest super-node.
    pub super_pod: bool,
    /// `sp-fit: idlest`.
    pub idlest: bool,
}

/// One atomic sub-unit of a job's unit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnitKey {
    /// [`job_key`].
    pub job: String,
    pub unit: u32,
    pub atomic: u32,
}

impl UnitKey {
    /// The sub-unit of `pod`, whose spec is `spec`.
    pub fn of(pod: &Pod, spec: &UnitSpec) -> Self {
        UnitKey {
            job: job_key(pod),
            unit: spec.unit,
            atomic: spec.atomic_unit,
        }
    }
}

impl std::fmt::Display for UnitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unit {} of job {} (atomic part {})",
            self.unit, self.job, self.atomic
        )
    }
}

/// A pod's place in its unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitMember {
    pub key: UnitKey,
    pub spec: UnitSpec,
    /// GPUs of this pod.
    pub gpus: u32,
}

impl UnitMember {
    /// Keys of every atomic sub-unit of this pod's unit.
    pub fn sub_units(&self) -> impl Iterator<Item = UnitKey> + '_ {
        let per_unit = (self.spec.group_size / self.spec.atomic_size).max(1);
        let first = self.spec.unit.saturating_mul(per_unit);
        (first..first.saturating_add(per_unit)).map(|atomic| UnitKey {
            job: self.key.job.clone(),
            unit: self.key.unit,
            atomic,
        })
    }
}

/// The job a pod belongs to, `namespace/name` (see the module doc).
pub fn job_key(pod: &Pod) -> String {
    let meta = &pod.metadata;
    let ns = meta.namespace.as_deref().unwrap_or("default");
    for key in [VOLCANO_JOB_NAME, KUBEFLOW_JOB_NAME, DLROVER_JOB_NAME] {
        if let Some(job) = meta_value(pod, key) {
            return format!("{ns}/{job}");
        }
    }
    if let Some(owner) = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    {
        return format!("{ns}/{}/{}", owner.kind, owner.name);
    }
    let name = meta.name.as_deref().unwrap_or_default();
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let stem = stem.strip_suffix(['-', '_', '.']).unwrap_or(stem);
    format!("{ns}/{stem}")
}

/// An annotation, else a label, of the pod.
fn meta_value<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    let meta = &pod.metadata;
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .or_else(|| meta.labels.as_ref().and_then(|l| l.get(key)))
        .map(String::as_str)
}

fn meta_index(pod: &Pod, key: &str) -> Option<u32> {
    meta_value(pod, key).and_then(|v| v.trim().parse().ok())
}

/// The value of the first of `keys` present, checked against the other and parsed.
fn annotation(
    annotations: &BTreeMap<String, String>,
    keys: &[&'static str],
) -> Result<Option<(&'static str, u32)>, UnitError> {
    let mut found: Option<(&'static str, &str)> = None;
    for &key in keys {
        if let Some(v) = annotations.get(key) {
            if let Some((k0, v0)) = found
                && v0.trim() != v.trim()
            {
                return Err(UnitError::Conflict {
                    a: k0.to_string(),
                    va: v0.to_string(),
                    b: key.to_string(),
                    vb: v.clone(),
                });
            }
            found.get_or_insert((key, v.as_str()));
        }
    }
    let Some((key, value)) = found else {
        return Ok(None);
    };
    match value.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(Some((key, n))),
        _ => Err(UnitError::NotInteger {
            key: key.to_string(),
            value: value.to_string(),
        }),
    }
}

/// A pod's group annotations, parsed: the group size and the atomic size, each with the key it
/// was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub group: Option<(&'static str, u32)>,
    pub atomic: Option<(&'static str, u32)>,
    /// `sp-block` was one of the keys read.
    pub super_pod: bool,
    /// `sp-fit: idlest`.
    pub idlest: bool,
    /// Huawei's default for a super-pod job without `sp-block`: the whole job is one block.
    pub whole_job: bool,
}

impl Sizes {
    /// The pod's own annotations; `None` when it carries none.
    fn of(pod: &Pod) -> Result<Option<Sizes>, UnitError> {
        match pod.metadata.annotations.as_ref() {
            Some(annotations) => Self::of_annotations(annotations),
            None => Ok(None),
        }
    }

    /// The group annotations among `annotations`; `None` when there are none.
    fn of_annotations(annotations: &BTreeMap<String, String>) -> Result<Option<Sizes>, UnitError> {
        let group = annotation(annotations, &GROUP_SIZE)?;
        // sp-block is the atomic size (it MUST share a super-node) and, alone, the unit too;
        // read with the atomic spellings so a disagreeing atomic size is a conflict.
        let [a0, a1] = ATOMIC_GROUP_SIZE;
        let atomic = annotation(annotations, &[a0, a1, SP_BLOCK])?;
        let super_pod = annotations.contains_key(SP_BLOCK);
        let group = match group {
            None if super_pod => annotation(annotations, &[SP_BLOCK])?,
            g => g,
        };
        let idlest = match annotations.get(SP_FIT).map(|v| v.trim()) {
            None => false,
            Some(v) if v == SP_FIT_IDLEST => true,
            Some(v) => {
                return Err(UnitError::BadSpFit {
                    value: v.to_string(),
                });
            }
        };
        let sizes = Sizes {
            group,
            atomic,
            super_pod,
            idlest,
            whole_job: false,
        };
        Ok((sizes.group.is_some() || sizes.atomic.is_some()).then_some(sizes))
    }

    fn describe(&self) -> String {
        let part = |v: Option<(&str, u32)>| v.map_or("-".to_string(), |(_, n)| n.to_string());
        let sp = if self.super_pod { " (sp-block)" } else { "" };
        let fit = if self.idlest { ", sp-fit idlest" } else { "" };
        format!(
            "group {} / atomic {}{sp}{fit}",
            part(self.group),
            part(self.atomic)
        )
    }
}

/// What the view knows about one job from all of its pods.
#[derive(Clone, Debug, Default)]
struct JobFacts {
    /// The group annotations its pods carry (first seen), or why they cannot be used.
    sizes: Option<Result<Sizes, UnitError>>,
    /// Volcano task -> pods of that task seen.
    tasks: BTreeMap<String, u32>,
    /// Accelerator devices its pods request in all (as far as told: [`Jobs::add_devices`]).
    devices: u32,
    /// True once some pod's devices were counted.
    counted: bool,
    /// Pods asking for an Ascend resource, counted for Huawei's whole-job default.
    ascend_pods: u32,
}

/// Merges one more statement of the job's group annotations into what its other pods said:
/// the same values agree, others are [`UnitError::JobConflict`]; an error stays.
fn merge_sizes(facts: &mut JobFacts, job: &str, own: Result<Sizes, UnitError>) {
    facts.sizes = Some(match facts.sizes.take() {
        None => own,
        Some(Ok(seen)) => match own {
            Ok(s) if s == seen => Ok(seen),
            Ok(s) => Err(UnitError::JobConflict {
                job: job.to_string(),
                a: seen.describe(),
                b: s.describe(),
            }),
            Err(e) => Err(e),
        },
        Some(Err(e)) => Err(e),
    });
}

/// The `sp-block` and `sp-fit` of Volcano PodGroups (which Volcano copies from the Volcano
/// Job's annotations), by `namespace/name`, for the pods that name them.
#[derive(Clone, Debug, Default)]
pub struct PodGroupSizes {
    /// Shared by the views derived from one another (read-only once made).
    groups: std::sync::Arc<HashMap<String, Result<Sizes, UnitError>>>,
}

impl PodGroupSizes {
    /// From each PodGroup's namespace, name and annotations; PodGroups without `sp-block`
    /// are left out (`sp-fit` alone says nothing: it only qualifies a block).
    pub fn new<'a>(
        groups: impl IntoIterator<Item = (&'a str, &'a str, &'a BTreeMap<String, String>)>,
    ) -> Self {
        let groups = groups
            .into_iter()
            .filter_map(|(ns, name, annotations)| {
                let ours = Self::annotations_read(annotations)?;
                let sizes = Sizes::of_annotations(&ours).transpose()?;
                Some((format!("{ns}/{name}"), sizes))
            })
            .collect();
        PodGroupSizes {
            groups: std::sync::Arc::new(groups),
        }
    }

    /// The annotations of a PodGroup that count (`sp-block` and `sp-fit`), or `None` when it
    /// has no `sp-block`: any other change to a PodGroup (Volcano's status updates, most of
    /// its events) changes nothing here.
    pub fn annotations_read(
        annotations: &BTreeMap<String, String>,
    ) -> Option<BTreeMap<String, String>> {
        annotations.contains_key(SP_BLOCK).then(|| {
            [SP_BLOCK, SP_FIT]
                .into_iter()
                .filter_map(|k| annotations.get(k).map(|v| (k.to_string(), v.clone())))
                .collect()
        })
    }

    /// The group annotations of the PodGroup the pod names, if that PodGroup has any.
    pub fn of(&self, pod: &UnitFacts) -> Option<&Result<Sizes, UnitError>> {
        self.groups.get(pod.pod_group.as_deref()?)
    }
}

/// What the view learns about jobs from outside their pods.
#[derive(Clone, Debug, Default)]
pub struct JobSources {
    /// `sp-block` / `sp-fit` of the Volcano PodGroups the pods name.
    pub pod_groups: PodGroupSizes,
    /// Huawei's default: a job of several Ascend pods without any group annotation is one
    /// logical super-pod (see the module doc).
    pub whole_job_super_pod: bool,
}

/// Every job's group annotations and Volcano task sizes, gathered from all the pods of the
/// cluster view (bound or pending), so pods without annotations of their own inherit their
/// job's and ranks run across a job's tasks.
#[derive(Clone, Debug, Default)]
pub struct Jobs {
    /// Shared with the view this one was derived from, but for the jobs that changed.
    jobs: CowMap<String, JobFacts>,
    /// [`JobSources::whole_job_super_pod`].
    whole_job_super_pod: bool,
    /// [`JobSources::pod_groups`], kept for pods whose job has no pod in the view yet (the
    /// first pod a scheduler asks about may come before the view holds any of its job).
    pod_groups: PodGroupSizes,
}

impl Jobs {
    /// No jobs yet, with what the view learned about jobs from outside their pods: with
    /// `whole_job_super_pod`, Huawei's default applies to the jobs of the Ascend pods told
    /// with [`Self::add_ascend_pod`]; a pod of a job the view has no pod of still gets its
    /// PodGroup's `sp-block`.
    pub fn with_sources(sources: JobSources) -> Self {
        Jobs {
            whole_job_super_pod: sources.whole_job_super_pod,
            pod_groups: sources.pod_groups,
            ..Jobs::default()
        }
    }

    /// True when some pod of `job` (or its PodGroup) said something about it.
    pub(crate) fn knows(&self, job: &str) -> bool {
        self.jobs.contains_key(job)
    }

    /// Every job's facts, written out, by job (for comparing two views in tests).
    #[cfg(test)]
    pub(crate) fn written_out(&self) -> BTreeMap<String, String> {
        self.jobs
            .iter()
            .map(|(job, facts)| (job.clone(), format!("{facts:?}")))
            .collect()
    }

    /// Forgets what the pods of `job` said (before they are told again).
    pub(crate) fn forget(&mut self, job: &str) {
        self.jobs.remove(job);
    }

    /// The PodGroup of `pod` has group annotations.
    pub(crate) fn pod_group_speaks(&self, pod: &UnitFacts) -> bool {
        self.pod_groups.of(pod).is_some()
    }

    /// True when Huawei's whole-job default is on.
    pub fn whole_job_super_pod(&self) -> bool {
        self.whole_job_super_pod
    }

    /// Counts one pod of `job` asking for `devices` of an Ascend resource (for the whole-job
    /// default; pods of group jobs are counted with [`Self::add_devices`]).
    pub fn add_ascend_pod(&mut self, job: &str, devices: u32) {
        self.add_devices(job, devices);
        if let Some(facts) = self.jobs.get_mut(job) {
            facts.ascend_pods += 1;
        }
    }

    /// The job's NPUs when Huawei's whole-job default makes it one logical super-pod.
    fn whole_job(&self, job: &str) -> Option<u32> {
        if !self.whole_job_super_pod {
            return None;
        }
        let facts = self.jobs.get(job)?;
        (facts.sizes.is_none() && facts.ascend_pods > 1 && facts.devices > 0)
            .then_some(facts.devices)
    }

    /// The jobs of `pods`.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut jobs = Jobs::default();
        for pod in pods {
            jobs.add(pod);
        }
        jobs
    }

    /// Takes one pod into account.
    pub fn add(&mut self, pod: &Pod) {
        self.add_facts(&UnitFacts::of(pod));
    }

    /// Takes one pod into account, from what was read of it.
    pub fn add_facts(&mut self, pod: &UnitFacts) {
        if pod.volcano_task.is_none() && matches!(pod.sizes, Ok(None)) {
            // Says nothing about its job.
            return;
        }
        let facts = self.jobs.get_or_default(pod.job.clone());
        if let Some(task) = &pod.volcano_task {
            *facts.tasks.entry(task.clone()).or_default() += 1;
        }
        let own = match &pod.sizes {
            Ok(Some(s)) => Ok(*s),
            Ok(None) => return,
            Err(e) => Err(e.clone()),
        };
        merge_sizes(facts, &pod.job, own);
    }

    /// Takes the group annotations of a pod's PodGroup ([`PodGroupSizes::of`]) into account
    /// for its job, like those of one more pod of the job.
    pub fn add_pod_group(&mut self, pod: &UnitFacts) {
        if let Some(sizes) = self.pod_groups.of(pod) {
            let facts = self.jobs.get_or_default(pod.job.clone());
            merge_sizes(facts, &pod.job, sizes.clone());
        }
    }

    /// Counts `devices` requested by one pod of `job` towards the job's total (checked against
    /// `sp-block`). Jobs never told their devices are not checked.
    pub fn add_devices(&mut self, job: &str, devices: u32) {
        let facts = self.jobs.get_or_default(job.to_string());
        facts.devices = facts.devices.saturating_add(devices);
        facts.counted = true;
    }

    /// The job's device total, when counted.
    fn devices(&self, job: &str) -> Option<u32> {
        self.jobs.get(job).filter(|j| j.counted).map(|j| j.devices)
    }

    /// The group annotations that hold for the pod: its own, else its job's, else (no pod of
    /// its job carries any yet) its PodGroup's.
    fn sizes(&self, pod: &UnitFacts) -> Result<Option<Sizes>, UnitError> {
        if let Some(own) = pod.sizes.clone()? {
            return Ok(Some(own));
        }
        let job = self.jobs.get(&pod.job).and_then(|j| j.sizes.as_ref());
        match job.or_else(|| self.pod_groups.of(pod)) {
            None => Ok(self.whole_job(&pod.job).map(|npus| Sizes {
                group: Some((SP_BLOCK, npus)),
                atomic: Some((SP_BLOCK, npus)),
                super_pod: true,
                idlest: false,
                whole_job: true,
            })),
            Some(Ok(s)) => Ok(Some(*s)),
            Some(Err(e)) => Err(e.clone()),
        }
    }

    /// True when `pod` or another pod of its job carries a gpu-group-size or
    /// atomic-gpu-group-size annotation (any spelling), well-formed or not.
    pub fn in_unit(&self, pod: &Pod) -> bool {
        self.in_unit_facts(&UnitFacts::of(pod))
    }

    /// [`Self::in_unit`], from what was read of the pod.
    pub fn in_unit_facts(&self, pod: &UnitFacts) -> bool {
        self.annotated_unit(pod) || self.whole_job(&pod.job).is_some()
    }

    /// [`Self::in_unit_facts`] by group annotations alone (not Huawei's whole-job default).
    pub fn annotated_unit(&self, pod: &UnitFacts) -> bool {
        pod.annotated
            || self.jobs.get(&pod.job).is_some_and(|j| j.sizes.is_some())
            || self.pod_groups.of(pod).is_some()
    }

    /// Pods of the job's Volcano tasks that come before `task` in rank order.
    fn task_offset(&self, job: &str, task: &str) -> u32 {
        let Some(facts) = self.jobs.get(job) else {
            return 0;
        };
        let order = |t: &str| {
            (
                !LEADING_TASKS.contains(&t.to_ascii_lowercase().as_str()),
                t.to_string(),
            )
        };
        let mine = order(task);
        facts
            .tasks
            .iter()
            .filter(|(t, _)| order(t) < mine)
            .map(|(_, n)| *n)
            .sum()
    }
}

/// What grouping reads of a pod, taken once per version of the pod, so a view rebuilt after a
/// change elsewhere need not read the pod again. The pod-based functions read through it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitFacts {
    /// `namespace/name`.
    pod: String,
    /// [`job_key`].
    pub job: String,
    /// The Volcano task the pod counts for in its job (a Volcano job's pod naming its task).
    volcano_task: Option<String>,
    /// The pod's own group annotations.
    sizes: Result<Option<Sizes>, UnitError>,
    /// The pod carries a group annotation, well-formed or not.
    annotated: bool,
    rank: RankFacts,
    /// `namespace/name` of the PodGroup the pod names ([`POD_GROUP_NAME`]).
    pod_group: Option<String>,
}

/// Where a pod's rank comes from (see [`rank`] for the order).
#[derive(Clone, Debug, PartialEq, Eq)]
enum RankFacts {
    /// Stated by the pod whatever its job: `RANK`, DLRover's or Kubeflow's index, a
    /// StatefulSet ordinal.
    Own(u32),
    /// Volcano's task index, offset by the pods of the job's tasks before `task`.
    VolcanoTask { index: u32, task: Option<String> },
    /// The trailing number of the name, if any: a guess.
    Fallback(Option<u32>),
}

impl UnitFacts {
    pub fn of(pod: &Pod) -> Self {
        let volcano_task = meta_value(pod, VOLCANO_JOB_NAME)
            .and(meta_value(pod, VOLCANO_TASK_SPEC))
            .map(str::to_string);
        UnitFacts {
            pod: fumarole_topology::pod::key(pod),
            job: job_key(pod),
            volcano_task,
            sizes: Sizes::of(pod),
            annotated: has_group_annotations(pod),
            rank: RankFacts::of(pod),
            pod_group: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(POD_GROUP_NAME))
                .map(|g| {
                    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                    format!("{ns}/{g}")
                }),
        }
    }

    /// True when the pod itself says something about its job: it names a Volcano task or
    /// carries group annotations (well-formed or not).
    pub(crate) fn speaks(&self) -> bool {
        self.volcano_task.is_some() || !matches!(self.sizes, Ok(None))
    }

    /// The pod's rank within its job (see the module doc), if it has one.
    fn rank(&self, jobs: &Jobs) -> Option<u32> {
        match &self.rank {
            RankFacts::Own(r) => Some(*r),
            RankFacts::VolcanoTask { index, task } => {
                let offset = task
                    .as_deref()
                    .map_or(0, |t| jobs.task_offset(&self.job, t));
                Some(offset.saturating_add(*index))
            }
            RankFacts::Fallback(r) => *r,
        }
    }

    /// [`Self::rank`] when the pod's framework states it (not guessed from the pod's name).
    pub fn stated_rank(&self, jobs: &Jobs) -> Option<u32> {
        match self.rank {
            RankFacts::Fallback(_) => None,
            _ => self.rank(jobs),
        }
    }
}

impl RankFacts {
    fn of(pod: &Pod) -> Self {
        if let Some(r) = rank_env(pod) {
            return RankFacts::Own(r);
        }
        if let Some(r) = meta_index(pod, DLROVER_RANK_INDEX) {
            return RankFacts::Own(r);
        }
        if let Some(i) = meta_index(pod, KUBEFLOW_REPLICA_INDEX) {
            let kind = meta_value(pod, KUBEFLOW_REPLICA_TYPE).map(str::to_ascii_lowercase);
            return RankFacts::Own(if kind.as_deref() == Some("worker") {
                i + 1
            } else {
                i
            });
        }
        if let Some(index) = meta_index(pod, VOLCANO_TASK_INDEX) {
            let task = meta_value(pod, VOLCANO_TASK_SPEC).map(str::to_string);
            return RankFacts::VolcanoTask { index, task };
        }
        if let Some(i) = meta_index(pod, STATEFULSET_POD_INDEX) {
            return RankFacts::Own(i);
        }
        let digits = pod.metadata.name.as_deref().and_then(|name| {
            let digits = name.rsplit(|c: char| !c.is_ascii_digit()).next()?;
            digits.parse().ok()
        });
        RankFacts::Fallback(digits)
    }
}

/// The literal `RANK` of the pod's first container that sets one.
fn rank_env(pod: &Pod) -> Option<u32> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == RANK_ENV)
        .and_then(|e| e.value.as_deref())
        .and_then(|v| v.trim().parse().ok())
}

/// The pod's rank within its job (see the module doc), if it has one.
pub fn rank(pod: &Pod, jobs: &Jobs) -> Option<u32> {
    UnitFacts::of(pod).rank(jobs)
}

/// True when the pod itself carries a gpu-group-size or atomic-gpu-group-size annotation (any
/// spelling), well-formed or not. [`Jobs::in_unit`] also looks at the pod's job.
pub fn has_group_annotations(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| {
        GROUP_SIZE
            .iter()
            .chain(&ATOMIC_GROUP_SIZE)
            .chain(&[SP_BLOCK])
            .any(|k| a.contains_key(*k))
    })
}

/// The pod's unit, or `None` when neither it nor its job has a group-size annotation. `gpus`
/// is the pod's GPU count (from [`crate::core::request::device_request`]).
pub fn unit_spec(pod: &Pod, gpus: u32, jobs: &Jobs) -> Result<Option<UnitSpec>, UnitError> {
    unit_spec_of(&UnitFacts::of(pod), gpus, jobs)
}

/// [`unit_spec`], from what was read of the pod.
pub fn unit_spec_of(
    pod: &UnitFacts,
    gpus: u32,
    jobs: &Jobs,
) -> Result<Option<UnitSpec>, UnitError> {
    let Some(sizes) = jobs.sizes(pod)? else {
        return Ok(None);
    };
    let Some((gkey, group_size)) = sizes.group else {
        return match sizes.atomic {
            Some((key, _)) => Err(UnitError::AtomicWithoutGroup {
                key: key.to_string(),
            }),
            None => Ok(None),
        };
    };
    let gpus = gpus.max(1);
    if group_size % gpus != 0 {
        return Err(UnitError::NotMultiple {
            key: gkey.to_string(),
            size: group_size,
            gpus,
        });
    }
    let (akey, atomic_size) = sizes.atomic.unwrap_or((gkey, group_size));
    if atomic_size % gpus != 0 {
        return Err(UnitError::NotMultiple {
            key: akey.to_string(),
            size: atomic_size,
            gpus,
        });
    }
    if group_size % atomic_size != 0 {
        return Err(UnitError::AtomicNotDivisor {
            atomic: atomic_size,
            group: group_size,
        });
    }
    if sizes.super_pod
        && let Some(total) = jobs.devices(&pod.job)
        && total % atomic_size != 0
    {
        return Err(UnitError::JobNotMultiple {
            job: pod.job.clone(),
            total,
            block: atomic_size,
        });
    }
    let rank = pod.rank(jobs).ok_or_else(|| UnitError::NoRank {
        pod: pod.pod.clone(),
    })?;
    let first_gpu = u64::from(rank) * u64::from(gpus);
    let unit = u32::try_from(first_gpu / u64::from(group_size)).unwrap_or(u32::MAX);
    let atomic_unit = u32::try_from(first_gpu / u64::from(atomic_size)).unwrap_or(u32::MAX);
    // The whole job is one block even while the view holds only some of its pods.
    let (unit, atomic_unit) = if sizes.whole_job {
        (0, 0)
    } else {
        (unit, atomic_unit)
    };
    Ok(Some(UnitSpec {
        group_size,
        atomic_size,
        rank,
        unit,
        atomic_unit,
        super_pod: sizes.super_pod,
        idlest: sizes.idlest,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn pod(name: &str, annotations: serde_json::Value, labels: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": annotations, "labels": labels}
        }))
        .unwrap()
    }

    #[test]
    fn units_from_ranks() {
        // 16 pods of 2 GPUs, units of 8 GPUs, atomic halves of 4.
        let p = pod(
            "job-worker-5",
            serde_json::json!({"metax-tech.com/gpu-group-size": "8",
                               "fumarole.dev/atomic-gpu-group-size": "4"}),
            serde_json::json!({}),
        );
        let g = unit_spec(&p, 2, &Jobs::default()).unwrap().unwrap();
        assert_eq!(
            g,
            UnitSpec {
                group_size: 8,
                atomic_size: 4,
                rank: 5,
                unit: 1,
                atomic_unit: 2,
                super_pod: false,
                idlest: false,
            }
        );
        let v = pod(
            "x",
            serde_json::json!({"fumarole.dev/gpu-group-size": "16", VOLCANO_TASK_INDEX: "9"}),
            serde_json::json!({}),
        );
        let g = unit_spec(&v, 4, &Jobs::default()).unwrap().unwrap();
        assert_eq!(
            (g.rank, g.unit, g.atomic_size, g.atomic_unit),
            (9, 2, 16, 2)
        );
        let k = pod(
            "pt",
            serde_json::json!({"fumarole.dev/gpu-group-size": "8"}),
            serde_json::json!({KUBEFLOW_REPLICA_INDEX: "0", KUBEFLOW_REPLICA_TYPE: "Worker"}),
        );
        assert_eq!(unit_spec(&k, 8, &Jobs::default()).unwrap().unwrap().rank, 1);
        assert_eq!(
            unit_spec(
                &pod("a", serde_json::json!({}), serde_json::json!({})),
                1,
                &Jobs::default()
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn bad_annotations_get_reasons() {
        let bad = |a: serde_json::Value, name: &str, gpus: u32| {
            unit_spec(&pod(name, a, serde_json::json!({})), gpus, &Jobs::default()).unwrap_err()
        };
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "eight"}),
                "p-0",
                1
            ),
            UnitError::NotInteger { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "0"}),
                "p-0",
                1
            ),
            UnitError::NotInteger { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "6"}),
                "p-0",
                4
            ),
            UnitError::NotMultiple { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "8", "fumarole.dev/gpu-group-size": "4"}),
                "p-0",
                1
            ),
            UnitError::Conflict { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "8", "metax-tech.com/atomic-gpu-group-size": "3"}),
                "p-0",
                1
            ),
            UnitError::AtomicNotDivisor { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"fumarole.dev/atomic-gpu-group-size": "4"}),
                "p-0",
                1
            ),
            UnitError::AtomicWithoutGroup { .. }
        ));
        let e = bad(
            serde_json::json!({"metax-tech.com/gpu-group-size": "8"}),
            "solo",
            1,
        );
        assert!(e.to_string().contains("has no rank"), "{e}");
    }

    /// A pod of a Volcano Job as vc-controller-manager creates it: `task-spec`, `task-index`,
    /// `job-name`, and (with the pytorch plugin) a `RANK` env.
    fn volcano_pod(
        job: &str,
        task: &str,
        index: u32,
        rank_env: Option<u32>,
        annotations: serde_json::Value,
    ) -> Pod {
        let mut a = serde_json::json!({
            VOLCANO_JOB_NAME: job, VOLCANO_TASK_SPEC: task, VOLCANO_TASK_INDEX: index.to_string()
        });
        if let (Some(a), Some(extra)) = (a.as_object_mut(), annotations.as_object()) {
            a.extend(extra.clone());
        }
        let env = rank_env.map_or_else(Vec::new, |r| {
            vec![serde_json::json!({"name": RANK_ENV, "value": r.to_string()})]
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{job}-{task}-{index}"), "namespace": "ml", "annotations": a},
            "spec": {"containers": [{"name": "c", "env": env}]}
        }))
        .unwrap()
    }

    /// The seed's `pytorch-demo`: master 1 + worker 7, 8 GPUs each, gpu-group-size 32 on the
    /// master's template only. Ranks 0-3 are unit 0, 4-7 unit 1, across both tasks, with the
    /// pytorch plugin's RANK env and without it (task order: master first).
    #[test]
    fn the_master_annotation_holds_for_the_whole_job() {
        for with_env in [true, false] {
            let group = serde_json::json!({"metax-tech.com/gpu-group-size": "32"});
            let mut pods = vec![volcano_pod(
                "pytorch-demo",
                "master",
                0,
                with_env.then_some(0),
                group,
            )];
            for i in 0..7 {
                pods.push(volcano_pod(
                    "pytorch-demo",
                    "worker",
                    i,
                    with_env.then_some(i + 1),
                    serde_json::json!({}),
                ));
            }
            let jobs = Jobs::of(&pods);
            let units: Vec<(u32, u32)> = pods
                .iter()
                .map(|p| {
                    let g = unit_spec(p, 8, &jobs).unwrap().unwrap();
                    assert_eq!(UnitKey::of(p, &g).job, "ml/pytorch-demo");
                    (g.rank, g.unit)
                })
                .collect();
            assert_eq!(
                units,
                [
                    (0, 0),
                    (1, 0),
                    (2, 0),
                    (3, 0),
                    (4, 1),
                    (5, 1),
                    (6, 1),
                    (7, 1)
                ],
                "RANK env: {with_env}"
            );
            assert!(pods.iter().all(|p| jobs.in_unit(p)));
        }
        // Without the job's other pods a worker has no group.
        let lone = volcano_pod("pytorch-demo", "worker", 3, Some(4), serde_json::json!({}));
        assert_eq!(unit_spec(&lone, 8, &Jobs::default()).unwrap(), None);
    }

    #[test]
    fn framework_ranks() {
        let jobs = Jobs::default();
        let with = |labels: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "x", "labels": labels}
            }))
            .unwrap()
        };
        let dlrover = with(serde_json::json!({DLROVER_JOB_NAME: "ej", DLROVER_RANK_INDEX: "5"}));
        assert_eq!(rank(&dlrover, &jobs), Some(5));
        assert_eq!(job_key(&dlrover), "default/ej");
        let sts = with(serde_json::json!({STATEFULSET_POD_INDEX: "3"}));
        assert_eq!(rank(&sts, &jobs), Some(3));
        let kubeflow_master = with(serde_json::json!({
            KUBEFLOW_JOB_NAME: "pt", KUBEFLOW_REPLICA_INDEX: "0", KUBEFLOW_REPLICA_TYPE: "master"}));
        assert_eq!(rank(&kubeflow_master, &jobs), Some(0));
    }

    #[test]
    fn pods_of_one_job_must_agree() {
        let a = volcano_pod(
            "j",
            "master",
            0,
            Some(0),
            serde_json::json!({"fumarole.dev/gpu-group-size": "16"}),
        );
        let b = volcano_pod(
            "j",
            "worker",
            0,
            Some(1),
            serde_json::json!({"fumarole.dev/gpu-group-size": "32"}),
        );
        let c = volcano_pod("j", "worker", 1, Some(2), serde_json::json!({}));
        let jobs = Jobs::of([&a, &b, &c]);
        // Annotated pods use their own values; the others cannot tell which holds.
        assert_eq!(unit_spec(&a, 8, &jobs).unwrap().unwrap().group_size, 16);
        let e = unit_spec(&c, 8, &jobs).unwrap_err();
        assert!(
            e.to_string()
                .contains("pods of job ml/j disagree on their group annotations"),
            "{e}"
        );
    }

    /// Huawei's `sp-block` alone is the unit and its atomic size (the block MUST share a
    /// super-node); beside gpu-group-size it is the atomic size; the job's master carries it
    /// for the whole job.
    #[test]
    fn sp_block_is_an_alias_of_the_group_sizes() {
        let g = unit_spec(
            &pod(
                "job-3",
                serde_json::json!({SP_BLOCK: "16"}),
                serde_json::json!({}),
            ),
            8,
            &Jobs::default(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            g,
            UnitSpec {
                group_size: 16,
                atomic_size: 16,
                rank: 3,
                unit: 1,
                atomic_unit: 1,
                super_pod: true,
                idlest: false,
            }
        );
        let both = pod(
            "job-5",
            serde_json::json!({"metax-tech.com/gpu-group-size": "32", SP_BLOCK: "16", SP_FIT: "idlest"}),
            serde_json::json!({}),
        );
        let g = unit_spec(&both, 8, &Jobs::default()).unwrap().unwrap();
        assert_eq!(
            (g.group_size, g.atomic_size, g.unit, g.atomic_unit, g.idlest),
            (32, 16, 1, 2, true)
        );
        // The same job written MetaX's way gets the same units.
        let metax = pod(
            "job-5",
            serde_json::json!({"metax-tech.com/gpu-group-size": "32", "metax-tech.com/atomic-gpu-group-size": "16"}),
            serde_json::json!({}),
        );
        let m = unit_spec(&metax, 8, &Jobs::default()).unwrap().unwrap();
        assert_eq!((m.unit, m.atomic_unit, m.super_pod), (1, 2, false));

        let mut pods = vec![volcano_pod(
            "sp",
            "master",
            0,
            Some(0),
            serde_json::json!({SP_BLOCK: "16"}),
        )];
        for i in 0..3 {
            pods.push(volcano_pod(
                "sp",
                "worker",
                i,
                Some(i + 1),
                serde_json::json!({}),
            ));
        }
        let jobs = Jobs::of(&pods);
        let units: Vec<(u32, bool)> = pods
            .iter()
            .map(|p| {
                let g = unit_spec(p, 8, &jobs).unwrap().unwrap();
                (g.unit, g.super_pod)
            })
            .collect();
        assert_eq!(units, [(0, true), (0, true), (1, true), (1, true)]);
        assert!(pods.iter().all(|p| jobs.in_unit(p)));
    }

    #[test]
    fn bad_sp_block_jobs_get_reasons() {
        let one = |a: serde_json::Value, npus: u32, jobs: &Jobs| {
            unit_spec(&pod("job-0", a, serde_json::json!({})), npus, jobs)
        };
        let none = Jobs::default();
        let e = one(serde_json::json!({SP_BLOCK: "12"}), 8, &none).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sp-block = 12 is not a multiple of the pod's 8 GPUs"
        );
        let e = one(serde_json::json!({SP_BLOCK: "-4"}), 8, &none).unwrap_err();
        assert!(matches!(e, UnitError::NotInteger { .. }), "{e}");
        let e = one(
            serde_json::json!({SP_BLOCK: "16", "metax-tech.com/atomic-gpu-group-size": "8"}),
            8,
            &none,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "metax-tech.com/atomic-gpu-group-size = \"8\" and sp-block = \"16\" disagree"
        );
        let e = one(
            serde_json::json!({SP_BLOCK: "16", SP_FIT: "best"}),
            8,
            &none,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("sp-fit: \"best\" is not understood"),
            "{e}"
        );
        // Three pods of 8 NPUs: 24 in all, not whole blocks of 16.
        let mut jobs = Jobs::default();
        for _ in 0..3 {
            jobs.add_devices("default/job", 8);
        }
        let e = one(serde_json::json!({SP_BLOCK: "16"}), 8, &jobs).unwrap_err();
        assert_eq!(
            e.to_string(),
            "job default/job requests 24 devices in all (pods seen so far), not a multiple of sp-block = 16"
        );
        jobs.add_devices("default/job", 8);
        assert!(one(serde_json::json!({SP_BLOCK: "16"}), 8, &jobs).is_ok());
        // gpu-group-size jobs are not held to whole units (MetaX's behaviour, unchanged).
        assert!(
            one(
                serde_json::json!({"metax-tech.com/gpu-group-size": "16"}),
                8,
                &Jobs::default()
            )
            .is_ok()
        );
    }
}
