//! The kubelet CPU manager checkpoint (`/var/lib/kubelet/cpu_manager_state`):
//! `{"policyName": "static", "defaultCpuSet": "0-1,6-63", "entries": {"<pod uid>":
//! {"<container>": "2-5"}}, "checksum": 123}`. Entries are the exclusive CPUs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fumarole_topology::CpuSet;
use serde::Deserialize;

use super::{ContainerAllocation, PodAllocation};

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    policy_name: String,
    #[serde(default)]
    default_cpu_set: String,
    #[serde(default)]
    entries: BTreeMap<String, BTreeMap<String, String>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuManagerState {
    pub policy_name: String,
    pub default_cpu_set: CpuSet,
    /// Pod uid -> container -> exclusive CPUs.
    pub entries: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("CPU manager checkpoint {path}: no such file")]
    Missing { path: PathBuf },
    #[error("CPU manager checkpoint {path}: {reason}")]
    Read {
        path: PathBuf,
        reason: std::io::Error,
    },
    #[error("CPU manager checkpoint {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

impl CpuManagerState {
    pub fn load(path: &Path) -> Result<Self, StateError> {
        let text = std::fs::read_to_string(path).map_err(|reason| StateError::Read {
            path: path.to_path_buf(),
            reason,
        })?;
        Self::parse(&text).map_err(|reason| StateError::Corrupt {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// A checkpoint's text; the error says what is corrupt.
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let default_cpu_set =
            CpuSet::parse(&raw.default_cpu_set).map_err(|e| format!("defaultCpuSet: {e}"))?;
        let mut entries = BTreeMap::new();
        for (uid, containers) in raw.entries {
            let mut parsed = BTreeMap::new();
            for (name, cpus) in containers {
                let set =
                    CpuSet::parse(&cpus).map_err(|e| format!("entries[{uid}][{name}]: {e}"))?;
                parsed.insert(name, set);
            }
            entries.insert(uid, parsed);
        }
        Ok(Self {
            policy_name: raw.policy_name,
            default_cpu_set,
            entries,
        })
    }

    /// Allocations by pod uid (the checkpoint has no pod names).
    pub fn pod_allocations(&self) -> Vec<PodAllocation> {
        self.entries
            .iter()
            .map(|(uid, containers)| PodAllocation {
                uid: Some(uid.clone()),
                name: String::new(),
                namespace: String::new(),
                containers: containers
                    .iter()
                    .map(|(name, cpus)| ContainerAllocation {
                        name: name.clone(),
                        cpus: cpus.clone(),
                        devices: BTreeMap::new(),
                        memory: Vec::new(),
                        claimed: Vec::new(),
                    })
                    .collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_entries_and_rejects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu_manager_state");
        std::fs::write(&path, r#"{"policyName":"static","defaultCpuSet":"0-1,6-7","entries":{"uid-1":{"app":"2-5"}},"checksum":1}"#).unwrap();
        let s = CpuManagerState::load(&path).unwrap();
        assert_eq!(s.entries["uid-1"]["app"].to_string(), "2-5");
        let pods = s.pod_allocations();
        assert_eq!(pods[0].uid.as_deref(), Some("uid-1"));
        assert_eq!(pods[0].containers[0].cpus.to_string(), "2-5");

        for bad in [
            r#"{"policyName":"static","entries":{"u":{"c":"9-2"}}}"#,
            "{\"policyNa",
            "",
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = CpuManagerState::load(&path).unwrap_err().to_string();
            assert!(
                err.contains("corrupt") && err.contains(&path.display().to_string()),
                "{err}"
            );
        }
    }
}
