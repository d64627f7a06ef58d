//! Idempotent access to the node's cgroup files. Start at [`Cgroups`]: it maps a [`CgroupPath`]
//! (the kubelet's name for a cgroup, the same in every v1 hierarchy) to a directory, reads
//! files, and writes only values that differ, so re-applying desired state (after an agent
//! restart, on every sync) changes and logs nothing. All cgroup writes of co-location go
//! through [`Cgroups::write_if_changed`].

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::error::{Error, Result, invalid};
use super::layout::{CgroupPath, Layout};
use crate::rules::kernel::Version;

/// What [`Cgroups::write_if_changed`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    /// The file already held the value; nothing was written.
    Unchanged,
    /// The value was written; `previous` is what the file held before.
    Written { previous: String },
    /// The kernel has no such file; nothing was written.
    Unsupported,
}

/// The outcome of applying a plan: which files changed and which this kernel lacks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub changed: Vec<PathBuf>,
    pub unsupported: Vec<PathBuf>,
}

impl Applied {
    /// True when every value was already in place (a re-apply after a restart).
    pub fn is_noop(&self) -> bool {
        self.changed.is_empty()
    }

    pub fn merge(&mut self, other: Applied) {
        self.changed.extend(other.changed);
        self.unsupported.extend(other.unsupported);
    }
}

/// The node's cgroup filesystem: a mount root plus the kubelet's [`Layout`].
#[derive(Clone, Debug)]
pub struct Cgroups {
    root: PathBuf,
    layout: Layout,
}

