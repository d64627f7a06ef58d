//! gpu-podaffinity: gpu-group-size units over super-nodes.
//!
//! A unit (`gpu-group-size` GPUs of consecutive pod ranks, see [`crate::core::group`]) is cut into
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
//!    super-node has.
//!
//! Room of a super-node for pods of `g` GPUs: the sum over its nodes of `g·⌊free/g⌋` (each pod
//! needs its GPUs on one node), minus what other units' plans reserve there. A pod may then go
//! only to nodes of its sub-unit's super-node ([`Checker`]), and no pod may take room another
//! unit reserved.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::core::cluster::Cluster;
use crate::core::group::{PodGroup, UnitKey};
use crate::core::ledger::{Ledger, Plan};
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
    /// The view has no nodes at all.
    #[error("{unit}: no super-node in the cluster view")]
    NoSuperNode { unit: UnitKey },
}

/// Why group placement keeps a pod off one node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupConflict {
    /// The pod's sub-unit is placed in another super-node.
    #[error("{unit} is placed in super-node {planned}; this node is in {here}")]
    OtherSuperNode {
        unit: UnitKey,
        planned: String,
        here: String,
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
/// plan (see the module doc). `candidates` limits a new plan to super-nodes with room on those
/// nodes (kube-scheduler's filter gets only the nodes its own filters passed); `None` looks at
/// every node. Renews the plan. Errors are the reason the pod cannot be placed.
pub fn ensure_plan(
    view: &ClusterView,
    ledger: &mut Ledger,
    pg: &PodGroup,
    resource: &str,
    candidates: Option<&HashSet<&str>>,
    now: Instant,
    ttl: Duration,
) -> Result<String, PlacementError> {
    let until = now + ttl;
    let c = Cluster::new(view, ledger, now);
    let here = placed(&c, &pg.key);
    if let Some(sn) = main_super_node(&here) {
        let sn = sn.to_string();
        ledger.renew_plan(&pg.key, until);
        return Ok(sn);
    }
    if let Some(p) = ledger.plan(&pg.key, now) {
        let sn = p.super_node.clone();
        ledger.renew_plan(&pg.key, until);
        return Ok(sn);
    }

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
    let rooms: Vec<(String, u32)> = view
        .super_nodes()
        .iter()
        .map(|(sn, nodes)| {
            let total = room(&c, nodes, resource, pg.gpus, candidates);
            let (taken, _, _) = reserved(&c, sn, |k| *k == pg.key);
            (sn.clone(), total.saturating_sub(taken))
        })
        .collect();
    let need_one = pg.spec.atomic_size;
    let need_all = pg
        .spec
        .atomic_size
        .saturating_mul(u32::try_from(open.len()).unwrap_or(u32::MAX));
    let best_fit = |need: u32| {
        rooms
            .iter()
            .filter(|(_, r)| *r >= need)
            .min_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)))
            .map(|(sn, _)| sn.clone())
    };
    siblings.sort();
    let sibling = siblings
        .iter()
        .find(|sn| rooms.iter().any(|(s, r)| s == *sn && *r >= need_one));
    let (chosen, keys) = if let Some(sn) = sibling {
        (sn.clone(), vec![pg.key.clone()])
    } else if let Some(sn) = best_fit(need_all) {
        (sn, open)
    } else if let Some(sn) = best_fit(need_one) {
        (sn, vec![pg.key.clone()])
    } else {
        let most = rooms
            .iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)));
        return Err(match most {
            Some((sn, r)) => PlacementError::NoRoom {
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
    member: Option<(&'a PodGroup, &'a str)>,
    resource: &'a str,
    /// Super-node -> its reservations by other units.
    rooms: RefCell<HashMap<String, Reservations>>,
}

impl<'a> Checker<'a> {
    pub fn new(c: Cluster<'a>, member: Option<(&'a PodGroup, &'a str)>, resource: &'a str) -> Self {
        Checker {
            c,
            member,
            resource,
            rooms: RefCell::new(HashMap::new()),
        }
    }

    /// Why the pod (asking `count` devices) may not go to `node`; `None` when it may.
    pub fn check(&self, node: &NodeView, count: usize) -> Option<GroupConflict> {
        let sn = node.group();
        if let Some((pg, planned)) = self.member
            && sn != planned
        {
            return Some(GroupConflict::OtherSuperNode {
                unit: pg.key.clone(),
                planned: planned.to_string(),
                here: sn.to_string(),
            });
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
        Some(GroupConflict::Reserved {
            super_node: sn.to_string(),
            reserved: reserved_gpus,
            resource: self.resource.to_string(),
            by: who,
            after,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::core::group::GroupSpec;
    use crate::core::ledger::Commit;
    use fumarole_topology::crd::device_topology::SuperNodeInfo;

    /// Super-node `rack-a`: a0, a1 (4 free each); `rack-b`: b0, b1, b2 (4 free each);
    /// `rack-c`: c0 (8 free).
    fn view() -> ClusterView {
        let mut dts = Vec::new();
        for (name, rack, allocated) in [
            ("a0", "rack-a", &[0u32, 1, 2, 3][..]),
            ("a1", "rack-a", &[0, 1, 2, 3]),
            ("b0", "rack-b", &[0, 1, 2, 3]),
            ("b1", "rack-b", &[0, 1, 2, 3]),
            ("b2", "rack-b", &[0, 1, 2, 3]),
            ("c0", "rack-c", &[]),
        ] {
            let mut t = fumarole_topology::crd::testing::nvlink_node(name, 8, 10, allocated, |i| {
                format!("{name}-g{i}")
            });
            t.spec.super_node = Some(SuperNodeInfo {
                id: rack.into(),
                source: "config".into(),
            });
            dts.push(t);
        }
        ClusterView::build(&dts, &[], &[], &[]).unwrap()
    }

    fn pg(job: &str, rank: u32, gpus: u32, group: u32, atomic: u32) -> PodGroup {
        let first = rank * gpus;
        PodGroup {
            key: UnitKey {
                job: job.into(),
                unit: first / group,
                atomic: first / atomic,
            },
            spec: GroupSpec {
                group_size: group,
                atomic_size: atomic,
                rank,
                unit: first / group,
                atomic_unit: first / atomic,
            },
            gpus,
        }
    }

    const GPU: &str = "nvidia.com/gpu";
    const TTL: Duration = Duration::from_secs(60);

    #[test]
    fn best_fit_then_siblings_then_reasons() {
        let v = view();
        let mut l = Ledger::default();
        let now = Instant::now();
        // A whole 8-GPU unit: rack-a (8) and rack-c (8) fit; rack-a wins on name, best fit.
        let p = pg("ns/j", 0, 2, 8, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &p, GPU, None, now, TTL).unwrap(),
            "rack-a"
        );
        // Its second pod follows the plan.
        let p1 = pg("ns/j", 1, 2, 8, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &p1, GPU, None, now, TTL).unwrap(),
            "rack-a"
        );
        // A second 8-GPU job cannot take rack-a's reserved room: rack-c (8) is the best fit
        // over rack-b (12).
        let q = pg("ns/k", 0, 2, 8, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &q, GPU, None, now, TTL).unwrap(),
            "rack-c"
        );
        // A 16-GPU unit in atomic halves of 8: the only room left is rack-b (12) for one half.
        let r0 = pg("ns/big", 0, 4, 16, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &r0, GPU, None, now, TTL).unwrap(),
            "rack-b"
        );
        let r2 = pg("ns/big", 2, 4, 16, 8);
        let e = ensure_plan(&v, &mut l, &r2, GPU, None, now, TTL)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unit 0 of job ns/big (atomic part 1)")
                && e.contains("needs 8 nvidia.com/gpu (2 pods of 4)")
                && e.contains("the most room any super-node has is 4 (rack-b)"),
            "{e}"
        );
        // After the reservation time-to-live nobody holds rack-a any more.
        let later = now + TTL + Duration::from_secs(1);
        let s = pg("ns/s", 0, 4, 12, 12);
        assert_eq!(
            ensure_plan(&v, &mut l, &s, GPU, None, later, TTL).unwrap(),
            "rack-b"
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
            },
        );
        let p1 = pg("ns/j", 1, 2, 8, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &p1, GPU, None, now, TTL).unwrap(),
            "rack-b"
        );
        // No plan was needed for that; plan rack-a for another unit and check the guards.
        let q = pg("ns/k", 0, 4, 8, 8);
        assert_eq!(
            ensure_plan(&v, &mut l, &q, GPU, None, now, TTL).unwrap(),
            "rack-a"
        );
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
            ensure_plan(&v, &mut l, &p, GPU, Some(&only_b), now, TTL).unwrap(),
            "rack-b"
        );
    }
}
