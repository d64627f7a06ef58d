//! What the co-location rules know about a pod, read from its API object in this one place:
//! [`PodFacts`] for eviction and oversubscription (its Kubernetes [`QosClass`], whether it is
//! offline, critical, being deleted or finished, and its effective requests), [`is_offline`]
//! (the only place that decides whether a pod is offline) and [`pod_cpu_request_millis`] (what
//! the kubelet sizes the pod cgroup's CPU weight by).
//!
//! Requests are the scheduler's effective ones (init containers, sidecars, overhead) through
//! [`fumarole_topology::pod`], parsed exactly with [`fumarole_topology::quantity`].

use std::fmt;
use std::str::FromStr;

use fumarole_topology::{pod, quantity};
use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::level::QosLevel;

pub use fumarole_topology::colocation::{BATCH_CPU, BATCH_MEMORY};
/// Priority from which a pod is critical (`scheduling.SystemCriticalPriority`).
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
const CRITICAL_CLASSES: &[&str] = &["system-node-critical", "system-cluster-critical"];

/// A pod by name and uid; the uid tells a recreated pod of the same name apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Kubernetes QoS class (`status.qosClass`): it picks the pod's kubepods sub-tree, and under a
/// static CPU manager the Guaranteed pods' CPUs are exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Directly under `kubepods`.
    Guaranteed,
    Burstable,
    BestEffort,
}

/// A `status.qosClass` that is none of the three; the pod is skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod QoS class {value:?}: expected Guaranteed, Burstable or BestEffort")]
pub struct QosClassError {
    pub value: String,
}

impl FromStr for QosClass {
    type Err = QosClassError;
    fn from_str(s: &str) -> Result<Self, QosClassError> {
        match s {
            "Guaranteed" => Ok(QosClass::Guaranteed),
            "Burstable" => Ok(QosClass::Burstable),
            "BestEffort" => Ok(QosClass::BestEffort),
            _ => Err(QosClassError {
                value: s.to_string(),
            }),
        }
    }
}

/// Effective pod requests, as the scheduler counts them (init containers, sidecars, overhead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// `kubernetes.io/batch-cpu`, millicores.
    pub batch_cpu_millis: u64,
    /// `kubernetes.io/batch-memory`, bytes.
    pub batch_memory_bytes: u64,
}

/// The two resources that requests, usage and pressure are counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Cpu,
    Memory,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        })
    }
}

/// What eviction and oversubscription need to know about a pod; [`PodFacts::from_pod`] reads it
/// from the API object, tests build it directly.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFacts {
    pub pod: PodRef,
    pub qos_class: QosClass,
    /// [`is_offline`]: may use batch resources and be evicted.
    pub offline: bool,
    /// Never evicted: a critical priority class or priority, or a static / mirror pod.
    pub critical: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Phase `Succeeded` or `Failed`: holds no resources.
    pub finished: bool,
    pub requests: Requests,
}

/// Why a pod could not be read; the caller logs it and leaves the pod out of this round (which
/// never evicts it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// `metadata.name`, `namespace` or `uid` is missing.
    #[error("pod without metadata.{0}")]
    Missing(&'static str),
    /// A request that is not a Kubernetes quantity.
    #[error("pod {pod}: {field} is {value:?}, not a Kubernetes quantity")]
    Quantity {
        pod: String,
        field: String,
        value: String,
    },
}

