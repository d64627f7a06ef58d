//! gpu-podaffinity: gpu-group-size units over super-nodes.
//!
//! A unit (`gpu-group-size` GPUs of consecutive pod ranks, see [`crate::core::unit`]) is cut into
//! atomic sub-units (`atomic-gpu-group-size`). Each atomic sub-unit MUST run inside one
//! super-node; the whole unit SHOULD.
//!
//! The first pod of a sub-unit that is filtered plans where the sub-unit goes
//! ([`ensure_plan`]), and the plan reserves the room for the rest of it ([`crate::core::ledger`]):
//! 1. a sub-unit that already has pods bound or committed stays where they are;
//! 2. else a super-node that already holds (or is planned for) another sub-unit of the same
//!    unit, if it has room for this one;
//! 3. else the super-node with the least room that still holds every sub-unit of the unit not
//!    placed yet (best fit, so large super-nodes stay free for large units); they are all
//!    planned there at once;
//! 4. else the super-node with the least room that holds this sub-unit;
//! 5. else the pod is unschedulable, with a reason naming the sub-unit and the most room any
//!    super-node has, and the plans of the unit's other sub-units that have no pod bound yet
//!    lapse: the unit cannot start now, and they would only keep others out.
//!
//! With the lapse rules (the default; off with `--keep-waiting-reservations`,
//! [`Ledger::keeping_waiting_plans`]), a plan holds only while it helps: a sub-unit with
//! nothing placed keeps its plan while the planned super-node still has its room (after other
//! units' reservations); when a pod bound outside the plans took it, the plan lapses and the
//! sub-unit is planned afresh. Only where the scheduler tells the service where it puts each
//! pod ([`PlanInputs::lapse`]): under Volcano without `allocateFunc`, plans
//! are renewed as without the rules. When a pod of a sub-unit was placed outside its plan
//! anyway (Volcano goes on whatever `allocateFunc` answers), the plan follows the pod. Only the
//! service knows counts (free devices, pods bound or committed, plans), never how long a
//! running pod will take. (Holding a plan for a sub-unit one pod short of room, so that what
//! frees there stays for it, was tried in the simulator and more than tripled the mean
//! queueing delay: the reserved room idles until the last busy node drains;
//! `docs/placement.md`, "What we tried".)
//!
//! **Super-pod jobs** (Huawei's `sp-block`, [`crate::core::unit`]) are such units, with these
//! rules from Huawei's scheduler ([`SuperPods`]):
//! - steps 2-4 run first over the room outside each super-node's reserve (the last
//!   `reserve-nodes` nodes, by name, whose devices are all free), and only when nothing fits
//!   there over the whole room: the reserve is kept when it can be (soft: a block eats into
//!   a reserve rather than wait);
//!   a sub-unit planned outside the reserve keeps its pods off the reserve nodes ([`Checker`]);
//! - `sp-fit: idlest` picks the super-node with the most room instead of the least;
//! - with `super-pod-size` set, a block that needs more nodes than a super-pod has is refused
//!   with that reason.
//!
//! Room of a super-node for pods of `g` GPUs: the sum over its nodes of `g·⌊free/g⌋` (each pod
//! needs its GPUs on one node), minus what other units' plans reserve there. A pod may then go
//! only to nodes of its sub-unit's super-node ([`Checker`]), and no pod may take room another
//! unit reserved; a pod that takes none of that room (devices beyond it, or on a node where
//! the reserving unit's pods would not fit anyway) backfills around the reservation.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::core::cluster::Cluster;
use crate::core::ledger::{Ledger, Plan};
use crate::core::unit::{UnitKey, UnitMember};
use crate::core::view::{ClusterView, NodeView};

/// Why a unit's sub-unit fits in no super-node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No super-node has room for the sub-unit (after other units' reservations).
    #[error(
        "{unit}: needs {need} {resource} ({pods} pods of {pod_gpus}) in one super-node; the most room any super-node has is {most_room} ({most_super_node})",
        pods = need / pod_gpus.max(&1)
    )]
    NoRoom {
        unit: UnitKey,
        need: u32,
        resource: String,
        pod_gpus: u32,
        most_room: u32,
        most_super_node: String,
    },
    /// A super-pod block needs more nodes than `super-pod-size`.
    #[error(
        "{unit}: needs {need} {resource}, at least {nodes} nodes of {per_node}; a super-pod has {size} nodes (super-pod-size)"
    )]
    LargerThanSuperPod {
        unit: UnitKey,
        need: u32,
        resource: String,
        nodes: u32,
        per_node: u32,
        size: u32,
    },
    /// The view has no nodes at all.
    #[error("{unit}: no super-node in the cluster view")]
    NoSuperNode { unit: UnitKey },
}

/// Why group placement keeps a pod off one node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitConflict {
    /// The pod's sub-unit is placed in another super-node.
    #[error("{unit} is placed in super-node {planned}; this node is in {here}")]
    OtherSuperNode {
        unit: UnitKey,
        planned: String,
        here: String,
    },
    /// The node is one of the super-node's reserve nodes, which the pod's super-pod block keeps
    /// free (other nodes of the super-node have room for it).
    #[error(
        "{unit} keeps {keep_free} whole nodes of super-node {super_node} free (reserve-nodes); {node} is one of them"
    )]
    ReserveNode {
        unit: UnitKey,
        node: String,
        super_node: String,
        keep_free: u32,
    },
    /// Taking the pod's devices here would eat into room other units reserved.
    #[error(
        "super-node {super_node}: {reserved} {resource} are reserved for {} and other pending units; this pod would leave room for {after}",
        by.as_ref().map_or_else(|| "a unit".to_string(), UnitKey::to_string)
    )]
    Reserved {
        super_node: String,
        reserved: u32,
        resource: String,
        /// One reserving unit.
        by: Option<UnitKey>,
        after: u32,
    },
}

