//! The answer for one pod on one node: fits (with the devices, `q`, `loss` and score) or does
//! not, and why ([`Unfit`]). Every verb and `explain` read these; the reasons users see are
//! [`Unfit`]'s `Display`.

use std::sync::Arc;

use compact_str::CompactString;
use fumarole_topology::{SelectError, Selection};

use crate::core::placement::{PlacementError, UnitConflict};
use crate::core::request::RequestError;
use crate::core::view::{ClusterView, NODE_POOL_LABEL};

/// Why a node cannot take a pod.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unfit {
    /// The view has neither a `DeviceTopology` nor a `Node` of that name.
    #[error("unknown node: no DeviceTopology or Node object in the cluster view")]
    UnknownNode,
    /// The node's accelerators belong to another scheduler's node pool.
    #[error(
        "the node is in {} ({NODE_POOL_LABEL}); this scheduler places accelerator pods in {}",
        pool_name(node.as_deref()),
        pool_name(ours.as_deref())
    )]
    OtherNodePool {
        node: Option<String>,
        ours: Option<String>,
    },
    /// A `Node` without a published `DeviceTopology`: no devices.
    #[error("node publishes no DeviceTopology")]
    NoTopology,
    /// Fewer free devices of the resource than the pod asks for.
    #[error("needs {need} {resource}, {free} free")]
    NotEnoughFree {
        need: usize,
        /// Inline (resource names are short): one per node refused.
        resource: CompactString,
        free: usize,
    },
    /// `select` refused the node's devices for another reason.
    #[error(transparent)]
    Select(SelectError),
    /// `single-numa-node` on a node without a `Numatopology` (no CPU data).
    #[error("single-numa-node: the node publishes no Numatopology")]
    NoNumatopology,
    /// `single-numa-node`, and no NUMA node has both the devices and the CPUs.
    #[error(
        "single-numa-node: no NUMA node has {need} free {resource} and {cpus} free CPUs ({})",
        numa.iter().map(|(id, free, cpus)| format!("NUMA {id}: {free} free, {cpus} CPUs")).collect::<Vec<_>>().join("; ")
    )]
    NoNumaFit {
        need: usize,
        resource: String,
        cpus: u32,
        /// Per NUMA node: id, free devices of the resource, free CPUs.
        numa: Vec<(u32, usize, u32)>,
    },
    /// The pod's gpu-group-size unit or another unit's reservation keeps it off the node.
    #[error(transparent)]
    Unit(#[from] UnitConflict),
    /// The pod's unit fits in no super-node (every node gets this reason).
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The pod's request is unusable (every node gets this reason).
    #[error(transparent)]
    Request(#[from] RequestError),
}

impl Unfit {
    /// Whether evicting pods from the node could make it fit: devices or CPUs in use are the
    /// reason. A refused placement (the unit's plan, another unit's reservation, no super-node
    /// for the unit), a node without the devices or data, and an unusable request are not
    /// changed by an eviction: a scheduler should not try preemption for them.
    pub fn resolvable_by_eviction(&self) -> bool {
        match self {
            Unfit::NotEnoughFree { .. } | Unfit::Select(_) | Unfit::NoNumaFit { .. } => true,
            Unfit::UnknownNode
            | Unfit::OtherNodePool { .. }
            | Unfit::NoTopology
            | Unfit::NoNumatopology
            | Unfit::Unit(_)
            | Unfit::Placement(_)
            | Unfit::Request(_) => false,
        }
    }
}

/// A node pool as a message names it.
fn pool_name(pool: Option<&str>) -> String {
    match pool {
        Some(p) => format!("node pool {p:?}"),
        None => "no node pool".to_string(),
    }
}

/// The verdict for one node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeVerdict {
    /// Inline up to 24 bytes (most node names): a request judges thousands of nodes, and a
    /// heap copy of each name was a fifth of an all-names filter's allocations.
    pub node: CompactString,
    /// `None` when the node can hold the pod; else why not.
    pub unfit: Option<Unfit>,
    pub q: Option<f64>,
    pub loss: Option<f64>,
    /// 0..1 (see [`crate::core::score::gpu_aware`]); `None` when filtered.
    pub raw: Option<f64>,
    /// The devices the pod would get (indices into the node's devices, ascending); shared
    /// with the select memo, so judging a node allocates nothing for it.
    pub selection: Option<Arc<Selection>>,
}

impl NodeVerdict {
    pub fn feasible(&self) -> bool {
        self.unfit.is_none()
    }

    /// A node that cannot take the pod, with why.
    pub fn filtered(node: &str, unfit: Unfit) -> Self {
        NodeVerdict {
            node: node.into(),
            unfit: Some(unfit),
            q: None,
            loss: None,
            raw: None,
            selection: None,
        }
    }

    /// Why the node cannot take the pod, as users read it.
    pub fn reason(&self) -> Option<String> {
        self.unfit.as_ref().map(Unfit::to_string)
    }

    /// The chosen devices' ids on `view` (empty when filtered).
    pub fn device_ids(&self, view: &ClusterView) -> Vec<String> {
        match (&self.selection, view.node(&self.node)) {
            (Some(s), Some(nv)) => nv.ids_of(&s.devices),
            _ => Vec::new(),
        }
    }
}

/// Orders verdicts best first: feasible by score, then name; then filtered ones by name.
pub fn best_first(v: &mut [NodeVerdict]) {
    v.sort_by(|a, b| {
        let (ra, rb) = (a.raw.unwrap_or(-1.0), b.raw.unwrap_or(-1.0));
        rb.total_cmp(&ra).then_with(|| a.node.cmp(&b.node))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_devices_in_use_are_resolvable_by_eviction() {
        let short = Unfit::NotEnoughFree {
            need: 4,
            resource: "nvidia.com/gpu".into(),
            free: 3,
        };
        assert!(short.resolvable_by_eviction());
        assert!(!Unfit::NoTopology.resolvable_by_eviction());
        assert!(!Unfit::UnknownNode.resolvable_by_eviction());
        assert!(!Unfit::NoNumatopology.resolvable_by_eviction());
    }
}
