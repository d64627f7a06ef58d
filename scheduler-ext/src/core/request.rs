//! A pod's accelerator request: which accelerator resource and how many devices.
//!
//! The pod asks for its effective request of the resource, as the kubelet counts it
//! ([`fumarole_topology::pod::effective_request`]: containers, init containers and sidecars).
//! A resource is an accelerator when a known vendor prefix names it (`nvidia.com/`,
//! `huawei.com/`, `metax-tech.com/`, `amd.com/gpu`, `gpu.intel.com/`,
//! `fumarole.dev/accelerator`) or some node of the view offers it.
//!
//! A pod may instead ask through ResourceClaims of fumarole's DRA classes ([`super::claims`]):
//! the class (`gpu.fumarole.dev`, `npu.fumarole.dev`) is then its resource and the claims'
//! device count its count. An extended-resource accelerator and a claim of ours in one pod, or
//! claims of both classes, are [`RequestError::Mixed`]. A claim already allocated counts only
//! for a bound pod (its unit membership): a pod not bound yet whose claim is allocated already
//! has its devices, on the node the allocation names, and asks for nothing more.
//!
//! [`pod_request`] adds what placement needs beyond the count: the pod's gpu-group-size unit
//! ([`UnitMember`]) and, for `volcano.sh/numa-topology-policy:
//! single-numa-node`, the whole CPUs that must sit on the devices' NUMA node.

use std::collections::{BTreeMap, BTreeSet};

use fumarole_topology::{pod, quantity};
use k8s_openapi::api::core::v1::Pod;

use crate::core::claims::{ClaimRef, Claims, our_class, pod_claims};
use crate::core::unit::{self, Jobs, UnitError, UnitKey, UnitMember};

/// Volcano's pod annotation for the topology policy of one pod.
pub const NUMA_POLICY: &str = "volcano.sh/numa-topology-policy";

/// Why a pod's request cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The pod asks for no accelerator at all.
    #[error("pod {pod} requests no accelerator resource (none of {known})")]
    NoAccelerator { pod: String, known: String },
    /// An accelerator resource no node in the cluster view offers.
    #[error(
        "pod {pod} requests {resource}, which no node in the cluster view offers (offered: {offered})"
    )]
    UnknownResource {
        pod: String,
        resource: String,
        offered: String,
    },
    /// A quantity that is not a whole number of devices.
    #[error(
        "pod {pod}, container {container}: {resource} = {value:?} is not a whole number of devices"
    )]
    BadQuantity {
        pod: String,
        container: String,
        resource: String,
        value: String,
    },
    /// More than one accelerator resource in one pod.
    #[error("pod {pod} requests more than one accelerator resource ({resources}); not supported")]
    Mixed { pod: String, resources: String },
    /// Unusable gpu-group-size annotations.
    #[error("pod {pod}: {source}")]
    Unit {
        pod: String,
        #[source]
        source: UnitError,
    },
    /// A ResourceClaim the pod uses that the view has not seen.
    #[error("pod {pod} uses ResourceClaim {claim}, which does not exist (yet)")]
    ClaimMissing { pod: String, claim: String },
    /// A claim from a template that the resource claim controller has not generated yet.
    #[error(
        "pod {pod}: the ResourceClaim of entry {entry:?} (template {template}) is not generated yet"
    )]
    ClaimNotGenerated {
        pod: String,
        entry: String,
        template: String,
    },
    /// A claim whose device requests cannot be read.
    #[error("pod {pod}: {reason}")]
    BadClaim { pod: String, reason: String },
    /// A CPU quantity that cannot be read.
    #[error("pod {pod}, container {container}: cpu = {value:?} is not a CPU quantity")]
    BadCpu {
        pod: String,
        container: String,
        value: String,
    },
}

/// Everything placement needs to know about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRequest {
    pub devices: DeviceRequest,
    /// The pod's place in its gpu-group-size unit; `None` outside any unit.
    pub unit: Option<UnitMember>,
    /// Whole CPUs that must share one NUMA node with the devices (`single-numa-node`).
    pub numa_cpus: Option<u32>,
}