/// Huawei's super-pod parameters (`init-params` of its Volcano scheduler; flags here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SuperPods {
    /// Nodes per physical super-pod (`super-pod-size`). Super-node membership comes from the
    /// nodes; this only refuses blocks that could never fit.
    pub size: Option<u32>,
    /// Whole nodes to keep free in each super-node for fault rescheduling (`reserve-nodes`).
    pub reserve_nodes: u32,
}

/// How to plan a sub-unit, besides what (the pod's unit and resource) and over what (the view
/// and the ledger): what the asking scheduler allows and the service's settings.
/// [`PlanInputs::new`] is the common case: every node, no super-pod parameters, plans that may
/// lapse.
#[derive(Clone, Copy, Debug)]
pub struct PlanInputs<'a> {
    /// Limits a new plan to super-nodes with room on these nodes (kube-scheduler's filter gets
    /// only the nodes its own filters passed); `None` looks at every node.
    pub candidates: Option<&'a HashSet<&'a str>>,
    /// Huawei's super-pod parameters.
    pub super_pods: SuperPods,
    /// The clock: plans live until `now + ttl`.
    pub now: Instant,
    /// How long a plan lives without being renewed (`--reservation-ttl`).
    pub ttl: Duration,
    /// Waiting plans may lapse (the lapse rules, unless the ledger
    /// [keeps waiting plans](Ledger::keeping_waiting_plans)). Only true where the asking
    /// scheduler tells this service where it puts each pod before it asks about the next
    /// (kube-scheduler's `bind`, Volcano's `allocateFunc`): otherwise a pod of the sub-unit may
    /// already be placed without the service knowing, and a plan moved now would split the
    /// sub-unit.
    pub lapse: bool,
}

impl<'a> PlanInputs<'a> {
    /// Planning at `now` with plans living `ttl`: every node a candidate, no super-pod
    /// parameters, waiting plans may lapse.
    pub fn new(now: Instant, ttl: Duration) -> Self {
        PlanInputs {
            candidates: None,
            super_pods: SuperPods::default(),
            now,
            ttl,
            lapse: true,
        }
    }

    /// These inputs with Huawei's super-pod parameters `super_pods`.
    pub fn with_super_pods(self, super_pods: SuperPods) -> Self {
        PlanInputs { super_pods, ..self }
    }

    /// These inputs with new plans limited to `candidates`.
    pub fn among(self, candidates: &'a HashSet<&'a str>) -> Self {
        PlanInputs {
            candidates: Some(candidates),
            ..self
        }
    }
}

/// The reserve of a super-node: of its nodes whose devices of `resource` are all free, the
/// last `keep` by name (deterministic, so every pod of a session sees the same set).
fn reserve_nodes<'n>(c: &Cluster, nodes: &'n [String], resource: &str, keep: u32) -> Vec<&'n str> {
    if keep == 0 {
        return Vec::new();
    }
    let whole_free = nodes.iter().filter(|n| {
        c.view.node(n).is_some_and(|nv| {
            let all = nv.resource_mask(resource).count_ones();
            all > 0 && c.free_mask(nv, resource).count_ones() == all
        })
    });
    let mut out: Vec<&str> = whole_free
        .rev()
        .take(usize::try_from(keep).unwrap_or(usize::MAX))
        .map(String::as_str)
        .collect();
    out.reverse();
    out
}

/// GPUs of `unit` bound (view) or committed (ledger), per super-node.
pub fn placed(c: &Cluster, unit: &UnitKey) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let group_of = |node: &str| {
        c.view
            .node(node)
            .map_or_else(|| node.to_string(), |n| n.group().to_string())
    };
    for m in c.view.members(unit) {
        *out.entry(group_of(&m.node)).or_default() += m.gpus;
    }
    for (_, node, gpus) in c.ledger.unit_commits(unit, c.view) {
        *out.entry(group_of(node)).or_default() += gpus;
    }
    out
}

/// The super-node holding most of `placed`.
fn main_super_node(placed: &BTreeMap<String, u32>) -> Option<&str> {
    placed
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(s, _)| s.as_str())
}

/// How many GPUs `super_node` lacks for `pg`'s whole sub-unit: its room for the sub-unit's
/// pods, less what other units reserve there, against the sub-unit's size.
fn shortfall(c: &Cluster, super_node: &str, pg: &UnitMember, resource: &str) -> u32 {
    let nodes = c
        .view
        .super_nodes()
        .get(super_node)
        .map_or(&[][..], Vec::as_slice);
    let (taken, _, _) = reserved(c, super_node, |k| *k == pg.key);
    let room = room(c, nodes, resource, pg.gpus, None).saturating_sub(taken);
    pg.spec.atomic_size.saturating_sub(room)
}

/// `g·⌊free/g⌋`: GPUs usable by pods of `g` GPUs out of `free`.
fn usable(free: usize, g: u32) -> u32 {
    let g = g.max(1);
    let free = u32::try_from(free).unwrap_or(u32::MAX);
    free / g * g
}

/// GPUs reserved on `super_node` by live plans other than those `skip` says to leave out,
/// with the largest pod size among them and one reserving unit (for reasons).
fn reserved(
    c: &Cluster,
    super_node: &str,
    skip: impl Fn(&UnitKey) -> bool,
) -> (u32, u32, Option<UnitKey>) {
    let (mut gpus, mut pod_gpus, mut who) = (0u32, 1u32, None);
    for (key, plan) in c.ledger.plans(c.now) {
        if plan.super_node != super_node || skip(key) {
            continue;
        }
        let here = placed(c, key).get(super_node).copied().unwrap_or(0);
        let rest = plan.gpus.saturating_sub(here);
        if rest > 0 {
            gpus += rest;
            pod_gpus = pod_gpus.max(plan.pod_gpus);
            who.get_or_insert_with(|| key.clone());
        }
    }
    (gpus, pod_gpus, who)
}

