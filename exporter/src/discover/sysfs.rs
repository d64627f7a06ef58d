//! Vendor and driver facts read from files under the discovery root: per-device sysfs
//! attributes, the NVIDIA driver's `/proc` entries, device nodes under `/dev`.
//!
//! Every read is relative to a root, so the same code reads `/`, a fixture or a dump. A
//! missing or unreadable file is an absent fact (`None`), never an error: sysfs varies across
//! kernels and drivers.

use std::path::{Path, PathBuf};

use fumarole_topology::CpuSet;

/// Files under one filesystem root.
#[derive(Clone, Debug)]
pub struct Root(PathBuf);

impl Root {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `rel` (an absolute host path such as `/sys/...`) under this root.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }

    /// A text file's content, trimmed; `None` when missing or not UTF-8.
    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.join(rel))
            .ok()
            .map(|s| s.trim().to_owned())
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.join(rel).exists()
    }

    /// The node's hostname as the kernel reports it.
    pub fn hostname(&self) -> Option<String> {
        self.read("/proc/sys/kernel/hostname")
            .filter(|h| !h.is_empty())
    }

    fn pci_attr(&self, bus_id: &str, attr: &str) -> Option<String> {
        self.read(&format!("/sys/bus/pci/devices/{bus_id}/{attr}"))
    }

    /// `numa_node` of a PCI device; `-1` (no affinity) and bad content are `None`.
    pub fn pci_numa_node(&self, bus_id: &str) -> Option<u32> {
        parse_numa_node(&self.pci_attr(bus_id, "numa_node")?)
    }

    /// `local_cpulist` of a PCI device; bad content is logged and ignored.
    pub fn pci_local_cpus(&self, bus_id: &str) -> Option<CpuSet> {
        let text = self.pci_attr(bus_id, "local_cpulist")?;
        match CpuSet::parse(&text) {
            Ok(set) => Some(set),
            Err(e) => {
                tracing::warn!(device = bus_id, error = %e, "ignoring unreadable local_cpulist");
                None
            }
        }
    }

    /// Names under `/sys/bus/pci/devices/<bus_id>/<sub>` (e.g. `drm` -> `card1`, `renderD129`).
    pub fn pci_children(&self, bus_id: &str, sub: &str) -> Vec<String> {
        let dir = self.join(&format!("/sys/bus/pci/devices/{bus_id}/{sub}"));
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The NVIDIA driver's `/proc/driver/nvidia/gpus/<bus_id>/information`.
    pub fn nvidia_info(&self, bus_id: &str) -> Option<NvidiaProcInfo> {
        let text = self.read(&format!("/proc/driver/nvidia/gpus/{bus_id}/information"))?;
        Some(NvidiaProcInfo::parse(&text))
    }
}

/// A `numa_node` attribute's value; `-1` (no affinity) and bad content are `None`.
pub fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// What the NVIDIA kernel driver tells about one GPU without NVML.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvidiaProcInfo {
    pub model: Option<String>,
    pub uuid: Option<String>,
    pub minor: Option<u32>,
}

impl NvidiaProcInfo {
    /// The `Key: value` lines of an `information` file; `N/A` and `??` values are absent.
    pub fn parse(text: &str) -> Self {
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == key))
                .map(|(_, v)| v.trim().to_owned())
                .filter(|v| !v.is_empty() && !v.starts_with("N/A") && !v.starts_with("??"))
        };
        NvidiaProcInfo {
            model: field("Model"),
            uuid: field("GPU UUID"),
            minor: field("Device Minor").and_then(|m| m.parse().ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_facts_and_tolerates_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let dev = dir.path().join("sys/bus/pci/devices/0000:1b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
        std::fs::write(dev.join("local_cpulist"), "0-3,zz\n").unwrap();
        assert_eq!(root.pci_numa_node("0000:1b:00.0"), None);
        assert_eq!(root.pci_local_cpus("0000:1b:00.0"), None);
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        std::fs::write(dev.join("local_cpulist"), "8-15\n").unwrap();
        assert_eq!(root.pci_numa_node("0000:1b:00.0"), Some(1));
        assert_eq!(
            root.pci_local_cpus("0000:1b:00.0").unwrap().to_string(),
            "8-15"
        );
        assert_eq!(root.pci_numa_node("0000:ff:00.0"), None);

        let info = dir.path().join("proc/driver/nvidia/gpus/0000:1b:00.0");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("information"),
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   42\nGPU UUID: \t GPU-abc\nDevice Minor: \t 3\nBus Location: \t 0000:1b:00.0\n",
        )
        .unwrap();
        let info = root.nvidia_info("0000:1b:00.0").unwrap();
        assert_eq!(info.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(info.uuid.as_deref(), Some("GPU-abc"));
        assert_eq!(info.minor, Some(3));
    }
}
