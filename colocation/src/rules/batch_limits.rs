//! Batch resources as cgroup limits: a BestEffort pod that asks for `kubernetes.io/batch-cpu`
//! (millicores, a plain number) or `kubernetes.io/batch-memory` (bytes) gets those amounts as its
//! CPU weight, CFS quota and memory limit, in its containers' cgroups and its pod cgroup, as
//! volcano-agent's resources handler does. Without this a pod scheduled on batch resources would
//! run unlimited, since the kubelet knows nothing of them.
//!
//! Start at [`from_spec`] (the containers' amounts) and [`desired`] (the writes). Per container,
//! as volcano-agent (cgroup v1 file first, v2 second):
//!
//! - `cpu.shares` / `cpu.weight` from the batch-cpu request (its limit without one):
//!   [`kubelet_cpu_shares`] of the millicores, on v2 through [`kubelet_cpu_weight`];
//! - `cpu.cfs_quota_us` / `cpu.max` from the batch-cpu limit: millicores x 100 µs (a 100 ms
//!   period), at least 1 ms, at most the kernel's largest quota;
//! - `memory.limit_in_bytes` / `memory.max` from the batch-memory limit, rounded down to 64 KiB.
//!
//! The pod cgroup gets the sum of the containers' shares (2 when none asked), the sum of their
//! quotas and of their memory limits, each sum only when every container declares that limit
//! (one unlimited container leaves the pod unlimited). Zero counts as absent. Only regular
//! containers count (volcano-agent leaves init containers out too).
//!
//! Differences from volcano-agent, on purpose:
//! - only pods whose Kubernetes QoS class is BestEffort: a pod with native CPU or memory
//!   requests keeps the kubelet's values, which a batch amount must not replace;
//! - every QoS level (volcano-agent skips `LC` / `HLS` pods): the limits are a function of the
//!   immutable spec, so nothing is ever left to undo when an annotation changes;
//! - on v2 the weight follows the kubelet's shares-to-weight mapping, as every other pod on the
//!   node does (volcano-agent uses millicores / 10), so a batch pod weighs what a pod
//!   requesting the same CPU weighs;
//! - values are held to what the kernel stores (shares clamped, quotas in range, memory page
//!   aligned), so a re-apply finds them in place and writes nothing.

use fumarole_topology::quantity::{self, QuantityError};
use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::kernel::Version;
use super::level::{kubelet_cpu_shares, kubelet_cpu_weight};
use super::pod::{BATCH_CPU, BATCH_MEMORY, QosClass};

/// The CFS period the quota is computed for: the kubelet's default, 100 ms, which it gives every
/// pod and container cgroup (volcano-agent assumes it too).
pub const PERIOD_US: u64 = 100_000;
/// The kernel refuses quotas under 1 ms (`EINVAL`).
pub const MIN_QUOTA_US: u64 = 1_000;
/// The kernel's largest quota (`max_cfs_runtime`, 2^44 - 1 µs); above it `EINVAL`.
pub const MAX_QUOTA_US: u64 = (1 << 44) - 1;
/// Memory limits are rounded down to this, a multiple of every page size (4K, 16K, 64K): the
/// kernel keeps limits in pages, and an unaligned value would read back different every sync.
pub const MEMORY_ALIGN: u64 = 64 * 1024;
/// The largest memory limit written: `i64::MAX` rounded down to [`MEMORY_ALIGN`]. The kernel
/// parses larger values with wrap-around (`memparse`), so they would come back as a random
/// smaller limit.
pub const MAX_MEMORY_BYTES: u64 = 0x7fff_ffff_ffff_0000;

/// One `(file, value)` write.
pub type Write = (&'static str, String);

/// A regular container's batch amounts; 0 is absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerBatch {
    pub name: String,
    /// `requests[batch-cpu]`, else `limits[batch-cpu]` (the API server defaults the request to
    /// the limit), millicores.
    pub cpu_request_millis: u64,
    /// `limits[batch-cpu]`, millicores.
    pub cpu_limit_millis: u64,
    /// `limits[batch-memory]`, bytes.
    pub memory_limit_bytes: u64,
}

impl ContainerBatch {
    fn asks(&self) -> bool {
        self.cpu_request_millis > 0 || self.cpu_limit_millis > 0 || self.memory_limit_bytes > 0
    }
}

/// A batch amount that is not a Kubernetes quantity; the pod gets no batch limits (logged,
/// retried every round), never a guess.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container}: {field} = {value:?}: {source}")]
pub struct BatchError {
    pub container: String,
    /// `requests.kubernetes.io/batch-cpu`, `limits.kubernetes.io/batch-memory`, ...
    pub field: String,
    pub value: String,
    #[source]
    pub source: QuantityError,
}

