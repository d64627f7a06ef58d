//! Cluster snapshots: a [`ClusterView`] from YAML or JSON files instead of an API server.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file directly in the directory is read, in name order.
//! A file holds one object, a `kind: List` (or `DeviceTopologyList`, `PodList`, ...; anything
//! with `items`), or several YAML documents, as `kubectl get -o yaml` writes them. Objects of
//! kind `DeviceTopology`, `Numatopology`, `Node` and `Pod` are used; other kinds are skipped.

use std::path::{Path, PathBuf};

use fumarole_topology::crd::{DeviceTopology, Numatopology};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Deserialize;

use crate::core::view::{ClusterView, ViewError};

/// Why a snapshot cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A file or directory could not be read.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A document is not valid YAML / JSON.
    #[error("{path}: document {doc}: {message}")]
    Parse {
        path: PathBuf,
        doc: usize,
        message: String,
    },
    /// An object of a known kind does not match its schema.
    #[error("{path}: {kind} {name}: {message}")]
    Object {
        path: PathBuf,
        kind: String,
        name: String,
        message: String,
    },
    /// The objects do not form a valid view.
    #[error("{0}")]
    View(#[from] ViewError),
    /// Nothing usable in the directory.
    #[error("{0}: no DeviceTopology or Node objects found")]
    Empty(PathBuf),
}

/// The objects read from a snapshot, before they become a view.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub topologies: Vec<DeviceTopology>,
    pub numatopologies: Vec<Numatopology>,
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
}

impl Objects {
    /// Adds the objects of one YAML or JSON text (`path` names it in errors).
    pub fn add_text(&mut self, path: &Path, text: &str) -> Result<(), SnapshotError> {
        for (doc, de) in serde_norway::Deserializer::from_str(text).enumerate() {
            let value = serde_json::Value::deserialize(de).map_err(|e| SnapshotError::Parse {
                path: path.to_path_buf(),
                doc: doc + 1,
                message: e.to_string(),
            })?;
            self.add_value(path, value)?;
        }
        Ok(())
    }

    fn add_value(&mut self, path: &Path, value: serde_json::Value) -> Result<(), SnapshotError> {
        if let Some(items) = value.get("items").and_then(|i| i.as_array()) {
            for item in items.clone() {
                self.add_value(path, item)?;
            }
            return Ok(());
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_string();
        let name = value
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .unwrap_or("<unnamed>")
            .to_string();
        let err = |e: serde_json::Error| SnapshotError::Object {
            path: path.to_path_buf(),
            kind: kind.clone(),
            name: name.clone(),
            message: e.to_string(),
        };
        match kind.as_str() {
            "DeviceTopology" => self
                .topologies
                .push(serde_json::from_value(value).map_err(err)?),
            "Numatopology" => self
                .numatopologies
                .push(serde_json::from_value(value).map_err(err)?),
            "Node" => self.nodes.push(serde_json::from_value(value).map_err(err)?),
            "Pod" => self.pods.push(serde_json::from_value(value).map_err(err)?),
            other => tracing::debug!(path = %path.display(), kind = other, "skipping object"),
        }
        Ok(())
    }

    /// The view of these objects; a node that would be skipped is an error here (a snapshot is
    /// something a person hands us to check).
    pub fn view(&self) -> Result<ClusterView, ViewError> {
        let mut view = ClusterView::build(
            &self.topologies,
            &self.numatopologies,
            self.nodes.iter().map(|n| &n.metadata),
            &self.pods,
        )?;
        if view.skipped.is_empty() {
            Ok(view)
        } else {
            Err(view.skipped.swap_remove(0))
        }
    }
}

/// Reads every snapshot file in `dir`.
pub fn read_dir(dir: &Path) -> Result<Objects, SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    files.retain(|p| {
        p.is_file()
            && matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
    });
    files.sort();
    let mut objects = Objects::default();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|source| SnapshotError::Io {
            path: f.clone(),
            source,
        })?;
        objects.add_text(f, &text)?;
    }
    if objects.topologies.is_empty() && objects.nodes.is_empty() {
        return Err(SnapshotError::Empty(dir.to_path_buf()));
    }
    Ok(objects)
}

/// The view of the snapshot in `dir`.
pub fn load(dir: &Path) -> Result<ClusterView, SnapshotError> {
    Ok(read_dir(dir)?.view()?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const TWO_DOCS: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: n1
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: ignored
---
apiVersion: v1
kind: Pod
metadata:
  name: p
spec:
  containers: []
"#;

    #[test]
    fn lists_and_documents() {
        let mut o = Objects::default();
        o.add_text(Path::new("x.yaml"), TWO_DOCS).unwrap();
        assert_eq!(o.nodes.len(), 1);
        assert_eq!(o.pods.len(), 1);
    }

    #[test]
    fn errors_name_file_and_object() {
        let mut o = Objects::default();
        let e = o
            .add_text(Path::new("bad.yaml"), "kind: Node\nmetadata: [\n")
            .unwrap_err();
        assert!(e.to_string().starts_with("bad.yaml: document 1"), "{e}");
        let e = o
            .add_text(
                Path::new("n.yaml"),
                "kind: Node\nmetadata:\n  name: n\n  labels: 5\n",
            )
            .unwrap_err();
        assert!(e.to_string().starts_with("n.yaml: Node n:"), "{e}");
    }

    #[test]
    fn empty_dir_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(read_dir(d.path()), Err(SnapshotError::Empty(_))));
        assert!(matches!(
            read_dir(&d.path().join("missing")),
            Err(SnapshotError::Io { .. })
        ));
    }
}
