//! Usage of the kubepods cgroup tree, read from the kernel for oversubscription and eviction:
//! CPU time (cgroup v1 `cpuacct.usage`, v2 `cpu.stat`) and memory working set (usage minus
//! inactive file cache, as the kubelet counts it). Start at [`KubepodsUsage`]; the rules turn the
//! CPU counter into millicores ([`crate::rules::oversub::CpuMeter`]).

use std::path::{Path, PathBuf};

use super::files::Cgroups;
use crate::rules::kernel::Version;

/// Why a usage file could not be read; the caller skips the round (nothing is published from
/// a guess) and logs the error.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Format { path: PathBuf, reason: String },
}

fn read(path: &Path) -> Result<String, UsageError> {
    std::fs::read_to_string(path).map_err(|source| UsageError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_u64(path: &Path) -> Result<u64, UsageError> {
    let text = read(path)?;
    text.trim().parse().map_err(|_| UsageError::Format {
        path: path.to_owned(),
        reason: format!("{:?} is not a number", text.trim()),
    })
}

/// The value of `key` in a flat-keyed file (`memory.stat`, `cpu.stat`).
fn stat_value(path: &Path, keys: &[&str]) -> Result<u64, UsageError> {
    let text = read(path)?;
    for key in keys {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if words.next() == Some(*key) {
                let v = words.next().unwrap_or_default();
                return v.parse().map_err(|_| UsageError::Format {
                    path: path.to_owned(),
                    reason: format!("{key} {v:?} is not a number"),
                });
            }
        }
    }
    Err(UsageError::Format {
        path: path.to_owned(),
        reason: format!("no {} line", keys.join(" or ")),
    })
}

/// cgroup v1: `cpuacct.usage` of `dir` (a `cpuacct` hierarchy directory), nanoseconds since
/// the group was created.
pub fn cpu_usage_ns_v1(dir: &Path) -> Result<u64, UsageError> {
    read_u64(&dir.join("cpuacct.usage"))
}

/// cgroup v2: `usage_usec` of `dir/cpu.stat`, in nanoseconds.
pub fn cpu_usage_ns_v2(dir: &Path) -> Result<u64, UsageError> {
    Ok(stat_value(&dir.join("cpu.stat"), &["usage_usec"])?.saturating_mul(1000))
}

/// cgroup v1: working set of `dir` (a `memory` hierarchy directory): `memory.usage_in_bytes`
/// minus `total_inactive_file` (the whole subtree's, as the kubelet counts it) from
/// `memory.stat`.
pub fn memory_working_set_v1(dir: &Path) -> Result<u64, UsageError> {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let inactive = stat_value(
        &dir.join("memory.stat"),
        &["total_inactive_file", "inactive_file"],
    )?;
    Ok(usage.saturating_sub(inactive))
}

/// cgroup v2: working set of `dir`: `memory.current` minus `inactive_file` from `memory.stat`.
pub fn memory_working_set_v2(dir: &Path) -> Result<u64, UsageError> {
    let usage = read_u64(&dir.join("memory.current"))?;
    let inactive = stat_value(&dir.join("memory.stat"), &["inactive_file"])?;
    Ok(usage.saturating_sub(inactive))
}

/// Where the kubepods tree's usage files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubepodsUsage {
    /// cgroup v1: the `cpuacct` and `memory` hierarchies' kubepods directories.
    V1 { cpuacct: PathBuf, memory: PathBuf },
    /// cgroup v2: the one kubepods directory.
    V2 { dir: PathBuf },
}

impl KubepodsUsage {
    /// The kubelet's `kubepods` cgroup on this node ([`Layout::kubepods`](super::Layout::kubepods),
    /// so the driver and the kubelet's `cgroupRoot` count): in the `cpuacct` and `memory`
    /// hierarchies on v1, its one directory on v2.
    pub fn of(cgroups: &Cgroups) -> Self {
        let kubepods = cgroups.layout().kubepods();
        match cgroups.version() {
            Version::V1 => Self::V1 {
                cpuacct: cgroups.dir("cpuacct", &kubepods),
                memory: cgroups.dir("memory", &kubepods),
            },
            Version::V2 => Self::V2 {
                dir: cgroups.dir("cpu", &kubepods),
            },
        }
    }

    /// Cumulative CPU time in nanoseconds.
    pub fn cpu_ns(&self) -> Result<u64, UsageError> {
        match self {
            Self::V1 { cpuacct, .. } => cpu_usage_ns_v1(cpuacct),
            Self::V2 { dir } => cpu_usage_ns_v2(dir),
        }
    }