/// The pod's request: devices, unit and NUMA need. `jobs` holds what the other pods of the
/// pod's job say (their group annotations, their tasks). ResourceClaims are not read
/// ([`pod_request_in`] reads them).
pub fn pod_request(
    pod: &Pod,
    offered: &BTreeSet<&str>,
    jobs: &Jobs,
) -> Result<PodRequest, RequestError> {
    pod_request_in(pod, offered, jobs, &Claims::default())
}

/// [`pod_request`], the pod's ResourceClaims read from `claims`.
pub fn pod_request_in(
    pod: &Pod,
    offered: &BTreeSet<&str>,
    jobs: &Jobs,
    claims: &Claims,
) -> Result<PodRequest, RequestError> {
    let devices = RequestFacts::of(pod).request(offered, claims)?;
    let gpus = u32::try_from(devices.count).unwrap_or(u32::MAX);
    let unit = unit::unit_spec(pod, gpus, jobs)
        .map_err(|source| RequestError::Unit {
            pod: devices.pod.clone(),
            source,
        })?
        .map(|spec| UnitMember {
            key: UnitKey::of(pod, &spec),
            spec,
            gpus,
        });
    let single_numa = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NUMA_POLICY))
        .is_some_and(|p| p.trim() == "single-numa-node");
    let numa_cpus = if single_numa {
        Some(cpu_millis(pod, &devices.pod)?.div_ceil(1000))
    } else {
        None
    };
    Ok(PodRequest {
        devices,
        unit,
        numa_cpus,
    })
}

/// The pod's effective CPU request in millicores ([`pod::effective_request`]).
fn cpu_millis(pod: &Pod, key: &str) -> Result<u32, RequestError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(0);
    };
    let millis = pod::effective_request(spec, "cpu", quantity::cpu_millis).map_err(|e| {
        RequestError::BadCpu {
            pod: key.to_string(),
            container: e.container.unwrap_or_else(|| e.field.clone()),
            value: e.value,
        }
    })?;
    Ok(u32::try_from(millis).unwrap_or(u32::MAX))
}

/// Resource-name prefixes of the accelerator vendors the project knows.
pub const KNOWN_PREFIXES: &[&str] = &[
    "nvidia.com/",
    "huawei.com/",
    "metax-tech.com/",
    "amd.com/gpu",
    "gpu.intel.com/",
    "fumarole.dev/accelerator",
];

/// What a pod asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRequest {
    /// `namespace/name`.
    pub pod: String,
    pub resource: String,
    pub count: usize,
}

impl DeviceRequest {
    /// True when the devices come from ResourceClaims: `resource` is a fumarole DRA class and
    /// kube-scheduler's DRA allocator, not this service, picks them on the node.
    pub fn from_claims(&self) -> bool {
        our_class(&self.resource).is_some()
    }
}

/// `namespace/name` of a pod ([`fumarole_topology::pod::key`]).
pub use fumarole_topology::pod::key as pod_key;

fn is_accelerator(name: &str, offered: &BTreeSet<&str>) -> bool {
    offered.contains(name) || KNOWN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Every resource the pod's containers name with a domain (`vendor.com/thing`), in requests or
/// limits: the names that may be accelerators, whatever the cluster offers.
fn domain_resource_names(pod: &Pod) -> BTreeSet<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return BTreeSet::new();
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| [&r.limits, &r.requests])
        .flatten()
        .flat_map(|m| m.keys())
        .filter(|k| k.contains('/'))
        .cloned()
        .collect()
}

/// What a pod's request depends on, read once per version of the pod: its effective count of
/// every resource that may be an accelerator. [`Self::request`] then checks it against the
/// resources a view offers, so a view rebuilt after a change elsewhere need not read the pod
/// again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    /// `namespace/name`.
    pod: String,
    /// Resource name (sorted) -> the effective request, or why it cannot be read.
    counts: Vec<(String, Result<usize, RequestError>)>,
    /// The ResourceClaims the pod uses ([`pod_claims`]).
    claims: Vec<ClaimRef>,
    /// `spec.nodeName` is set.
    bound: bool,
}

