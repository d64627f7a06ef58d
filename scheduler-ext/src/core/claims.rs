//! ResourceClaims (`resource.k8s.io/v1`) as the decision core reads them: how many devices a
//! claim asks of fumarole's DRA classes, and which devices an allocated claim holds.
//!
//! A claim's request counts when its `deviceClassName` is one of fumarole's drivers
//! (`gpu.fumarole.dev`, `npu.fumarole.dev`: `deploy/dra` names each DeviceClass after its
//! driver). `exactly.count` gives the devices (1 when unset); for `firstAvailable`, the first
//! alternative's (the one kube-scheduler tries first). A request with `allocationMode: All`,
//! and requests of other classes, are not counted: the extension leaves them to kube-scheduler.
//!
//! The class is the pod's accelerator "resource" in the view: the view offers it on every node
//! with devices of that driver ([`super::view`]), so gpu-aware scoring and gpu-group-size
//! placement judge a claim pod as they judge a pod asking for the extended resource. Which
//! devices the pod gets on the node stays kube-scheduler's own DRA allocator's choice.
//!
//! An allocated claim's results of our drivers (pool = node name, device `<vendor>-<index>`,
//! [`fumarole_topology::dra`]) are devices in use on that node; a partition's result
//! (`<vendor>-<index>-<profile>-<placement>`) holds its device. Claims of the partition classes
//! (`gpu-partition.fumarole.dev`, ...) are not counted as asks: kube-scheduler's allocator
//! places them alone.

use std::collections::{BTreeMap, HashMap};

use fumarole_topology::dra::DRIVERS;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

/// One device an allocated claim holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldDevice {
    pub driver: String,
    /// The pool: the node's name.
    pub node: String,
    /// `<vendor>-<index>`.
    pub device: String,
}

/// What the core reads of one claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimFacts {
    /// Devices asked per fumarole class (driver name), summed over the claim's requests.
    pub asks: BTreeMap<&'static str, usize>,
    /// The claim has an allocation (`status.allocation`).
    pub allocated: bool,
    /// Devices of our drivers the allocation holds.
    pub held: Vec<HeldDevice>,
}

/// The fumarole class (driver) called `name`, if it is one.
pub fn our_class(name: &str) -> Option<&'static str> {
    DRIVERS.into_iter().find(|d| *d == name)
}

impl ClaimFacts {
    /// Reads `claim`; `Err` says why its ask cannot be used.
    pub fn of(claim: &ResourceClaim) -> Result<Self, String> {
        let key = claim_key(claim);
        let mut asks: BTreeMap<&'static str, usize> = BTreeMap::new();
        let requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_ref());
        for r in requests.into_iter().flatten() {
            let (class, count, mode) = match (&r.exactly, &r.first_available) {
                (Some(e), _) => (
                    e.device_class_name.as_str(),
                    e.count,
                    e.allocation_mode.as_deref(),
                ),
                (None, Some(alternatives)) => match alternatives.first() {
                    Some(s) => (
                        s.device_class_name.as_str(),
                        s.count,
                        s.allocation_mode.as_deref(),
                    ),
                    None => {
                        return Err(format!(
                            "ResourceClaim {key}: request {:?} has an empty firstAvailable",
                            r.name
                        ));
                    }
                },
                (None, None) => {
                    return Err(format!(
                        "ResourceClaim {key}: request {:?} has neither exactly nor firstAvailable",
                        r.name
                    ));
                }
            };
            let Some(class) = our_class(class) else {
                continue;
            };
            if mode.is_some_and(|m| m == "All") {
                continue;
            }
            let count = match count {
                None => 1,
                Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
                Some(n) => {
                    return Err(format!(
                        "ResourceClaim {key}: request {:?} asks for {n} devices of {class}",
                        r.name
                    ));
                }
            };
            let total = asks.entry(class).or_default();
            *total = total.saturating_add(count);
        }
        let allocation = claim.status.as_ref().and_then(|s| s.allocation.as_ref());
        let held = allocation
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| our_class(&r.driver).is_some())
            .map(|r| HeldDevice {
                driver: r.driver.clone(),
                node: r.pool.clone(),
                device: r.device.clone(),
            })
            .collect();
        Ok(ClaimFacts {
            asks,
            allocated: allocation.is_some(),
            held,
        })
    }
}

