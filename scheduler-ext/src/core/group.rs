//! gpu-podaffinity input: a pod's model-parallel unit, read from its annotations.
//!
//! Annotations (each also under the `fumarole.dev/` prefix; both spellings present must agree):
//! - `metax-tech.com/gpu-group-size`: GPUs of one model-parallel unit; a positive multiple of
//!   the pod's GPU count. Without it the pod takes no part in group placement.
//! - `metax-tech.com/atomic-gpu-group-size`: GPUs that must share one super-node; defaults to
//!   the group size; a multiple of the pod's GPU count that divides the group size.
//!
//! A pod's rank orders the pods of a job: Volcano's `volcano.sh/task-index` annotation, else
//! the PyTorchJob `training.kubeflow.org/replica-index` label or annotation (ranks of replica
//! type `worker` come after the one `master`), else the trailing number of the pod's name
//! (`job-worker-3` -> 3). Consecutive ranks form units: pod `rank` with `g` GPUs is in unit
//! `rank·g / group_size` and atomic sub-unit `rank·g / atomic_size`.
//!
//! Pods of one job share a job key ([`job_key`]): namespace plus Volcano's `volcano.sh/job-name`
//! and task spec, else the Kubeflow `training.kubeflow.org/job-name`, else the controlling
//! owner, else the pod name without its trailing number. A unit is identified by
//! [`UnitKey`]; a pod's place in its unit is a [`PodGroup`]; [`crate::core::placement`] places units
//! over super-nodes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

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
/// Volcano's task index annotation.
pub const VOLCANO_TASK_INDEX: &str = "volcano.sh/task-index";
/// Kubeflow training-operator replica index and type.
pub const KUBEFLOW_REPLICA_INDEX: &str = "training.kubeflow.org/replica-index";
pub const KUBEFLOW_REPLICA_TYPE: &str = "training.kubeflow.org/replica-type";

/// Volcano's job name and task spec annotations (also labels on Volcano's pods).
pub const VOLCANO_JOB_NAME: &str = "volcano.sh/job-name";
pub const VOLCANO_TASK_SPEC: &str = "volcano.sh/task-spec";
/// Kubeflow training-operator job name label.
pub const KUBEFLOW_JOB_NAME: &str = "training.kubeflow.org/job-name";

/// Why a pod's group annotations are unusable (the pod is unschedulable with this reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
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
        "pod {pod} has no rank: no {VOLCANO_TASK_INDEX}, no {KUBEFLOW_REPLICA_INDEX} and no number at the end of its name"
    )]
    NoRank { pod: String },
}

