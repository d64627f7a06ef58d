//! QoS levels from the pod annotation `volcano.sh/qos-level` and what each level writes to the
//! pod's cgroup.
//!
//! Where the kernel has `cpu.qos_level` / `memory.qos_level` (openEuler) the level goes there,
//! as volcano-agent does. On mainline kernels, where volcano-agent does nothing, offline (BE)
//! pods get `cpu.idle = 1` (SCHED_IDLE for the group, kernel >= 5.15) or, without it, the
//! minimal `cpu.shares` / `cpu.weight`, and on v2 a `memory.high` below their limit; every other
//! level gets the values the kubelet would set, so removing the annotation restores them.
//!
//! [`desired`] is the pure plan for a level, a [`PodResources`] and the [`Kernel`]'s files; the
//! cgroup layer finds out which files exist and writes the plan (`crate::cgroup::level_files`).

use std::collections::BTreeMap;

use super::kernel::{Kernel, Version};

/// Pod annotation with the QoS level (`LC`, `HLS`, `LS`, `BE`); `BE` marks an offline pod.
pub const QOS_LEVEL_ANNOTATION: &str = "volcano.sh/qos-level";

/// The kubelet's bounds for `cpu.shares` (`MinShares`, `MaxShares`).
const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;
/// BE `memory.high` as a share of the pod's memory limit: the group is throttled and reclaimed
/// at 80 % so an offline pod gives memory back before it reaches its limit (and the OOM killer);
/// online pods are never throttled this way.
const BE_MEMORY_HIGH_PERCENT: u64 = 80;
/// `memory.high` is rounded down to this, a multiple of every page size (4K, 16K, 64K): the
/// kernel reads the value back page-aligned, and an unaligned plan would differ on every sync.
const MEMORY_HIGH_ALIGN: u64 = 64 * 1024;

/// The annotation's level; `value()` is what volcano-agent writes to `cpu.qos_level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosLevel {
    /// `LC` (latency critical) or `HLS` (highly latency sensitive): 2.
    Critical,
    /// `LS` (latency sensitive): 1.
    Sensitive,
    /// No annotation: 0, the kubelet's defaults.
    Unset,
    /// `BE` (best effort, offline): -1; may use batch resources and be evicted.
    BestEffort,
}

/// An annotation value that is not a level; the pod is skipped (logged), not guessed at.
#[derive(Debug, thiserror::Error)]
#[error("annotation {QOS_LEVEL_ANNOTATION}: {value:?} is not one of LC, HLS, LS, BE")]
pub struct LevelError {
    pub value: String,
}

impl QosLevel {
    /// The level for an annotation value (`None` when the pod has no annotation). Exact match,
    /// as volcano-agent's lookup: `be` is an error, not `BE`.
    pub fn parse(annotation: Option<&str>) -> Result<Self, LevelError> {
        match annotation {
            None => Ok(QosLevel::Unset),
            Some("LC" | "HLS") => Ok(QosLevel::Critical),
            Some("LS") => Ok(QosLevel::Sensitive),
            Some("BE") => Ok(QosLevel::BestEffort),
            Some(other) => Err(LevelError {
                value: other.to_string(),
            }),
        }
    }

    /// The level of a pod with these annotations.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Self, LevelError> {
        Self::parse(annotations.get(QOS_LEVEL_ANNOTATION).map(String::as_str))
    }

    pub fn value(self) -> i64 {
        match self {
            QosLevel::Critical => 2,
            QosLevel::Sensitive => 1,
            QosLevel::Unset => 0,
            QosLevel::BestEffort => -1,
        }
    }

    /// Offline pods (level < 0) are the ones that use batch resources and get evicted.
    pub fn is_offline(self) -> bool {
        self.value() < 0
    }
}

/// What the plan needs to know about the pod, from its spec or its cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodResources {
    /// Sum of the containers' CPU requests, millicores (0 for BestEffort pods).
    pub cpu_request_millis: u64,
    /// The pod's memory limit in bytes (v2 `memory.max`), `None` when unlimited.
    pub memory_limit_bytes: Option<u64>,
}

