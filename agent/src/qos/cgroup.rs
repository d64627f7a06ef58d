//! The cgroup layer that QoS levels and CPU burst write through: which cgroup version and kubelet
//! driver the node runs, where a pod's and a container's cgroup lives, and idempotent access to
//! their files.
//!
//! Start at [`Cgroups`]: it maps a [`CgroupPath`] (the kubelet's name for a cgroup, the same in
//! every v1 hierarchy) to a directory, reads files, and writes only values that differ, so
//! re-applying desired state (after an agent restart, on every sync) changes and logs nothing.
//! [`Layout`] is the pure part: pod and container paths for containerd, CRI-O and docker under
//! both kubelet drivers.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where cgroup filesystems are mounted unless configured otherwise.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";
/// The mount table [`detect_version`] reads unless configured otherwise.
pub const DEFAULT_MOUNTINFO: &str = "/proc/self/mountinfo";

/// Errors of the cgroup layer; each names the file or the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cgroup directory does not exist: the pod or container is gone or not created yet.
    /// Retry on the next sync; there is nothing to undo.
    #[error("cgroup {dir} does not exist")]
    NoCgroup { dir: PathBuf },
    /// The cgroup exists but this kernel has no such file (`cpu.qos_level` outside openEuler,
    /// `cpu.idle` before 5.15): callers fall back to another file or skip the feature.
    #[error("{file} is not supported by this kernel (not in {dir})")]
    Unsupported { dir: PathBuf, file: String },
    /// Reading failed for another reason (permissions, I/O); retrying may help.
    #[error("reading {path}: {reason}")]
    Read { path: PathBuf, reason: io::Error },
    /// The kernel refused the value (`EINVAL` for a burst above the quota, for `cpu.shares` on
    /// an idle group ...); retrying the same value will not help.
    #[error("writing {value:?} to {path}: {reason}")]
    Write {
        path: PathBuf,
        value: String,
        reason: io::Error,
    },
    /// A file's content is not in the format the kernel documents.
    #[error("{path}: unexpected content {content:?}: {reason}")]
    Content {
        path: PathBuf,
        content: String,
        reason: &'static str,
    },
    /// Neither cgroup v2 at the root nor v1 controllers below it.
    #[error("no cgroup filesystem mounted at or below {root} (per {mountinfo})")]
    NotMounted { root: PathBuf, mountinfo: PathBuf },
    /// The kubelet's driver is neither configured nor visible in the cgroup tree.
    #[error(
        "cannot tell the kubelet's cgroup driver: {reason}; set cgroupDriver in the kubelet config"
    )]
    Driver { reason: String },
    /// Bad input from the API or configuration: a container id, pod uid, QoS class, driver
    /// name or cgroup root that does not parse. The pod (or setting) is skipped.
    #[error("{what} {value:?}: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: String,
    },
}

impl Error {
    /// Whether the kernel lacks the file, so the caller may fall back instead of failing.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn invalid(what: &'static str, value: &str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        what,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// The cgroup version pods live in. A hybrid node (v1 controllers plus an empty v2 hierarchy at
/// `unified/`) counts as v1: that is where the cpu and memory controllers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    V1,
    V2,
}

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

/// The Kubernetes QoS class of a pod (`status.qosClass`), which picks the kubepods sub-tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodQos {
    /// Directly under `kubepods`.
    Guaranteed,
    Burstable,
    BestEffort,
}

impl FromStr for PodQos {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "Guaranteed" => Ok(PodQos::Guaranteed),
            "Burstable" => Ok(PodQos::Burstable),
            "BestEffort" => Ok(PodQos::BestEffort),
            _ => Err(invalid(
                "pod QoS class",
                s,
                "expected Guaranteed, Burstable or BestEffort",
            )),
        }
    }
}

