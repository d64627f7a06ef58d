//! CPU burst from the pod annotations `volcano.sh/enable-quota-burst` and
//! `volcano.sh/quota-burst-time`: a quota-limited container may bank the quota it left unused
//! and spend up to `burst` µs more in a later period (`cpu.cfs_burst_us` on v1,
//! `cpu.max.burst` on v2; kernel >= 5.14).
//!
//! Per container the burst is the annotation's value capped at the container's quota (the
//! kernel refuses a burst above the quota), or the quota itself without a value; containers
//! without a quota are left alone. The pod cgroup gets the sum, capped at its own quota. A
//! disabled or removed annotation sets 0 everywhere. [`desired`] plans from the quotas; the cgroup
//! layer reads the quotas and writes the plan (`crate::cgroup::burst_files`).

use std::collections::BTreeMap;

use super::kernel::Version;

/// Pod annotation: `"true"` turns CPU burst on for the pod's containers.
pub const ENABLE_ANNOTATION: &str = "volcano.sh/enable-quota-burst";
/// Pod annotation: the burst in µs per container (default: each container's quota).
pub const BURST_TIME_ANNOTATION: &str = "volcano.sh/quota-burst-time";

/// What the pod's annotations ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BurstRequest {
    /// No annotation, `false`, or a bad value: burst 0 everywhere.
    Disabled,
    /// Burst on; `burst_us` is the annotation's value, `None` for "each container's quota".
    Enabled { burst_us: Option<u64> },
}

/// A bad annotation; the pod's burst is turned off (logged), not guessed at.
#[derive(Debug, thiserror::Error)]
pub enum BurstError {
    #[error("annotation {ENABLE_ANNOTATION}: {value:?} is not a boolean (true or false)")]
    Enable { value: String },
    #[error(
        "annotation {BURST_TIME_ANNOTATION}: {value:?} is not a whole number of microseconds > 0"
    )]
    BurstTime { value: String },
}

impl BurstRequest {
    /// Reads both annotations. The enable flag takes what volcano-agent's `strconv.ParseBool`
    /// takes (`true`, `1`, `t`, `TRUE`, ...); the burst time is only looked at when enabled.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Self, BurstError> {
        let enabled = match annotations.get(ENABLE_ANNOTATION).map(String::as_str) {
            None => false,
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
            Some(other) => {
                return Err(BurstError::Enable {
                    value: other.to_string(),
                });
            }
        };
        if !enabled {
            return Ok(BurstRequest::Disabled);
        }
        let burst_us = match annotations.get(BURST_TIME_ANNOTATION) {
            None => None,
            Some(value) => match value.parse::<u64>() {
                Ok(us) if us > 0 => Some(us),
                _ => {
                    return Err(BurstError::BurstTime {
                        value: value.to_string(),
                    });
                }
            },
        };
        Ok(BurstRequest::Enabled { burst_us })
    }
}

/// A cgroup's CFS quota per period, in µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quota {
    /// `-1` (v1) or `max` (v2): no limit, so nothing to burst above.
    Unlimited,
    Limited(u64),
}

impl Quota {
    /// Parses `cpu.cfs_quota_us` (v1) or the first field of `cpu.max` (v2).
    pub fn parse(version: Version, text: &str) -> Result<Self, &'static str> {
        let field = match version {
            Version::V1 => text.trim(),
            Version::V2 => text.split_whitespace().next().unwrap_or_default(),
        };
        match (version, field) {
            (Version::V1, "-1") | (Version::V2, "max") => Ok(Quota::Unlimited),
            _ => match field.parse::<u64>() {
                Ok(us) if us > 0 => Ok(Quota::Limited(us)),
                _ => Err(match version {
                    Version::V1 => "expected -1 or a quota in microseconds",
                    Version::V2 => "expected \"max <period>\" or \"<quota> <period>\"",
                }),
            },
        }
    }
}

/// Burst values in µs for each container (same order as the quotas given) and the pod;
/// `None` leaves that cgroup's burst as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BurstPlan {
    pub containers: Vec<Option<u64>>,
    pub pod: Option<u64>,
}

