//! One pod against a set of nodes: plan its unit's super-node, then judge every node.
//!
//! The same two steps answer kube-scheduler's `filter` / `prioritize`, Volcano's `predicate` /
//! `prioritize`, the commits of `bind` / `allocateFunc`, `explain`, and the trace simulator.

use crate::core::cluster::Cluster;
use crate::core::ledger::Ledger;
use crate::core::placement::{self, Checker, PlacementError, PlanInputs};
use crate::core::request::PodRequest;
use crate::core::score::Scoring;
use crate::core::verdict::{NodeVerdict, Unfit};
use crate::core::view::{ClusterView, RequestMemo};

/// The super-node of the pod's atomic sub-unit (`None` for pods outside any unit), planning it
/// when needed, as `inputs` allow (see [`placement::ensure_plan`]). `Err` is why the pod fits
/// nowhere.
pub fn plan(
    view: &ClusterView,
    ledger: &mut Ledger,
    req: &PodRequest,
    inputs: PlanInputs<'_>,
) -> Result<Option<String>, PlacementError> {
    let Some(pg) = &req.unit else {
        return Ok(None);
    };
    placement::ensure_plan(view, ledger, pg, &req.devices.resource, inputs).map(Some)
}

/// The verdict for each of `nodes`, in order: gpu-aware fit (the devices and whether they fit),
/// then the unit checks (the pod's super-node, other units' reservations), then the score of
/// each node that can take the pod: the policies of `scoring` weighed together
/// ([`crate::core::score`]). With a super-node weight, a node of a super-node of several nodes
/// leans towards fuller super-nodes: small jobs go where devices are already in use and
/// emptier super-nodes stay whole for the units that need them (the Ascend rule "prefer the
/// super-pod with fewer nodes left").
pub fn judge<'a>(
    c: Cluster<'a>,
    scoring: &Scoring,
    req: &PodRequest,
    planned: Option<&str>,
    nodes: impl IntoIterator<Item = &'a str>,
) -> Vec<NodeVerdict> {
    let view = c.view;
    // One lookup per node: every request names thousands.
    let looked_up = view
        .positions(nodes)
        .map(|(name, p)| (name, p.and_then(|p| view.node_at(p))));
    judge_nodes(c, scoring, req, planned, looked_up)
}

/// [`judge`] over nodes already looked up (`None`: not in the view), such as every node of the
/// view in its own order, which needs no lookup at all.
pub fn judge_nodes<'a>(
    c: Cluster<'a>,
    scoring: &Scoring,
    req: &PodRequest,
    planned: Option<&str>,
    nodes: impl IntoIterator<Item = (&'a str, Option<&'a crate::core::view::NodeView>)>,
) -> Vec<NodeVerdict> {
    let member = req.unit.as_ref().zip(planned);
    let checker = Checker::new(c, member, &req.devices.resource);
    let gpu_aware = scoring.gpu_aware();
    // Most nodes of a request share their link matrix and free mask with an earlier one.
    let mut memo = RequestMemo::default();
    let mut scores = scoring.for_request();
    nodes
        .into_iter()
        .map(|(name, nv)| {
            let Some(nv) = nv else {
                return NodeVerdict::filtered(name, Unfit::UnknownNode);
            };
            if !c.ledger.places_on(nv) {
                let unfit = Unfit::OtherNodePool {
                    node: nv.node_pool.clone(),
                    ours: c.ledger.node_pool().map(String::from),
                };
                return NodeVerdict::filtered(name, unfit);
            }
            let mut v = gpu_aware.node_view(&c, name, nv, req, &mut memo);
            if !v.feasible() {
                return v;
            }
            // Whole devices other units reserve are not what a share (outside any unit) takes.
            let share_alone = req.unit.is_none() && nv.offers_shares(&req.devices.resource);
            if !share_alone && let Some(conflict) = checker.check(nv, req.devices.count) {
                return NodeVerdict::filtered(name, conflict.into());
            }
            v.raw = scores.score(&c, nv, req, &v);
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::core::request::DeviceRequest;
    use crate::core::verdict::best_first;
    use std::time::Instant;

    /// Super-node `rack-a`: a0, a1, all 8 GPUs free; `rack-b`: b0 (8 free), b1 (all taken).
    fn view() -> ClusterView {
        crate::core::placement::tests::racks(&[
            ("a0", "rack-a", &[]),
            ("a1", "rack-a", &[]),
            ("b0", "rack-b", &[]),
            ("b1", "rack-b", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ])
    }

    /// With `--super-node-weight`, a single-node job goes to the partly used super-node
    /// (rack-b) though a0, a1 and b0 are alike to gpu-aware; rack-a stays whole for a unit
    /// that needs it.
    #[test]
    fn a_small_job_is_steered_into_the_partly_used_super_node() {
        let v = view();
        let l = Ledger::default();
        let req = PodRequest {
            devices: DeviceRequest {
                pod: "ns/small".into(),
                resource: "nvidia.com/gpu".into(),
                count: 2,
            },
            unit: None,
            numa_cpus: None,
        };
        let g = Scoring {
            super_node_weight: 0.05,
            ..Scoring::default()
        };
        // Without the weight, a0 wins (first by name among alike nodes).
        let mut plain = judge(
            Cluster::new(&v, &l, Instant::now()),
            &Scoring::default(),
            &req,
            None,
            ["a0", "a1", "b0", "b1"],
        );
        best_first(&mut plain);
        assert_eq!(plain[0].node, "a0");
        let mut v1 = judge(
            Cluster::new(&v, &l, Instant::now()),
            &g,
            &req,
            None,
            ["a0", "a1", "b0", "b1"],
        );
        best_first(&mut v1);
        assert_eq!(v1[0].node, "b0");
        // The term only tips alike nodes: b0's score is a0's plus half rack-b's share in use.
        let score = |n: &str| v1.iter().find(|x| x.node == n).unwrap().raw.unwrap();
        assert!(score("b0") > score("a0"));
        assert!((score("b0") - score("a0") - 0.05 * 0.5 / 1.05).abs() < 1e-9);
        assert!(!v1.iter().find(|x| x.node == "b1").unwrap().feasible());
    }

    /// Names in any order (repeated, unknown) get, each at its place, what each gets judged
    /// alone.
    #[test]
    fn a_request_in_any_order_gets_each_nodes_own_verdict() {
        let v = view();
        let l = Ledger::default();
        let req = PodRequest {
            devices: DeviceRequest {
                pod: "ns/p".into(),
                resource: "nvidia.com/gpu".into(),
                count: 2,
            },
            unit: None,
            numa_cpus: None,
        };
        let g = Scoring::default();
        let judged = |names: &[&str]| {
            judge(
                Cluster::new(&v, &l, Instant::now()),
                &g,
                &req,
                None,
                names.iter().copied(),
            )
        };
        let names = ["b1", "x", "a1", "b0", "a1", "a0", "y", "b1"];
        let together = judged(&names);
        assert_eq!(together.len(), names.len());
        for (name, verdict) in names.iter().zip(&together) {
            assert_eq!(&judged(&[name])[0], verdict, "{name}");
        }
        assert_eq!(together[1].unfit, Some(Unfit::UnknownNode));
        assert!(together[2].feasible() && !together[0].feasible());
    }
}