/// A pod's unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    pub group_size: u32,
    pub atomic_size: u32,
    pub rank: u32,
    /// `rank·gpus / group_size`.
    pub unit: u32,
    /// `rank·gpus / atomic_size`.
    pub atomic_unit: u32,
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
    pub fn of(pod: &Pod, spec: &GroupSpec) -> Self {
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
pub struct PodGroup {
    pub key: UnitKey,
    pub spec: GroupSpec,
    /// GPUs of this pod.
    pub gpus: u32,
}

impl PodGroup {
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
    let get = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .or_else(|| meta.labels.as_ref().and_then(|l| l.get(key)))
    };
    if let Some(job) = get(VOLCANO_JOB_NAME) {
        return match get(VOLCANO_TASK_SPEC) {
            Some(task) => format!("{ns}/{job}/{task}"),
            None => format!("{ns}/{job}"),
        };
    }
    if let Some(job) = get(KUBEFLOW_JOB_NAME) {
        return format!("{ns}/{job}");
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

/// The value of the first of `keys` present, checked against the other and parsed.
fn annotation(
    annotations: &BTreeMap<String, String>,
    keys: [&'static str; 2],
) -> Result<Option<(&'static str, u32)>, GroupError> {
    let mut found: Option<(&'static str, &str)> = None;
    for key in keys {
        if let Some(v) = annotations.get(key) {
            if let Some((k0, v0)) = found
                && v0.trim() != v.trim()
            {
                return Err(GroupError::Conflict {
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
        _ => Err(GroupError::NotInteger {
            key: key.to_string(),
            value: value.to_string(),
        }),
    }
}

/// The pod's rank (see the module doc), if it has one.
pub fn rank(pod: &Pod) -> Option<u32> {
    let meta = &pod.metadata;
    let get = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .or_else(|| meta.labels.as_ref().and_then(|l| l.get(key)))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    if let Some(i) = get(VOLCANO_TASK_INDEX) {
        return Some(i);
    }
    if let Some(i) = get(KUBEFLOW_REPLICA_INDEX) {
        let kind = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(KUBEFLOW_REPLICA_TYPE))
            .map(|t| t.to_ascii_lowercase());
        return Some(if kind.as_deref() == Some("worker") {
            i + 1
        } else {
            i
        });
    }
    let name = meta.name.as_deref()?;
    let digits = name.rsplit(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// True when the pod carries a gpu-group-size or atomic-gpu-group-size annotation (any
/// spelling), well-formed or not.
pub fn has_group_annotations(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| {
        GROUP_SIZE
            .iter()
            .chain(&ATOMIC_GROUP_SIZE)
            .any(|k| a.contains_key(*k))
    })
}

/// The pod's unit, or `None` when it has no group-size annotation. `gpus` is the pod's GPU
/// count (from [`crate::core::request::device_request`]).
pub fn group_spec(pod: &Pod, gpus: u32) -> Result<Option<GroupSpec>, GroupError> {
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let group = annotation(annotations, GROUP_SIZE)?;
    let atomic = annotation(annotations, ATOMIC_GROUP_SIZE)?;
    let Some((gkey, group_size)) = group else {
        return match atomic {
            Some((key, _)) => Err(GroupError::AtomicWithoutGroup {
                key: key.to_string(),
            }),
            None => Ok(None),
        };
    };
    let gpus = gpus.max(1);
    if group_size % gpus != 0 {
        return Err(GroupError::NotMultiple {
            key: gkey.to_string(),
            size: group_size,
            gpus,
        });
    }
    let (akey, atomic_size) = atomic.unwrap_or((gkey, group_size));
    if atomic_size % gpus != 0 {
        return Err(GroupError::NotMultiple {
            key: akey.to_string(),
            size: atomic_size,
            gpus,
        });
    }
    if group_size % atomic_size != 0 {
        return Err(GroupError::AtomicNotDivisor {
            atomic: atomic_size,
            group: group_size,
        });
    }
    let rank = rank(pod).ok_or_else(|| GroupError::NoRank {
        pod: fumarole_topology::pod::key(pod),
    })?;
    let first_gpu = u64::from(rank) * u64::from(gpus);
    let unit = u32::try_from(first_gpu / u64::from(group_size)).unwrap_or(u32::MAX);
    let atomic_unit = u32::try_from(first_gpu / u64::from(atomic_size)).unwrap_or(u32::MAX);
    Ok(Some(GroupSpec {
        group_size,
        atomic_size,
        rank,
        unit,
        atomic_unit,
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
        let g = group_spec(&p, 2).unwrap().unwrap();
        assert_eq!(
            g,
            GroupSpec {
                group_size: 8,
                atomic_size: 4,
                rank: 5,
                unit: 1,
                atomic_unit: 2
            }
        );
        let v = pod(
            "x",
            serde_json::json!({"fumarole.dev/gpu-group-size": "16", VOLCANO_TASK_INDEX: "9"}),
            serde_json::json!({}),
        );
        let g = group_spec(&v, 4).unwrap().unwrap();
        assert_eq!(
            (g.rank, g.unit, g.atomic_size, g.atomic_unit),
            (9, 2, 16, 2)
        );
        let k = pod(
            "pt",
            serde_json::json!({"fumarole.dev/gpu-group-size": "8"}),
            serde_json::json!({KUBEFLOW_REPLICA_INDEX: "0", KUBEFLOW_REPLICA_TYPE: "Worker"}),
        );
        assert_eq!(group_spec(&k, 8).unwrap().unwrap().rank, 1);
        assert_eq!(
            group_spec(&pod("a", serde_json::json!({}), serde_json::json!({})), 1).unwrap(),
            None
        );
    }

    #[test]
    fn bad_annotations_get_reasons() {
        let bad = |a: serde_json::Value, name: &str, gpus: u32| {
            group_spec(&pod(name, a, serde_json::json!({})), gpus).unwrap_err()
        };
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "eight"}),
                "p-0",
                1
            ),
            GroupError::NotInteger { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "0"}),
                "p-0",
                1
            ),
            GroupError::NotInteger { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "6"}),
                "p-0",
                4
            ),
            GroupError::NotMultiple { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "8", "fumarole.dev/gpu-group-size": "4"}),
                "p-0",
                1
            ),
            GroupError::Conflict { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"metax-tech.com/gpu-group-size": "8", "metax-tech.com/atomic-gpu-group-size": "3"}),
                "p-0",
                1
            ),
            GroupError::AtomicNotDivisor { .. }
        ));
        assert!(matches!(
            bad(
                serde_json::json!({"fumarole.dev/atomic-gpu-group-size": "4"}),
                "p-0",
                1
            ),
            GroupError::AtomicWithoutGroup { .. }
        ));
        let e = bad(
            serde_json::json!({"metax-tech.com/gpu-group-size": "8"}),
            "solo",
            1,
        );
        assert!(e.to_string().contains("has no rank"), "{e}");
    }
}
