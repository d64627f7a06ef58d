//! gpu-aware: per node, the best devices for the pod and how good they are.
//!
//! For each node, `topology::select` on the node's free devices of the requested resource
//! gives `q` (quality of the chosen set against the best set of that size on an empty node,
//! 0..1) and `loss` (link weight the choice cuts from devices left free, normalised, 0..1).
//! The node's score is
//!
//! ```text
//! raw = (q - loss_weight * loss + loss_weight) / (1 + loss_weight)      in 0..1
//! ```
//!
//! (a [`NodeScore`], combined with the other policies in [`crate::core::score`]), scaled by the
//! protocols ([`crate::protocol::scale`]) to 0..100 times `weight` for Volcano and to 0..10
//! (rounded) for kube-scheduler. `weight` and `loss_weight` are Volcano's `weight` and
//! `loss.weight` arguments (default 1).
//!
//! Worked example (DGX H100, every GPU pair on NVSwitch with the same weight `w`), a 4-GPU pod:
//! - node with exactly 4 free GPUs: `q = 1`, nothing left free, `loss = 0`:
//!   `raw = (1 - 0 + 1) / 2 = 1` -> Volcano 100, kube-scheduler 10.
//! - node with 6 free GPUs: `q = 1`, the 4 chosen keep `4·2` links of weight `w` to the 2 left
//!   free, normalised by `k·(n-k)·w_max = 4·4·w`: `loss = 8/16 = 0.5`,
//!   `raw = (1 - 0.5 + 1) / 2 = 0.75` -> Volcano 75, kube-scheduler 8 (7.5 rounded).
//! - node with 2 free GPUs: filtered, "needs 4 nvidia.com/gpu, 2 free".
//!
//! NUMA fit: a pod with `volcano.sh/numa-topology-policy: single-numa-node` is judged per NUMA
//! node of the node: only devices on that NUMA node count, and the NUMA node must have the
//! pod's whole CPUs free (from the node's `Numatopology`); the best NUMA node wins.

use fumarole_topology::SelectError;

use crate::core::cluster::Cluster;
use crate::core::request::PodRequest;
use crate::core::score::node_score::NodeScore;
use crate::core::verdict::{NodeVerdict, Unfit};
use crate::core::view::{NodeView, RequestMemo};

/// The gpu-aware policy (Volcano's `loss.weight`; built by
/// [`crate::core::score::Scoring::gpu_aware`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuAware {
    /// How much the loss counts against the quality; 0 ignores the loss.
    pub loss_weight: f64,
}

impl Default for GpuAware {
    fn default() -> Self {
        GpuAware { loss_weight: 1.0 }
    }
}

/// The score of the devices the fit chose: [`GpuAware::raw`] of its `q` and `loss`.
impl NodeScore for GpuAware {
    fn score(
        &mut self,
        _c: &Cluster<'_>,
        _nv: &NodeView,
        _req: &PodRequest,
        fit: &NodeVerdict,
    ) -> Option<f64> {
        Some(self.raw(fit.q?, fit.loss?))
    }
}

impl GpuAware {
    /// `(q - lw·loss + lw) / (1 + lw)`, clamped to 0..1; a negative `loss_weight` counts as 0.
    pub fn raw(&self, q: f64, loss: f64) -> f64 {
        let lw = self.loss_weight.max(0.0);
        ((q - lw * loss + lw) / (1.0 + lw)).clamp(0.0, 1.0)
    }

    /// Filter and score one node for the request.
    pub fn node(&self, c: &Cluster, node: &str, req: &PodRequest) -> NodeVerdict {
        match c.view.node(node) {
            Some(nv) => self.node_view(c, node, nv, req, &mut RequestMemo::default()),
            None => NodeVerdict::filtered(node, Unfit::UnknownNode),
        }
    }

