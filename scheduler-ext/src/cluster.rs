//! The cluster as one request sees it: the [`ClusterView`] (what the API server shows) with the
//! [`Ledger`] (what this service decided since) laid over it.

use std::time::Instant;

use crate::ledger::Ledger;
use crate::view::ClusterView;

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

    /// Indices of the free devices of `resource` on `node`: free in the view and not committed
    /// by this service.
    pub fn free(&self, node: &str, resource: &str) -> Vec<usize> {
        if self.ledger.has_commits_on(node) {
            self.view
                .free_except(node, resource, |id| self.ledger.is_committed(node, id))
        } else {
            self.view.free(node, resource)
        }
    }
}
