//! Where the kubelet puts a pod's and a container's cgroup: the [`Layout`] for this node's
//! cgroup version, kubelet driver (cgroupfs, systemd) and `cgroupRoot`, and the container
//! runtime's naming (containerd, CRI-O, docker). Pure: paths only, no I/O; [`super::files`]
//! resolves them to directories.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::error::{Error, Result, invalid};
use crate::rules::kernel::Version;
use crate::rules::pod::QosClass;

/// How the kubelet names cgroups (`cgroupDriver` in its configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

impl FromStr for Driver {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cgroupfs" => Ok(Driver::Cgroupfs),
            "systemd" => Ok(Driver::Systemd),
            _ => Err(invalid("cgroup driver", s, "expected cgroupfs or systemd")),
        }
    }
}

/// The container runtime, from the scheme of a container id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    Containerd,
    CriO,
    Docker,
}

/// A container as the pod status names it (`containerStatuses[].containerID`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ContainerId {
    pub runtime: Runtime,
    /// The runtime's id (64 hex digits in practice); checked to be a single path component.
    pub id: String,
}

impl FromStr for ContainerId {
    type Err = Error;
    /// Parses `containerd://<id>`, `cri-o://<id>` or `docker://<id>`.
    fn from_str(s: &str) -> Result<Self> {
        let Some((scheme, id)) = s.split_once("://") else {
            return Err(invalid(
                "container id",
                s,
                "expected <runtime>://<id> (the container may not have started yet)",
            ));
        };
        let runtime = match scheme {
            "containerd" => Runtime::Containerd,
            "cri-o" => Runtime::CriO,
            "docker" => Runtime::Docker,
            _ => {
                return Err(invalid(
                    "container id",
                    s,
                    format!("unknown runtime {scheme:?} (expected containerd, cri-o or docker)"),
                ));
            }
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(invalid(
                "container id",
                s,
                "the id must be non-empty and alphanumeric",
            ));
        }
        Ok(ContainerId {
            runtime,
            id: id.to_string(),
        })
    }
}

/// A cgroup's path relative to the root of a hierarchy, e.g. `kubepods/burstable/pod<uid>`
/// (what `/proc/<pid>/cgroup` shows, without the leading `/`). On v1 the same path exists in
/// every controller's hierarchy; [`super::files::Cgroups::dir`] resolves it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CgroupPath(pub(super) PathBuf);

impl CgroupPath {
    fn join(&self, child: &str) -> CgroupPath {
        CgroupPath(self.0.join(child))
    }
}

impl fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.display())
    }
}

/// How the kubelet lays out pod cgroups on this node. Pure: no I/O.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: Version,
    pub driver: Driver,
    /// The kubelet's `cgroupRoot` as cgroup name components (empty for the default `/`).
    cgroup_root: Vec<String>,
}

impl Layout {
    pub fn new(version: Version, driver: Driver) -> Self {
        Layout {
            version,
            driver,
            cgroup_root: Vec::new(),
        }
    }

    /// Sets the kubelet's `cgroupRoot` (`/` by default), given in cgroupfs form as the kubelet
    /// takes it for both drivers (`/foo` becomes `foo.slice/foo-kubepods.slice` under systemd).
    pub fn with_cgroup_root(mut self, cgroup_root: &str) -> Result<Self> {
        let mut parts = Vec::new();
        for part in cgroup_root.split('/').filter(|p| !p.is_empty()) {
            if part == "." || part == ".." {
                return Err(invalid(
                    "kubelet cgroupRoot",
                    cgroup_root,
                    "must not contain . or ..",
                ));
            }
            parts.push(part.to_string());
        }
        self.cgroup_root = parts;
        Ok(self)
    }

    /// The `kubepods` cgroup every pod lives under.
    pub fn kubepods(&self) -> CgroupPath {
        self.name(&["kubepods"])
    }

