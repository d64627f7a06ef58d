//! What the QoS level plan ([`crate::rules::level::desired`]) needs from a pod's cgroup, and
//! writing the plan: [`Kernel::probe`] says which QoS files this kernel has for the pod,
//! [`memory_limit`] reads its v2 `memory.max`, [`apply`] writes the plan through [`Cgroups`].

use super::error::{Error, Result};
use super::files::{Applied, Cgroups};
use super::layout::CgroupPath;
use crate::rules::kernel::{Kernel, Version};

impl Kernel {
    /// Looks at the pod's cgroup to see which files exist.
    pub fn probe(cgroups: &Cgroups, pod: &CgroupPath) -> Self {
        let version = cgroups.version();
        Kernel {
            version,
            cpu_qos_level: cgroups.has(pod, "cpu.qos_level"),
            memory_qos_level: cgroups.has(pod, "memory.qos_level"),
            cpu_idle: cgroups.has(pod, "cpu.idle"),
            memory_high: version == Version::V2 && cgroups.has(pod, "memory.high"),
        }
    }
}

/// The pod's memory limit from its v2 `memory.max` (`None` for `max`, on v1, or without the
/// memory controller), to fill [`crate::rules::level::PodResources::memory_limit_bytes`].
pub fn memory_limit(cgroups: &Cgroups, pod: &CgroupPath) -> Result<Option<u64>> {
    if cgroups.version() != Version::V2 {
        return Ok(None);
    }
    let text = match cgroups.read(pod, "memory.max") {
        Ok(text) => text,
        Err(e) if e.is_unsupported() => return Ok(None),
        Err(e) => return Err(e),
    };
    if text == "max" {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| Error::Content {
        path: cgroups.dir("memory", pod).join("memory.max"),
        content: text,
        reason: "expected bytes or max",
    })
}

/// Writes the plan to the pod's cgroup; only differing values are written (and logged).
pub fn apply(
    cgroups: &Cgroups,
    pod: &CgroupPath,
    plan: &[(&'static str, String)],
) -> Result<Applied> {
    cgroups.apply(pod, plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::layout::{Driver, Layout};
    use crate::rules::level::{PodResources, QosLevel, desired};
    use crate::rules::pod::QosClass;

    #[test]
    fn probe_apply_and_memory_limit_on_a_fake_v2_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let cgroups = Cgroups::new(tmp.path(), Layout::new(Version::V2, Driver::Systemd));
        let pod = cgroups.layout().pod(QosClass::Burstable, "u1").unwrap();
        let dir = cgroups.dir("cpu", &pod);
        std::fs::create_dir_all(&dir).unwrap();
        for (f, v) in [
            ("cpu.idle", "0"),
            ("cpu.weight", "20"),
            ("memory.high", "max"),
            ("memory.max", "1073741824"),
        ] {
            std::fs::write(dir.join(f), format!("{v}\n")).unwrap();
        }
        let k = Kernel::probe(&cgroups, &pod);
        assert_eq!(
            k,
            Kernel {
                version: Version::V2,
                cpu_qos_level: false,
                memory_qos_level: false,
                cpu_idle: true,
                memory_high: true,
            }
        );
        let resources = PodResources {
            cpu_request_millis: 500,
            memory_limit_bytes: memory_limit(&cgroups, &pod).unwrap(),
        };
        assert_eq!(
            resources,
            PodResources {
                cpu_request_millis: 500,
                memory_limit_bytes: Some(1 << 30),
            }
        );
        assert!(
            apply(&cgroups, &pod, &desired(QosLevel::Unset, &resources, &k))
                .unwrap()
                .is_noop()
        );
        let be = apply(
            &cgroups,
            &pod,
            &desired(QosLevel::BestEffort, &resources, &k),
        )
        .unwrap();
        assert_eq!(be.changed.len(), 2);
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.high")).unwrap(),
            "858980352"
        );

        std::fs::write(dir.join("memory.max"), "lots\n").unwrap();
        let e = memory_limit(&cgroups, &pod).unwrap_err().to_string();
        assert!(e.contains("memory.max") && e.contains("lots"), "{e}");
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        assert_eq!(memory_limit(&cgroups, &pod).unwrap(), None);
    }
}
