//! The kubelet configuration file (`KubeletConfiguration`, `/var/lib/kubelet/config.yaml`):
//! the fields topology publishing needs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fumarole_topology::CpuSet;
use serde::Deserialize;

use fumarole_topology::quantity;

/// The fields of `KubeletConfiguration` we read; unknown fields are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfig {
    #[serde(default)]
    pub cpu_manager_policy: Option<String>,
    #[serde(default)]
    pub topology_manager_policy: Option<String>,
    #[serde(default)]
    pub topology_manager_scope: Option<String>,
    #[serde(default)]
    pub kube_reserved: BTreeMap<String, String>,
    #[serde(default)]
    pub system_reserved: BTreeMap<String, String>,
    #[serde(default)]
    pub eviction_hard: BTreeMap<String, String>,
    /// CPUs the kubelet keeps for system daemons; never handed out exclusively.
    #[serde(default, rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    /// `cgroupfs` or `systemd`: how the kubelet names pod cgroups (co-location needs it).
    #[serde(default)]
    pub cgroup_driver: Option<String>,
    /// The cgroup the kubelet puts `kubepods` under (`/` when unset).
    #[serde(default)]
    pub cgroup_root: Option<String>,
    /// Memory and huge pages kept from pods per NUMA node (the `--reserved-memory` flag's
    /// field); the memory manager's per-zone allocatable is what is left.
    #[serde(default)]
    pub reserved_memory: Vec<ReservedMemory>,
}

/// The kubelet's `--reserved-memory` flag syntax, for kubelets configured by flags:
/// `0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi` (entries separated by `;`, the flag may be
/// given several times). Quantities and NUMA ids are checked by [`KubeletConfig::policies`].
pub fn parse_reserved_memory_flag(value: &str) -> Result<Vec<ReservedMemory>, String> {
    let mut out = Vec::new();
    for entry in value.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (node, limits) = entry
            .split_once(':')
            .ok_or_else(|| format!("{entry:?} is not NUMA:resource=quantity,..."))?;
        let numa_node = node
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("{entry:?}: {node:?} is not a NUMA node id"))?;
        let mut map = BTreeMap::new();
        for pair in limits.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (resource, quantity) = pair
                .split_once('=')
                .ok_or_else(|| format!("{entry:?}: {pair:?} is not resource=quantity"))?;
            if map
                .insert(resource.trim().to_string(), quantity.trim().to_string())
                .is_some()
            {
                return Err(format!("{entry:?}: {resource:?} given twice"));
            }
        }
        if map.is_empty() {
            return Err(format!("{entry:?}: no resource=quantity"));
        }
        out.push(ReservedMemory {
            numa_node,
            limits: map,
        });
    }
    Ok(out)
}

/// One `reservedMemory` entry: a NUMA node and the quantities kept on it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservedMemory {
    pub numa_node: i64,
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("kubelet config {path}: {reason}")]
    Read {
        path: PathBuf,
        reason: std::io::Error,
    },
    #[error("kubelet config {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// What a Numatopology / NodeResourceTopology needs from the configuration, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletPolicies {
    /// `none` when unset, as the kubelet defaults.
    pub cpu_manager_policy: String,
    pub topology_manager_policy: String,
    pub topology_manager_scope: String,
    pub reserved_cpu_millis: u64,
    pub reserved_memory_bytes: u64,
    pub reserved_system_cpus: CpuSet,
    /// NUMA node -> resource (`memory`, `hugepages-1Gi`, ...) -> bytes kept from pods there.
    pub reserved_memory: BTreeMap<u32, BTreeMap<String, u64>>,
}

impl KubeletConfig {
    pub fn load(path: &Path) -> Result<KubeletPolicies, ConfigError> {
        Self::read(path)?
            .policies()
            .map_err(|reason| ConfigError::Invalid {
                path: path.to_path_buf(),
                reason,
            })
    }

