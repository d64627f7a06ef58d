//! Facts about a Kubernetes pod that more than one component needs, written once: its
//! `namespace/name` key, a reference to it for Events, and its effective request of a
//! resource, as Kubernetes computes it.
//!
//! Effective request (the rule of `k8s.io/component-helpers/resource`, which both the scheduler
//! and the kubelet use): pod-level `spec.resources.requests` when set; else the larger of
//! (app containers + sidecars) and each regular init container plus the sidecars started
//! before it (sidecars are init containers with `restartPolicy: Always`); plus `spec.overhead`.
//! A container's amount is its request, else its limit: the API server defaults a missing
//! request to the limit, so objects built without that defaulting (snapshots, tests) count the
//! same.

use k8s_openapi::api::core::v1::{Container, ObjectReference, Pod, PodSpec};

use crate::quantity::QuantityError;

/// `namespace/name` of a pod (`default` without a namespace; the `generateName` prefix, else
/// `<unnamed>`, without a name).
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata
            .name
            .as_deref()
            .or(pod.metadata.generate_name.as_deref())
            .unwrap_or("<unnamed>")
    )
}

/// A reference to a pod, as Events about it name it.
pub fn reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..ObjectReference::default()
    }
}

/// A quantity in a pod spec that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{field} = {value:?}: {source}", container.as_ref().map(|c| format!("container {c}: ")).unwrap_or_default())]
pub struct AmountError {
    /// The container, when the quantity is a container's.
    pub container: Option<String>,
    /// Where the quantity is: `requests.cpu`, `limits.nvidia.com/gpu`,
    /// `spec.resources.requests.cpu`, `spec.overhead.memory`.
    pub field: String,
    pub value: String,
    #[source]
    pub source: QuantityError,
}

/// How a quantity string becomes a number (`quantity::cpu_millis`, `units`, `whole`).
pub type Parse = fn(&str) -> Result<u64, QuantityError>;

/// The container's amount of `resource`: its request, else its limit (0 with neither).
pub fn container_amount(c: &Container, resource: &str, parse: Parse) -> Result<u64, AmountError> {
    let res = c.resources.as_ref();
    let found = [
        ("requests", res.and_then(|r| r.requests.as_ref())),
        ("limits", res.and_then(|r| r.limits.as_ref())),
    ]
    .into_iter()
    .find_map(|(kind, m)| m.and_then(|m| m.get(resource)).map(|q| (kind, q)));
    let Some((kind, q)) = found else {
        return Ok(0);
    };
    parse(&q.0).map_err(|source| AmountError {
        container: Some(c.name.clone()),
        field: format!("{kind}.{resource}"),
        value: q.0.clone(),
        source,
    })
}

/// The pod's effective request of `resource` (see the module doc), saturating at `u64::MAX`.
pub fn effective_request(spec: &PodSpec, resource: &str, parse: Parse) -> Result<u64, AmountError> {
    let pod_field = |field: &str, q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        parse(&q.0).map_err(|source| AmountError {
            container: None,
            field: format!("{field}.{resource}"),
            value: q.0.clone(),
            source,
        })
    };
    let pod_level = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource));
    let base = match pod_level {
        Some(q) => pod_field("spec.resources.requests", q)?,
        None => {
            let mut sidecars = 0u64;
            let mut init_peak = 0u64;
            for c in spec.init_containers.iter().flatten() {
                let r = container_amount(c, resource, parse)?;
                if c.restart_policy.as_deref() == Some("Always") {
                    sidecars = sidecars.saturating_add(r);
                } else {
                    init_peak = init_peak.max(sidecars.saturating_add(r));
                }
            }
            let mut app = 0u64;
            for c in &spec.containers {
                app = app.saturating_add(container_amount(c, resource, parse)?);
            }
            init_peak.max(app.saturating_add(sidecars))
        }
    };
    let overhead = match spec.overhead.as_ref().and_then(|o| o.get(resource)) {
        Some(q) => pod_field("spec.overhead", q)?,
        None => 0,
    };
    Ok(base.saturating_add(overhead))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::quantity::{cpu_millis, whole};

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn init_containers_sidecars_overhead_and_pod_level() {
        let s = spec(serde_json::json!({
            "initContainers": [
                {"name": "setup", "resources": {"requests": {"cpu": "3"}}},
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
                {"name": "late", "resources": {"limits": {"cpu": "2"}}},
            ],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}},
                {"name": "b", "resources": {"limits": {"cpu": "250m"}}},
            ],
            "overhead": {"cpu": "100m"}
        }));
        // max(setup 3, proxy + late 2.5, app 1.25 + proxy 0.5) + overhead 0.1
        assert_eq!(effective_request(&s, "cpu", cpu_millis).unwrap(), 3100);
        assert_eq!(effective_request(&s, "memory", cpu_millis).unwrap(), 0);
        let pod_level = spec(serde_json::json!({
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "8"}}}],
            "resources": {"requests": {"cpu": "2"}}
        }));
        assert_eq!(
            effective_request(&pod_level, "cpu", cpu_millis).unwrap(),
            2000
        );
    }

    #[test]
    fn errors_name_the_container_and_field() {
        let s = spec(serde_json::json!({"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}));
        let e = effective_request(&s, "nvidia.com/gpu", whole).unwrap_err();
        assert_eq!(e.container.as_deref(), Some("a"));
        assert_eq!(
            e.to_string(),
            "container a: limits.nvidia.com/gpu = \"500m\": \"500m\" is not a whole number"
        );
        let o = spec(serde_json::json!({"containers": [], "overhead": {"cpu": "lots"}}));
        let e = effective_request(&o, "cpu", cpu_millis).unwrap_err();
        assert_eq!(e.container, None);
        assert_eq!(e.field, "spec.overhead.cpu");
    }

    #[test]
    fn keys() {
        let p: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"generateName": "job-"}}))
                .unwrap();
        assert_eq!(key(&p), "default/job-");
        let p: Pod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}}),
        )
        .unwrap();
        assert_eq!(key(&p), "ns/a");
    }
}