    /// The pod's cgroup: `kubepods[/burstable|/besteffort]/pod<uid>` (cgroupfs) or
    /// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice` (systemd).
    pub fn pod(&self, qos: QosClass, uid: &str) -> Result<CgroupPath> {
        if uid.is_empty() || !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(invalid(
                "pod uid",
                uid,
                "expected letters, digits and dashes",
            ));
        }
        let pod = format!("pod{uid}");
        Ok(match kubepods_child(qos) {
            Some(class) => self.name(&["kubepods", class, &pod]),
            None => self.name(&["kubepods", &pod]),
        })
    }

    /// A container's cgroup under its pod: `<pod>/<id>` for containerd and docker and
    /// `<pod>/crio-<id>` for CRI-O under cgroupfs; `<pod>/cri-containerd-<id>.scope`,
    /// `<pod>/crio-<id>.scope`, `<pod>/docker-<id>.scope` under systemd.
    pub fn container(
        &self,
        qos: QosClass,
        uid: &str,
        container: &ContainerId,
    ) -> Result<CgroupPath> {
        let pod = self.pod(qos, uid)?;
        let id = &container.id;
        let leaf = match (self.driver, container.runtime) {
            (Driver::Cgroupfs, Runtime::Containerd | Runtime::Docker) => id.clone(),
            (Driver::Cgroupfs, Runtime::CriO) => format!("crio-{id}"),
            (Driver::Systemd, Runtime::Containerd) => format!("cri-containerd-{id}.scope"),
            (Driver::Systemd, Runtime::CriO) => format!("crio-{id}.scope"),
            (Driver::Systemd, Runtime::Docker) => format!("docker-{id}.scope"),
        };
        Ok(pod.join(&leaf))
    }

    /// The kubelet's conversion of a cgroup name (components below its `cgroupRoot`) to a path:
    /// joined with `/` for cgroupfs; for systemd each component has `-` escaped to `_` and the
    /// slices nest by prefix (`a.slice/a-b.slice/a-b-c.slice`).
    fn name(&self, below_root: &[&str]) -> CgroupPath {
        let components = self
            .cgroup_root
            .iter()
            .map(String::as_str)
            .chain(below_root.iter().copied());
        let mut path = PathBuf::new();
        match self.driver {
            Driver::Cgroupfs => components.for_each(|c| path.push(c)),
            Driver::Systemd => {
                let mut prefix = String::new();
                for c in components {
                    if !prefix.is_empty() {
                        prefix.push('-');
                    }
                    prefix.push_str(&c.replace('-', "_"));
                    path.push(format!("{prefix}.slice"));
                }
            }
        }
        CgroupPath(path)
    }
}

/// The kubepods child the kubelet creates for a QoS class; none for Guaranteed, whose pods sit
/// directly under `kubepods`.
fn kubepods_child(class: QosClass) -> Option<&'static str> {
    match class {
        QosClass::Guaranteed => None,
        QosClass::Burstable => Some("burstable"),
        QosClass::BestEffort => Some("besteffort"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(runtime: &str) -> ContainerId {
        format!("{runtime}://abc123").parse().unwrap()
    }

    #[test]
    fn kubelet_cgroup_root_is_prepended_as_the_kubelet_does() {
        let fs = Layout::new(Version::V1, Driver::Cgroupfs)
            .with_cgroup_root("/custom/nested")
            .unwrap();
        assert_eq!(
            fs.pod(QosClass::Burstable, "u").unwrap().to_string(),
            "custom/nested/kubepods/burstable/podu"
        );
        let sd = Layout::new(Version::V2, Driver::Systemd)
            .with_cgroup_root("/my-root")
            .unwrap();
        assert_eq!(
            sd.pod(QosClass::BestEffort, "a-b").unwrap().to_string(),
            "my_root.slice/my_root-kubepods.slice/my_root-kubepods-besteffort.slice/my_root-kubepods-besteffort-poda_b.slice"
        );
        let default = Layout::new(Version::V2, Driver::Systemd)
            .with_cgroup_root("/")
            .unwrap();
        assert_eq!(default.kubepods().to_string(), "kubepods.slice");
        assert!(
            Layout::new(Version::V1, Driver::Cgroupfs)
                .with_cgroup_root("/a/../b")
                .is_err()
        );
    }

    #[test]
    fn container_ids_parse_or_say_why_not() {
        assert_eq!(
            "containerd://0123abcdef".parse::<ContainerId>().unwrap(),
            ContainerId {
                runtime: Runtime::Containerd,
                id: "0123abcdef".into()
            }
        );
        assert_eq!(
            "cri-o://ff".parse::<ContainerId>().unwrap().runtime,
            Runtime::CriO
        );
        assert_eq!(
            "docker://ff".parse::<ContainerId>().unwrap().runtime,
            Runtime::Docker
        );
        for (bad, says) in [
            ("", "expected <runtime>://<id>"),
            ("abc123", "expected <runtime>://<id>"),
            ("rkt://abc", "unknown runtime \"rkt\""),
            ("containerd://", "non-empty"),
            ("containerd://../../etc", "alphanumeric"),
            ("docker://abc/def", "alphanumeric"),
        ] {
            let e = bad.parse::<ContainerId>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn bad_uids_classes_and_drivers_are_errors() {
        let layout = Layout::new(Version::V2, Driver::Cgroupfs);
        for bad in ["", "../x", "a/b", "a.b", "a_b"] {
            let e = layout
                .pod(QosClass::Burstable, bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("pod uid"), "{e}");
        }
        assert!(
            layout
                .container(QosClass::Burstable, "", &id("docker"))
                .is_err()
        );
        assert_eq!(
            "Burstable".parse::<QosClass>().unwrap(),
            QosClass::Burstable
        );
        assert!(
            "burstable"
                .parse::<QosClass>()
                .unwrap_err()
                .to_string()
                .contains("Guaranteed")
        );
        assert_eq!("systemd".parse::<Driver>().unwrap(), Driver::Systemd);
        assert!(
            "Systemd"
                .parse::<Driver>()
                .unwrap_err()
                .to_string()
                .contains("cgroupfs or systemd")
        );
    }
}
