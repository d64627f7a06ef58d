//! The super-node share: a node scores the share of its super-node's devices already in use,
//! so that, weighted in ([`super::Scoring::super_node_weight`], `--super-node-weight`), small
//! jobs lean towards fuller super-nodes and emptier ones stay whole for the units that need
//! them (the Ascend rule "prefer the super-pod with fewer nodes left"). Nodes of a super-node
//! of one node have no share to give.

use std::collections::HashMap;

use crate::core::cluster::Cluster;
use crate::core::request::PodRequest;
use crate::core::score::node_score::NodeScore;
use crate::core::verdict::NodeVerdict;
use crate::core::view::NodeView;

/// [`used_share`] of each node's super-node, computed once per super-node for the nodes of one
/// request.
#[derive(Debug, Default)]
pub struct SuperNodeShare {
    /// Super-node -> share of its devices in use.
    used: HashMap<String, f64>,
}

impl NodeScore for SuperNodeShare {
    fn score(
        &mut self,
        c: &Cluster<'_>,
        nv: &NodeView,
        req: &PodRequest,
        _fit: &NodeVerdict,
    ) -> Option<f64> {
        let sn = nv.group();
        if c.view.super_nodes().get(sn).is_none_or(|n| n.len() <= 1) {
            return None;
        }
        let used = self
            .used
            .entry(sn.to_string())
            .or_insert_with(|| used_share(c, sn, &req.devices.resource));
        Some(*used)
    }
}

/// The share of `super_node`'s devices of `resource` in use (bound or committed), 0..1; 0 for
/// a super-node without such devices.
pub fn used_share(c: &Cluster, super_node: &str, resource: &str) -> f64 {
    let (mut all, mut free) = (0u32, 0u32);
    for nv in c
        .view
        .super_nodes()
        .get(super_node)
        .into_iter()
        .flatten()
        .filter_map(|n| c.view.node(n))
    {
        all += nv.resource_mask(resource).count_ones();
        free += c.free_mask(nv, resource).count_ones();
    }
    if all == 0 {
        0.0
    } else {
        f64::from(all.saturating_sub(free)) / f64::from(all)
    }
}
