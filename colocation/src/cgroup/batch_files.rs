//! Batch resources as cgroup limits on the kernel: writes the plan of
//! [`crate::rules::batch_limits::desired`] to the pod's cgroup and its started containers'. Start
//! at [`apply`].
//!
//! The pod cgroup comes first: on cgroup v1 the kernel refuses a child's CFS quota above its
//! parent's (`EINVAL`), and the pod's quota is the sum of its containers', so setting it first
//! is valid from the kubelet's unlimited start. Memory is in the `memory` hierarchy on v1; a
//! node without it reports the files as missing.

use std::collections::HashMap;

use super::error::Result;
use super::files::{Applied, Cgroups};
use super::layout::CgroupPath;
use crate::rules::batch_limits::Plan;

/// Writes the plan: the pod's weight (when `pod_weight`: a `BE` level in force owns it), the
/// pod's limits, then each started container's (`containers` maps a container name to its
/// cgroup; containers not started yet get theirs on a later round). Only differing values are
/// written (and logged); stops at the first error.
pub fn apply(
    cgroups: &Cgroups,
    pod: &CgroupPath,
    containers: &HashMap<String, CgroupPath>,
    plan: &Plan,
    pod_weight: bool,
) -> Result<Applied> {
    let mut writes = Vec::with_capacity(plan.pod_limits.len() + 1);
    if pod_weight {
        writes.push(plan.pod_weight.clone());
    }
    writes.extend(plan.pod_limits.iter().cloned());
    let mut applied = cgroups.apply(pod, &writes)?;
    for (name, writes) in &plan.containers {
        if let Some(path) = containers.get(name)
            && !writes.is_empty()
        {
            applied.merge(cgroups.apply(path, writes)?);
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::layout::{Driver, Layout};
    use crate::rules::batch_limits::{ContainerBatch, desired};
    use crate::rules::kernel::Version;
    use crate::rules::pod::QosClass;

    /// A v1 BestEffort pod with two containers as the kubelet leaves it: minimal shares,
    /// unlimited quota and memory, in the `cpu` and `memory` hierarchies.
    #[test]
    fn applies_pod_first_then_started_containers_and_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let cgroups = Cgroups::new(tmp.path(), Layout::new(Version::V1, Driver::Cgroupfs));
        let pod = cgroups.layout().pod(QosClass::BestEffort, "u1").unwrap();
        let started = cgroups
            .layout()
            .container(
                QosClass::BestEffort,
                "u1",
                &"containerd://aaa".parse().unwrap(),
            )
            .unwrap();
        for path in [&pod, &started] {
            let cpu = cgroups.dir("cpu", path);
            let memory = cgroups.dir("memory", path);
            std::fs::create_dir_all(&cpu).unwrap();
            std::fs::create_dir_all(&memory).unwrap();
            std::fs::write(cpu.join("cpu.shares"), "2\n").unwrap();
            std::fs::write(cpu.join("cpu.cfs_quota_us"), "-1\n").unwrap();
            std::fs::write(
                memory.join("memory.limit_in_bytes"),
                "9223372036854771712\n",
            )
            .unwrap();
        }
        let batch = |name: &str| ContainerBatch {
            name: name.into(),
            cpu_request_millis: 1000,
            cpu_limit_millis: 500,
            memory_limit_bytes: 1 << 30,
        };
        let plan = desired(
            QosClass::BestEffort,
            &[batch("main"), batch("later")],
            Version::V1,
        )
        .unwrap();
        let containers = HashMap::from([("main".to_string(), started.clone())]);

        let first = apply(&cgroups, &pod, &containers, &plan, true).unwrap();
        let file = |path: &CgroupPath, f: &str| cgroups.file(path, f).unwrap();
        assert_eq!(
            first.changed,
            vec![
                file(&pod, "cpu.shares"),
                file(&pod, "cpu.cfs_quota_us"),
                file(&pod, "memory.limit_in_bytes"),
                file(&started, "cpu.shares"),
                file(&started, "cpu.cfs_quota_us"),
                file(&started, "memory.limit_in_bytes"),
            ]
        );
        assert_eq!(cgroups.read(&pod, "cpu.shares").unwrap(), "2048");
        assert_eq!(cgroups.read(&pod, "cpu.cfs_quota_us").unwrap(), "100000");
        assert_eq!(
            cgroups.read(&pod, "memory.limit_in_bytes").unwrap(),
            "2147483648"
        );
        assert_eq!(cgroups.read(&started, "cpu.shares").unwrap(), "1024");
        assert_eq!(cgroups.read(&started, "cpu.cfs_quota_us").unwrap(), "50000");
        assert!(
            apply(&cgroups, &pod, &containers, &plan, true)
                .unwrap()
                .is_noop()
        );

        // A BE level owns the pod's weight: it is left as it is.
        std::fs::write(cgroups.dir("cpu", &pod).join("cpu.shares"), "3\n").unwrap();
        assert!(
            apply(&cgroups, &pod, &containers, &plan, false)
                .unwrap()
                .is_noop()
        );
        assert_eq!(cgroups.read(&pod, "cpu.shares").unwrap(), "3");

        // No memory controller for the pod: reported as unsupported files, CPU still written.
        std::fs::remove_file(cgroups.dir("memory", &pod).join("memory.limit_in_bytes")).unwrap();
        std::fs::write(cgroups.dir("cpu", &pod).join("cpu.cfs_quota_us"), "-1\n").unwrap();
        let partial = apply(&cgroups, &pod, &containers, &plan, false).unwrap();
        assert_eq!(partial.changed, vec![file(&pod, "cpu.cfs_quota_us")]);
        assert_eq!(
            partial.unsupported,
            vec![file(&pod, "memory.limit_in_bytes")]
        );
    }
}