impl PodFacts {
    /// Reads a pod from the API server's object.
    pub fn from_pod(pod: &Pod) -> Result<Self, PodError> {
        let meta = &pod.metadata;
        let name = meta.name.clone().ok_or(PodError::Missing("name"))?;
        let namespace = meta
            .namespace
            .clone()
            .ok_or(PodError::Missing("namespace"))?;
        let uid = meta.uid.clone().ok_or(PodError::Missing("uid"))?;
        let pod_ref = PodRef {
            namespace,
            name,
            uid,
        };
        let annotations = meta.annotations.as_ref();
        let annotation = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
        let spec = pod.spec.as_ref();
        let priority = spec.and_then(|s| s.priority);
        let class = spec.and_then(|s| s.priority_class_name.as_deref());
        let static_pod = annotation(MIRROR_ANNOTATION).is_some()
            || annotation(SOURCE_ANNOTATION).is_some_and(|s| s != "api");
        let critical = static_pod
            || class.is_some_and(|c| CRITICAL_CLASSES.contains(&c))
            || priority.is_some_and(|p| p >= CRITICAL_PRIORITY);
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        let qos_class = status
            .and_then(|s| s.qos_class.as_deref())
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| spec.map_or(QosClass::BestEffort, computed_qos_class));
        let requests = match spec {
            Some(spec) => {
                let who = pod_ref.to_string();
                Requests {
                    cpu_millis: pod_request(spec, "cpu", quantity::cpu_millis, &who)?,
                    memory_bytes: pod_request(spec, "memory", quantity::units, &who)?,
                    batch_cpu_millis: pod_request(spec, BATCH_CPU, quantity::units, &who)?,
                    batch_memory_bytes: pod_request(spec, BATCH_MEMORY, quantity::units, &who)?,
                }
            }
            None => Requests::default(),
        };
        Ok(Self {
            pod: pod_ref,
            qos_class,
            offline: is_offline(pod),
            critical,
            deleting: meta.deletion_timestamp.is_some(),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
            requests,
        })
    }

    /// The request that counts for evicting under pressure of `resource`: the native request
    /// plus the batch one, since offline pods usually ask for batch resources instead.
    pub fn request_of(&self, resource: Resource) -> u64 {
        match resource {
            Resource::Cpu => self.requests.cpu_millis + self.requests.batch_cpu_millis,
            Resource::Memory => self.requests.memory_bytes + self.requests.batch_memory_bytes,
        }
    }

    /// Whether eviction may ever pick this pod.
    pub fn evictable(&self) -> bool {
        self.offline && !self.critical && !self.deleting && !self.finished
    }
}

