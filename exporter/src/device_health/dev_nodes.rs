//! The device-node source: a device is healthy while every one of its device nodes exists
//! under the root (`/dev/nvidia3`, `/dev/davinci5`, ...), and healthy again when a missing one
//! comes back. This is the only source on a node without the vendor libraries.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fumarole_topology::{Fault, FaultKind, NodeHealth};

use super::SourceHandle;

/// How often device nodes are looked at.
pub const POLL: Duration = Duration::from_millis(500);

/// The faults of `devices` (id and device nodes) under `root` now.
pub fn check(root: &Path, devices: &[(String, Vec<String>)]) -> NodeHealth {
    let mut h = NodeHealth::default();
    for (id, nodes) in devices {
        for node in nodes {
            if !root.join(node.trim_start_matches('/')).exists() {
                h.add(
                    id,
                    Fault::new(
                        FaultKind::DevNodeMissing,
                        format!("device node {node} is missing"),
                    ),
                );
            }
        }
    }
    h
}

/// Checks `devices` under `root` once now (so the stream is right before anyone subscribes),
/// then every [`POLL`] from a tokio task, and reports to `source`.
pub fn spawn(root: PathBuf, devices: Vec<(String, Vec<String>)>, source: SourceHandle) {
    source.report(check(&root, &devices));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(POLL).await;
            source.report(check(&root, &devices));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_node_is_a_fault_until_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("dev/nvidia0"), "").unwrap();
        let devices = vec![
            ("g0".to_string(), vec!["/dev/nvidia0".to_string()]),
            ("g1".to_string(), vec!["/dev/nvidia1".to_string()]),
        ];
        let h = check(dir.path(), &devices);
        assert!(h.is_healthy("g0"));
        assert_eq!(
            h.reason("g1").as_deref(),
            Some("dev-node-missing: device node /dev/nvidia1 is missing")
        );
        std::fs::write(dir.path().join("dev/nvidia1"), "").unwrap();
        assert_eq!(check(dir.path(), &devices), NodeHealth::default());
    }
}