/// The `cpu.shares` the kubelet gives a pod requesting `millis` (`MilliCPUToShares`).
pub fn kubelet_cpu_shares(millis: u64) -> u64 {
    (millis.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// The v2 `cpu.weight` for `shares`, the linear mapping of [2, 262144] onto [1, 10000] that the
/// kubelet applies through runc's `ConvertCPUSharesToCgroupV2Value`. (Runtimes since runc 1.3.2
/// moved to a quadratic mapping, kubernetes#131216; the kubelet's own pod cgroups follow the
/// library it is built with.)
pub fn kubelet_cpu_weight(shares: u64) -> u64 {
    1 + ((shares.clamp(MIN_SHARES, MAX_SHARES) - MIN_SHARES) * 9999) / (MAX_SHARES - MIN_SHARES)
}

/// The `(file, value)` writes for a pod at `level`, in the order they must happen.
///
/// - openEuler (`cpu.qos_level`): the level, nothing else (as volcano-agent).
/// - `cpu.idle`: BE gets `1` and nothing more, because the kernel itself gives an idle group
///   the minimal weight and refuses `cpu.shares` / `cpu.weight` writes while it is idle; any
///   other level gets `0` first (which resets the weight to the default) and then the kubelet's
///   shares / weight for the request.
/// - no `cpu.idle`: BE gets the minimal `cpu.shares` (2) / `cpu.weight` (1), others the kubelet's.
/// - memory: `memory.qos_level` -1 for BE and 0 otherwise (openEuler takes only those); on v2
///   `memory.high` at 80 % of the limit for BE (left at `max` without a limit: there is nothing
///   to take a share of, eviction handles pressure), `max` for the others.
///
/// [`QosLevel::Unset`] restores the kubelet's values: apply it to pods whose annotation went
/// away, not to every pod on every sync (on v2 newer kubelets convert shares to weight with
/// another formula, and the two would fight).
pub fn desired(
    level: QosLevel,
    pod: &PodResources,
    kernel: &Kernel,
) -> Vec<(&'static str, String)> {
    let offline = level.is_offline();
    let mut plan = Vec::new();
    let weight_file = match kernel.version {
        Version::V1 => "cpu.shares",
        Version::V2 => "cpu.weight",
    };
    let shares = if offline {
        MIN_SHARES
    } else {
        kubelet_cpu_shares(pod.cpu_request_millis)
    };
    let weight = match kernel.version {
        Version::V1 => shares,
        Version::V2 => kubelet_cpu_weight(shares),
    };
    if kernel.cpu_qos_level {
        plan.push(("cpu.qos_level", level.value().to_string()));
    } else if kernel.cpu_idle {
        if offline {
            plan.push(("cpu.idle", "1".to_string()));
        } else {
            plan.push(("cpu.idle", "0".to_string()));
            plan.push((weight_file, weight.to_string()));
        }
    } else {
        plan.push((weight_file, weight.to_string()));
    }

    if kernel.memory_qos_level {
        plan.push((
            "memory.qos_level",
            if offline { "-1" } else { "0" }.to_string(),
        ));
    } else if kernel.memory_high {
        let high = match pod.memory_limit_bytes {
            Some(limit) if offline => {
                let high = limit / 100 * BE_MEMORY_HIGH_PERCENT
                    + limit % 100 * BE_MEMORY_HIGH_PERCENT / 100;
                (high / MEMORY_HIGH_ALIGN * MEMORY_HIGH_ALIGN).to_string()
            }
            _ => "max".to_string(),
        };
        plan.push(("memory.high", high));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(value: Option<&str>) -> BTreeMap<String, String> {
        value
            .map(|v| BTreeMap::from([(QOS_LEVEL_ANNOTATION.to_string(), v.to_string())]))
            .unwrap_or_default()
    }

    #[test]
    fn levels_from_the_annotation() {
        for (value, level, n) in [
            (Some("LC"), QosLevel::Critical, 2),
            (Some("HLS"), QosLevel::Critical, 2),
            (Some("LS"), QosLevel::Sensitive, 1),
            (Some("BE"), QosLevel::BestEffort, -1),
            (None, QosLevel::Unset, 0),
        ] {
            let got = QosLevel::from_annotations(&annotations(value)).unwrap();
            assert_eq!((got, got.value()), (level, n));
            assert_eq!(got.is_offline(), n < 0);
        }
        for bad in ["be", "", " BE", "offline", "-1"] {
            let e = QosLevel::from_annotations(&annotations(Some(bad)))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(QOS_LEVEL_ANNOTATION) && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn kubelet_shares_and_weights() {
        for (millis, shares, weight) in [
            (0, 2, 1),
            (1, 2, 1),
            (100, 102, 4),
            (250, 256, 10),
            (1000, 1024, 39),
            (4000, 4096, 157),
            (1_000_000, 262_144, 10_000),
        ] {
            assert_eq!(kubelet_cpu_shares(millis), shares, "{millis}m");
            assert_eq!(kubelet_cpu_weight(shares), weight, "{shares} shares");
        }
        assert_eq!(kubelet_cpu_shares(u64::MAX), MAX_SHARES);
    }

    fn kernel(version: Version) -> Kernel {
        Kernel {
            version,
            cpu_qos_level: false,
            memory_qos_level: false,
            cpu_idle: true,
            memory_high: version == Version::V2,
        }
    }

    fn plan(level: QosLevel, pod: PodResources, kernel: Kernel) -> Vec<(&'static str, String)> {
        desired(level, &pod, &kernel)
    }

    fn want(writes: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        writes.iter().map(|(f, v)| (*f, v.to_string())).collect()
    }

    const POD: PodResources = PodResources {
        cpu_request_millis: 500,
        memory_limit_bytes: Some(1 << 30),
    };

    #[test]
    fn mainline_v1_with_cpu_idle() {
        let k = kernel(Version::V1);
        assert_eq!(
            plan(QosLevel::BestEffort, POD, k),
            want(&[("cpu.idle", "1")])
        );
        for online in [QosLevel::Critical, QosLevel::Sensitive, QosLevel::Unset] {
            assert_eq!(
                plan(online, POD, k),
                want(&[("cpu.idle", "0"), ("cpu.shares", "512")])
            );
        }
    }

    #[test]
    fn mainline_v2_with_cpu_idle_and_memory_high() {
        let k = kernel(Version::V2);
        // 80 % of 1 GiB = 858993459.2, rounded down to 64 KiB.
        assert_eq!(
            plan(QosLevel::BestEffort, POD, k),
            want(&[("cpu.idle", "1"), ("memory.high", "858980352")])
        );
        let unlimited = PodResources {
            memory_limit_bytes: None,
            ..POD
        };
        assert_eq!(
            plan(QosLevel::BestEffort, unlimited, k),
            want(&[("cpu.idle", "1"), ("memory.high", "max")])
        );
        assert_eq!(
            plan(QosLevel::Unset, POD, k),
            want(&[
                ("cpu.idle", "0"),
                ("cpu.weight", "20"),
                ("memory.high", "max")
            ])
        );
        let huge = PodResources {
            memory_limit_bytes: Some(u64::MAX),
            ..POD
        };
        let high: u64 = desired(QosLevel::BestEffort, &huge, &k)[1]
            .1
            .parse()
            .unwrap();
        assert!(
            high > u64::MAX / 100 * 79 && high.is_multiple_of(MEMORY_HIGH_ALIGN),
            "no overflow: {high}"
        );
    }

    #[test]
    fn older_kernels_without_cpu_idle_use_minimal_weights() {
        let v1 = Kernel {
            cpu_idle: false,
            ..kernel(Version::V1)
        };
        assert_eq!(
            plan(QosLevel::BestEffort, POD, v1),
            want(&[("cpu.shares", "2")])
        );
        assert_eq!(
            plan(QosLevel::Sensitive, POD, v1),
            want(&[("cpu.shares", "512")])
        );
        let v2 = Kernel {
            cpu_idle: false,
            memory_high: false,
            ..kernel(Version::V2)
        };
        assert_eq!(
            plan(QosLevel::BestEffort, POD, v2),
            want(&[("cpu.weight", "1")])
        );
        let best_effort_pod = PodResources::default();
        assert_eq!(
            plan(QosLevel::Unset, best_effort_pod, v2),
            want(&[("cpu.weight", "1")])
        );
    }

    #[test]
    fn openeuler_gets_the_level_itself() {
        let k = Kernel {
            cpu_qos_level: true,
            memory_qos_level: true,
            ..kernel(Version::V1)
        };
        assert_eq!(
            plan(QosLevel::BestEffort, POD, k),
            want(&[("cpu.qos_level", "-1"), ("memory.qos_level", "-1")])
        );
        assert_eq!(
            plan(QosLevel::Critical, POD, k),
            want(&[("cpu.qos_level", "2"), ("memory.qos_level", "0")])
        );
        assert_eq!(
            plan(QosLevel::Unset, POD, k),
            want(&[("cpu.qos_level", "0"), ("memory.qos_level", "0")])
        );
    }
}
