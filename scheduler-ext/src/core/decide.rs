//! One pod against a set of nodes: plan its unit's super-node, then judge every node.
//!
//! The same two steps answer kube-scheduler's `filter` / `prioritize`, Volcano's `predicate` /
//! `prioritize`, the commits of `bind` / `allocateFunc`, `explain`, and the trace simulator.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::core::cluster::Cluster;
use crate::core::ledger::Ledger;
use crate::core::placement::{self, Checker, PlacementError, SuperPods};
use crate::core::request::PodRequest;
use crate::core::score::gpu_aware::GpuAware;
use crate::core::verdict::{NodeVerdict, Unfit};
use crate::core::view::{ClusterView, RequestMemo};

/// The super-node of the pod's atomic sub-unit (`None` for pods outside any unit), planning it
/// when needed (see [`placement::ensure_plan`]). `Err` is why the pod fits nowhere.
pub fn plan(
    view: &ClusterView,
    ledger: &mut Ledger,
    req: &PodRequest,
    candidates: Option<&HashSet<&str>>,
    super_pods: SuperPods,
    now: Instant,
    ttl: Duration,
) -> Result<Option<String>, PlacementError> {
    let Some(pg) = &req.group else {
        return Ok(None);
    };
    placement::ensure_plan(
        view,
        ledger,
        pg,
        &req.devices.resource,
        candidates,
        super_pods,
        now,
        ttl,
    )
    .map(Some)
}

/// The verdict for each of `nodes`, in order: gpu-aware fit and score, then the group checks
/// (the pod's super-node, other units' reservations).
pub fn judge<'a>(
    c: Cluster<'_>,
    g: &GpuAware,
    req: &PodRequest,
    planned: Option<&str>,
    nodes: impl IntoIterator<Item = &'a str>,
) -> Vec<NodeVerdict> {
    let member = req.group.as_ref().zip(planned);
    let checker = Checker::new(c, member, &req.devices.resource);
    // Most nodes of a request share their link matrix and free mask with an earlier one.
    let mut memo = RequestMemo::default();
    nodes
        .into_iter()
        .map(|name| {
            // One lookup per node: every request names thousands.
            let Some(nv) = c.view.node(name) else {
                return NodeVerdict::filtered(name, Unfit::UnknownNode);
            };
            let v = g.node_view(&c, name, nv, req, &mut memo);
            if v.feasible()
                && let Some(conflict) = checker.check(nv, req.devices.count)
            {
                return NodeVerdict::filtered(name, conflict.into());
            }
            v
        })
        .collect()
}
