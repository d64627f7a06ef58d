//! Node scoring: each policy scores a node that can take the pod from 0 to 1 (the seam:
//! [`node_score::NodeScore`]), and [`Scoring`] combines them with their weights, in one place
//! ([`RequestScores::score`]).
//! The policies: [`gpu_aware`] (the quality of the devices `topology::select` would give the
//! pod and the loss it leaves behind; it also filters the nodes that cannot hold the devices)
//! and [`super_node`] (the share of the node's super-node already in use).
//!
//! Scores stay 0..1 here; turning them into a scheduler's numbers (0..10 for kube-scheduler,
//! 0..100 times `weight` for Volcano) is the protocols' business ([`crate::protocol::scale`]).
//!
//! Start at [`Scoring`] (the settings) and [`RequestScores`] (what one request's nodes are
//! scored with).

pub mod gpu_aware;
pub mod node_score;
pub mod super_node;

use crate::core::cluster::Cluster;
use crate::core::request::PodRequest;
use crate::core::score::gpu_aware::GpuAware;
use crate::core::score::node_score::NodeScore;
use crate::core::score::super_node::SuperNodeShare;
use crate::core::verdict::NodeVerdict;
use crate::core::view::NodeView;

/// The scoring settings (`--weight`, `--loss-weight`, `--super-node-weight`; Volcano's
/// `weight` and `loss.weight`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scoring {
    /// Volcano's `weight`: multiplies the 0..100 Volcano score (applied by
    /// [`crate::protocol::scale::volcano`], never to the 0..1 score).
    pub weight: f64,
    /// How much the loss counts against the quality in [`GpuAware`]; 0 ignores the loss.
    pub loss_weight: f64,
    /// The weight of the [`SuperNodeShare`] against gpu-aware's 1; 0 (the default) leaves it
    /// out.
    pub super_node_weight: f64,
}

impl Default for Scoring {
    fn default() -> Self {
        Scoring {
            weight: 1.0,
            loss_weight: 1.0,
            super_node_weight: 0.0,
        }
    }
}

impl Scoring {
    /// The gpu-aware policy with these settings: it filters the nodes and chooses the devices.
    pub fn gpu_aware(&self) -> GpuAware {
        GpuAware {
            loss_weight: self.loss_weight,
        }
    }

    /// The policies and their weights for the nodes of one request (what a policy keeps per
    /// request starts empty).
    pub fn for_request(&self) -> RequestScores {
        RequestScores {
            gpu_aware: self.gpu_aware(),
            super_node: SuperNodeShare::default(),
            super_node_weight: self.super_node_weight,
        }
    }
}

/// Every scoring policy with its weight, for the nodes of one request.
pub struct RequestScores {
    gpu_aware: GpuAware,
    super_node: SuperNodeShare,
    super_node_weight: f64,
}

impl RequestScores {
    /// The node's score: the weighted mean of the policies' scores, 0..1. gpu-aware weighs 1;
    /// a policy with weight 0, or with nothing to say about the node, is left out. With the
    /// super-node share `used` at weight `w` that is `(raw + w·used) / (1 + w)`: a small `w`
    /// (0.05) decides between nodes gpu-aware scores about alike and never outweighs a better
    /// device set.
    pub fn score(
        &mut self,
        c: &Cluster<'_>,
        nv: &NodeView,
        req: &PodRequest,
        fit: &NodeVerdict,
    ) -> Option<f64> {
        let policies: [(f64, &mut dyn NodeScore); 2] = [
            (1.0, &mut self.gpu_aware),
            (self.super_node_weight, &mut self.super_node),
        ];
        weighted_mean(
            policies
                .into_iter()
                .filter(|(w, _)| *w > 0.0)
                .filter_map(|(w, p)| Some((w, p.score(c, nv, req, fit)?))),
        )
    }
}

/// `Σ wᵢ·sᵢ / Σ wᵢ` over `(wᵢ, sᵢ)`, summed in order; `None` when there are none.
fn weighted_mean(scores: impl IntoIterator<Item = (f64, f64)>) -> Option<f64> {
    let mut scores = scores.into_iter();
    let (w, s) = scores.next()?;
    let (sum, weights) = scores.fold((w * s, w), |(sum, weights), (w, s)| {
        (sum + w * s, weights + w)
    });
    Some(sum / weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weighted_mean_of_one_score_is_that_score() {
        assert_eq!(weighted_mean([(1.0, 0.75)]), Some(0.75));
        assert_eq!(weighted_mean([]), None);
        let (raw, used, w) = (0.6, 0.5, 0.05);
        assert_eq!(
            weighted_mean([(1.0, raw), (w, used)]),
            Some((raw + w * used) / (1.0 + w))
        );
    }
}