/// `status.qosClass` is set by the API server; this is the fallback for objects without it.
fn computed_qos_class(spec: &PodSpec) -> QosClass {
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let (mut any, mut guaranteed) = (false, true);
    for c in containers {
        let res = c.resources.as_ref();
        let requests = res.and_then(|r| r.requests.as_ref());
        let limits = res.and_then(|r| r.limits.as_ref());
        for name in ["cpu", "memory"] {
            let request = requests.and_then(|r| r.get(name));
            let limit = limits.and_then(|l| l.get(name));
            any |= request.is_some() || limit.is_some();
            guaranteed &= limit.is_some() && (request.is_none() || request == limit);
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

/// The pod's effective CPU request in millicores (as [`PodFacts`] computes it): what the kubelet
/// sizes the pod cgroup's `cpu.shares` by. `who` names the pod in errors.
pub fn pod_cpu_request_millis(spec: &PodSpec, who: &str) -> Result<u64, PodError> {
    pod_request(spec, "cpu", quantity::cpu_millis, who)
}

/// The pod's effective request of `name` ([`fumarole_topology::pod::effective_request`]).
fn pod_request(spec: &PodSpec, name: &str, parse: pod::Parse, who: &str) -> Result<u64, PodError> {
    pod::effective_request(spec, name, parse).map_err(|e| PodError::Quantity {
        pod: who.into(),
        field: match e.container {
            Some(c) => format!("container {c} {}", e.field),
            None => e.field,
        },
        value: e.value,
    })
}

/// Whether the pod is offline: its `volcano.sh/qos-level` annotation is an offline level
/// ([`QosLevel::is_offline`]: `BE`). Offline pods run at the lowest CPU priority, may use batch
/// resources and are the only ones ever evicted; a pod whose annotation is not a level is not
/// offline. Every part of co-location asks this function.
pub fn is_offline(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .map_or(Ok(QosLevel::Unset), QosLevel::from_annotations)
        .is_ok_and(QosLevel::is_offline)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn api_pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn facts_from_api_pods() {
        let p = api_pod(serde_json::json!({
            "metadata": {"name": "job-0", "namespace": "batch", "uid": "u1",
                         "annotations": {"volcano.sh/qos-level": "BE"}},
            "spec": {
                "initContainers": [
                    {"name": "init", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
                    {"name": "sidecar", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "256Mi",
                        "kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "2Gi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "1"}}}
                ],
                "overhead": {"cpu": "10m"}
            },
            "status": {"phase": "Running", "qosClass": "Burstable"}
        }));
        let f = PodFacts::from_pod(&p).unwrap();
        assert_eq!(f.pod.to_string(), "batch/job-0");
        assert!(f.offline && !f.critical && !f.deleting && !f.finished && f.evictable());
        assert_eq!(f.qos_class, QosClass::Burstable);
        assert_eq!(
            f.requests,
            Requests {
                // max(init 3000, app 1500 + sidecar 100) + overhead 10
                cpu_millis: 3010,
                // max(init 1 GiB, app 256 MiB + sidecar 64 MiB)
                memory_bytes: 1 << 30,
                batch_cpu_millis: 1500,
                batch_memory_bytes: 2 << 30,
            }
        );
        assert_eq!(f.request_of(Resource::Cpu), 4510);
    }

    #[test]
    fn critical_deleting_and_qos_from_api_pods() {
        let base = |extra_meta: serde_json::Value, extra_spec: serde_json::Value| {
            let mut meta = serde_json::json!({"name": "p", "namespace": "n", "uid": "u",
                "annotations": {"volcano.sh/qos-level": "BE"}});
            let mut spec = serde_json::json!({"containers": [{"name": "c",
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                              "requests": {"cpu": "1", "memory": "1Gi"}}}]});
            meta.as_object_mut()
                .unwrap()
                .extend(extra_meta.as_object().unwrap().clone());
            spec.as_object_mut()
                .unwrap()
                .extend(extra_spec.as_object().unwrap().clone());
            PodFacts::from_pod(&api_pod(
                serde_json::json!({"metadata": meta, "spec": spec}),
            ))
            .unwrap()
        };
        let plain = base(serde_json::json!({}), serde_json::json!({}));
        assert!(plain.evictable());
        // No status: the class is computed.
        assert_eq!(plain.qos_class, QosClass::Guaranteed);
        let table = [
            (
                serde_json::json!({}),
                serde_json::json!({"priorityClassName": "system-node-critical"}),
            ),
            (
                serde_json::json!({}),
                serde_json::json!({"priorityClassName": "system-cluster-critical"}),
            ),
            (
                serde_json::json!({}),
                serde_json::json!({"priority": 2_000_000_000}),
            ),
            (
                serde_json::json!({"annotations": {"volcano.sh/qos-level": "BE",
                    "kubernetes.io/config.mirror": "abc"}}),
                serde_json::json!({}),
            ),
            (
                serde_json::json!({"annotations": {"volcano.sh/qos-level": "BE",
                    "kubernetes.io/config.source": "file"}}),
                serde_json::json!({}),
            ),
        ];
        for (meta, spec) in table {
            let f = base(meta.clone(), spec.clone());
            assert!(f.critical && !f.evictable(), "{meta} {spec}");
        }
        let deleting = base(
            serde_json::json!({"deletionTimestamp": "2026-01-01T00:00:00Z"}),
            serde_json::json!({}),
        );
        assert!(deleting.deleting && !deleting.evictable());
        let api_source = base(
            serde_json::json!({"annotations": {"volcano.sh/qos-level": "BE",
                "kubernetes.io/config.source": "api"}}),
            serde_json::json!({"priority": 1000}),
        );
        assert!(api_source.evictable());
        for level in ["LC", "LS", "HLS", "be", ""] {
            let f = base(
                serde_json::json!({"annotations": {"volcano.sh/qos-level": level}}),
                serde_json::json!({}),
            );
            assert!(!f.offline && !f.evictable(), "{level}");
        }
    }

    #[test]
    fn computed_qos_classes() {
        let class = |containers: serde_json::Value| {
            PodFacts::from_pod(&api_pod(serde_json::json!({
                "metadata": {"name": "p", "namespace": "n", "uid": "u"},
                "spec": {"containers": containers}
            })))
            .unwrap()
            .qos_class
        };
        assert_eq!(
            class(serde_json::json!([{"name": "c"}])),
            QosClass::BestEffort
        );
        assert_eq!(
            class(serde_json::json!([{"name": "c", "resources": {"requests": {"cpu": "1"}}}])),
            QosClass::Burstable
        );
        assert_eq!(
            class(serde_json::json!([{"name": "c", "resources":
                {"limits": {"cpu": "1", "memory": "1Gi"}}}])),
            QosClass::Guaranteed
        );
        assert_eq!(
            class(serde_json::json!([{"name": "c", "resources":
                {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "1"}}}])),
            QosClass::Burstable
        );
    }

    #[test]
    fn bad_pods_are_errors() {
        let no_uid = api_pod(serde_json::json!({"metadata": {"name": "p", "namespace": "n"}}));
        assert_eq!(
            PodFacts::from_pod(&no_uid).unwrap_err().to_string(),
            "pod without metadata.uid"
        );
        let bad = api_pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "lots"}}}]}
        }));
        assert_eq!(
            PodFacts::from_pod(&bad).unwrap_err().to_string(),
            "pod n/p: container c requests.memory is \"lots\", not a Kubernetes quantity"
        );
    }
}
