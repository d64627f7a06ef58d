//! Memory per NUMA node from sysfs, as the kubelet's memory manager (through cAdvisor) and
//! node-feature-discovery count it: `MemTotal` of `devices/system/node/nodeN/meminfo` and, per
//! page size, `nr_hugepages` of `nodeN/hugepages/hugepages-<size>kB`.
//!
//! Start at [`numa_memory`]. A node without a `meminfo` file, or a `meminfo` without a readable
//! `MemTotal`, is an error naming the file; a hugepages entry whose name or count cannot be
//! read is logged and skipped (the node's memory is still right without it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One NUMA node's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZoneMemory {
    /// `MemTotal`, bytes (huge pages included, as the kernel counts them).
    pub total_bytes: u64,
    /// Page size in bytes -> number of pages reserved as huge pages on this node.
    pub hugepages: BTreeMap<u64, u64>,
}

impl ZoneMemory {
    /// Bytes held as huge pages, all sizes together.
    pub fn hugepages_bytes(&self) -> u64 {
        self.hugepages.iter().fold(0u64, |acc, (size, n)| {
            acc.saturating_add(size.saturating_mul(*n))
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// A file that must be there could not be read.
    #[error("{path}: {reason}")]
    Read {
        path: PathBuf,
        reason: std::io::Error,
    },
    /// A `meminfo` without a `MemTotal` line we can read.
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// The Kubernetes resource name of huge pages of `page_bytes` (`hugepages-2Mi`,
/// `hugepages-1Gi`), as `v1helper.HugePageResourceName` writes it: the size in the largest
/// binary unit that divides it.
pub fn hugepages_resource(page_bytes: u64) -> String {
    let units = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in units {
        let unit = 1u64 << shift;
        if page_bytes >= unit && page_bytes.is_multiple_of(unit) {
            return format!("hugepages-{}{suffix}", page_bytes / unit);
        }
    }
    format!("hugepages-{page_bytes}")
}

/// NUMA node id -> its memory, for every `nodeN` under `<root>/sys/devices/system/node`. An
/// empty map when the directory is absent (a root without NUMA files, an XML source): callers
/// fall back to hwloc's figures.
pub fn numa_memory(root: &Path) -> Result<BTreeMap<u32, ZoneMemory>, MemoryError> {
    let dir = root.join("sys/devices/system/node");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(reason) => return Err(MemoryError::Read { path: dir, reason }),
    };
    let mut out = BTreeMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let node_dir = entry.path();
        let meminfo = node_dir.join("meminfo");
        let text = std::fs::read_to_string(&meminfo).map_err(|reason| MemoryError::Read {
            path: meminfo.clone(),
            reason,
        })?;
        let total_bytes = mem_total(&text).map_err(|reason| MemoryError::Invalid {
            path: meminfo.clone(),
            reason,
        })?;
        out.insert(
            id,
            ZoneMemory {
                total_bytes,
                hugepages: hugepages(&node_dir.join("hugepages")),
            },
        );
    }
    Ok(out)
}

/// `Node N MemTotal:   123 kB` (a node's `meminfo`) -> bytes; the error says what is wrong.
pub fn mem_total(text: &str) -> Result<u64, String> {
    let line = text
        .lines()
        .find(|l| l.split(':').next().is_some_and(|k| k.contains("MemTotal")))
        .ok_or("no MemTotal line")?;
    let value = line.split(':').nth(1).unwrap_or_default().trim();
    let kib = value
        .strip_suffix("kB")
        .map(str::trim)
        .ok_or_else(|| format!("MemTotal {value:?} is not in kB"))?;
    kib.parse::<u64>()
        .ok()
        .and_then(|k| k.checked_mul(1024))
        .ok_or_else(|| format!("MemTotal {value:?} is not a number of kB"))
}

/// Page size -> pages, from `hugepages-<size>kB/nr_hugepages`; unreadable entries are logged
/// and left out. No directory (no huge page support) is no huge pages.
fn hugepages(dir: &Path) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let size = name
            .strip_prefix("hugepages-")
            .and_then(|s| s.strip_suffix("kB"))
            .and_then(|s| s.parse::<u64>().ok())
            .and_then(|kib| kib.checked_mul(1024));
        let Some(size) = size else {
            tracing::warn!(path = %entry.path().display(), "not a hugepages-<size>kB entry; skipped");
            continue;
        };
        let count_file = entry.path().join("nr_hugepages");
        match std::fs::read_to_string(&count_file)
            .map_err(|e| e.to_string())
            .and_then(|t| t.trim().parse::<u64>().map_err(|e| format!("{t:?}: {e}")))
        {
            Ok(n) => {
                out.insert(size, n);
            }
            Err(error) => {
                tracing::warn!(path = %count_file.display(), %error, "huge page count unreadable; skipped");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn reads_memtotal_and_hugepages_per_node() {
        let dir = tempfile::tempdir().unwrap();
        let n = "sys/devices/system/node";
        write(
            dir.path(),
            &format!("{n}/node0/meminfo"),
            "Node 0 MemTotal:       4194304 kB\nNode 0 MemFree:  1 kB\n",
        );
        write(
            dir.path(),
            &format!("{n}/node0/hugepages/hugepages-2048kB/nr_hugepages"),
            "512\n",
        );
        write(
            dir.path(),
            &format!("{n}/node0/hugepages/hugepages-1048576kB/nr_hugepages"),
            "1\n",
        );
        // Skipped, not fatal: a count that is not a number, a name that is not a size.
        write(
            dir.path(),
            &format!("{n}/node0/hugepages/hugepages-64kB/nr_hugepages"),
            "many\n",
        );
        write(dir.path(), &format!("{n}/node0/hugepages/oddity/x"), "1");
        write(
            dir.path(),
            &format!("{n}/node1/meminfo"),
            "Node 1 MemTotal:       2097152 kB\n",
        );
        write(dir.path(), &format!("{n}/possible"), "0-1\n");
        let m = numa_memory(dir.path()).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[&0].total_bytes, 4 << 30);
        assert_eq!(
            m[&0].hugepages,
            BTreeMap::from([(2 << 20, 512), (1 << 30, 1)])
        );
        assert_eq!(m[&0].hugepages_bytes(), 2 << 30);
        assert_eq!(m[&1].total_bytes, 2 << 30);
        assert!(m[&1].hugepages.is_empty());
    }

    #[test]
    fn bad_meminfo_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for (text, want) in [
            ("Node 0 MemFree: 1 kB\n", "no MemTotal"),
            ("Node 0 MemTotal: lots kB\n", "not a number"),
            ("Node 0 MemTotal: 12 MB\n", "not in kB"),
        ] {
            write(dir.path(), "sys/devices/system/node/node0/meminfo", text);
            let err = numa_memory(dir.path()).unwrap_err().to_string();
            assert!(err.contains("node0/meminfo") && err.contains(want), "{err}");
        }
        // No NUMA directory at all: nothing known, no error.
        assert!(
            numa_memory(&dir.path().join("elsewhere"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn hugepage_resource_names_are_kubernetes_names() {
        assert_eq!(hugepages_resource(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepages_resource(1 << 30), "hugepages-1Gi");
        assert_eq!(hugepages_resource(64 << 10), "hugepages-64Ki");
        assert_eq!(hugepages_resource(32 << 20), "hugepages-32Mi");
    }
}
