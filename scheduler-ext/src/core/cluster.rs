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

    /// Each device of `nv` offering `resource` in shares ([`crate::core::view::ShareRoom`]):
    /// `(device, free, used)`, used being the shares the status reports held plus those this
    /// service committed and the status does not show yet; none on a node of another
    /// scheduler's pool.
    pub fn free_shares(&self, nv: &NodeView, resource: &str) -> Vec<(usize, u32, u32)> {
        if !self.ledger.places_on(nv) {
            return Vec::new();
        }
        nv.share_rooms
            .iter()
            .filter(|r| r.resource == resource)
            .map(|r| {
                let id = nv.device_ids.get(r.device).map_or("", String::as_str);
                let used = r.held + self.ledger.shares_committed(&nv.name, resource, id);
                (r.device, r.offered.saturating_sub(used), used)
            })
            .collect()
    }

    /// Number of free devices of `resource` on `node` (0 for unknown nodes).
    pub fn free_count(&self, node: &str, resource: &str) -> usize {
        self.view
            .node(node)
            .map_or(0, |nv| self.free_mask(nv, resource).count_ones() as usize)
    }
}