    /// Memory working set in bytes.
    pub fn memory_bytes(&self) -> Result<u64, UsageError> {
        match self {
            Self::V1 { memory, .. } => memory_working_set_v1(memory),
            Self::V2 { dir } => memory_working_set_v2(dir),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::cgroup::layout::{Driver, Layout};

    fn usage_of(root: &Path, version: Version, driver: Driver) -> KubepodsUsage {
        KubepodsUsage::of(&Cgroups::new(root, Layout::new(version, driver)))
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    /// Excerpt of a real cgroup v1 `memory.stat` (this machine's root).
    const V1_MEMORY_STAT: &str = "cache 9240576\nrss 5136384\ninactive_file 0\nactive_file 155648\n\
        total_cache 15732736\ntotal_rss 10235904\ntotal_inactive_anon 4980736\n\
        total_active_anon 1560576\ntotal_inactive_file 1769472\ntotal_active_file 8208384\n";
    const V2_CPU_STAT: &str = "usage_usec 123456789\nuser_usec 100000000\nsystem_usec 23456789\n\
        nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n";
    const V2_MEMORY_STAT: &str = "anon 1048576\nfile 4194304\nkernel 65536\nactive_file 1048576\n\
        inactive_file 3145728\n";

    #[test]
    fn reads_cgroup_v1_usage() {
        let root = tempfile::tempdir().unwrap();
        write(
            &root.path().join("cpuacct/kubepods"),
            "cpuacct.usage",
            "16166877621793\n",
        );
        write(
            &root.path().join("memory/kubepods"),
            "memory.usage_in_bytes",
            "25825280\n",
        );
        write(
            &root.path().join("memory/kubepods"),
            "memory.stat",
            V1_MEMORY_STAT,
        );
        let k = usage_of(root.path(), Version::V1, Driver::Cgroupfs);
        assert_eq!(k.cpu_ns().unwrap(), 16_166_877_621_793);
        assert_eq!(k.memory_bytes().unwrap(), 25_825_280 - 1_769_472);
    }

    #[test]
    fn reads_cgroup_v1_combined_hierarchy_and_systemd_names() {
        let root = tempfile::tempdir().unwrap();
        write(
            &root.path().join("cpu,cpuacct/kubepods.slice"),
            "cpuacct.usage",
            "42",
        );
        // The combined hierarchy is reached through the `cpuacct` link systemd makes beside it.
        std::os::unix::fs::symlink("cpu,cpuacct", root.path().join("cpuacct")).unwrap();
        let k = usage_of(root.path(), Version::V1, Driver::Systemd);
        assert_eq!(
            k,
            KubepodsUsage::V1 {
                cpuacct: root.path().join("cpuacct/kubepods.slice"),
                memory: root.path().join("memory/kubepods.slice"),
            }
        );
        assert_eq!(k.cpu_ns().unwrap(), 42);
        // A memory.stat of a leaf group without total_* lines still works.
        write(
            &root.path().join("memory/kubepods.slice"),
            "memory.usage_in_bytes",
            "1000",
        );
        write(
            &root.path().join("memory/kubepods.slice"),
            "memory.stat",
            "inactive_file 300\n",
        );
        assert_eq!(k.memory_bytes().unwrap(), 700);
    }

    #[test]
    fn reads_cgroup_v2_usage() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("kubepods.slice");
        write(&dir, "cpu.stat", V2_CPU_STAT);
        write(&dir, "memory.current", "8388608\n");
        write(&dir, "memory.stat", V2_MEMORY_STAT);
        let k = usage_of(root.path(), Version::V2, Driver::Systemd);
        assert_eq!(k.cpu_ns().unwrap(), 123_456_789_000);
        assert_eq!(k.memory_bytes().unwrap(), 8_388_608 - 3_145_728);
        // Inactive file above usage (racy reads): 0, not a wrap-around.
        write(&dir, "memory.current", "1000\n");
        assert_eq!(k.memory_bytes().unwrap(), 0);
    }

    #[test]
    fn bad_usage_files_are_errors() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("kubepods");
        let k = usage_of(root.path(), Version::V2, Driver::Cgroupfs);
        let e = k.cpu_ns().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("reading {}", dir.join("cpu.stat").display())),
            "{e}"
        );
        write(&dir, "cpu.stat", "user_usec 5\n");
        assert_eq!(
            k.cpu_ns().unwrap_err().to_string(),
            format!("{}: no usage_usec line", dir.join("cpu.stat").display())
        );
        write(&dir, "cpu.stat", "usage_usec many\n");
        assert_eq!(
            k.cpu_ns().unwrap_err().to_string(),
            format!(
                "{}: usage_usec \"many\" is not a number",
                dir.join("cpu.stat").display()
            )
        );
        write(&dir, "memory.current", "max\n");
        assert_eq!(
            k.memory_bytes().unwrap_err().to_string(),
            format!(
                "{}: \"max\" is not a number",
                dir.join("memory.current").display()
            )
        );
        write(&dir, "memory.current", "10\n");
        write(&dir, "memory.stat", "anon 1\n");
        assert_eq!(
            k.memory_bytes().unwrap_err().to_string(),
            format!(
                "{}: no inactive_file line",
                dir.join("memory.stat").display()
            )
        );
    }

    #[test]
    fn reads_this_machines_root_cgroup_when_v1() {
        let root = Path::new("/sys/fs/cgroup");
        if root.join("cpuacct/cpuacct.usage").exists() {
            assert!(cpu_usage_ns_v1(&root.join("cpuacct")).unwrap() > 0);
        }
        if root.join("memory/memory.usage_in_bytes").exists() {
            memory_working_set_v1(&root.join("memory")).unwrap();
        }
        if root.join("cpu.stat").exists() {
            cpu_usage_ns_v2(root).unwrap();
        }
    }
}
