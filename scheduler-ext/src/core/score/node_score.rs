//! The scoring seam: what every node-scoring policy implements ([`NodeScore`]). The policies
//! are its siblings ([`super::gpu_aware`], [`super::super_node`]); [`super::Scoring`] weighs
//! them.

use crate::core::cluster::Cluster;
use crate::core::request::PodRequest;
use crate::core::verdict::NodeVerdict;
use crate::core::view::NodeView;

/// One scoring policy: how good a node is for a pod, 0..1.
pub trait NodeScore {
    /// The score of node `nv` for `req`, 0..1, given its verdict `fit` (a node that can take
    /// the pod, with the devices it would get); `None` when this policy has nothing to say
    /// about the node (it then counts for nothing in the node's score). `&mut self`: a policy
    /// may keep what it computed for the nodes of one request.
    fn score(
        &mut self,
        c: &Cluster<'_>,
        nv: &NodeView,
        req: &PodRequest,
        fit: &NodeVerdict,
    ) -> Option<f64>;
}
