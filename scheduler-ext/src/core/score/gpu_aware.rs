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
//! Shares: on a node that offers the pod's resource in shares (replicas or MIG devices,
//! [`crate::core::view::ShareRoom`]), the pod needs that many shares free (offered, less held
//! and committed). They are taken from devices already shared first, most used first, then
//! from untouched devices. `q` is 1 when no untouched device is opened; otherwise half the
//! part of the node's devices already in use (shared, held whole, unhealthy), so a node whose
//! devices are all free whole (an unbroken NVLink / HCCS group) comes last. `loss` is `1 - q`,
//! so the raw score is `q` whatever `loss_weight`. NUMA policy does not apply to shares.
//!
//! NUMA fit: a pod with `volcano.sh/numa-topology-policy: single-numa-node` is judged per NUMA
//! node of the node: only devices on that NUMA node count, and the NUMA node must have the
//! pod's whole CPUs free (from the node's `Numatopology`); the best NUMA node wins.

use std::sync::Arc;

use fumarole_topology::{Method, SelectError, Selection};

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
        if nv.offers_shares(resource) {
            return self.shares(c, node, nv, resource, count);
        }
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

    /// `count` shares of `resource` on `nv` (see the module doc).
    fn shares(
        &self,
        c: &Cluster,
        node: &str,
        nv: &NodeView,
        resource: &str,
        count: usize,
    ) -> NodeVerdict {
        let mut rooms = c.free_shares(nv, resource);
        let free: usize = rooms.iter().map(|(_, f, _)| *f as usize).sum();
        if free < count {
            return NodeVerdict::filtered(
                node,
                Unfit::NotEnoughFree {
                    need: count,
                    resource: resource.into(),
                    free,
                },
            );
        }
        // Devices in use first, the most used first; then untouched ones in order.
        rooms.sort_unstable_by_key(|&(i, _, used)| (used == 0, std::cmp::Reverse(used), i));
        let mut chosen = Vec::with_capacity(count);
        let mut opened = false;
        for &(i, f, used) in &rooms {
            let n = (count - chosen.len()).min(f as usize);
            opened |= n > 0 && used == 0;
            chosen.extend(std::iter::repeat_n(i, n));
        }
        let q = if opened {
            let in_use = rooms.iter().filter(|(_, _, used)| *used > 0).fold(
                !nv.available_mask | nv.assumed_mask | nv.claimed_mask,
                |m, (i, _, _)| m | 1 << i,
            );
            let n = nv.device_ids.len().max(1);
            let touched = (in_use & mask_below(n)).count_ones() as f64;
            0.5 * touched / n as f64
        } else {
            1.0
        };
        NodeVerdict {
            node: node.into(),
            unfit: None,
            q: Some(q),
            loss: Some(1.0 - q),
            raw: Some(self.raw(q, 1.0 - q)),
            selection: Some(Arc::new(Selection {
                devices: chosen,
                quality: 0,
                cut: 0,
                q,
                loss: 1.0 - q,
                method: Method::Exhaustive,
            })),
        }
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

/// The mask of devices `0..n`.
fn mask_below(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1 << n) - 1 }
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

    /// `n` GPUs offered in 4 time-sliced replicas each (`nvidia.com/gpu.shared`), `held[i]`
    /// replicas of GPU i held by pods.
    fn shared_node(name: &str, n: u32, held: &[(u32, u32)]) -> DeviceTopology {
        use fumarole_topology::crd::SharingInfo;
        use fumarole_topology::crd::device_topology::ShareAllocation;
        let mut t = node(name, n, 100, &[]);
        for d in &mut t.spec.devices {
            d.sharing = Some(SharingInfo {
                resource: "nvidia.com/gpu.shared".into(),
                mechanism: "timeSlicing".into(),
                replicas: 4,
            });
        }
        let status = t.status.get_or_insert_default();
        for &(i, k) in held {
            let id = format!("{name}-gpu{i}");
            let s = status.devices.entry(id.clone()).or_default();
            s.health = "Healthy".into();
            s.shares = (0..k)
                .map(|r| ShareAllocation {
                    share: format!("{id}::{r}"),
                    namespace: "serve".into(),
                    pod: format!("{name}-{i}-{r}"),
                    container: "main".into(),
                })
                .collect();
        }
        t
    }

    fn share_req(count: usize) -> PodRequest {
        let mut r = req(count);
        r.devices.resource = "nvidia.com/gpu.shared".into();
        r
    }

    /// A share goes onto a device already shared (q 1) before it opens a device; of two nodes
    /// where it must open one, the node with more devices already in use wins; a node whose
    /// replicas are all held is filtered, and no node offers the replicas whole.
    #[test]
    fn shares_pack_onto_shared_devices_before_opening_a_whole_node() {
        let view = ClusterView::build(
            &[
                shared_node("packed", 8, &[(2, 1), (5, 3)]),
                shared_node("untouched", 8, &[]),
                shared_node("half", 8, &[(0, 4), (1, 4), (2, 4), (3, 4)]),
                shared_node("full", 2, &[(0, 4), (1, 4)]),
            ],
            &[],
            &[],
            &[],
        )
        .unwrap();
        assert!(view.resources().contains("nvidia.com/gpu.shared"));
        let packed = view.node("packed").unwrap();
        assert_eq!(packed.resource_mask("nvidia.com/gpu"), 0);
        assert!(packed.offers_shares("nvidia.com/gpu.shared"));
        assert!(view.reported("serve/packed-5-2"));

        let g = GpuAware::default();
        let v = all(&g, &view, &share_req(1));
        let by = |n: &str| v.iter().find(|x| x.node == n).unwrap();
        // GPU 5 (3 of 4 held) before GPU 2 (1 of 4): the fullest shared device first.
        assert_eq!(by("packed").raw, Some(1.0));
        assert_eq!(by("packed").selection.as_ref().unwrap().devices, [5]);
        // half: 4 of 8 GPUs in use, a fresh one opened: 0.5 * 4/8.
        assert_eq!(by("half").raw, Some(0.25));
        assert_eq!(by("half").selection.as_ref().unwrap().devices, [4]);
        assert_eq!(by("untouched").raw, Some(0.0));
        assert_eq!(
            by("full").reason().unwrap(),
            "needs 1 nvidia.com/gpu.shared, 0 free"
        );
        assert_eq!(v[0].node, "packed");

        // Four shares on `packed`: GPU 5's last, GPU 2's three, none opened.
        let four = all(&g, &view, &share_req(4));
        let p = four.iter().find(|x| x.node == "packed").unwrap();
        assert_eq!(p.selection.as_ref().unwrap().devices, [5, 2, 2, 2]);
        assert_eq!(p.raw, Some(1.0));
        // Whole GPUs asked on a node that offers them only in replicas: none there.
        let whole = all(&g, &view, &req(1));
        assert!(whole.iter().all(|x| !x.feasible()), "{whole:?}");
    }

    /// Shares committed by this scheduler and not reported yet count as held: the device they
    /// took is the one packed next, and a device's last replica, once committed, is gone.
    #[test]
    fn committed_shares_count_until_reported() {
        use crate::core::ledger::Commit;
        let view = ClusterView::build(&[shared_node("a", 2, &[])], &[], &[], &[]).unwrap();
        let mut ledger = Ledger::default();
        let commit = |devices: &[&str]| Commit {
            node: "a".into(),
            resource: "nvidia.com/gpu.shared".into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            unit: None,
            at: Instant::now(),
            share: true,
        };
        ledger.commit("serve/p1", commit(&["a-gpu1", "a-gpu1", "a-gpu1"]));
        let g = GpuAware::default();
        let judge = |ledger: &Ledger, n: usize| {
            g.node(
                &Cluster::new(&view, ledger, Instant::now()),
                "a",
                &share_req(n),
            )
        };
        let v = judge(&ledger, 1);
        assert_eq!(v.selection.as_ref().unwrap().devices, [1]);
        assert_eq!(v.raw, Some(1.0));
        assert_eq!(
            ledger.shares_committed("a", "nvidia.com/gpu.shared", "a-gpu1"),
            3
        );
        ledger.commit("serve/p2", commit(&["a-gpu1"]));
        assert_eq!(
            judge(&ledger, 5).reason().unwrap(),
            "needs 5 nvidia.com/gpu.shared, 4 free"
        );
        // Whole-device commits are not touched by shares, and a release gives them back.
        assert!(ledger.committed_on("a").is_none());
        ledger.release("serve/p2");
        assert_eq!(
            ledger.shares_committed("a", "nvidia.com/gpu.shared", "a-gpu1"),
            3
        );
        assert!(judge(&ledger, 5).feasible());
        // Once the node reports p1 holding its shares, its commit settles: counted once, from
        // the status.
        let mut reported = shared_node("a", 2, &[(1, 3)]);
        let status = reported.status.as_mut().unwrap();
        for s in &mut status.devices.get_mut("a-gpu1").unwrap().shares {
            s.pod = "p1".into();
        }
        let reported = ClusterView::build(&[reported], &[], &[], &[]).unwrap();
        let settled = ledger.prune(&reported, Instant::now(), std::time::Duration::MAX);
        assert_eq!(settled.len(), 1);
        assert_eq!(
            ledger.shares_committed("a", "nvidia.com/gpu.shared", "a-gpu1"),
            0
        );
        let c = Cluster::new(&reported, &ledger, Instant::now());
        assert!(g.node(&c, "a", &share_req(5)).feasible());
        assert_eq!(
            g.node(&c, "a", &share_req(6)).reason().unwrap(),
            "needs 6 nvidia.com/gpu.shared, 5 free"
        );
    }

    /// MIG devices are offered per profile; one held is not free, and a GPU whose MIG devices
    /// are in use takes the next before an untouched GPU does.
    #[test]
    fn mig_devices_are_shares_of_their_profile() {
        use fumarole_topology::crd::device_topology::{MigInfo, ShareAllocation};
        let mut t = node("m", 2, 100, &[]);
        for (i, d) in t.spec.devices.iter_mut().enumerate() {
            d.mig = (0..2)
                .map(|k| MigInfo {
                    uuid: format!("MIG-{i}-{k}"),
                    profile: "3g.40gb".into(),
                })
                .collect();
        }
        let s = t.status.get_or_insert_default();
        let gpu1 = s.devices.entry("m-gpu1".into()).or_default();
        gpu1.health = "Healthy".into();
        gpu1.shares = vec![ShareAllocation {
            share: "MIG-1-0".into(),
            namespace: "serve".into(),
            pod: "infer".into(),
            container: "main".into(),
        }];
        let view = ClusterView::build(&[t], &[], &[], &[]).unwrap();
        let mut r = req(1);
        r.devices.resource = "nvidia.com/mig-3g.40gb".into();
        let v = all(&GpuAware::default(), &view, &r);
        assert_eq!(v[0].selection.as_ref().unwrap().devices, [1]);
        assert_eq!(v[0].raw, Some(1.0));
        r.devices.count = 4;
        let v = all(&GpuAware::default(), &view, &r);
        assert_eq!(
            v[0].reason().unwrap(),
            "needs 4 nvidia.com/mig-3g.40gb, 3 free"
        );
    }
}