/// The batch amounts of the pod's regular containers, in spec order.
pub fn from_spec(spec: &PodSpec) -> Result<Vec<ContainerBatch>, BatchError> {
    spec.containers.iter().map(container_batch).collect()
}

fn container_batch(c: &Container) -> Result<ContainerBatch, BatchError> {
    let res = c.resources.as_ref();
    let amount = |kind: &str, resource: &str| -> Result<u64, BatchError> {
        let map = match kind {
            "requests" => res.and_then(|r| r.requests.as_ref()),
            _ => res.and_then(|r| r.limits.as_ref()),
        };
        let Some(q) = map.and_then(|m| m.get(resource)) else {
            return Ok(0);
        };
        // Batch amounts are plain numbers in their unit, rounded up as the API's Value() does.
        quantity::units(&q.0).map_err(|source| BatchError {
            container: c.name.clone(),
            field: format!("{kind}.{resource}"),
            value: q.0.clone(),
            source,
        })
    };
    let cpu_limit_millis = amount("limits", BATCH_CPU)?;
    let cpu_request_millis = match amount("requests", BATCH_CPU)? {
        0 => cpu_limit_millis,
        request => request,
    };
    Ok(ContainerBatch {
        name: c.name.clone(),
        cpu_request_millis,
        cpu_limit_millis,
        memory_limit_bytes: amount("limits", BATCH_MEMORY)?,
    })
}

/// The writes for one pod: the pod cgroup's, then each container's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The pod cgroup's CPU weight. Kept apart because a `BE` QoS level owns the pod's weight
    /// where it is in force (an idle group refuses weight writes; see [`super::level`]).
    pub pod_weight: Write,
    /// The pod cgroup's quota and memory limit, where every container declares them.
    pub pod_limits: Vec<Write>,
    /// Per container (by name, spec order): its weight, quota and memory limit, those it asks for.
    pub containers: Vec<(String, Vec<Write>)>,
}

impl Plan {
    /// The file the pod's CPU weight goes to on `version`.
    pub fn weight_file(version: Version) -> &'static str {
        match version {
            Version::V1 => "cpu.shares",
            Version::V2 => "cpu.weight",
        }
    }
}

/// The writes for a pod of class `qos` with these containers on a `version` kernel; `None` when
/// the pod is not BestEffort or asks for no batch resource (the kubelet's values stay).
pub fn desired(qos: QosClass, containers: &[ContainerBatch], version: Version) -> Option<Plan> {
    if qos != QosClass::BestEffort || !containers.iter().any(ContainerBatch::asks) {
        return None;
    }
    let mut shares_sum = 0u64;
    let mut quota_sum = Some(0u64);
    let mut memory_sum = Some(0u64);
    let mut planned = Vec::with_capacity(containers.len());
    for c in containers {
        let mut writes = Vec::new();
        if c.cpu_request_millis > 0 {
            let shares = kubelet_cpu_shares(c.cpu_request_millis);
            shares_sum = shares_sum.saturating_add(shares);
            writes.push(weight(version, shares));
        }
        if c.cpu_limit_millis > 0 {
            let quota = quota_us(c.cpu_limit_millis);
            quota_sum = quota_sum.map(|sum| sum.saturating_add(quota));
            writes.push(quota_write(version, quota));
        } else {
            quota_sum = None;
        }
        if c.memory_limit_bytes > 0 {
            let bytes = memory_limit(c.memory_limit_bytes);
            memory_sum = memory_sum.map(|sum| sum.saturating_add(bytes));
            writes.push(memory_write(version, bytes));
        } else {
            memory_sum = None;
        }
        planned.push((c.name.clone(), writes));
    }
    let mut pod_limits = Vec::new();
    if let Some(sum) = quota_sum {
        pod_limits.push(quota_write(version, sum.min(MAX_QUOTA_US)));
    }
    if let Some(sum) = memory_sum {
        pod_limits.push(memory_write(version, memory_limit(sum)));
    }
    Some(Plan {
        // No container asked for CPU: the minimal weight, as the kubelet gives BestEffort pods.
        pod_weight: weight(version, shares_sum.max(kubelet_cpu_shares(0))),
        pod_limits,
        containers: planned,
    })
}

/// `shares` clamped as the kernel stores them, or its v2 weight.
fn weight(version: Version, shares: u64) -> Write {
    let shares = kubelet_cpu_shares(0).max(shares.min(kubelet_cpu_shares(u64::MAX)));
    match version {
        Version::V1 => ("cpu.shares", shares.to_string()),
        Version::V2 => ("cpu.weight", kubelet_cpu_weight(shares).to_string()),
    }
}