/// The burst each cgroup should have, from the request and the quotas the kubelet set.
pub fn desired(request: BurstRequest, pod_quota: Quota, container_quotas: &[Quota]) -> BurstPlan {
    let BurstRequest::Enabled { burst_us } = request else {
        return BurstPlan {
            containers: vec![Some(0); container_quotas.len()],
            pod: Some(0),
        };
    };
    let containers: Vec<Option<u64>> = container_quotas
        .iter()
        .map(|quota| match quota {
            Quota::Unlimited => None,
            Quota::Limited(q) => Some(burst_us.map_or(*q, |b| b.min(*q))),
        })
        .collect();
    let sum = containers
        .iter()
        .flatten()
        .fold(0u64, |a, b| a.saturating_add(*b));
    let pod = match pod_quota {
        Quota::Unlimited => None,
        Quota::Limited(q) => Some(sum.min(q)),
    };
    BurstPlan { containers, pod }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn requests_from_annotations() {
        let on = |extra: &[(&str, &str)]| {
            let mut a = annotations(&[(ENABLE_ANNOTATION, "true")]);
            a.extend(annotations(extra));
            BurstRequest::from_annotations(&a)
        };
        assert_eq!(
            BurstRequest::from_annotations(&BTreeMap::new()).unwrap(),
            BurstRequest::Disabled
        );
        assert_eq!(on(&[]).unwrap(), BurstRequest::Enabled { burst_us: None });
        assert_eq!(
            on(&[(BURST_TIME_ANNOTATION, "50000")]).unwrap(),
            BurstRequest::Enabled {
                burst_us: Some(50_000)
            }
        );
        for off in ["false", "0", "F"] {
            let a = annotations(&[(ENABLE_ANNOTATION, off), (BURST_TIME_ANNOTATION, "junk")]);
            assert_eq!(
                BurstRequest::from_annotations(&a).unwrap(),
                BurstRequest::Disabled
            );
        }
        for bad in [
            "0",
            "-5",
            "1.5",
            "1e3",
            "",
            " 10",
            "99999999999999999999999",
        ] {
            let e = on(&[(BURST_TIME_ANNOTATION, bad)]).unwrap_err().to_string();
            assert!(
                e.contains(BURST_TIME_ANNOTATION) && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
        let a = annotations(&[(ENABLE_ANNOTATION, "yes")]);
        let e = BurstRequest::from_annotations(&a).unwrap_err().to_string();
        assert!(
            e.contains(ENABLE_ANNOTATION) && e.contains("\"yes\""),
            "{e}"
        );
    }

    #[test]
    fn quotas_parse_per_version() {
        assert_eq!(Quota::parse(Version::V1, "-1\n"), Ok(Quota::Unlimited));
        assert_eq!(
            Quota::parse(Version::V1, "50000"),
            Ok(Quota::Limited(50_000))
        );
        assert_eq!(
            Quota::parse(Version::V2, "max 100000"),
            Ok(Quota::Unlimited)
        );
        assert_eq!(
            Quota::parse(Version::V2, "20000 100000\n"),
            Ok(Quota::Limited(20_000))
        );
        for (v, bad) in [
            (Version::V1, "max"),
            (Version::V1, ""),
            (Version::V1, "0"),
            (Version::V2, "-1 100000"),
            (Version::V2, ""),
        ] {
            assert!(Quota::parse(v, bad).is_err(), "{v:?} {bad:?}");
        }
    }

    #[test]
    fn plan_caps_at_the_quota_and_skips_unlimited() {
        let quotas = [
            Quota::Limited(20_000),
            Quota::Limited(100_000),
            Quota::Unlimited,
        ];
        let asked = BurstRequest::Enabled {
            burst_us: Some(50_000),
        };
        assert_eq!(
            desired(asked, Quota::Limited(120_000), &quotas),
            BurstPlan {
                containers: vec![Some(20_000), Some(50_000), None],
                pod: Some(70_000)
            }
        );
        let quota_itself = BurstRequest::Enabled { burst_us: None };
        assert_eq!(
            desired(quota_itself, Quota::Limited(120_000), &quotas),
            BurstPlan {
                containers: vec![Some(20_000), Some(100_000), None],
                pod: Some(120_000)
            }
        );
        // The pod's sum never exceeds the pod's own quota (the kernel would refuse it).
        assert_eq!(
            desired(quota_itself, Quota::Limited(100_000), &quotas).pod,
            Some(100_000)
        );
        assert_eq!(desired(asked, Quota::Unlimited, &quotas).pod, None);
        assert_eq!(
            desired(BurstRequest::Disabled, Quota::Unlimited, &quotas),
            BurstPlan {
                containers: vec![Some(0); 3],
                pod: Some(0)
            }
        );
    }
}