/// Room for pods of `g` GPUs of `resource` on the nodes of `super_node` (limited to
/// `candidates` when given), before reservations.
fn room(
    c: &Cluster,
    nodes: &[String],
    resource: &str,
    g: u32,
    candidates: Option<&HashSet<&str>>,
) -> u32 {
    nodes
        .iter()
        .filter(|n| candidates.is_none_or(|set| set.contains(n.as_str())))
        .map(|n| usable(c.free_count(n, resource), g))
        .sum()
}

/// The super-node of `pg`'s atomic sub-unit: where it already runs, its live plan, or a new
/// plan (see the module doc), for `resource`, as `inputs` allow ([`PlanInputs`]: which nodes,
/// the clock, whether waiting plans may lapse). Renews the plan. Errors are the reason the pod
/// cannot be placed.
pub fn ensure_plan(
    view: &ClusterView,
    ledger: &mut Ledger,
    pg: &UnitMember,
    resource: &str,
    inputs: PlanInputs<'_>,
) -> Result<String, PlacementError> {
    let PlanInputs {
        candidates,
        super_pods,
        now,
        ttl,
        lapse,
    } = inputs;
    let keep_waiting = ledger.keeps_waiting_plans() || !lapse;
    let until = now + ttl;
    let c = Cluster::new(view, ledger, now);
    let here = placed(&c, &pg.key);
    if let Some(sn) = main_super_node(&here) {
        let sn = sn.to_string();
        ledger.follow_plan(&pg.key, &sn, until);
        return Ok(sn);
    }
    if let Some(p) = ledger.plan(&pg.key, now) {
        let sn = p.super_node.clone();
        // Nothing of the sub-unit is placed (checked above): its plan holds while the
        // super-node still has the room (a pod bound outside the plans may have taken it);
        // otherwise it no longer helps, and the sub-unit is planned afresh.
        if keep_waiting || shortfall(&c, &sn, pg, resource) == 0 {
            ledger.renew_plan(&pg.key, until);
            return Ok(sn);
        }
        ledger.drop_plan(&pg.key);
    }
    let c = Cluster::new(view, ledger, now);

    // Where the other sub-units are, and which are not placed anywhere yet.
    let mut siblings: Vec<String> = Vec::new();
    let mut open: Vec<UnitKey> = Vec::new();
    for key in pg.sub_units() {
        let p = placed(&c, &key);
        if let Some(sn) = main_super_node(&p) {
            siblings.push(sn.to_string());
        } else if let Some(plan) = c.ledger.plan(&key, now) {
            siblings.push(plan.super_node.clone());
        } else {
            open.push(key);
        }
    }
    if !open.contains(&pg.key) {
        open.push(pg.key.clone());
    }
    let super_pod = pg.spec.super_pod;
    if super_pod && let Some(size) = super_pods.size {
        let per_node = view
            .nodes()
            .map(|n| n.resource_mask(resource).count_ones())
            .max()
            .unwrap_or(0)
            .max(1);
        let nodes = pg.spec.atomic_size.div_ceil(per_node);
        if nodes > size {
            return Err(PlacementError::LargerThanSuperPod {
                unit: pg.key.clone(),
                need: pg.spec.atomic_size,
                resource: resource.to_string(),
                nodes,
                per_node,
                size,
            });
        }
    }
    let keep = if super_pod {
        super_pods.reserve_nodes
    } else {
        0
    };
    // (super-node, room, room outside its reserve, given up for this sub-unit)
    let rooms: Vec<(String, u32, u32, bool)> = view
        .super_nodes()
        .iter()
        .map(|(sn, nodes)| {
            let total = room(&c, nodes, resource, pg.gpus, candidates);
            let (taken, _, _) = reserved(&c, sn, |k| *k == pg.key);
            let kept: u32 = reserve_nodes(&c, nodes, resource, keep)
                .into_iter()
                .filter(|n| candidates.is_none_or(|set| set.contains(n)))
                .map(|n| usable(c.free_count(n, resource), pg.gpus))
                .sum();
            let all = total.saturating_sub(taken);
            let avoided = ledger.avoids(&pg.key, sn, now);
            (sn.clone(), all, all.saturating_sub(kept), avoided)
        })
        .collect();
    let need_one = pg.spec.atomic_size;
    let need_all = pg
        .spec
        .atomic_size
        .saturating_mul(u32::try_from(open.len()).unwrap_or(u32::MAX));
    let room_of = |r: &(String, u32, u32, bool), outside: bool| if outside { r.2 } else { r.1 };
    // Best fit (least room) keeps large super-nodes for large units; sp-fit idlest the most.
    // A super-node the sub-unit's plan was given up on is taken only when no other fits.
    let fit = |need: u32, outside: bool, skip_avoided: bool| {
        let fits = rooms
            .iter()
            .filter(|r| room_of(r, outside) >= need && !(skip_avoided && r.3));
        let pick = if pg.spec.idlest {
            fits.max_by(|a, b| {
                room_of(a, outside)
                    .cmp(&room_of(b, outside))
                    .then_with(|| b.0.cmp(&a.0))
            })
        } else {
            fits.min_by(|a, b| {
                room_of(a, outside)
                    .cmp(&room_of(b, outside))
                    .then_with(|| a.0.cmp(&b.0))
            })
        };
        pick.map(|(sn, _, _, _)| sn.clone())
    };
    siblings.sort();
    // Outside the reserve first (only super-pod jobs have one), then anywhere.
    let passes: &[bool] = if keep > 0 { &[true, false] } else { &[false] };
    let choose = |skip_avoided: bool| {
        passes.iter().find_map(|&outside| {
            let sibling = siblings.iter().find(|sn| {
                rooms.iter().any(|r| {
                    r.0 == **sn && room_of(r, outside) >= need_one && !(skip_avoided && r.3)
                })
            });
            let found = if let Some(sn) = sibling {
                Some((sn.clone(), vec![pg.key.clone()]))
            } else if let Some(sn) = fit(need_all, outside, skip_avoided) {
                Some((sn, open.clone()))
            } else {
                fit(need_one, outside, skip_avoided).map(|sn| (sn, vec![pg.key.clone()]))
            };
            found.map(|(sn, keys)| (sn, keys, if outside { keep } else { 0 }))
        })
    };
    let avoiding = rooms.iter().any(|r| r.3);
    let choice = choose(true).or_else(|| avoiding.then(|| choose(false)).flatten());
    let Some((chosen, keys, keep_free)) = choice else {
        let most = rooms
            .iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)));
        // The unit cannot start now: the plans of its other sub-units with no pod bound in the
        // view lapse instead of keeping others out while it waits (under a gang scheduler the
        // pods they hold in this session are given back; they plan afresh at the next try).
        if !keep_waiting {
            for key in pg.sub_units() {
                if view.members(&key).is_empty() {
                    ledger.drop_plan(&key);
                }
            }
        }
        return Err(match most {
            Some((sn, r, _, _)) => PlacementError::NoRoom {
                unit: pg.key.clone(),
                need: need_one,
                resource: resource.to_string(),
                pod_gpus: pg.gpus.max(1),
                most_room: *r,
                most_super_node: sn.clone(),
            },
            None => PlacementError::NoSuperNode {
                unit: pg.key.clone(),
            },
        });
    };
    for key in keys {
        ledger.set_plan(
            key,
            Plan {
                super_node: chosen.clone(),
                gpus: pg.spec.atomic_size,
                pod_gpus: pg.gpus,
                resource: resource.to_string(),
                expires: until,
                keep_free,
            },
        );
    }
    Ok(chosen)
}