    /// [`Self::node`] for node `node`, already looked up (`nv`), with the request's memo of
    /// `select` answers (shared by the nodes of one request). The verdict copies `node`, the
    /// caller's copy of the name, which is in cache where `nv.name` need not be.
    pub fn node_view(
        &self,
        c: &Cluster,
        node: &str,
        nv: &NodeView,
        req: &PodRequest,
        memo: &mut RequestMemo,
    ) -> NodeVerdict {
        if !nv.has_topology {
            return NodeVerdict::filtered(node, Unfit::NoTopology);
        }
        let resource = req.devices.resource.as_str();
        let count = req.devices.count;
        let free = c.free_mask(nv, resource);
        let Some(cpus) = req.numa_cpus else {
            return self.choose(node, nv, free, req, memo);
        };
        let Some(numa_cpus) = &nv.free_cpus else {
            return NodeVerdict::filtered(node, Unfit::NoNumatopology);
        };
        let mut best: Option<NodeVerdict> = None;
        let mut seen = Vec::with_capacity(numa_cpus.len());
        for (&id, &cpu_free) in numa_cpus {
            let on_numa = nv
                .numa
                .iter()
                .enumerate()
                .filter(|(_, n)| **n == Some(id))
                .fold(0u64, |m, (i, _)| m | 1 << i);
            let local = free & on_numa;
            let n_local = local.count_ones() as usize;
            seen.push((id, n_local, cpu_free));
            if n_local < count || cpu_free < cpus {
                continue;
            }
            let v = self.choose(node, nv, local, req, memo);
            if v.raw > best.as_ref().and_then(|b| b.raw) {
                best = Some(v);
            }
        }
        best.unwrap_or_else(|| {
            NodeVerdict::filtered(
                node,
                Unfit::NoNumaFit {
                    need: count,
                    resource: resource.to_string(),
                    cpus,
                    numa: seen,
                },
            )
        })
    }