impl Cgroups {
    pub fn new(root: impl Into<PathBuf>, layout: Layout) -> Self {
        Cgroups {
            root: root.into(),
            layout,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn version(&self) -> Version {
        self.layout.version
    }

    /// The directory of `path` in `controller`'s hierarchy: `<root>/<controller>/<path>` on v1
    /// (where `cpu` is usually a link to `cpu,cpuacct`), `<root>/<path>` on v2.
    pub fn dir(&self, controller: &str, path: &CgroupPath) -> PathBuf {
        match self.layout.version {
            Version::V1 => self.root.join(controller).join(&path.0),
            Version::V2 => self.root.join(&path.0),
        }
    }

    /// The full path of a controller file (`cpu.shares`, `memory.high`): on v1 the hierarchy is
    /// the file's prefix. Files without a controller (`cgroup.procs`, `tasks`) exist in every v1
    /// hierarchy: use [`Cgroups::dir`] for those.
    pub fn file(&self, path: &CgroupPath, file: &str) -> Result<PathBuf> {
        let controller = match file.split_once('.') {
            Some((controller, rest)) if !controller.is_empty() && !rest.is_empty() => controller,
            _ => return Err(invalid("cgroup file", file, "expected <controller>.<name>")),
        };
        if file.contains('/') {
            return Err(invalid("cgroup file", file, "must be a plain file name"));
        }
        if controller == "cgroup" && self.layout.version == Version::V1 {
            return Err(invalid(
                "cgroup file",
                file,
                "exists in every v1 hierarchy; name the hierarchy with Cgroups::dir",
            ));
        }
        Ok(self.dir(controller, path).join(file))
    }

    /// Whether this kernel has `file` for the cgroup (false too when the cgroup is gone).
    pub fn has(&self, path: &CgroupPath, file: &str) -> bool {
        self.file(path, file).is_ok_and(|p| p.is_file())
    }

    /// The file's content without trailing whitespace.
    pub fn read(&self, path: &CgroupPath, file: &str) -> Result<String> {
        let full = self.file(path, file)?;
        match std::fs::read_to_string(&full) {
            Ok(mut s) => {
                s.truncate(s.trim_end().len());
                Ok(s)
            }
            Err(reason) => Err(
                self.classify(full, file, reason, |path, reason| Error::Read {
                    path,
                    reason,
                }),
            ),
        }
    }

    /// Writes `value` only when the file holds something else, and logs each change once.
    pub fn write_if_changed(&self, path: &CgroupPath, file: &str, value: &str) -> Result<Changed> {
        let current = match self.read(path, file) {
            Ok(current) => current,
            Err(Error::Unsupported { .. }) => return Ok(Changed::Unsupported),
            Err(e) => return Err(e),
        };
        if current.trim() == value.trim() {
            return Ok(Changed::Unchanged);
        }
        let full = self.file(path, file)?;
        // No create: a file this kernel lacks must not appear as a plain file by mistake.
        // Truncation is a no-op on cgroupfs and keeps plain-file fixtures exact.
        let written = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&full)
            .and_then(|mut f| f.write_all(value.as_bytes()));
        if let Err(reason) = written {
            return Err(
                self.classify(full, file, reason, |path, reason| Error::Write {
                    path,
                    value: value.to_string(),
                    reason,
                }),
            );
        }
        tracing::info!(file = %full.display(), from = %current, to = %value, "cgroup value changed");
        Ok(Changed::Written { previous: current })
    }

    /// Applies `(file, value)` pairs to one cgroup in order (order matters: `cpu.idle = 0`
    /// resets the weight the kernel gave the idle group, so it comes before `cpu.shares`).
    /// Stops at the first error; files this kernel lacks are skipped and reported.
    pub fn apply(&self, path: &CgroupPath, plan: &[(&str, String)]) -> Result<Applied> {
        let mut applied = Applied::default();
        for (file, value) in plan {
            match self.write_if_changed(path, file, value)? {
                Changed::Unchanged => {}
                Changed::Written { .. } => applied.changed.push(self.file(path, file)?),
                Changed::Unsupported => {
                    tracing::debug!(cgroup = %path, file, "not supported by this kernel; skipped");
                    applied.unsupported.push(self.file(path, file)?);
                }
            }
        }
        Ok(applied)
    }

    /// A missing file in an existing cgroup is [`Error::Unsupported`]; a missing cgroup is
    /// [`Error::NoCgroup`]; anything else is the caller's error.
    fn classify(
        &self,
        full: PathBuf,
        file: &str,
        reason: io::Error,
        other: impl FnOnce(PathBuf, io::Error) -> Error,
    ) -> Error {
        if reason.kind() != io::ErrorKind::NotFound {
            return other(full, reason);
        }
        let dir = full.parent().map(Path::to_path_buf).unwrap_or_default();
        if dir.is_dir() {
            Error::Unsupported {
                dir,
                file: file.to_string(),
            }
        } else {
            Error::NoCgroup { dir }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::layout::{ContainerId, Driver};
    use crate::rules::pod::QosClass;

    const UID: &str = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";

    fn id(runtime: &str) -> ContainerId {
        format!("{runtime}://abc123").parse().unwrap()
    }

    /// Every runtime x driver x version x QoS class, against the paths the kubelet and the
    /// runtimes create.
    #[test]
    fn container_paths_for_every_runtime_driver_version_and_class() {
        let cases = [
            (
                Driver::Cgroupfs,
                QosClass::Guaranteed,
                "kubepods/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                ["abc123", "crio-abc123", "abc123"],
            ),
            (
                Driver::Cgroupfs,
                QosClass::Burstable,
                "kubepods/burstable/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                ["abc123", "crio-abc123", "abc123"],
            ),
            (
                Driver::Cgroupfs,
                QosClass::BestEffort,
                "kubepods/besteffort/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                ["abc123", "crio-abc123", "abc123"],
            ),
            (
                Driver::Systemd,
                QosClass::Guaranteed,
                "kubepods.slice/kubepods-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice",
                [
                    "cri-containerd-abc123.scope",
                    "crio-abc123.scope",
                    "docker-abc123.scope",
                ],
            ),
            (
                Driver::Systemd,
                QosClass::Burstable,
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice",
                [
                    "cri-containerd-abc123.scope",
                    "crio-abc123.scope",
                    "docker-abc123.scope",
                ],
            ),
            (
                Driver::Systemd,
                QosClass::BestEffort,
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice",
                [
                    "cri-containerd-abc123.scope",
                    "crio-abc123.scope",
                    "docker-abc123.scope",
                ],
            ),
        ];
        for (driver, qos, pod, leaves) in cases {
            for version in [Version::V1, Version::V2] {
                let cgroups = Cgroups::new("/sys/fs/cgroup", Layout::new(version, driver));
                let layout = cgroups.layout();
                assert_eq!(layout.pod(qos, UID).unwrap().to_string(), pod);
                for (runtime, leaf) in ["containerd", "cri-o", "docker"].into_iter().zip(leaves) {
                    let path = layout.container(qos, UID, &id(runtime)).unwrap();
                    assert_eq!(
                        path.to_string(),
                        format!("{pod}/{leaf}"),
                        "{runtime} {driver:?} {qos:?}"
                    );
                    let expected = match version {
                        Version::V1 => format!("/sys/fs/cgroup/cpu/{pod}/{leaf}"),
                        Version::V2 => format!("/sys/fs/cgroup/{pod}/{leaf}"),
                    };
                    assert_eq!(cgroups.dir("cpu", &path), PathBuf::from(&expected));
                    assert_eq!(
                        cgroups.file(&path, "cpu.shares").unwrap(),
                        PathBuf::from(expected).join("cpu.shares")
                    );
                }
            }
        }
    }

    #[test]
    fn v1_files_resolve_to_their_controller_hierarchy() {
        let cgroups = Cgroups::new("/cg", Layout::new(Version::V1, Driver::Cgroupfs));
        let pod = cgroups.layout().pod(QosClass::Burstable, "u1").unwrap();
        assert_eq!(
            cgroups.file(&pod, "memory.qos_level").unwrap(),
            PathBuf::from("/cg/memory/kubepods/burstable/podu1/memory.qos_level")
        );
        assert_eq!(
            cgroups.file(&pod, "cpuacct.usage").unwrap(),
            PathBuf::from("/cg/cpuacct/kubepods/burstable/podu1/cpuacct.usage")
        );
        assert!(cgroups.file(&pod, "cgroup.procs").is_err());
        assert!(cgroups.file(&pod, "tasks").is_err());
        assert!(cgroups.file(&pod, "../cpu.shares").is_err());
        let v2 = Cgroups::new("/cg", Layout::new(Version::V2, Driver::Cgroupfs));
        assert_eq!(
            v2.file(&pod, "cgroup.procs").unwrap(),
            PathBuf::from("/cg/kubepods/burstable/podu1/cgroup.procs")
        );
    }

    fn fake_tree(version: Version) -> (tempfile::TempDir, Cgroups, CgroupPath) {
        let tmp = tempfile::tempdir().unwrap();
        let cgroups = Cgroups::new(tmp.path(), Layout::new(version, Driver::Cgroupfs));
        let pod = cgroups.layout().pod(QosClass::Burstable, "u1").unwrap();
        let dir = cgroups.dir("cpu", &pod);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cpu.shares"), "1024\n").unwrap();
        (tmp, cgroups, pod)
    }

    #[test]
    fn writes_only_when_different_and_reports_missing_files() {
        let (_tmp, cgroups, pod) = fake_tree(Version::V1);
        assert_eq!(cgroups.read(&pod, "cpu.shares").unwrap(), "1024");
        assert_eq!(
            cgroups
                .write_if_changed(&pod, "cpu.shares", "1024")
                .unwrap(),
            Changed::Unchanged
        );
        assert_eq!(
            cgroups.write_if_changed(&pod, "cpu.shares", "2").unwrap(),
            Changed::Written {
                previous: "1024".into()
            }
        );
        assert_eq!(cgroups.read(&pod, "cpu.shares").unwrap(), "2");
        assert_eq!(
            cgroups.write_if_changed(&pod, "cpu.shares", "2").unwrap(),
            Changed::Unchanged
        );

        assert_eq!(
            cgroups
                .write_if_changed(&pod, "cpu.qos_level", "-1")
                .unwrap(),
            Changed::Unsupported
        );
        assert!(
            !cgroups.dir("cpu", &pod).join("cpu.qos_level").exists(),
            "never created"
        );
        let e = cgroups.read(&pod, "cpu.qos_level").unwrap_err();
        assert!(e.is_unsupported());
        assert!(e.to_string().contains("cpu.qos_level"), "{e}");

        let gone = cgroups.layout().pod(QosClass::Burstable, "gone").unwrap();
        let e = cgroups
            .write_if_changed(&gone, "cpu.shares", "2")
            .unwrap_err();
        assert!(matches!(e, Error::NoCgroup { .. }), "{e}");
        assert!(e.to_string().contains("podgone"), "{e}");
    }

    #[test]
    fn apply_reports_changes_then_nothing() {
        let (_tmp, cgroups, pod) = fake_tree(Version::V2);
        let plan = [
            ("cpu.shares", "2".to_string()),
            ("cpu.idle", "1".to_string()),
        ];
        let first = cgroups.apply(&pod, &plan).unwrap();
        assert_eq!(
            first.changed,
            vec![cgroups.file(&pod, "cpu.shares").unwrap()]
        );
        assert_eq!(
            first.unsupported,
            vec![cgroups.file(&pod, "cpu.idle").unwrap()]
        );
        let second = cgroups.apply(&pod, &plan).unwrap();
        assert!(second.is_noop());
    }
}
