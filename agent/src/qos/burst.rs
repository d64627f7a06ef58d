//! CPU burst from the pod annotations `volcano.sh/enable-quota-burst` and
//! `volcano.sh/quota-burst-time`: a quota-limited container may bank the quota it left unused
//! and spend up to `burst` µs more in a later period (`cpu.cfs_burst_us` on v1,
//! `cpu.max.burst` on v2; kernel >= 5.14).
//!
//! Per container the burst is the annotation's value capped at the container's quota (the
//! kernel refuses a burst above the quota), or the quota itself without a value; containers
//! without a quota are left alone. The pod cgroup gets the sum, capped at its own quota. A
//! disabled or removed annotation sets 0 everywhere. [`desired`] plans, [`apply`] writes,
//! [`sync`] does both after reading the quotas.

use std::collections::BTreeMap;

use super::cgroup::{Applied, CgroupPath, Cgroups, Error, Result, Version};

pub const ENABLE_ANNOTATION: &str = "volcano.sh/enable-quota-burst";
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

    /// The pod's request, or [`BurstRequest::Disabled`] with a warning naming the pod when an
    /// annotation is bad.
    pub fn of_pod(pod: &str, annotations: &BTreeMap<String, String>) -> Self {
        Self::from_annotations(annotations).unwrap_or_else(|e| {
            tracing::warn!(pod, error = %e, "CPU burst off for the pod");
            BurstRequest::Disabled
        })
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

    /// Reads the cgroup's quota.
    pub fn read(cgroups: &Cgroups, path: &CgroupPath) -> Result<Self> {
        let file = quota_file(cgroups.version());
        let text = cgroups.read(path, file)?;
        Quota::parse(cgroups.version(), &text).map_err(|reason| Error::Content {
            path: cgroups.dir("cpu", path).join(file),
            content: text,
            reason,
        })
    }
}

fn quota_file(version: Version) -> &'static str {
    match version {
        Version::V1 => "cpu.cfs_quota_us",
        Version::V2 => "cpu.max",
    }
}

