//! Which cgroup version and kubelet driver this node runs, found out once at start: the mount
//! table tells v1 from v2, the kubelet configuration (or, without it, which `kubepods` cgroup
//! exists) gives the driver. Start at [`Settings::detect`].

use std::path::{Path, PathBuf};

use super::error::{Error, Result};
use super::files::Cgroups;
use super::layout::{Driver, Layout};
use crate::rules::kernel::Version;

/// Where cgroup filesystems are mounted unless configured otherwise.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";
/// The mount table [`detect_version`] reads unless configured otherwise.
pub const DEFAULT_MOUNTINFO: &str = "/proc/self/mountinfo";

/// The cgroup version mounted at `root`, from the text of a mountinfo file: v2 when a
/// `cgroup2` filesystem is mounted at `root` itself, v1 when `cgroup` (v1) filesystems are
/// mounted below it (a hybrid node's `unified/` v2 mount has no controllers and is ignored),
/// else v2 when `cgroup2` filesystems are mounted below it (the agent's DaemonSet mounts only
/// the kubepods subtree, `kubepods.slice` at `<root>/kubepods.slice`). `None` when none.
pub fn detect_version(mountinfo: &str, root: &Path) -> Option<Version> {
    let (mut v1, mut v2_below) = (false, false);
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
            "cgroup2" if mount_point.starts_with(root) => v2_below = true,
            "cgroup" if mount_point.starts_with(root) => v1 = true,
            _ => {}
        }
    }
    match (v1, v2_below) {
        (true, _) => Some(Version::V1),
        (false, true) => Some(Version::V2),
        (false, false) => None,
    }
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

/// Where the cgroups are and how the kubelet names them; [`Cgroups::detect`] fills the rest.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where the cgroup filesystems are mounted (`/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
    /// The mount table that tells v1 from v2 (`/proc/self/mountinfo`).
    pub mountinfo: PathBuf,
    /// The kubelet's `cgroupDriver`; `None` detects it from the kubepods cgroup.
    pub driver: Option<String>,
    /// The kubelet's `cgroupRoot`; `None` for `/`.
    pub kubelet_cgroup_root: Option<String>,
}

impl Settings {
    pub fn detect(&self) -> Result<Cgroups> {
        Cgroups::detect(
            &self.cgroup_root,
            &self.mountinfo,
            self.driver.as_deref(),
            self.kubelet_cgroup_root.as_deref(),
        )
    }
}

impl Cgroups {
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
            let mut layout = base.clone();
            layout.driver = driver;
            Cgroups::new(&root, layout)
        };
        let driver = match kubelet_driver.filter(|d| !d.is_empty()) {
            Some(d) => d.parse()?,
            None => {
                let kubepods = |c: Cgroups| c.dir("cpu", &c.layout().kubepods());
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Only the kubepods subtrees mounted, as the DaemonSet does: v2's one, v1's per
        // controller (a hybrid node's unified/ beside them does not make it v2).
        let v2_subtree = "50 40 0:22 /kubepods.slice /host/sys/fs/cgroup/kubepods.slice rw - cgroup2 cgroup2 rw\n";
        let v1_subtrees = "\
51 40 0:29 /kubepods.slice /host/sys/fs/cgroup/cpu/kubepods.slice rw - cgroup cgroup rw,cpu,cpuacct
52 40 0:29 /kubepods.slice /host/sys/fs/cgroup/cpuacct/kubepods.slice rw - cgroup cgroup rw,cpu,cpuacct
53 40 0:38 / /host/sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
        let host = Path::new("/host/sys/fs/cgroup");
        assert_eq!(detect_version(v2_subtree, host), Some(Version::V2));
        assert_eq!(detect_version(v1_subtrees, host), Some(Version::V1));
        assert_eq!(detect_version(v2_subtree, root), None);
        assert_eq!(detect_version("garbage\n\n - \n", root), None);
        let escaped = "24 30 0:22 / /host\\040root/cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            detect_version(escaped, Path::new("/host root/cg")),
            Some(Version::V2)
        );
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