/// `namespace/name` of a claim.
pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or("default"),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Every claim the view knows, by `namespace/name`, read ([`ClaimFacts::of`]) or why not.
/// The default is "no claim data" (a snapshot, or an API server that does not serve
/// `resource.k8s.io/v1`): pods' claims are then not read at all.
#[derive(Clone, Debug, Default)]
pub struct Claims {
    served: bool,
    by_key: HashMap<String, Result<ClaimFacts, String>>,
}

impl Claims {
    /// The claims of a cluster that serves them (every claim there is).
    pub fn new<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> Self {
        Claims {
            served: true,
            by_key: claims
                .into_iter()
                .map(|c| (claim_key(c), ClaimFacts::of(c)))
                .collect(),
        }
    }

    /// The claim `namespace/name`: `None` when the view has not seen it.
    pub fn get(&self, key: &str) -> Option<&Result<ClaimFacts, String>> {
        self.by_key.get(key)
    }

    /// Every claim read, with its key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ClaimFacts)> {
        self.by_key
            .iter()
            .filter_map(|(k, c)| c.as_ref().ok().map(|c| (k.as_str(), c)))
    }

    /// False when there is no claim data at all ([`Claims::default`]).
    pub fn served(&self) -> bool {
        self.served
    }
}

/// One of a pod's `spec.resourceClaims`, resolved to the claim it uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimRef {
    /// The claim, `namespace/name`.
    Claim(String),
    /// From a template whose claim is not generated yet (no entry in
    /// `status.resourceClaimStatuses`).
    NotGenerated { entry: String, template: String },
}

/// The claims `pod` uses: `resourceClaimName`, or for `resourceClaimTemplateName` the claim
/// named for the entry in `status.resourceClaimStatuses` (an entry whose status names no claim
/// needs none and is left out).
pub fn pod_claims(pod: &Pod) -> Vec<ClaimRef> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    let mut out = Vec::new();
    let entries = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    for entry in entries.into_iter().flatten() {
        if let Some(name) = &entry.resource_claim_name {
            out.push(ClaimRef::Claim(format!("{ns}/{name}")));
        } else if let Some(template) = &entry.resource_claim_template_name {
            match statuses
                .into_iter()
                .flatten()
                .find(|s| s.name == entry.name)
            {
                Some(s) => {
                    if let Some(name) = &s.resource_claim_name {
                        out.push(ClaimRef::Claim(format!("{ns}/{name}")));
                    }
                }
                None => out.push(ClaimRef::NotGenerated {
                    entry: entry.name.clone(),
                    template: template.clone(),
                }),
            }
        }
    }
    out
}

/// Objects for the core's tests.
#[cfg(test)]
pub mod testing {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use fumarole_topology::crd::DeviceTopology;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::resource::v1::ResourceClaim;

    /// An Atlas 800 node: 8 Ascend 910 NPUs `Ascend910-<i>`, HCCS (weight 200) inside groups
    /// 0-3 and 4-7, cross-NUMA (10) between them.
    pub fn ascend_node(name: &str) -> DeviceTopology {
        let mut t = fumarole_topology::crd::testing::nvlink_node(name, 8, 10, &[], |i| {
            format!("Ascend910-{i}")
        });
        for d in &mut t.spec.devices {
            d.vendor = "huawei".into();
            d.kind = "npu".into();
        }
        for l in &mut t.spec.links {
            if (l.a < 4) == (l.b < 4) {
                l.kind = "hccs".into();
                l.weight = 200;
            } else {
                l.kind = "crossNuma".into();
                l.weight = 10;
            }
        }
        t
    }