/// What other units reserve on one super-node, as one pod sees it.
#[derive(Clone, Debug)]
struct Reservations {
    /// GPUs reserved and not yet placed.
    gpus: u32,
    /// The largest pod size among the reserving units.
    pod_gpus: u32,
    /// The super-node's room for pods of that size now.
    room: u32,
    /// One reserving unit, for reasons.
    who: Option<UnitKey>,
}

/// Per-node group checks for one pod, with the room of each super-node computed once.
pub struct Checker<'a> {
    c: Cluster<'a>,
    /// The pod's group and its sub-unit's super-node.
    member: Option<(&'a UnitMember, &'a str)>,
    resource: &'a str,
    /// Super-node -> its reservations by other units.
    rooms: RefCell<HashMap<String, Reservations>>,
    /// The reserve nodes the pod's super-pod block keeps free, and whether the rest of its
    /// super-node has room for the pod (computed on first use).
    reserve: RefCell<Option<(Vec<String>, bool)>>,
}

impl<'a> Checker<'a> {
    pub fn new(
        c: Cluster<'a>,
        member: Option<(&'a UnitMember, &'a str)>,
        resource: &'a str,
    ) -> Self {
        Checker {
            c,
            member,
            resource,
            rooms: RefCell::new(HashMap::new()),
            reserve: RefCell::new(None),
        }
    }

    /// Why a super-pod block's pod keeps off `node`: the node is in the reserve its plan keeps
    /// free while other nodes of the super-node have room for the pod.
    fn reserve_conflict(
        &self,
        pg: &UnitMember,
        planned: &str,
        node: &NodeView,
        count: usize,
    ) -> Option<UnitConflict> {
        let keep = self.c.ledger.plan(&pg.key, self.c.now)?.keep_free;
        if keep == 0 {
            return None;
        }
        let mut cache = self.reserve.borrow_mut();
        let (reserve, room_elsewhere) = cache.get_or_insert_with(|| {
            let nodes = self
                .c
                .view
                .super_nodes()
                .get(planned)
                .map_or(&[][..], Vec::as_slice);
            let reserve: Vec<String> = reserve_nodes(&self.c, nodes, self.resource, keep)
                .into_iter()
                .map(str::to_string)
                .collect();
            let g = u32::try_from(count).unwrap_or(u32::MAX);
            // Soft: when only the reserve has room left, the pod may use it.
            let elsewhere = nodes.iter().any(|n| {
                !reserve.contains(n) && g > 0 && usable(self.c.free_count(n, self.resource), g) >= g
            });
            (reserve, elsewhere)
        });
        (*room_elsewhere && reserve.contains(&node.name)).then(|| UnitConflict::ReserveNode {
            unit: pg.key.clone(),
            node: node.name.clone(),
            super_node: planned.to_string(),
            keep_free: keep,
        })
    }