/// The quota for `millis` in a [`PERIOD_US`] period (volcano-agent's `milliCPUToQuota`), held to
/// the range the kernel takes.
pub fn quota_us(millis: u64) -> u64 {
    (millis.saturating_mul(PERIOD_US) / 1000).clamp(MIN_QUOTA_US, MAX_QUOTA_US)
}

/// `bytes` as the kernel stores it: page aligned, below the wrap-around.
pub fn memory_limit(bytes: u64) -> u64 {
    (bytes.min(MAX_MEMORY_BYTES) / MEMORY_ALIGN * MEMORY_ALIGN).max(MEMORY_ALIGN)
}

fn quota_write(version: Version, quota: u64) -> Write {
    match version {
        Version::V1 => ("cpu.cfs_quota_us", quota.to_string()),
        Version::V2 => ("cpu.max", format!("{quota} {PERIOD_US}")),
    }
}

fn memory_write(version: Version, bytes: u64) -> Write {
    match version {
        Version::V1 => ("memory.limit_in_bytes", bytes.to_string()),
        Version::V2 => ("memory.max", bytes.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(containers: serde_json::Value) -> PodSpec {
        serde_json::from_value(serde_json::json!({ "containers": containers })).unwrap()
    }

    fn batch(name: &str, request: u64, limit: u64, memory: u64) -> ContainerBatch {
        ContainerBatch {
            name: name.into(),
            cpu_request_millis: request,
            cpu_limit_millis: limit,
            memory_limit_bytes: memory,
        }
    }

    fn writes(pairs: &[(&'static str, &str)]) -> Vec<Write> {
        pairs.iter().map(|(f, v)| (*f, v.to_string())).collect()
    }

    #[test]
    fn amounts_from_the_spec() {
        let s = spec(serde_json::json!([
            {"name": "a", "resources": {
                "requests": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "1Gi"},
                "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "2Gi"}}},
            // Only limits (no API defaulting in this object): the request is the limit.
            {"name": "b", "resources": {"limits": {"kubernetes.io/batch-cpu": "500"}}},
            // Fractions round up, as the API's Value() does.
            {"name": "c", "resources": {"requests": {"kubernetes.io/batch-cpu": "0.5"}}},
            {"name": "d"},
        ]));
        assert_eq!(
            from_spec(&s).unwrap(),
            vec![
                batch("a", 1500, 2000, 2 << 30),
                batch("b", 500, 500, 0),
                batch("c", 1, 0, 0),
                batch("d", 0, 0, 0),
            ]
        );
    }

    #[test]
    fn malformed_amounts_are_errors_naming_the_field() {
        for (resources, field, value) in [
            (
                serde_json::json!({"requests": {"kubernetes.io/batch-cpu": "lots"}}),
                "requests.kubernetes.io/batch-cpu",
                "lots",
            ),
            (
                serde_json::json!({"limits": {"kubernetes.io/batch-memory": "-1Gi"}}),
                "limits.kubernetes.io/batch-memory",
                "-1Gi",
            ),
            (
                serde_json::json!({"limits": {"kubernetes.io/batch-cpu": "1e30"}}),
                "limits.kubernetes.io/batch-cpu",
                "1e30",
            ),
        ] {
            let s = spec(serde_json::json!([{"name": "main", "resources": resources}]));
            let e = from_spec(&s).unwrap_err();
            assert_eq!((e.field.as_str(), e.value.as_str()), (field, value));
            let text = e.to_string();
            assert!(
                text.contains("container main") && text.contains(field),
                "{text}"
            );
        }
    }

    #[test]
    fn v1_containers_and_pod_sums() {
        let plan = desired(
            QosClass::BestEffort,
            &[
                batch("a", 1500, 2000, 1 << 30),
                batch("b", 500, 1000, 1 << 29),
            ],
            Version::V1,
        )
        .unwrap();
        assert_eq!(
            plan,
            Plan {
                pod_weight: ("cpu.shares", "2048".into()),
                pod_limits: writes(&[
                    ("cpu.cfs_quota_us", "300000"),
                    ("memory.limit_in_bytes", "1610612736"),
                ]),
                containers: vec![
                    (
                        "a".into(),
                        writes(&[
                            ("cpu.shares", "1536"),
                            ("cpu.cfs_quota_us", "200000"),
                            ("memory.limit_in_bytes", "1073741824"),
                        ])
                    ),
                    (
                        "b".into(),
                        writes(&[
                            ("cpu.shares", "512"),
                            ("cpu.cfs_quota_us", "100000"),
                            ("memory.limit_in_bytes", "536870912"),
                        ])
                    ),
                ],
            }
        );
    }

    #[test]
    fn v2_files_and_formats() {
        let plan = desired(
            QosClass::BestEffort,
            &[batch("a", 1000, 1500, 1 << 30)],
            Version::V2,
        )
        .unwrap();
        assert_eq!(plan.pod_weight, ("cpu.weight", "39".into()));
        assert_eq!(
            plan.pod_limits,
            writes(&[("cpu.max", "150000 100000"), ("memory.max", "1073741824")])
        );
        assert_eq!(
            plan.containers[0].1,
            writes(&[
                ("cpu.weight", "39"),
                ("cpu.max", "150000 100000"),
                ("memory.max", "1073741824")
            ])
        );
        assert_eq!(Plan::weight_file(Version::V2), "cpu.weight");
        assert_eq!(Plan::weight_file(Version::V1), "cpu.shares");
    }

    #[test]
    fn one_undeclared_limit_leaves_the_pod_unlimited() {
        let plan = desired(
            QosClass::BestEffort,
            &[batch("a", 1000, 1000, 1 << 30), batch("b", 0, 0, 0)],
            Version::V1,
        )
        .unwrap();
        // b asks for nothing: no writes of its own, the pod's weight is a's, no pod limits.
        assert_eq!(plan.pod_weight, ("cpu.shares", "1024".into()));
        assert!(plan.pod_limits.is_empty(), "{plan:?}");
        assert_eq!(plan.containers[1], ("b".into(), vec![]));

        // Memory only: the pod keeps the minimal weight, gets the memory limit, no quota.
        let memory_only = desired(
            QosClass::BestEffort,
            &[batch("a", 0, 0, 1 << 30)],
            Version::V1,
        )
        .unwrap();
        assert_eq!(memory_only.pod_weight, ("cpu.shares", "2".into()));
        assert_eq!(
            memory_only.pod_limits,
            writes(&[("memory.limit_in_bytes", "1073741824")])
        );
    }

    #[test]
    fn nothing_for_other_classes_or_no_batch_resources() {
        let asks = [batch("a", 1000, 1000, 1 << 30)];
        for class in [QosClass::Burstable, QosClass::Guaranteed] {
            assert_eq!(desired(class, &asks, Version::V1), None);
        }
        assert_eq!(
            desired(QosClass::BestEffort, &[batch("a", 0, 0, 0)], Version::V1),
            None
        );
        assert_eq!(desired(QosClass::BestEffort, &[], Version::V2), None);
    }

    #[test]
    fn rounding_and_kernel_bounds() {
        // 1m: 2 shares (the kernel's minimum), a 1 ms quota (the kernel's minimum).
        let tiny = desired(QosClass::BestEffort, &[batch("a", 1, 1, 1)], Version::V1).unwrap();
        assert_eq!(
            tiny.containers[0].1,
            writes(&[
                ("cpu.shares", "2"),
                ("cpu.cfs_quota_us", "1000"),
                // One byte is one aligned unit: never a 0 limit.
                ("memory.limit_in_bytes", "65536"),
            ])
        );
        // 1000000001 bytes round down to 64 KiB; 250m is 256 shares and a 25 ms quota.
        let odd = desired(
            QosClass::BestEffort,
            &[batch("a", 250, 250, 1_000_000_001)],
            Version::V1,
        )
        .unwrap();
        assert_eq!(
            odd.containers[0].1,
            writes(&[
                ("cpu.shares", "256"),
                ("cpu.cfs_quota_us", "25000"),
                ("memory.limit_in_bytes", "999948288"),
            ])
        );
        assert_eq!(999_948_288 % MEMORY_ALIGN, 0);
    }

    #[test]
    fn huge_amounts_saturate_at_what_the_kernel_takes() {
        let max = u64::MAX;
        let plan = desired(
            QosClass::BestEffort,
            &[batch("a", max, max, max), batch("b", max, max, max)],
            Version::V1,
        )
        .unwrap();
        let top = writes(&[
            ("cpu.shares", "262144"),
            ("cpu.cfs_quota_us", "17592186044415"),
            ("memory.limit_in_bytes", "9223372036854710272"),
        ]);
        assert_eq!(plan.containers[0].1, top);
        assert_eq!(plan.pod_weight, top[0]);
        assert_eq!(plan.pod_limits, top[1..].to_vec());
        assert_eq!(
            MAX_MEMORY_BYTES,
            i64::MAX as u64 / MEMORY_ALIGN * MEMORY_ALIGN
        );
        assert_eq!(quota_us(max), MAX_QUOTA_US);
        let v2 = desired(
            QosClass::BestEffort,
            &[batch("a", max, max, max)],
            Version::V2,
        )
        .unwrap();
        assert_eq!(v2.pod_weight, ("cpu.weight", "10000".into()));
        assert_eq!(
            v2.pod_limits[0],
            ("cpu.max", "17592186044415 100000".into())
        );
    }
}
