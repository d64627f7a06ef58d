//! `fumarole.dev/devices`: the devices the scheduler extension chose for a pod, which the
//! device plugin hands out instead of choosing itself, so scheduler and kubelet agree. Both
//! sides use this one definition (the device plugin re-exports it).
//!
//! Format: a JSON object from resource name to the device ids of the whole pod, e.g.
//! `{"nvidia.com/gpu": ["GPU-8c2...", "GPU-3f1..."]}`. A pod whose containers request the
//! resource one after another gets the ids in that order (each container takes the next ones
//! that are still free).
//!
//! `fumarole.dev/devices-node` names the node the choice is for. It is written with the choice
//! and matters while the pod is not bound yet (Volcano binds after `allocateFunc`): the devices
//! are promised on that node, and a restarted or newly elected scheduler extension counts them
//! as taken from the pod alone.

use std::collections::BTreeMap;

pub mod ascend;

/// The pod annotation key.
pub const DEVICES_ANNOTATION: &str = "fumarole.dev/devices";

/// The node [`DEVICES_ANNOTATION`]'s devices are on.
pub const DEVICES_NODE_ANNOTATION: &str = "fumarole.dev/devices-node";

/// Resource name -> device ids.
pub type DeviceChoice = BTreeMap<String, Vec<String>>;

/// Why an annotation value is unusable; the pod is skipped with this reason in the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("{DEVICES_ANNOTATION} is not a JSON object of resource name to device id list: {0}")]
    Json(String),
    #[error("{DEVICES_ANNOTATION}: resource {resource:?} lists device {id:?} twice")]
    Duplicate { resource: String, id: String },
    #[error("{DEVICES_ANNOTATION}: resource {0:?} has an empty device id")]
    EmptyId(String),
}

/// Parses an annotation value.
pub fn parse(value: &str) -> Result<DeviceChoice, AnnotationError> {
    let choice: DeviceChoice =
        serde_json::from_str(value).map_err(|e| AnnotationError::Json(e.to_string()))?;
    for (resource, ids) in &choice {
        let mut seen = std::collections::BTreeSet::new();
        for id in ids {
            if id.is_empty() {
                return Err(AnnotationError::EmptyId(resource.clone()));
            }
            if !seen.insert(id) {
                return Err(AnnotationError::Duplicate {
                    resource: resource.clone(),
                    id: id.clone(),
                });
            }
        }
    }
    Ok(choice)
}

/// The annotation value for a choice (what the scheduler extension writes).
pub fn format(choice: &DeviceChoice) -> String {
    serde_json::to_string(choice).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let c = parse(r#"{"nvidia.com/gpu": ["GPU-a", "GPU-b"]}"#).unwrap();
        assert_eq!(c["nvidia.com/gpu"], vec!["GPU-a", "GPU-b"]);
        assert_eq!(parse(&format(&c)).unwrap(), c);
        assert!(matches!(
            parse("GPU-a,GPU-b"),
            Err(AnnotationError::Json(_))
        ));
        assert!(matches!(
            parse(r#"{"nvidia.com/gpu": "GPU-a"}"#),
            Err(AnnotationError::Json(_))
        ));
        assert!(matches!(
            parse(r#"{"x/y": ["a", "a"]}"#),
            Err(AnnotationError::Duplicate { .. })
        ));
        assert!(matches!(
            parse(r#"{"x/y": [""]}"#),
            Err(AnnotationError::EmptyId(_))
        ));
    }
}
