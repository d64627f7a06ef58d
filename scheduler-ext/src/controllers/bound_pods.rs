//! Pods bound by a scheduler that does not tell the service its choice (Volcano before
//! `allocateFunc`, named in `--annotate-bound-pods-of`) get their devices chosen and written
//! after the fact ([`annotate`], run by the live view after each rebuild), so the device plugin
//! and the view still agree.

use std::collections::HashSet;
use std::sync::Arc;

use crate::core::pod_facts::PodFacts;
use crate::core::view::ClusterView;
use crate::service::Service;

/// Gives each bound pod of `schedulers` among `pods` that lacks a choice its devices on its node
/// (chosen by the decider, written by the effects). `tried` remembers the pods already tried,
/// so a failure is logged once.
pub async fn annotate(
    svc: &Service,
    pods: Vec<Arc<PodFacts>>,
    view: &ClusterView,
    schedulers: &[String],
    tried: &mut HashSet<Arc<str>>,
) {
    if schedulers.is_empty() {
        return;
    }
    let Some(ops) = svc.effects() else {
        return;
    };
    if tried.len() > 100_000 {
        tried.clear();
    }
    for pod in pods {
        let (Some(node), Some(scheduler)) = (&pod.node, &pod.scheduler) else {
            continue;
        };
        let key = &pod.key;
        // A choice made for another node is no choice here.
        if pod.finished
            || pod.annotated()
            || !schedulers.contains(scheduler)
            || view.reported(key)
            || tried.contains(&**key)
        {
            continue;
        }
        tried.insert(Arc::clone(key));
        let (ns, name) = key.split_once('/').unwrap_or(("default", key));
        let whole = match ops.pod(ns, name).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(pod = %key, error = %e, "reading a pod bound by {scheduler}");
                continue;
            }
        };
        match svc.assign_bound(&whole, node).await {
            Ok(Some(c)) => {
                tracing::info!(pod = %key, node = %node, devices = ?c.devices, "annotated a pod bound by {scheduler}")
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(pod = %key, node = %node, error = %e, "cannot give devices to a bound pod")
            }
        }
    }
}