    /// The file's fields, not yet validated (for a caller that replaces some first).
    pub fn read(path: &Path) -> Result<KubeletConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|reason| ConfigError::Read {
            path: path.to_path_buf(),
            reason,
        })?;
        serde_norway::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// The validated policies of a configuration's text (YAML or JSON).
    pub fn parse(text: &str) -> Result<KubeletPolicies, String> {
        let config: KubeletConfig = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        config.policies()
    }

    /// Validated policies; the error names the field and the value.
    pub fn policies(&self) -> Result<KubeletPolicies, String> {
        let one_of = |field: &str, value: &Option<String>, allowed: &[&str], default: &str| {
            let v = value.clone().unwrap_or_else(|| default.to_string());
            if allowed.contains(&v.as_str()) {
                Ok(v)
            } else {
                Err(format!(
                    "{field}: {v:?} is not one of {}",
                    allowed.join(", ")
                ))
            }
        };
        let sum = |key: &str, parse: fn(&str) -> Result<u64, quantity::QuantityError>| {
            let mut total = 0u64;
            for (section, map) in [
                ("kubeReserved", &self.kube_reserved),
                ("systemReserved", &self.system_reserved),
            ] {
                if let Some(v) = map.get(key) {
                    let value = parse(v).map_err(|e| format!("{section}.{key}: {e}"))?;
                    total = total
                        .checked_add(value)
                        .ok_or_else(|| format!("{section}.{key}: {v:?} is too large"))?;
                }
            }
            Ok::<u64, String>(total)
        };
        let eviction_memory = match self.eviction_hard.get("memory.available") {
            // A percentage depends on capacity; only absolute thresholds are reserved here.
            Some(v) if v.ends_with('%') => 0,
            Some(v) => {
                quantity::units(v).map_err(|e| format!("evictionHard.memory.available: {e}"))?
            }
            None => 0,
        };
        let reserved_system_cpus = match &self.reserved_system_cpus {
            Some(s) => CpuSet::parse(s).map_err(|e| format!("reservedSystemCPUs: {e}"))?,
            None => CpuSet::new(),
        };
        let mut reserved_memory: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
        for (i, r) in self.reserved_memory.iter().enumerate() {
            let node = u32::try_from(r.numa_node).map_err(|_| {
                format!(
                    "reservedMemory[{i}].numaNode: {} is not a NUMA node id",
                    r.numa_node
                )
            })?;
            let zone = reserved_memory.entry(node).or_default();
            for (resource, v) in &r.limits {
                if resource != "memory" && !resource.starts_with("hugepages-") {
                    return Err(format!(
                        "reservedMemory[{i}].limits: {resource:?} is not memory or hugepages-<size>"
                    ));
                }
                let bytes = quantity::units(v)
                    .map_err(|e| format!("reservedMemory[{i}].limits.{resource}: {e}"))?;
                // The kubelet sums repeated entries for one node.
                let total = zone.entry(resource.clone()).or_default();
                *total = total.checked_add(bytes).ok_or_else(|| {
                    format!("reservedMemory[{i}].limits.{resource}: {v:?} is too large")
                })?;
            }
        }
        Ok(KubeletPolicies {
            cpu_manager_policy: one_of(
                "cpuManagerPolicy",
                &self.cpu_manager_policy,
                &["none", "static"],
                "none",
            )?,
            topology_manager_policy: one_of(
                "topologyManagerPolicy",
                &self.topology_manager_policy,
                &["none", "best-effort", "restricted", "single-numa-node"],
                "none",
            )?,
            topology_manager_scope: one_of(
                "topologyManagerScope",
                &self.topology_manager_scope,
                &["container", "pod"],
                "container",
            )?,
            reserved_cpu_millis: sum("cpu", quantity::cpu_millis)?,
            reserved_memory_bytes: sum("memory", quantity::units)?
                .checked_add(eviction_memory)
                .ok_or("evictionHard.memory.available: the reserved memory is too large")?,
            reserved_system_cpus,
            reserved_memory,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_policies_and_reservations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\nkubeReserved: {cpu: 500m, memory: 1Gi}\nsystemReserved: {cpu: \"1\"}\nevictionHard: {memory.available: 100Mi, nodefs.available: 10%}\nreservedSystemCPUs: 0-1\nsomethingElse: 3\n",
        )
        .unwrap();
        let p = KubeletConfig::load(&path).unwrap();
        assert_eq!(p.cpu_manager_policy, "static");
        assert_eq!(p.topology_manager_policy, "single-numa-node");
        assert_eq!(p.topology_manager_scope, "container");
        assert_eq!(p.reserved_cpu_millis, 1500);
        assert_eq!(p.reserved_memory_bytes, (1 << 30) + 100 * (1 << 20));
        assert_eq!(p.reserved_system_cpus.to_string(), "0-1");
        assert!(p.reserved_memory.is_empty());
    }

    #[test]
    fn reserved_memory_flag_is_the_kubelets_syntax() {
        let entries =
            parse_reserved_memory_flag("0:memory=1Gi,hugepages-1Gi=2Gi; 1:memory=512Mi").unwrap();
        let config = KubeletConfig {
            reserved_memory: entries,
            ..KubeletConfig::default()
        };
        let p = config.policies().unwrap();
        assert_eq!(p.reserved_memory[&0]["hugepages-1Gi"], 2 << 30);
        assert_eq!(p.reserved_memory[&1]["memory"], 512 << 20);
        for (value, want) in [
            ("memory=1Gi", "not NUMA:resource"),
            ("x:memory=1Gi", "\"x\" is not a NUMA node id"),
            ("0:memory", "not resource=quantity"),
            ("0:", "no resource=quantity"),
            ("0:memory=1Gi,memory=2Gi", "given twice"),
        ] {
            let err = parse_reserved_memory_flag(value).unwrap_err();
            assert!(err.contains(want), "{value}: {err}");
        }
        assert!(parse_reserved_memory_flag("").unwrap().is_empty());
    }

    #[test]
    fn reads_reserved_memory_per_numa_node() {
        let p = KubeletConfig::parse(
            "memoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits: {memory: 1Gi, hugepages-2Mi: 4Mi}\n- numaNode: 1\n  limits: {memory: 512Mi}\n- numaNode: 1\n  limits: {memory: 512Mi}\n",
        )
        .unwrap();
        assert_eq!(
            p.reserved_memory,
            BTreeMap::from([
                (
                    0,
                    BTreeMap::from([
                        ("hugepages-2Mi".to_string(), 4 << 20),
                        ("memory".to_string(), 1 << 30)
                    ])
                ),
                (1, BTreeMap::from([("memory".to_string(), 1 << 30)])),
            ])
        );
        for (text, want) in [
            (
                "reservedMemory: [{numaNode: -1, limits: {memory: 1Gi}}]",
                "reservedMemory[0].numaNode: -1",
            ),
            (
                "reservedMemory: [{numaNode: 0, limits: {cpu: 1}}]",
                "reservedMemory[0].limits: \"cpu\"",
            ),
            (
                "reservedMemory: [{numaNode: 0, limits: {memory: lots}}]",
                "reservedMemory[0].limits.memory",
            ),
        ] {
            let err = KubeletConfig::parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn defaults_to_none() {
        let p = KubeletConfig::default().policies().unwrap();
        assert_eq!(
            (
                p.cpu_manager_policy.as_str(),
                p.topology_manager_policy.as_str()
            ),
            ("none", "none")
        );
    }

    #[test]
    fn bad_files_name_path_field_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        for (text, want) in [
            ("cpuManagerPolicy: turbo", "cpuManagerPolicy: \"turbo\""),
            ("kubeReserved: {cpu: lots}", "kubeReserved.cpu"),
            ("reservedSystemCPUs: 3-1", "reservedSystemCPUs"),
            ("cpuManagerPolicy: [static", ""),
            // Found while writing the kubelet_config fuzz target: the sum overflowed (a panic).
            (
                "kubeReserved: {memory: 10E}\nsystemReserved: {memory: 9E}",
                "systemReserved.memory: \"9E\" is too large",
            ),
            (
                "kubeReserved: {memory: 16E}\nevictionHard: {memory.available: 3E}",
                "evictionHard.memory.available",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = KubeletConfig::load(&path).unwrap_err().to_string();
            assert!(
                err.contains(&path.display().to_string()) && err.contains(want),
                "{err}"
            );
        }
        assert!(KubeletConfig::load(&dir.path().join("missing.yaml")).is_err());
    }
}