    /// The best `count` of the devices in `free` on `nv`.
    fn choose(
        &self,
        node: &str,
        nv: &NodeView,
        free: u64,
        req: &PodRequest,
        memo: &mut RequestMemo,
    ) -> NodeVerdict {
        match memo.select(nv, free, req.devices.count) {
            Ok(s) => NodeVerdict {
                node: node.into(),
                unfit: None,
                q: Some(s.q),
                loss: Some(s.loss),
                raw: Some(self.raw(s.q, s.loss)),
                selection: Some(s),
            },
            Err(SelectError::NotEnoughFree { k, free }) => NodeVerdict::filtered(
                node,
                Unfit::NotEnoughFree {
                    need: k,
                    resource: req.devices.resource.as_str().into(),
                    free,
                },
            ),
            Err(e) => NodeVerdict::filtered(node, Unfit::Select(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::core::ledger::Ledger;
    use crate::core::request::DeviceRequest;
    use crate::core::score::Scoring;
    use crate::core::verdict::best_first;
    use crate::core::view::ClusterView;
    use crate::protocol::scale;
    use fumarole_topology::crd::{
        CpuInfo, DeviceTopology, Numatopology, NumatopologySpec, ResourceInfoNuma,
    };
    use std::time::Instant;

    /// `n` NVIDIA GPUs named `<node>-gpu<i>`, all pairs weight `w`, the listed ones allocated.
    fn node(name: &str, n: u32, w: u32, allocated: &[u32]) -> DeviceTopology {
        fumarole_topology::crd::testing::nvlink_node(name, n, w, allocated, |i| {
            format!("{name}-gpu{i}")
        })
    }

    fn req(count: usize) -> PodRequest {
        PodRequest {
            devices: DeviceRequest {
                pod: "default/p".into(),
                resource: "nvidia.com/gpu".into(),
                count,
            },
            unit: None,
            numa_cpus: None,
        }
    }

    /// The verdicts for every node of `view`, best first.
    fn all(g: &GpuAware, view: &ClusterView, req: &PodRequest) -> Vec<NodeVerdict> {
        let ledger = Ledger::default();
        let c = Cluster::new(view, &ledger, Instant::now());
        let mut v: Vec<NodeVerdict> = view.nodes().map(|n| g.node(&c, &n.name, req)).collect();
        best_first(&mut v);
        v
    }

    #[test]
    fn formula_worked_numbers() {
        let g = GpuAware::default();
        assert_eq!(g.raw(1.0, 0.0), 1.0);
        assert_eq!(g.raw(1.0, 0.5), 0.75);
        assert_eq!(g.raw(0.5, 1.0), 0.25);
        assert_eq!(g.raw(0.0, 1.0), 0.0);
        let g3 = Scoring {
            super_node_weight: 0.0,
            weight: 2.0,
            loss_weight: 3.0,
        };
        // (0.8 - 3·0.2 + 3) / 4 = 0.8
        assert!((g3.gpu_aware().raw(0.8, 0.2) - 0.8).abs() < 1e-12);
        assert!((scale::volcano(0.8, g3.weight) - 160.0).abs() < 1e-9);
        assert_eq!(scale::kube_scheduler(0.75), 8);
        assert_eq!(scale::kube_scheduler(0.74), 7);
        assert_eq!(scale::kube_scheduler(1.0), 10);
        // loss ignored
        let g0 = GpuAware { loss_weight: 0.0 };
        assert_eq!(g0.raw(0.6, 1.0), 0.6);
    }

    #[test]
    fn exact_fit_beats_leftover_and_too_small_is_filtered() {
        let view = ClusterView::build(
            &[
                node("four", 8, 100, &[0, 1, 2, 3]),
                node("six", 8, 100, &[0, 1]),
                node("two", 8, 100, &[0, 1, 2, 3, 4, 5]),
            ],
            &[],
            &[],
            &[],
        )
        .unwrap();
        let g = GpuAware::default();
        let v = all(&g, &view, &req(4));
        assert_eq!(v[0].node, "four");
        assert_eq!(v[0].q, Some(1.0));
        assert_eq!(v[0].loss, Some(0.0));
        assert_eq!(v[0].raw, Some(1.0));
        assert_eq!(
            v[0].device_ids(&view),
            ["four-gpu4", "four-gpu5", "four-gpu6", "four-gpu7"]
        );
        assert_eq!(v[1].node, "six");
        assert_eq!(v[1].q, Some(1.0));
        assert_eq!(v[1].loss, Some(0.5));
        assert_eq!(v[1].raw, Some(0.75));
        assert_eq!(scale::kube_scheduler(v[1].raw.unwrap()), 8);
        assert_eq!(v[2].node, "two");
        assert_eq!(
            v[2].reason().as_deref(),
            Some("needs 4 nvidia.com/gpu, 2 free")
        );
        let ledger = Ledger::default();
        let c = Cluster::new(&view, &ledger, Instant::now());
        let unknown = g.node(&c, "ghost", &req(1));
        assert!(unknown.reason().unwrap().starts_with("unknown node"));
    }

    #[test]
    fn single_numa_node_needs_devices_and_cpus_on_one_numa_node() {
        // 8 GPUs, 0-3 on NUMA 0 and 4-7 on NUMA 1; GPUs 0, 1 and 4 taken.
        let mut t = node("n", 8, 100, &[0, 1, 4]);
        for (i, d) in t.spec.devices.iter_mut().enumerate() {
            d.numa_node = Some(u32::from(i >= 4));
        }
        // CPUs 0-7 on NUMA 0, 8-15 on NUMA 1; free: 0-5 and 8-9.
        let nt = Numatopology::new(
            "n",
            NumatopologySpec {
                numares: [(
                    "cpu".to_string(),
                    ResourceInfoNuma {
                        allocatable: "0-5,8-9".into(),
                        capacity: 16,
                    },
                )]
                .into(),
                cpu_detail: (0..16)
                    .map(|c| {
                        let info = CpuInfo {
                            numa: i64::from(c >= 8),
                            socket: 0,
                            core: c,
                        };
                        (c.to_string(), info)
                    })
                    .collect(),
                ..Default::default()
            },
        );
        let view = ClusterView::build(&[t], &[nt], &[], &[]).unwrap();
        let ledger = Ledger::default();
        let c = Cluster::new(&view, &ledger, Instant::now());
        let g = GpuAware::default();
        let ask = |gpus: usize, cpus: u32| {
            let mut r = req(gpus);
            r.numa_cpus = Some(cpus);
            g.node(&c, "n", &r)
        };
        // 2 GPUs + 4 CPUs: NUMA 0 (GPUs 2, 3; 6 CPUs free).
        assert_eq!(ask(2, 4).device_ids(&view), ["n-gpu2", "n-gpu3"]);
        // 3 GPUs + 2 CPUs: only NUMA 1 has 3 GPUs (5, 6, 7) and it has 2 CPUs.
        assert_eq!(ask(3, 2).device_ids(&view), ["n-gpu5", "n-gpu6", "n-gpu7"]);
        // 3 GPUs + 4 CPUs: NUMA 0 lacks GPUs, NUMA 1 lacks CPUs.
        let why = ask(3, 4).reason().unwrap();
        assert_eq!(
            why,
            "single-numa-node: no NUMA node has 3 free nvidia.com/gpu and 4 free CPUs \
             (NUMA 0: 2 free, 6 CPUs; NUMA 1: 3 free, 2 CPUs)"
        );
        // Without a Numatopology the node says so.
        let bare = ClusterView::build(&[node("m", 8, 100, &[])], &[], &[], &[]).unwrap();
        let c = Cluster::new(&bare, &ledger, Instant::now());
        let mut r = req(1);
        r.numa_cpus = Some(1);
        assert!(
            g.node(&c, "m", &r)
                .reason()
                .unwrap()
                .contains("no Numatopology")
        );
    }
}
