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
}

impl KubeletConfig {
    pub fn load(path: &Path) -> Result<KubeletPolicies, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|reason| ConfigError::Read {
            path: path.to_path_buf(),
            reason,
        })?;
        Self::parse(&text).map_err(|reason| ConfigError::Invalid {
            path: path.to_path_buf(),
            reason,
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