impl RequestFacts {
    pub fn of(pod: &Pod) -> Self {
        let key = pod_key(pod);
        let counts = match pod.spec.as_ref() {
            None => Vec::new(),
            Some(spec) => domain_resource_names(pod)
                .into_iter()
                .map(|name| {
                    let n = pod::effective_request(spec, &name, quantity::whole)
                        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
                        .map_err(|e| RequestError::BadQuantity {
                            pod: key.clone(),
                            container: e.container.unwrap_or_else(|| e.field.clone()),
                            resource: name.clone(),
                            value: e.value,
                        });
                    (name, n)
                })
                .collect(),
        };
        RequestFacts {
            pod: key,
            counts,
            claims: pod_claims(pod),
            bound: pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()),
        }
    }

    /// Devices asked per fumarole class through the pod's claims. Without claim data
    /// (`claims` empty and not served: a cluster without DRA) the pod's claims are not read.
    fn claim_asks(&self, claims: &Claims) -> Result<BTreeMap<&'static str, usize>, RequestError> {
        let mut asks = BTreeMap::new();
        if !claims.served() {
            return Ok(asks);
        }
        for r in &self.claims {
            let key = match r {
                ClaimRef::Claim(key) => key,
                ClaimRef::NotGenerated { entry, template } => {
                    return Err(RequestError::ClaimNotGenerated {
                        pod: self.pod.clone(),
                        entry: entry.clone(),
                        template: template.clone(),
                    });
                }
            };
            let facts = match claims.get(key) {
                None => {
                    return Err(RequestError::ClaimMissing {
                        pod: self.pod.clone(),
                        claim: key.clone(),
                    });
                }
                Some(Err(reason)) => {
                    return Err(RequestError::BadClaim {
                        pod: self.pod.clone(),
                        reason: reason.clone(),
                    });
                }
                Some(Ok(f)) => f,
            };
            if facts.allocated && !self.bound {
                continue;
            }
            for (class, n) in &facts.asks {
                let total: &mut usize = asks.entry(*class).or_default();
                *total = total.saturating_add(*n);
            }
        }
        Ok(asks)
    }

    /// The pod's accelerator request, checked against the resources the view's nodes offer;
    /// its ResourceClaims read from `claims`.
    pub fn request(
        &self,
        offered: &BTreeSet<&str>,
        claims: &Claims,
    ) -> Result<DeviceRequest, RequestError> {
        let key = &self.pod;
        let mut asked: Vec<(&str, usize)> = Vec::new();
        for (name, n) in self
            .counts
            .iter()
            .filter(|(k, _)| is_accelerator(k, offered))
        {
            match n {
                Err(e) => return Err(e.clone()),
                Ok(n) if *n > 0 => asked.push((name.as_str(), *n)),
                Ok(_) => {}
            }
        }
        asked.extend(self.claim_asks(claims)?.into_iter().filter(|(_, n)| *n > 0));
        let mut it = asked.into_iter();
        let Some((resource, count)) = it.next() else {
            return Err(RequestError::NoAccelerator {
                pod: key.clone(),
                known: KNOWN_PREFIXES
                    .iter()
                    .copied()
                    .chain(offered.iter().copied())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        if let Some((other, _)) = it.next() {
            return Err(RequestError::Mixed {
                pod: key.clone(),
                resources: format!("{resource}, {other}"),
            });
        }
        if !offered.contains(resource) {
            return Err(RequestError::UnknownResource {
                pod: key.clone(),
                resource: resource.to_string(),
                offered: offered.iter().copied().collect::<Vec<_>>().join(", "),
            });
        }
        Ok(DeviceRequest {
            pod: key.clone(),
            resource: resource.to_string(),
            count,
        })
    }
}

/// The pod's accelerator request, checked against the resources the view's nodes offer.
pub fn device_request(pod: &Pod, offered: &BTreeSet<&str>) -> Result<DeviceRequest, RequestError> {
    RequestFacts::of(pod).request(offered, &Claims::default())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn offered() -> BTreeSet<&'static str> {
        ["nvidia.com/gpu", "huawei.com/Ascend910"].into()
    }

    #[test]
    fn sums_containers_limits_first_and_init_max() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "5"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}, "requests": {"nvidia.com/gpu": "2"}}},
                    {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
                ]
            }
        }));
        let r = device_request(&p, &offered()).unwrap();
        assert_eq!(r.pod, "ns/p");
        assert_eq!(r.resource, "nvidia.com/gpu");
        assert_eq!(r.count, 5);
    }

    #[test]
    fn numa_cpus_and_group() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "w-3", "namespace": "ns", "annotations": {
                NUMA_POLICY: "single-numa-node", "fumarole.dev/gpu-group-size": "4"}},
            "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1500m"}, "limits": {"nvidia.com/gpu": "2"}}},
                {"name": "b", "resources": {"limits": {"cpu": "2"}}}]}
        }));
        let r = pod_request(&p, &offered(), &Jobs::default()).unwrap();
        assert_eq!(r.numa_cpus, Some(4));
        let g = r.unit.unwrap();
        assert_eq!((g.key.job.as_str(), g.key.unit, g.gpus), ("ns/w", 1, 2));
        let bad = pod(serde_json::json!({
            "metadata": {"name": "w-0", "annotations": {NUMA_POLICY: "single-numa-node"}},
            "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "lots"}, "limits": {"nvidia.com/gpu": "2"}}}]}
        }));
        assert!(matches!(
            pod_request(&bad, &offered(), &Jobs::default()),
            Err(RequestError::BadCpu { .. })
        ));
        let odd = pod(serde_json::json!({
            "metadata": {"name": "w-0", "annotations": {"metax-tech.com/gpu-group-size": "3"}},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
        }));
        let e = pod_request(&odd, &offered(), &Jobs::default()).unwrap_err();
        assert!(
            e.to_string().contains("not a multiple of the pod's 2 GPUs"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let cpu = pod(
            serde_json::json!({"metadata": {"name": "c"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "2"}}}]}}),
        );
        assert!(matches!(
            device_request(&cpu, &offered()),
            Err(RequestError::NoAccelerator { .. })
        ));
        let unknown = pod(
            serde_json::json!({"metadata": {"name": "u"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"metax-tech.com/gpu": "1"}}}]}}),
        );
        let e = device_request(&unknown, &offered()).unwrap_err();
        assert!(e.to_string().contains("metax-tech.com/gpu"), "{e}");
        let half = pod(
            serde_json::json!({"metadata": {"name": "h"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}}),
        );
        assert!(matches!(
            device_request(&half, &offered()),
            Err(RequestError::BadQuantity { .. })
        ));
        let mixed = pod(
            serde_json::json!({"metadata": {"name": "m"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "huawei.com/Ascend910": "1"}}}]}}),
        );
        assert!(matches!(
            device_request(&mixed, &offered()),
            Err(RequestError::Mixed { .. })
        ));
    }

    mod claims {
        use super::*;
        use crate::core::claims::testing::{claim, claim_pod};
        use crate::core::claims::{ClaimFacts, Claims};

        const NPU: &str = "npu.fumarole.dev";
        const GPU: &str = "gpu.fumarole.dev";

        fn offered() -> BTreeSet<&'static str> {
            ["huawei.com/Ascend910", NPU, "nvidia.com/gpu", GPU].into()
        }

        fn claims() -> Claims {
            let nic = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "nic", "namespace": "ml"},
                "spec": {"devices": {"requests": [
                    {"name": "r", "exactly": {"deviceClassName": "nic.example.com", "count": 2}}]}}
            }))
            .unwrap();
            let bad = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "bad", "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "r"}]}}
            }))
            .unwrap();
            let list = [
                claim("two", NPU, 2, None),
                claim("one", NPU, 1, None),
                claim("gpu", GPU, 4, None),
                claim("held", NPU, 1, Some(("n1", &[0]))),
                nic,
                bad,
            ];
            Claims::new(&list)
        }

        fn ask(pod: &Pod) -> Result<DeviceRequest, RequestError> {
            RequestFacts::of(pod).request(&offered(), &claims())
        }

        #[test]
        fn claims_of_our_classes_are_the_request() {
            let none = serde_json::json!({});
            let r = ask(&claim_pod("p", &["two", "one", "nic"], None, none.clone())).unwrap();
            assert_eq!((r.resource.as_str(), r.count), (NPU, 3));
            assert!(r.from_claims());
            let g = ask(&claim_pod("g", &["gpu"], None, none.clone())).unwrap();
            assert_eq!((g.resource.as_str(), g.count), (GPU, 4));
            // Only another driver's claim: no accelerator of ours.
            assert!(matches!(
                ask(&claim_pod("n", &["nic"], None, none.clone())),
                Err(RequestError::NoAccelerator { .. })
            ));
            // An extended-resource pod is what it was.
            let ext = ask(&claim_pod(
                "e",
                &["nic"],
                None,
                serde_json::json!({"huawei.com/Ascend910": "2"}),
            ))
            .unwrap();
            assert_eq!(
                (ext.resource.as_str(), ext.count),
                ("huawei.com/Ascend910", 2)
            );
            assert!(!ext.from_claims());
            // Without claim data (a snapshot) the claims are not read.
            let unread = RequestFacts::of(&claim_pod("u", &["two"], None, none))
                .request(&offered(), &Claims::default());
            assert!(matches!(unread, Err(RequestError::NoAccelerator { .. })));
        }

        #[test]
        fn an_allocated_claim_counts_only_for_a_bound_pod() {
            let none = serde_json::json!({});
            assert!(matches!(
                ask(&claim_pod("w", &["held"], None, none.clone())),
                Err(RequestError::NoAccelerator { .. })
            ));
            let bound = ask(&claim_pod("b", &["held"], Some("n1"), none)).unwrap();
            assert_eq!((bound.resource.as_str(), bound.count), (NPU, 1));
        }

        #[test]
        fn mixed_missing_unreadable_and_ungenerated_claims_are_errors() {
            let none = serde_json::json!({});
            let e = ask(&claim_pod(
                "m",
                &["one"],
                None,
                serde_json::json!({"huawei.com/Ascend910": "1"}),
            ))
            .unwrap_err();
            assert!(matches!(e, RequestError::Mixed { .. }), "{e}");
            assert!(e.to_string().contains(NPU), "{e}");
            assert!(matches!(
                ask(&claim_pod("m2", &["one", "gpu"], None, none.clone())),
                Err(RequestError::Mixed { .. })
            ));
            let e = ask(&claim_pod("x", &["gone"], None, none.clone())).unwrap_err();
            assert_eq!(
                e.to_string(),
                "pod ml/x uses ResourceClaim ml/gone, which does not exist (yet)"
            );
            let e = ask(&claim_pod("y", &["bad"], None, none.clone())).unwrap_err();
            assert!(
                matches!(e, RequestError::BadClaim { .. }) && e.to_string().contains("ml/bad"),
                "{e}"
            );
            let templated: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "t", "namespace": "ml"},
                "spec": {"containers": [], "resourceClaims": [
                    {"name": "npus", "resourceClaimTemplateName": "tpl"}]}
            }))
            .unwrap();
            let e = ask(&templated).unwrap_err();
            assert!(matches!(e, RequestError::ClaimNotGenerated { .. }), "{e}");
            // Once generated, the claim named in the status is read.
            let mut generated = templated.clone();
            generated.status = serde_json::from_value(serde_json::json!({
                "resourceClaimStatuses": [{"name": "npus", "resourceClaimName": "two"}]}))
            .unwrap();
            assert_eq!(ask(&generated).unwrap().count, 2);
            // A class no node offers.
            let e = RequestFacts::of(&claim_pod("z", &["gpu"], None, none))
                .request(&["huawei.com/Ascend910", NPU].into(), &claims())
                .unwrap_err();
            assert!(matches!(e, RequestError::UnknownResource { .. }), "{e}");
            assert!(ClaimFacts::of(&claim("ok", NPU, 1, None)).is_ok());
        }
    }
}
