//! The cluster as one request sees it: the [`ClusterView`] (what the API server shows) with the
//! [`Ledger`] (what this service decided since) laid over it.

use std::time::Instant;

use crate::core::ledger::Ledger;
use crate::core::view::{ClusterView, NodeView};

/// A view and the ledger, read together under the ledger's lock.
#[derive(Clone, Copy, Debug)]
pub struct Cluster<'a> {
    pub view: &'a ClusterView,
    pub ledger: &'a Ledger,
    pub now: Instant,
}

impl<'a> Cluster<'a> {
    pub fn new(view: &'a ClusterView, ledger: &'a Ledger, now: Instant) -> Self {
        Cluster { view, ledger, now }
    }

    /// Mask of the free devices of `resource` on `nv`: free in the view and not committed by
    /// this service; none on a node of another scheduler's pool.
    pub fn free_mask(&self, nv: &NodeView, resource: &str) -> u64 {
        if !self.ledger.places_on(nv) {
            return 0;
        }
        let free = self.view.free_mask(nv, resource);
        match self.ledger.committed_on(&nv.name) {
            Some(ids) => free & !nv.mask_of_ids(ids),
            None => free,
        }
    }

    /// Number of free devices of `resource` on `node` (0 for unknown nodes).
    pub fn free_count(&self, node: &str, resource: &str) -> usize {
        self.view
            .node(node)
            .map_or(0, |nv| self.free_mask(nv, resource).count_ones() as usize)
    }
}