    /// Claim `ml/<name>` for `count` devices of `class`, allocated on `held.0` to devices
    /// `huawei-<i>` for each `i` of `held.1`.
    pub fn claim(
        name: &str,
        class: &str,
        count: u32,
        held: Option<(&str, &[u32])>,
    ) -> ResourceClaim {
        let status = held.map(|(node, devices)| {
            let results: Vec<_> = devices
                .iter()
                .map(|i| {
                    serde_json::json!({"request": "r", "driver": class, "pool": node,
                    "device": format!("huawei-{i}")})
                })
                .collect();
            serde_json::json!({"allocation": {"devices": {"results": results}}})
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [
                {"name": "r", "exactly": {"deviceClassName": class, "count": count}}]}},
            "status": status,
        }))
        .unwrap()
    }

    /// Pod `ml/<name>` using the named claims, bound to `node` if given, with `limits`.
    pub fn claim_pod(
        name: &str,
        claims: &[&str],
        node: Option<&str>,
        limits: serde_json::Value,
    ) -> Pod {
        let entries: Vec<_> = claims
            .iter()
            .map(|c| serde_json::json!({"name": format!("e-{c}"), "resourceClaimName": c}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"nodeName": node, "resourceClaims": entries,
                "containers": [{"name": "c", "resources": {"limits": limits}}]}
        }))
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    pub fn claim(v: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn counts_our_classes_exactly_first_available_and_default_one() {
        let c = claim(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml"},
            "spec": {"devices": {"requests": [
                {"name": "a", "exactly": {"deviceClassName": "npu.fumarole.dev", "count": 2}},
                {"name": "b", "exactly": {"deviceClassName": "npu.fumarole.dev"}},
                {"name": "f", "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.fumarole.dev", "count": 4},
                    {"name": "small", "deviceClassName": "gpu.fumarole.dev", "count": 1}]},
                {"name": "x", "exactly": {"deviceClassName": "nic.example.com", "count": 3}},
                {"name": "all", "exactly": {"deviceClassName": "gpu.fumarole.dev", "allocationMode": "All"}},
            ]}}
        }));
        let f = ClaimFacts::of(&c).unwrap();
        assert_eq!(
            f.asks,
            BTreeMap::from([("npu.fumarole.dev", 3), ("gpu.fumarole.dev", 4)])
        );
        assert!(!f.allocated && f.held.is_empty());
    }

    #[test]
    fn allocation_results_of_our_drivers_are_held() {
        let c = claim(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml"},
            "spec": {"devices": {"requests": [
                {"name": "a", "exactly": {"deviceClassName": "npu.fumarole.dev"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "a", "driver": "npu.fumarole.dev", "pool": "n1", "device": "huawei-3"},
                {"request": "b", "driver": "nic.example.com", "pool": "n1", "device": "eth0"}]}}}
        }));
        let f = ClaimFacts::of(&c).unwrap();
        assert!(f.allocated);
        assert_eq!(
            f.held,
            vec![HeldDevice {
                driver: "npu.fumarole.dev".into(),
                node: "n1".into(),
                device: "huawei-3".into()
            }]
        );
    }

    #[test]
    fn unreadable_requests_say_why() {
        let bad = claim(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "a"}]}}
        }));
        let e = ClaimFacts::of(&bad).unwrap_err();
        assert!(e.contains("ml/c") && e.contains("neither"), "{e}");
        let zero = claim(serde_json::json!({
            "metadata": {"name": "z", "namespace": "ml"},
            "spec": {"devices": {"requests": [
                {"name": "a", "exactly": {"deviceClassName": "gpu.fumarole.dev", "count": 0}}]}}
        }));
        assert!(ClaimFacts::of(&zero).unwrap_err().contains("asks for 0"));
    }

    #[test]
    fn pod_claims_resolve_names_and_generated_claims() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "direct", "resourceClaimName": "shared"},
                {"name": "gen", "resourceClaimTemplateName": "t"},
                {"name": "pending", "resourceClaimTemplateName": "t"},
                {"name": "unneeded", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [
                {"name": "gen", "resourceClaimName": "p-gen-x7"},
                {"name": "unneeded"}]}
        }))
        .unwrap();
        assert_eq!(
            pod_claims(&pod),
            vec![
                ClaimRef::Claim("ml/shared".into()),
                ClaimRef::Claim("ml/p-gen-x7".into()),
                ClaimRef::NotGenerated {
                    entry: "pending".into(),
                    template: "t".into()
                },
            ]
        );
    }
}