fn burst_file(version: Version) -> &'static str {
    match version {
        Version::V1 => "cpu.cfs_burst_us",
        Version::V2 => "cpu.max.burst",
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

/// Writes the plan: containers first, then the pod. Only differing values are written (and
/// logged); a kernel without burst files reports them as unsupported.
pub fn apply(
    cgroups: &Cgroups,
    pod: &CgroupPath,
    containers: &[CgroupPath],
    plan: &BurstPlan,
) -> Result<Applied> {
    if containers.len() != plan.containers.len() {
        return Err(Error::Invalid {
            what: "burst plan",
            value: format!("{} values", plan.containers.len()),
            reason: format!("the pod has {} container cgroups", containers.len()),
        });
    }
    let file = burst_file(cgroups.version());
    let mut applied = Applied::default();
    let targets = containers
        .iter()
        .zip(&plan.containers)
        .chain([(pod, &plan.pod)]);
    for (path, burst) in targets {
        if let Some(us) = burst {
            applied.merge(cgroups.apply(path, &[(file, us.to_string())])?);
        }
    }
    Ok(applied)
}

/// Reads the quotas of the pod and its containers, plans and applies.
pub fn sync(
    cgroups: &Cgroups,
    pod: &CgroupPath,
    containers: &[CgroupPath],
    request: BurstRequest,
) -> Result<Applied> {
    let plan = match request {
        BurstRequest::Disabled => desired(
            request,
            Quota::Unlimited,
            &vec![Quota::Unlimited; containers.len()],
        ),
        BurstRequest::Enabled { .. } => {
            let quotas = containers
                .iter()
                .map(|c| Quota::read(cgroups, c))
                .collect::<Result<Vec<_>>>()?;
            desired(request, Quota::read(cgroups, pod)?, &quotas)
        }
    };
    apply(cgroups, pod, containers, &plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::cgroup::{Driver, Layout, PodQos};

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
        assert_eq!(BurstRequest::of_pod("ns/p", &a), BurstRequest::Disabled);
        let bad_time = annotations(&[(ENABLE_ANNOTATION, "true"), (BURST_TIME_ANNOTATION, "0")]);
        assert_eq!(
            BurstRequest::of_pod("ns/p", &bad_time),
            BurstRequest::Disabled
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

    fn fake_pod(
        version: Version,
        quotas: &[&str],
    ) -> (tempfile::TempDir, Cgroups, CgroupPath, Vec<CgroupPath>) {
        let tmp = tempfile::tempdir().unwrap();
        let cgroups = Cgroups::new(tmp.path(), Layout::new(version, Driver::Systemd));
        let pod = cgroups.layout().pod(PodQos::Burstable, "u1").unwrap();
        let mut containers = Vec::new();
        for (i, quota) in quotas.iter().enumerate() {
            let id = format!("containerd://c{i}").parse().unwrap();
            let path = if i == 0 {
                pod.clone()
            } else {
                cgroups
                    .layout()
                    .container(PodQos::Burstable, "u1", &id)
                    .unwrap()
            };
            let dir = cgroups.dir("cpu", &path);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(quota_file(version)), format!("{quota}\n")).unwrap();
            std::fs::write(dir.join(burst_file(version)), "0\n").unwrap();
            if i > 0 {
                containers.push(path);
            }
        }
        (tmp, cgroups, pod, containers)
    }

    #[test]
    fn sync_reads_quotas_writes_bursts_and_is_idempotent() {
        // First entry is the pod, then its containers.
        let (_tmp, cgroups, pod, containers) =
            fake_pod(Version::V2, &["max 100000", "30000 100000", "max 100000"]);
        let on = BurstRequest::Enabled {
            burst_us: Some(50_000),
        };
        let first = sync(&cgroups, &pod, &containers, on).unwrap();
        assert_eq!(
            first.changed,
            vec![cgroups.file(&containers[0], "cpu.max.burst").unwrap()]
        );
        assert_eq!(
            cgroups.read(&containers[0], "cpu.max.burst").unwrap(),
            "30000"
        );
        assert_eq!(
            cgroups.read(&pod, "cpu.max.burst").unwrap(),
            "0",
            "unlimited pod left alone"
        );
        assert!(sync(&cgroups, &pod, &containers, on).unwrap().is_noop());
        let off = sync(&cgroups, &pod, &containers, BurstRequest::Disabled).unwrap();
        assert_eq!(off.changed.len(), 1);
        assert_eq!(cgroups.read(&containers[0], "cpu.max.burst").unwrap(), "0");
        assert!(
            sync(&cgroups, &pod, &containers, BurstRequest::Disabled)
                .unwrap()
                .is_noop()
        );

        let (_tmp, cgroups, pod, containers) = fake_pod(Version::V1, &["50000", "20000", "30000"]);
        let all = sync(
            &cgroups,
            &pod,
            &containers,
            BurstRequest::Enabled { burst_us: None },
        )
        .unwrap();
        assert_eq!(all.changed.len(), 3);
        assert_eq!(cgroups.read(&pod, "cpu.cfs_burst_us").unwrap(), "50000");

        std::fs::write(
            cgroups.dir("cpu", &containers[1]).join("cpu.cfs_quota_us"),
            "lots\n",
        )
        .unwrap();
        let e = sync(
            &cgroups,
            &pod,
            &containers,
            BurstRequest::Enabled { burst_us: None },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cpu.cfs_quota_us") && e.contains("lots"), "{e}");
        let e = apply(
            &cgroups,
            &pod,
            &containers[..1],
            &desired(BurstRequest::Disabled, Quota::Unlimited, &[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("burst plan"), "{e}");
    }

    #[test]
    fn kernels_without_burst_report_unsupported() {
        let (_tmp, cgroups, pod, containers) = fake_pod(Version::V1, &["50000", "20000"]);
        std::fs::remove_file(cgroups.dir("cpu", &containers[0]).join("cpu.cfs_burst_us")).unwrap();
        let applied = sync(
            &cgroups,
            &pod,
            &containers,
            BurstRequest::Enabled { burst_us: None },
        )
        .unwrap();
        assert_eq!(
            applied.unsupported,
            vec![cgroups.file(&containers[0], "cpu.cfs_burst_us").unwrap()]
        );
        assert_eq!(
            applied.changed,
            vec![cgroups.file(&pod, "cpu.cfs_burst_us").unwrap()]
        );
    }
}