impl PodQos {
    /// The kubepods child the kubelet creates for this class; none for Guaranteed.
    fn component(self) -> Option<&'static str> {
        match self {
            PodQos::Guaranteed => None,
            PodQos::Burstable => Some("burstable"),
            PodQos::BestEffort => Some("besteffort"),
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
/// every controller's hierarchy; [`Cgroups::dir`] resolves it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CgroupPath(PathBuf);

impl CgroupPath {
    pub fn as_path(&self) -> &Path {
        &self.0
    }

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

    /// The QoS-class cgroup (`kubepods/burstable`, ...; `kubepods` itself for Guaranteed).
    pub fn qos(&self, qos: PodQos) -> CgroupPath {
        match qos.component() {
            Some(class) => self.name(&["kubepods", class]),
            None => self.kubepods(),
        }
    }

    /// The pod's cgroup: `kubepods[/burstable|/besteffort]/pod<uid>` (cgroupfs) or
    /// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice` (systemd).
    pub fn pod(&self, qos: PodQos, uid: &str) -> Result<CgroupPath> {
        if uid.is_empty() || !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(invalid(
                "pod uid",
                uid,
                "expected letters, digits and dashes",
            ));
        }
        let pod = format!("pod{uid}");
        Ok(match qos.component() {
            Some(class) => self.name(&["kubepods", class, &pod]),
            None => self.name(&["kubepods", &pod]),
        })
    }

    /// A container's cgroup under its pod: `<pod>/<id>` for containerd and docker and
    /// `<pod>/crio-<id>` for CRI-O under cgroupfs; `<pod>/cri-containerd-<id>.scope`,
    /// `<pod>/crio-<id>.scope`, `<pod>/docker-<id>.scope` under systemd.
    pub fn container(&self, qos: PodQos, uid: &str, container: &ContainerId) -> Result<CgroupPath> {
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

/// The cgroup version mounted at `root`, from the text of a mountinfo file: v2 when a
/// `cgroup2` filesystem is mounted at `root` itself, v1 when `cgroup` (v1) filesystems are
/// mounted below it (a hybrid node's `unified/` v2 mount has no controllers and is ignored).
/// `None` when neither.
pub fn detect_version(mountinfo: &str, root: &Path) -> Option<Version> {
    let mut v1 = false;
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - fstype source super
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let (Some(mount_point), Some(fstype)) = (left.split(' ').nth(4), right.split(' ').next())
        else {
            continue;
        };
        let mount_point = PathBuf::from(unescape_mountinfo(mount_point));
        match fstype {
            "cgroup2" if mount_point == root => return Some(Version::V2),
            "cgroup" if mount_point.starts_with(root) => v1 = true,
            _ => {}
        }
    }
    v1.then_some(Version::V1)
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

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

    /// Detects the version from `mountinfo` and the driver from the kubelet configuration's
    /// `cgroupDriver` when given, else from which `kubepods` cgroup exists (`kubepods.slice`
    /// or `kubepods`). `cgroup_root` is the kubelet's `cgroupRoot` (`None` for `/`).
    pub fn detect(
        root: impl Into<PathBuf>,
        mountinfo: &Path,
        kubelet_driver: Option<&str>,
        cgroup_root: Option<&str>,
    ) -> Result<Self> {
        let root = root.into();
        let text = std::fs::read_to_string(mountinfo).map_err(|reason| Error::Read {
            path: mountinfo.to_path_buf(),
            reason,
        })?;
        let version = detect_version(&text, &root).ok_or_else(|| Error::NotMounted {
            root: root.clone(),
            mountinfo: mountinfo.to_path_buf(),
        })?;
        let base =
            Layout::new(version, Driver::Cgroupfs).with_cgroup_root(cgroup_root.unwrap_or("/"))?;
        let with = |driver| {
            let layout = Layout {
                driver,
                ..base.clone()
            };
            Cgroups::new(&root, layout)
        };
        let driver = match kubelet_driver.filter(|d| !d.is_empty()) {
            Some(d) => d.parse()?,
            None => {
                let kubepods = |c: Cgroups| c.dir("cpu", &c.layout.kubepods());
                let systemd = kubepods(with(Driver::Systemd));
                let cgroupfs = kubepods(with(Driver::Cgroupfs));
                match (systemd.is_dir(), cgroupfs.is_dir()) {
                    (true, false) => Driver::Systemd,
                    (false, true) => Driver::Cgroupfs,
                    (both, _) => {
                        let (s, c) = (systemd.display(), cgroupfs.display());
                        return Err(Error::Driver {
                            reason: if both {
                                format!("both {s} and {c} exist")
                            } else {
                                format!("neither {s} nor {c} exists")
                            },
                        });
                    }
                }
            }
        };
        Ok(with(driver))
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
                PodQos::Guaranteed,
                "kubepods/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                ["abc123", "crio-abc123", "abc123"],
            ),
            (
                Driver::Cgroupfs,
                PodQos::Burstable,
                "kubepods/burstable/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                ["abc123", "crio-abc123", "abc123"],
            ),
            (
                Driver::Cgroupfs,
                PodQos::BestEffort,
                "kubepods/besteffort/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                ["abc123", "crio-abc123", "abc123"],
            ),
            (
                Driver::Systemd,
                PodQos::Guaranteed,
                "kubepods.slice/kubepods-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice",
                [
                    "cri-containerd-abc123.scope",
                    "crio-abc123.scope",
                    "docker-abc123.scope",
                ],
            ),
            (
                Driver::Systemd,
                PodQos::Burstable,
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice",
                [
                    "cri-containerd-abc123.scope",
                    "crio-abc123.scope",
                    "docker-abc123.scope",
                ],
            ),
            (
                Driver::Systemd,
                PodQos::BestEffort,
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
        let pod = cgroups.layout().pod(PodQos::Burstable, "u1").unwrap();
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

    #[test]
    fn kubelet_cgroup_root_is_prepended_as_the_kubelet_does() {
        let fs = Layout::new(Version::V1, Driver::Cgroupfs)
            .with_cgroup_root("/custom/nested")
            .unwrap();
        assert_eq!(
            fs.pod(PodQos::Burstable, "u").unwrap().to_string(),
            "custom/nested/kubepods/burstable/podu"
        );
        let sd = Layout::new(Version::V2, Driver::Systemd)
            .with_cgroup_root("/my-root")
            .unwrap();
        assert_eq!(
            sd.pod(PodQos::BestEffort, "a-b").unwrap().to_string(),
            "my_root.slice/my_root-kubepods.slice/my_root-kubepods-besteffort.slice/my_root-kubepods-besteffort-poda_b.slice"
        );
        let default = Layout::new(Version::V2, Driver::Systemd)
            .with_cgroup_root("/")
            .unwrap();
        assert_eq!(default.kubepods().to_string(), "kubepods.slice");
        assert_eq!(
            default.qos(PodQos::Guaranteed).to_string(),
            "kubepods.slice"
        );
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
            let e = layout.pod(PodQos::Burstable, bad).unwrap_err().to_string();
            assert!(e.contains("pod uid"), "{e}");
        }
        assert!(
            layout
                .container(PodQos::Burstable, "", &id("docker"))
                .is_err()
        );
        assert_eq!("Burstable".parse::<PodQos>().unwrap(), PodQos::Burstable);
        assert!(
            "burstable"
                .parse::<PodQos>()
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

    #[test]
    fn version_from_mountinfo() {
        let v2 = "24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
        let hybrid = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(detect_version(v2, root), Some(Version::V2));
        assert_eq!(
            detect_version(v2, Path::new("/sys/fs/cgroup/")),
            Some(Version::V2)
        );
        assert_eq!(detect_version(hybrid, root), Some(Version::V1));
        assert_eq!(
            detect_version(hybrid, Path::new("/sys/fs/cgroup/unified")),
            Some(Version::V2)
        );
        assert_eq!(detect_version(v2, Path::new("/host/sys/fs/cgroup")), None);
        assert_eq!(detect_version("garbage\n\n - \n", root), None);
        let escaped = "24 30 0:22 / /host\\040root/cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            detect_version(escaped, Path::new("/host root/cg")),
            Some(Version::V2)
        );
    }

    fn fake_tree(version: Version) -> (tempfile::TempDir, Cgroups, CgroupPath) {
        let tmp = tempfile::tempdir().unwrap();
        let cgroups = Cgroups::new(tmp.path(), Layout::new(version, Driver::Cgroupfs));
        let pod = cgroups.layout().pod(PodQos::Burstable, "u1").unwrap();
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

        let gone = cgroups.layout().pod(PodQos::Burstable, "gone").unwrap();
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

    #[test]
    fn detect_reads_the_driver_from_config_or_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cg");
        let mountinfo = tmp.path().join("mountinfo");
        std::fs::write(
            &mountinfo,
            format!("1 0 0:1 / {} rw - cgroup2 cgroup2 rw\n", root.display()),
        )
        .unwrap();
        std::fs::create_dir_all(&root).unwrap();

        let e = Cgroups::detect(&root, &mountinfo, None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither") && e.contains("kubepods.slice"), "{e}");
        let c = Cgroups::detect(&root, &mountinfo, Some("systemd"), None).unwrap();
        assert_eq!(
            (c.version(), c.layout().driver),
            (Version::V2, Driver::Systemd)
        );

        std::fs::create_dir_all(root.join("kubepods")).unwrap();
        let c = Cgroups::detect(&root, &mountinfo, None, None).unwrap();
        assert_eq!(c.layout().driver, Driver::Cgroupfs);
        std::fs::create_dir_all(root.join("kubepods.slice")).unwrap();
        assert!(
            Cgroups::detect(&root, &mountinfo, None, None)
                .unwrap_err()
                .to_string()
                .contains("both")
        );
        assert!(Cgroups::detect(&root, &mountinfo, Some("cgroupfs"), None).is_ok());
        assert!(Cgroups::detect(&root, &mountinfo, Some("upstart"), None).is_err());

        let e = Cgroups::detect(tmp.path().join("elsewhere"), &mountinfo, None, None).unwrap_err();
        assert!(matches!(e, Error::NotMounted { .. }), "{e}");
        let e = Cgroups::detect(&root, &tmp.path().join("nope"), None, None).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
