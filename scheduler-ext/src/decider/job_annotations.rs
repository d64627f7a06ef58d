//! The annotations a training job reads that go on a pod with its devices, Huawei's way
//! ([`ascend::job_annotations`]): computed here, written by [`crate::effects`] with the device
//! choice.

use std::collections::BTreeMap;

use fumarole_topology::annotation::ascend;
use k8s_openapi::api::core::v1::Pod;

use crate::core::ledger::Commit;
use crate::core::request::pod_key;
use crate::core::unit::{self, UnitFacts};
use crate::core::view::ClusterView;

/// The job annotations to write on `pod` given `commit` in `view` (`None`: remove), for a pod
/// given an Ascend resource only: `hccl/rankIndex` when its rank is stated by its framework
/// or it is in a group (the rank group placement uses); for a pod of an `sp-block` job on a
/// node in a super-node `super-pod-rank` (its block, `rank x NPUs / sp-block`) and
/// `super-pod-id` (the super-node's id, when that is a `SuperPodID`: a non-negative integer).
///
/// A key the pod already carries is left alone (a different value logged): the user's or
/// another scheduler's value stands. Only on a pod not bound yet, the keys the extension
/// added itself ([`ascend::WRITTEN_JOB_ANNOTATIONS`], for a placement that did not bind) are
/// replaced, or removed when this placement has none; that record lists what this write adds.
pub fn job_annotations(
    view: &ClusterView,
    pod: &Pod,
    commit: &Commit,
) -> BTreeMap<String, Option<String>> {
    if ascend::chip_of(&commit.resource).is_none() {
        return BTreeMap::new();
    }
    let facts = UnitFacts::of(pod);
    let npus = u32::try_from(commit.devices.len()).unwrap_or(u32::MAX);
    let spec = unit::unit_spec_of(&facts, npus, view.jobs()).ok().flatten();
    let rank = spec
        .as_ref()
        .map(|s| s.rank)
        .or_else(|| facts.stated_rank(view.jobs()));
    let super_pod = spec.as_ref().filter(|s| s.super_pod).and_then(|s| {
        let super_node = view.node(&commit.node)?.super_node.as_deref()?;
        Some(ascend::SuperPodPlace {
            logical: s.atomic_unit,
            physical: ascend::super_pod_id(super_node),
        })
    });
    let want = ascend::job_annotations(rank, super_pod);
    let empty = BTreeMap::new();
    let have = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let unbound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_none();
    let ours = if unbound {
        ascend::written_job_keys(have)
    } else {
        Default::default()
    };
    let mut out: BTreeMap<String, Option<String>> = BTreeMap::new();
    for (k, v) in want {
        match have.get(&k) {
            Some(set) if !ours.contains(k.as_str()) => {
                if *set != v {
                    tracing::info!(pod = %pod_key(pod), key = %k, kept = %set, ours = %v,
                        "the pod already carries this annotation; keeping its value");
                }
            }
            _ => {
                out.insert(k, Some(v));
            }
        }
    }
    for k in ours {
        out.entry(k.to_string()).or_insert(None);
    }
    if unbound {
        let written: Vec<&str> = out
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k.as_str())
            .collect();
        let record = (!written.is_empty()).then(|| written.join(","));
        if record.is_some() || have.contains_key(ascend::WRITTEN_JOB_ANNOTATIONS) {
            out.insert(ascend::WRITTEN_JOB_ANNOTATIONS.to_string(), record);
        }
    }
    out
}
