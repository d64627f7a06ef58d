//! CPU burst on the kernel: reading the CFS quotas the kubelet set ([`Quota::read`]) and writing
//! the burst plan of [`crate::rules::burst::desired`] (`cpu.cfs_burst_us` on v1, `cpu.max.burst`
//! on v2). Start at [`sync`].

use super::error::{Error, Result};
use super::files::{Applied, Cgroups};
use super::layout::CgroupPath;
use crate::rules::burst::{BurstPlan, BurstRequest, Quota, desired};
use crate::rules::kernel::Version;

impl Quota {
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
    use crate::cgroup::layout::{Driver, Layout};
    use crate::rules::pod::QosClass;

    fn fake_pod(
        version: Version,
        quotas: &[&str],
    ) -> (tempfile::TempDir, Cgroups, CgroupPath, Vec<CgroupPath>) {
        let tmp = tempfile::tempdir().unwrap();
        let cgroups = Cgroups::new(tmp.path(), Layout::new(version, Driver::Systemd));
        let pod = cgroups.layout().pod(QosClass::Burstable, "u1").unwrap();
        let mut containers = Vec::new();
        for (i, quota) in quotas.iter().enumerate() {
            let id = format!("containerd://c{i}").parse().unwrap();
            let path = if i == 0 {
                pod.clone()
            } else {
                cgroups
                    .layout()
                    .container(QosClass::Burstable, "u1", &id)
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