    /// Why the pod (asking `count` devices) may not go to `node`; `None` when it may.
    pub fn check(&self, node: &NodeView, count: usize) -> Option<UnitConflict> {
        let sn = node.group();
        if let Some((pg, planned)) = self.member
            && sn != planned
        {
            return Some(UnitConflict::OtherSuperNode {
                unit: pg.key.clone(),
                planned: planned.to_string(),
                here: sn.to_string(),
            });
        }
        if let Some((pg, planned)) = self.member
            && let Some(conflict) = self.reserve_conflict(pg, planned, node, count)
        {
            return Some(conflict);
        }
        if !self.c.ledger.has_plans() {
            return None;
        }
        let mut rooms = self.rooms.borrow_mut();
        let Reservations {
            gpus: reserved_gpus,
            pod_gpus: g,
            room: room_now,
            who,
        } = rooms
            .entry(sn.to_string())
            .or_insert_with(|| {
                let own = self.member.map(|(pg, _)| &pg.key);
                let (gpus, pod_gpus, who) = reserved(&self.c, sn, |k| Some(k) == own);
                let room = if gpus == 0 {
                    0
                } else {
                    self.c.view.super_nodes().get(sn).map_or(0, |nodes| {
                        room(&self.c, nodes, self.resource, pod_gpus, None)
                    })
                };
                Reservations {
                    gpus,
                    pod_gpus,
                    room,
                    who,
                }
            })
            .clone();
        if reserved_gpus == 0 {
            return None;
        }
        let free = self.c.free_mask(node, self.resource).count_ones() as usize;
        let after =
            room_now.saturating_sub(usable(free, g)) + usable(free.saturating_sub(count), g);
        if after >= reserved_gpus {
            return None;
        }
        Some(UnitConflict::Reserved {
            super_node: sn.to_string(),
            reserved: reserved_gpus,
            resource: self.resource.to_string(),
            by: who,
            after,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::core::ledger::Commit;
    use crate::core::unit::UnitSpec;
    use fumarole_topology::crd::DeviceTopology;
    use fumarole_topology::crd::device_topology::SuperNodeInfo;

    /// 8-GPU NVLink nodes `(name, super-node, allocated devices)`, devices `<name>-g<i>`.
    pub(crate) fn racks(nodes: &[(&str, &str, &[u32])]) -> ClusterView {
        ClusterView::build(&rack_topologies(nodes), &[], &[], &[]).unwrap()
    }

    /// The DeviceTopologies of [`racks`].
    fn rack_topologies(nodes: &[(&str, &str, &[u32])]) -> Vec<DeviceTopology> {
        let mut dts = Vec::new();
        for &(name, rack, allocated) in nodes {
            let mut t = fumarole_topology::crd::testing::nvlink_node(name, 8, 10, allocated, |i| {
                format!("{name}-g{i}")
            });
            t.spec.super_node = Some(SuperNodeInfo {
                id: rack.into(),
                source: "config".into(),
            });
            dts.push(t);
        }
        dts
    }

    /// Super-node `rack-a`: a0, a1 (4 free each); `rack-b`: b0, b1, b2 (4 free each);
    /// `rack-c`: c0 (8 free).
    fn view() -> ClusterView {
        let half: &[u32] = &[0, 1, 2, 3];
        racks(&[
            ("a0", "rack-a", half),
            ("a1", "rack-a", half),
            ("b0", "rack-b", half),
            ("b1", "rack-b", half),
            ("b2", "rack-b", half),
            ("c0", "rack-c", &[]),
        ])
    }

    fn pg(job: &str, rank: u32, gpus: u32, group: u32, atomic: u32) -> UnitMember {
        let first = rank * gpus;
        UnitMember {
            key: UnitKey {
                job: job.into(),
                unit: first / group,
                atomic: first / atomic,
            },
            spec: UnitSpec {
                group_size: group,
                atomic_size: atomic,
                rank,
                unit: first / group,
                atomic_unit: first / atomic,
                super_pod: false,
                idlest: false,
            },
            gpus,
        }
    }

    const GPU: &str = "nvidia.com/gpu";
    const TTL: Duration = Duration::from_secs(60);

    /// Planning at `now`: every node, no super-pod parameters, plans that may lapse.
    fn at(now: Instant) -> PlanInputs<'static> {
        PlanInputs::new(now, TTL)
    }

    /// a0, a1 (rack-a, 4 free each, labelled into node pool `kube`), b0 (rack-b, 4 free), c0
    /// (rack-c, 8 free): a scheduler hands out only its own pool's devices, in plans and
    /// verdicts alike.
    #[test]
    fn a_ledger_plans_and_judges_only_in_its_node_pool() {
        use crate::core::decide::judge;
        use crate::core::request::{DeviceRequest, PodRequest};
        use crate::core::score::Scoring;
        use crate::core::verdict::Unfit;
        use crate::core::view::NODE_POOL_LABEL;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

        let half: &[u32] = &[0, 1, 2, 3];
        let nodes: [(&str, &str, &[u32]); 4] = [
            ("a0", "rack-a", half),
            ("a1", "rack-a", half),
            ("b0", "rack-b", half),
            ("c0", "rack-c", &[]),
        ];
        let dts = rack_topologies(&nodes);
        let metas: Vec<ObjectMeta> = nodes
            .iter()
            .map(|(name, rack, _)| ObjectMeta {
                name: Some((*name).into()),
                labels: (*rack == "rack-a")
                    .then(|| [(NODE_POOL_LABEL.to_string(), "kube".to_string())].into()),
                ..Default::default()
            })
            .collect();
        let v = ClusterView::build(&dts, &[], &metas, &[]).unwrap();
        let now = Instant::now();
        // An 8-GPU unit: rack-a (8 free) would win on name; only the `kube` pool may plan it.
        let unit = pg("ns/j", 0, 2, 8, 8);
        let mut kube = Ledger::default().in_node_pool(Some("kube".into()));
        assert_eq!(
            ensure_plan(&v, &mut kube, &unit, GPU, at(now)).unwrap(),
            "rack-a"
        );
        let mut unpooled = Ledger::default();
        assert_eq!(
            ensure_plan(&v, &mut unpooled, &unit, GPU, at(now)).unwrap(),
            "rack-c"
        );
        // A lone 4-GPU pod (ledgers without the unit's plans): room only in each one's pool.
        let kube = Ledger::default().in_node_pool(Some("kube".into()));
        let unpooled = Ledger::default();
        let req = PodRequest {
            devices: DeviceRequest {
                pod: "ns/p".into(),
                resource: GPU.into(),
                count: 4,
            },
            unit: None,
            numa_cpus: None,
        };
        let feasible = |l: &Ledger| {
            judge(
                Cluster::new(&v, l, now),
                &Scoring::default(),
                &req,
                None,
                ["a0", "a1", "b0", "c0"],
            )
            .into_iter()
            .filter(|x| x.feasible())
            .map(|x| x.node)
            .collect::<Vec<_>>()
        };
        assert_eq!(feasible(&kube), ["a0", "a1"]);
        assert_eq!(feasible(&unpooled), ["b0", "c0"]);
        let verdicts = judge(
            Cluster::new(&v, &unpooled, now),
            &Scoring::default(),
            &req,
            None,
            ["a0"],
        );
        assert_eq!(
            verdicts[0].unfit,
            Some(Unfit::OtherNodePool {
                node: Some("kube".into()),
                ours: None
            })
        );
        assert_eq!(
            verdicts[0].unfit.as_ref().unwrap().to_string(),
            "the node is in node pool \"kube\" (fumarole.dev/node-pool); this scheduler places accelerator pods in no node pool"
        );
    }

    #[test]
    fn best_fit_then_siblings_then_reasons() {
        let v = view();
        let mut l = Ledger::default();
        let now = Instant::now();
        // A whole 8-GPU unit: rack-a (8) and rack-c (8) fit; rack-a wins on name, best fit.
        let p = pg("ns/j", 0, 2, 8, 8);
        assert_eq!(ensure_plan(&v, &mut l, &p, GPU, at(now)).unwrap(), "rack-a");
        // Its second pod follows the plan.
        let p1 = pg("ns/j", 1, 2, 8, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &p1, GPU, at(now)).unwrap(),
            "rack-a"
        );
        // A second 8-GPU job cannot take rack-a's reserved room: rack-c (8) is the best fit
        // over rack-b (12).
        let q = pg("ns/k", 0, 2, 8, 8);
        assert_eq!(ensure_plan(&v, &mut l, &q, GPU, at(now)).unwrap(), "rack-c");
        // A 16-GPU unit in atomic halves of 8: the only room left is rack-b (12) for one half.
        let r0 = pg("ns/big", 0, 4, 16, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &r0, GPU, at(now)).unwrap(),
            "rack-b"
        );
        // Its other half: the most room left is rack-b's 4. The unit cannot start, so the
        // plan of its first half lapses too, and rack-b is free for others again.
        let r2 = pg("ns/big", 2, 4, 16, 8);
        let e = ensure_plan(&v, &mut l, &r2, GPU, at(now))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unit 0 of job ns/big (atomic part 1)")
                && e.contains("needs 8 nvidia.com/gpu (2 pods of 4)")
                && e.contains("the most room any super-node has is 4 (rack-b)"),
            "{e}"
        );
        assert!(l.plan(&r0.key, now).is_none() && l.plan(&r2.key, now).is_none());
        // After the reservation time-to-live nobody holds rack-a any more.
        let later = now + TTL + Duration::from_secs(1);
        let s = pg("ns/s", 0, 4, 12, 12);
        assert_eq!(
            ensure_plan(&v, &mut l, &s, GPU, at(later)).unwrap(),
            "rack-b"
        );
    }

    /// A plan given up (the scheduler's other filters refused every node of its super-node)
    /// is made again elsewhere: rack-c, the next best fit, not rack-a again. When no other
    /// super-node has the room the given-up one is taken again rather than none; once the
    /// avoidance ends, best fit decides as before.
    #[test]
    fn a_plan_given_up_is_made_again_on_another_super_node() {
        let v = view();
        let mut l = Ledger::default();
        let now = Instant::now();
        let p = pg("ns/j", 0, 2, 8, 8);
        assert_eq!(ensure_plan(&v, &mut l, &p, GPU, at(now)).unwrap(), "rack-a");
        let until = now + TTL;
        assert_eq!(l.give_up_plan(&p.key, until).as_deref(), Some("rack-a"));
        assert!(l.plan(&p.key, now).is_none() && l.avoids(&p.key, "rack-a", now));
        assert_eq!(ensure_plan(&v, &mut l, &p, GPU, at(now)).unwrap(), "rack-c");
        // Another job is not affected: rack-a is still its best fit.
        let q = pg("ns/k", 0, 2, 8, 8);
        assert_eq!(ensure_plan(&v, &mut l, &q, GPU, at(now)).unwrap(), "rack-a");
        // rack-c given up too; rack-a is taken by ns/k: rack-b (12) is left.
        assert_eq!(l.give_up_plan(&p.key, until).as_deref(), Some("rack-c"));
        assert_eq!(ensure_plan(&v, &mut l, &p, GPU, at(now)).unwrap(), "rack-b");
        // A unit that fits only where it was given up goes there again.
        let big = pg("ns/big", 0, 4, 12, 12);
        assert_eq!(
            l.give_up_plan(&big.key, until),
            None,
            "no plan, nothing given up"
        );
        let mut solo = Ledger::default();
        assert_eq!(
            ensure_plan(&v, &mut solo, &big, GPU, at(now)).unwrap(),
            "rack-b"
        );
        assert_eq!(
            solo.give_up_plan(&big.key, until).as_deref(),
            Some("rack-b")
        );
        assert_eq!(
            ensure_plan(&v, &mut solo, &big, GPU, at(now)).unwrap(),
            "rack-b"
        );
        // After the avoidance ends (and the plans with it) rack-a is ns/j's best fit again.
        let later = until + Duration::from_secs(1);
        l.prune(&v, later, TTL);
        assert!(!l.avoids(&p.key, "rack-a", later));
        assert_eq!(
            ensure_plan(&v, &mut l, &p, GPU, at(later)).unwrap(),
            "rack-a"
        );
    }

    /// A stranger's pod holding `devices` of `node` (bound outside the unit's plans).
    fn take(l: &mut Ledger, node: &str, devices: &[u32], now: Instant) {
        l.commit(
            &format!("ns/x-{node}-{}", devices[0]),
            Commit {
                node: node.into(),
                resource: GPU.into(),
                devices: devices.iter().map(|d| format!("{node}-g{d}")).collect(),
                unit: None,
                at: now,
                share: false,
            },
        );
    }

    /// [`view`] with c0 full and one GPU of b2 taken (room for 4-GPU pods: rack-a 8, rack-b 8,
    /// rack-c 0), and a unit of two atomic halves of 8 (pods of 4): the first half planned in
    /// rack-a (best fit, first by name), the second in rack-b.
    fn planned_halves(l: &mut Ledger, now: Instant) -> (ClusterView, UnitMember, UnitMember) {
        let v = view();
        take(l, "c0", &[0, 1, 2, 3, 4, 5, 6, 7], now);
        take(l, "b2", &[4], now);
        let r0 = pg("ns/big", 0, 4, 16, 8);
        assert_eq!(ensure_plan(&v, l, &r0, GPU, at(now)).unwrap(), "rack-a");
        let r2 = pg("ns/big", 2, 4, 16, 8);
        assert_eq!(ensure_plan(&v, l, &r2, GPU, at(now)).unwrap(), "rack-b");
        (v, r0, r2)
    }

    /// A small job backfills around a reservation: devices the unit's pods cannot use (b2's
    /// 3 GPUs, for 4-GPU pods) are free to take; the room it needs is not.
    #[test]
    fn a_small_job_backfills_around_a_reservation_without_taking_its_room() {
        let mut l = Ledger::default();
        let now = Instant::now();
        let (v, _, _) = planned_halves(&mut l, now);
        let c = Cluster::new(&v, &l, now);
        let stranger = Checker::new(c, None, GPU);
        assert!(stranger.check(v.node("b2").unwrap(), 3).is_none());
        for node in ["b0", "b1", "a0", "a1"] {
            let why = stranger
                .check(v.node(node).unwrap(), 1)
                .unwrap()
                .to_string();
            assert!(
                why.contains("8 nvidia.com/gpu are reserved"),
                "{node}: {why}"
            );
        }
    }

    /// A plan lapses when its super-node no longer has the room (a pod bound outside the plans
    /// took it): the sub-unit is planned afresh where the room is, and the old super-node is
    /// free for others again. The live service's default ledger keeps it instead (the plan is
    /// what keeps together pods Volcano allocated without a commit).
    #[test]
    fn a_reservation_lapses_when_its_super_node_no_longer_has_the_room() {
        for (mut l, planned) in [
            (Ledger::default(), "rack-c"),
            (Ledger::keeping_waiting_plans(), "rack-a"),
        ] {
            let now = Instant::now();
            let (v, r0, _) = planned_halves(&mut l, now);
            take(&mut l, "a0", &[4], now);
            l.release("ns/x-c0-0");
            assert_eq!(ensure_plan(&v, &mut l, &r0, GPU, at(now)).unwrap(), planned);
            let c = Cluster::new(&v, &l, now);
            let a1_free = Checker::new(c, None, GPU)
                .check(v.node("a1").unwrap(), 4)
                .is_none();
            assert_eq!(a1_free, planned == "rack-c");
        }
    }

    /// A unit one of whose parts fits nowhere cannot start: the plans of its other parts
    /// lapse instead of keeping others out while it waits.
    #[test]
    fn a_unit_that_cannot_start_holds_no_reservation() {
        let mut l = Ledger::default();
        let now = Instant::now();
        let (v, r0, r2) = planned_halves(&mut l, now);
        // Three parts of 8 in a unit of 24: rack-a and rack-b are taken by ns/big's plans.
        let t0 = pg("ns/three", 0, 4, 24, 8);
        let e = ensure_plan(&v, &mut l, &t0, GPU, at(now)).unwrap_err();
        assert!(matches!(e, PlacementError::NoRoom { .. }), "{e}");
        // ns/big's second half loses its room in rack-b to a pod bound outside the plans, and
        // no other super-node has 8: both halves' plans lapse.
        take(&mut l, "b1", &[4], now);
        let e = ensure_plan(&v, &mut l, &r2, GPU, at(now)).unwrap_err();
        assert!(matches!(e, PlacementError::NoRoom { .. }), "{e}");
        assert!(l.plan(&r2.key, now).is_none() && l.plan(&r0.key, now).is_none());
        let c = Cluster::new(&v, &l, now);
        assert!(
            Checker::new(c, None, GPU)
                .check(v.node("a0").unwrap(), 4)
                .is_none()
        );
        // Its first part plans again at its next try.
        assert_eq!(
            ensure_plan(&v, &mut l, &r0, GPU, at(now)).unwrap(),
            "rack-a"
        );
    }

    #[test]
    fn a_placed_sub_unit_stays_and_checker_guards_reservations() {
        let v = view();
        let mut l = Ledger::default();
        let now = Instant::now();
        let p0 = pg("ns/j", 0, 2, 8, 8);
        // The pod already got devices on b1: the sub-unit is in rack-b.
        l.commit(
            "ns/j-0",
            Commit {
                node: "b1".into(),
                resource: GPU.into(),
                devices: vec!["b1-g4".into(), "b1-g5".into()],
                unit: Some((p0.key.clone(), 2)),
                at: now,
                share: false,
            },
        );
        let p1 = pg("ns/j", 1, 2, 8, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &p1, GPU, at(now)).unwrap(),
            "rack-b"
        );
        // No plan was needed for that; plan rack-a for another unit and check the guards.
        let q = pg("ns/k", 0, 4, 8, 8);
        assert_eq!(ensure_plan(&v, &mut l, &q, GPU, at(now)).unwrap(), "rack-a");
        let c = Cluster::new(&v, &l, now);
        let a0 = v.node("a0").unwrap();
        // A stranger asking 2 GPUs on a0 would leave 4 in rack-a where 8 are reserved.
        let stranger = Checker::new(c, None, GPU);
        let why = stranger.check(a0, 2).unwrap().to_string();
        assert!(
            why.contains("super-node rack-a: 8 nvidia.com/gpu are reserved"),
            "{why}"
        );
        assert!(stranger.check(v.node("c0").unwrap(), 2).is_none());
        // The unit's own pods may use it, but only in rack-a.
        let member = Checker::new(c, Some((&q, "rack-a")), GPU);
        assert!(member.check(a0, 4).is_none());
        let why = member.check(v.node("c0").unwrap(), 4).unwrap().to_string();
        assert!(why.contains("is placed in super-node rack-a"), "{why}");
    }

    #[test]
    fn candidates_limit_new_plans() {
        let v = view();
        let mut l = Ledger::default();
        let now = Instant::now();
        let only_b: HashSet<&str> = ["b0", "b1"].into();
        let p = pg("ns/j", 0, 2, 8, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &p, GPU, at(now).among(&only_b)).unwrap(),
            "rack-b"
        );
    }

    const NPU: &str = "huawei.com/Ascend910";

    /// Two physical super-pods of whole free Atlas 800 nodes: `sp-1` (n0..n3, 32 NPUs) and
    /// `sp-2` (m0..m5, 48 NPUs).
    fn super_pods() -> ClusterView {
        let mut dts = Vec::new();
        for (sp, prefix, n) in [("sp-1", "n", 4), ("sp-2", "m", 6)] {
            for i in 0..n {
                let mut t =
                    fumarole_topology::crd::testing::atlas_800_910(&format!("{prefix}{i}"), &[]);
                t.spec.super_node = Some(SuperNodeInfo {
                    id: sp.into(),
                    source: "config".into(),
                });
                dts.push(t);
            }
        }
        ClusterView::build(&dts, &[], &[], &[]).unwrap()
    }

    /// A pod of an sp-block job: 8 NPUs per pod, blocks of `block`.
    fn sp(job: &str, rank: u32, block: u32, idlest: bool) -> UnitMember {
        let mut p = pg(job, rank, 8, block, block);
        p.spec.super_pod = true;
        p.spec.idlest = idlest;
        p
    }

    fn reserve(n: u32) -> SuperPods {
        SuperPods {
            size: None,
            reserve_nodes: n,
        }
    }

    /// With reserve-nodes 2 a 16-NPU block goes where it leaves the reserve whole (sp-1, the
    /// fuller one) and keeps its pods off the reserve nodes (n2, n3); a second block no longer
    /// fits sp-1 outside its reserve and goes to sp-2, though sp-1 still has the room.
    #[test]
    fn sp_blocks_keep_the_reserve_and_prefer_the_fuller_super_pod() {
        let v = super_pods();
        let mut l = Ledger::default();
        let now = Instant::now();
        let a = sp("ns/a", 0, 16, false);
        assert_eq!(
            ensure_plan(&v, &mut l, &a, NPU, at(now).with_super_pods(reserve(2))).unwrap(),
            "sp-1"
        );
        assert_eq!(l.plan(&a.key, now).unwrap().keep_free, 2);
        let c = Cluster::new(&v, &l, now);
        let member = Checker::new(c, Some((&a, "sp-1")), NPU);
        assert!(member.check(v.node("n0").unwrap(), 8).is_none());
        assert!(member.check(v.node("n1").unwrap(), 8).is_none());
        let why = member.check(v.node("n3").unwrap(), 8).unwrap().to_string();
        assert!(
            why.contains("keeps 2 whole nodes of super-node sp-1 free (reserve-nodes); n3"),
            "{why}"
        );
        assert!(member.check(v.node("n2").unwrap(), 8).is_some());

        let b = sp("ns/b", 0, 16, false);
        assert_eq!(
            ensure_plan(&v, &mut l, &b, NPU, at(now).with_super_pods(reserve(2))).unwrap(),
            "sp-2"
        );
        // Without a reserve the second block would have taken sp-1's last two nodes.
        let mut l0 = Ledger::default();
        ensure_plan(&v, &mut l0, &a, NPU, at(now).with_super_pods(reserve(0))).unwrap();
        assert_eq!(
            ensure_plan(&v, &mut l0, &b, NPU, at(now).with_super_pods(reserve(0))).unwrap(),
            "sp-1"
        );
        assert_eq!(l0.plan(&b.key, now).unwrap().keep_free, 0);
    }

    /// The reserve is soft: a block that fits nowhere outside the reserves goes where it fits
    /// at all, and its pods may then use the reserve nodes.
    #[test]
    fn sp_blocks_eat_into_the_reserve_only_when_nothing_else_fits() {
        let v = super_pods();
        let mut l = Ledger::default();
        let now = Instant::now();
        // 48 NPUs: only sp-2 has them, and only with its 2 reserve nodes.
        let big = sp("ns/big", 0, 48, false);
        assert_eq!(
            ensure_plan(&v, &mut l, &big, NPU, at(now).with_super_pods(reserve(2))).unwrap(),
            "sp-2"
        );
        assert_eq!(l.plan(&big.key, now).unwrap().keep_free, 0);
        let c = Cluster::new(&v, &l, now);
        let member = Checker::new(c, Some((&big, "sp-2")), NPU);
        assert!(member.check(v.node("m5").unwrap(), 8).is_none());
    }

    /// `sp-fit: idlest` takes the super-pod with the most room; gpu-group-size units (not
    /// sp-block) ignore the reserve; super-pod-size refuses blocks that could never fit.
    #[test]
    fn sp_fit_idlest_plain_units_and_super_pod_size() {
        let v = super_pods();
        let now = Instant::now();
        let mut l = Ledger::default();
        let idle = sp("ns/i", 0, 16, true);
        assert_eq!(
            ensure_plan(&v, &mut l, &idle, NPU, at(now).with_super_pods(reserve(2))).unwrap(),
            "sp-2"
        );
        let mut l = Ledger::default();
        let plain = pg("ns/p", 0, 8, 32, 32);
        assert_eq!(
            ensure_plan(&v, &mut l, &plain, NPU, at(now).with_super_pods(reserve(2))).unwrap(),
            "sp-1"
        );
        assert_eq!(l.plan(&plain.key, now).unwrap().keep_free, 0);
        let sized = SuperPods {
            size: Some(4),
            reserve_nodes: 0,
        };
        let e = ensure_plan(
            &v,
            &mut Ledger::default(),
            &sp("ns/w", 0, 48, false),
            NPU,
            at(now).with_super_pods(sized),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(
                "needs 48 huawei.com/Ascend910, at least 6 nodes of 8; a super-pod has 4 nodes"
            ),
            "{e}"
        );
        // A block that fits nowhere names the largest room, as gpu-group-size units do.
        let e = ensure_plan(
            &v,
            &mut Ledger::default(),
            &sp("ns/h", 0, 64, false),
            NPU,
            at(now).with_super_pods(reserve(2)),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("the most room any super-node has is 48 (sp-2)"),
            "{e}"
        );
    }
}
