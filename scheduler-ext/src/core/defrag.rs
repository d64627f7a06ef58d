//! Defragmentation advice: the fewest running pods whose move would make room for the largest
//! waiting unit.
//!
//! **What waits.** A [`Waiting`] unit is `pods` pods of `pod_devices` devices each. An atomic
//! part of a gpu-group-size / `sp-block` unit must have all its pods in one super-node
//! ([`Waiting::one_super_node`]; in the super-node where part of it already runs or its plan
//! holds room, when it has one); any other pod waits on its own, for one node. Room is counted
//! in *ideal slots*: on a node, how many pods of `pod_devices` the free devices take, each with
//! the best interconnect any such set of that node has (`Q_ideal`, [`NodeView::ideal_fit`]):
//! a whole NVLink/HCCS group for a pod that needs one, the whole node for a whole-node pod. The
//! unit advised for is the largest (by devices) that has too few slots in every super-node
//! (node) now ([`advise`]).
//!
//! **Who may move** ([`crate::core::pod_facts::movability`]): a running pod whose devices the view knows (its
//! `fumarole.dev/devices`), owned by a controller that recreates it (not a bare pod, which a
//! move would delete for good; not a DaemonSet's or a static pod, which belong to their node),
//! and not marked `fumarole.dev/defrag: never`. A pod of a unit keeps its super-node (its
//! atomic part must share one), so inside the super-node being freed it cannot move at all.
//! Moving one pod of a multi-pod job restarts the job: the advice names the job and counts its
//! pods ([`Move::restarts`]), and prefers single-pod jobs.
//!
//! **The search** is greedy, deterministic and bounded: for each candidate (each super-node,
//! or each node for a pod on its own) it takes, while the unit lacks slots there, the node
//! whose shortest run of movable pods (single-pod jobs first, then most devices, then by name)
//! adds a slot, the fewest pods first; each moved pod needs a destination outside the
//! candidate (in its own super-node when it belongs to a unit) where its devices have ideal
//! interconnect, the fullest such node first (binpack), as if earlier moves were made. A pod
//! without a destination is left in place and the search goes on. The candidate needing the
//! fewest moves wins (then fewest restarted pods, then fewest devices moved, then by name).
//! Cost: every candidate is first searched without destinations (a bound on its moves: slot
//! counts over its nodes and their pods, each a memoized `select`); then, best bound first,
//! candidates are searched in full (one pass over the nodes per moved pod) only while their
//! bound can still beat the best found, so on a big cluster few candidates pay for the
//! destination search (1,024 nodes: milliseconds, see the tests).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::core::cluster::Cluster;
use crate::core::placement;
use crate::core::pod_facts::PodFacts;
use crate::core::request::{PodRequest, pod_key, pod_request_in};
use crate::core::unit::UnitKey;
use crate::core::view::NodeView;

/// A running pod, as the advisor sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Running {
    /// `namespace/name`.
    pub pod: String,
    /// [`crate::core::unit::job_key`].
    pub job: String,
    pub node: String,
    pub resource: String,
    /// Its devices on `node` (bit i = device i).
    pub devices: u64,
    /// Pods of its job a move restarts (1 for a single-pod job).
    pub job_pods: u32,
    /// It belongs to a unit: its atomic part must stay in its super-node.
    pub in_unit: bool,
    /// Why it may not be moved; `None` when it may.
    pub pinned: Option<String>,
}

/// A unit waiting for devices (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Waiting {
    /// The unit (`unit 0 of job ns/j (atomic part 0)`) or the pod (`pod ns/p`).
    pub name: String,
    pub resource: String,
    pub pod_devices: u32,
    pub pods: u32,
    /// Its pods must share one super-node.
    pub one_super_node: bool,
    /// The super-node it must go to, when part of it runs there or a plan holds room there.
    pub super_node: Option<String>,
}

impl Waiting {
    /// Devices it asks for in all.
    pub fn devices(&self) -> u32 {
        self.pods.saturating_mul(self.pod_devices)
    }
}

/// One proposed move.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    pub pod: String,
    pub job: String,
    pub from: String,
    /// The devices it frees.
    pub devices: Vec<String>,
    /// Where it fits now, and on which devices.
    pub to: String,
    pub to_devices: Vec<String>,
    /// Pods of its job that restart with it (1: only itself).
    pub restarts: u32,
}

/// Where one pod of the waiting unit would go once the moves are made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Slot {
    pub node: String,
    /// Device indices on the node.
    #[serde(skip)]
    pub mask: u64,
    pub devices: Vec<String>,
}

/// The advice for one waiting unit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Advice {
    /// The unit advised for (`None` when nothing waits).
    pub unit: Option<Waiting>,
    /// The super-node (or node, for a pod on its own) the moves free room in.
    pub target: Option<String>,
    /// Fewest first; empty when the unit fits now or no move helps (then `reason` says why).
    pub moves: Vec<Move>,
    /// Devices the moves free in `target`.
    pub freed: u32,
    /// Pods restarted in all (each moved pod's job counted once).
    pub restarted_pods: u32,
    /// Where the unit's pods would then go.
    pub placement: Vec<Slot>,
    /// Why there are no moves.
    pub reason: Option<String>,
    /// One line on what the moves gain (or the reason).
    pub gain: String,
}

impl Advice {
    /// The advice with its [`Advice::gain`] line written.
    fn finished(mut self) -> Self {
        self.gain = self.describe_gain();
        self
    }

    fn describe_gain(&self) -> String {
        match (&self.unit, &self.target) {
            (Some(u), Some(t)) if !self.moves.is_empty() => format!(
                "{} ({} pods of {} {}) becomes placeable in {t}: {} devices freed by {} moves, {} pods restarted",
                u.name,
                u.pods,
                u.pod_devices,
                u.resource,
                self.freed,
                self.moves.len(),
                self.restarted_pods
            ),
            _ => self.reason.clone().unwrap_or_default(),
        }
    }
}

/// The running pods and waiting units of `c`'s view, from what was read of the cluster's pods
/// (the view keeps neither owners nor each pod's devices). Running: bound, unfinished, not being
/// deleted, with a `fumarole.dev/devices` choice the view counts on their node. Waiting: the
/// view's pending pods not promised devices yet, gathered by atomic part ([`waiting_units`]).
pub fn from_facts<'p>(
    c: &Cluster,
    pods: impl IntoIterator<Item = &'p PodFacts> + Clone,
) -> (Vec<Running>, Vec<Waiting>) {
    let view = c.view;
    let offered = view.resources();
    let mut job_pods: HashMap<&str, u32> = HashMap::new();
    for p in pods.clone() {
        if !p.finished && !p.deleting {
            *job_pods.entry(p.unit.job.as_str()).or_default() += 1;
        }
    }
    let mut running = Vec::new();
    for p in pods.clone() {
        if p.finished || p.deleting || !p.annotated() {
            continue;
        }
        let (Some(node), Some(Ok(ids))) = (view.annotated_on(&p.key), &p.choice) else {
            continue;
        };
        let (Ok(req), Some(nv)) = (p.request.request(&offered, view.claims()), view.node(node))
        else {
            continue;
        };
        running.push(Running {
            pod: p.key.to_string(),
            job: p.unit.job.clone(),
            job_pods: job_pods.get(p.unit.job.as_str()).copied().unwrap_or(1),
            node: node.to_string(),
            devices: nv.mask_of_ids(ids) & nv.resource_mask(&req.resource),
            resource: req.resource,
            in_unit: view.jobs().in_unit_facts(&p.unit),
            pinned: p.pinned.clone(),
        });
    }
    let pending: Vec<PodRequest> = view
        .pending()
        .iter()
        .filter(|p| view.promised_on(&pod_key(p)).is_none())
        .filter_map(|p| pod_request_in(p, &offered, view.jobs(), view.claims()).ok())
        .collect();
    (running, waiting_units(c, &pending))
}

/// Pending requests gathered into waiting units: one per atomic part (its pods already placed
/// taken off), one per pod outside any unit.
pub fn waiting_units(c: &Cluster, pending: &[PodRequest]) -> Vec<Waiting> {
    let mut parts: BTreeMap<UnitKey, Waiting> = BTreeMap::new();
    let mut out = Vec::new();
    for req in pending {
        let Some(g) = &req.unit else {
            out.push(Waiting {
                name: format!("pod {}", req.devices.pod),
                resource: req.devices.resource.clone(),
                pod_devices: u32::try_from(req.devices.count).unwrap_or(u32::MAX),
                pods: 1,
                one_super_node: false,
                super_node: None,
            });
            continue;
        };
        if parts.contains_key(&g.key) {
            continue;
        }
        let placed = placement::placed(c, &g.key);
        let here: u32 = placed.values().sum();
        let super_node = placed
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(s, _)| s.clone())
            .or_else(|| c.ledger.plan(&g.key, c.now).map(|p| p.super_node.clone()));
        let gpus = g.gpus.max(1);
        parts.insert(
            g.key.clone(),
            Waiting {
                name: g.key.to_string(),
                resource: req.devices.resource.clone(),
                pod_devices: gpus,
                pods: g.spec.atomic_size.saturating_sub(here).div_ceil(gpus),
                one_super_node: true,
                super_node,
            },
        );
    }
    out.extend(parts.into_values().filter(|w| w.pods > 0));
    out
}

/// The advice for the largest waiting unit that does not fit now (see the module doc).
pub fn advise(c: &Cluster, running: &[Running], waiting: &[Waiting]) -> Advice {
    if waiting.is_empty() {
        return Advice {
            reason: Some("nothing waits for devices".into()),
            ..Advice::default()
        }
        .finished();
    }
    let mut by_resource: HashMap<&str, HashMap<String, u64>> = HashMap::new();
    let mut order: Vec<&Waiting> = waiting.iter().collect();
    order.sort_by(|a, b| {
        b.devices()
            .cmp(&a.devices())
            .then_with(|| a.name.cmp(&b.name))
    });
    let Some(unit) = order
        .iter()
        .find(|w| {
            let now = by_resource
                .entry(w.resource.as_str())
                .or_insert_with(|| free_now(c, &w.resource));
            fits_now(c, now, w).is_none()
        })
        .or(order.first())
    else {
        return Advice::default();
    };
    advise_unit(c, running, unit)
}

/// Free devices of `resource` per node now, read once per advice (the ledger's commits are
/// looked up per node, too slow to repeat for every candidate).
fn free_now(c: &Cluster, resource: &str) -> HashMap<String, u64> {
    c.view
        .nodes()
        .map(|nv| (nv.name.clone(), c.free_mask(nv, resource)))
        .collect()
}

/// Where `unit` fits now, without moves.
fn fits_now(
    c: &Cluster,
    base: &HashMap<String, u64>,
    unit: &Waiting,
) -> Option<(String, Vec<Slot>)> {
    let state = State::new(c, &unit.resource, base);
    domains(c, unit).into_iter().find_map(|(name, nodes)| {
        let slots = state.place(&nodes, unit)?;
        Some((name, slots))
    })
}

/// The candidates for `unit`: (name, its nodes); super-nodes for a unit that must share one,
/// nodes for a pod on its own.
fn domains<'v>(c: &Cluster<'v>, unit: &Waiting) -> Vec<(String, Vec<&'v NodeView>)> {
    let view = c.view;
    if unit.one_super_node {
        view.super_nodes()
            .iter()
            .filter(|(sn, _)| unit.super_node.as_ref().is_none_or(|want| want == *sn))
            .map(|(sn, names)| {
                let nodes = names.iter().filter_map(|n| view.node(n)).collect();
                (sn.clone(), nodes)
            })
            .collect()
    } else {
        view.nodes().map(|nv| (nv.name.clone(), vec![nv])).collect()
    }
}

/// The free devices of the cluster as the advice so far would leave them.
struct State<'c, 'v> {
    c: &'c Cluster<'v>,
    resource: &'c str,
    /// Free now ([`free_now`]).
    base: &'c HashMap<String, u64>,
    /// Nodes the advice so far changed.
    free: HashMap<String, u64>,
}

impl<'c, 'v> State<'c, 'v> {
    fn new(c: &'c Cluster<'v>, resource: &'c str, base: &'c HashMap<String, u64>) -> Self {
        State {
            c,
            resource,
            base,
            free: HashMap::new(),
        }
    }

    fn free(&self, nv: &NodeView) -> u64 {
        self.free
            .get(&nv.name)
            .or_else(|| self.base.get(&nv.name))
            .copied()
            .unwrap_or_else(|| self.c.free_mask(nv, self.resource))
    }

    /// Healthy devices of the resource on `nv`.
    fn usable(&self, nv: &NodeView) -> u64 {
        nv.resource_mask(self.resource) & !nv.unhealthy_mask
    }

    /// Ideal slots of `g` devices in `free` on `nv`, best first, at most `limit`.
    fn slots(nv: &NodeView, mut free: u64, g: usize, limit: usize) -> Vec<u64> {
        let mut out = Vec::new();
        while out.len() < limit && g > 0 && free.count_ones() as usize >= g {
            let Some(ideal) = nv.select.context.ideal_quality(g) else {
                break;
            };
            match nv.select.select(free, g) {
                Ok(s) if s.quality >= ideal => {
                    let m = s.devices.iter().fold(0u64, |m, &d| m | 1 << d);
                    free &= !m;
                    out.push(m);
                }
                _ => break,
            }
        }
        out
    }

    /// The unit's pods on `nodes` as they are now, or `None` when they do not all fit.
    fn place(&self, nodes: &[&NodeView], unit: &Waiting) -> Option<Vec<Slot>> {
        let (g, need) = (unit.pod_devices as usize, unit.pods as usize);
        let mut out = Vec::new();
        for nv in nodes {
            for m in Self::slots(nv, self.free(nv), g, need - out.len()) {
                out.push(Slot {
                    node: nv.name.clone(),
                    mask: m,
                    devices: nv.ids_of(&crate::core::view::indices(m)),
                });
            }
            if out.len() == need {
                return Some(out);
            }
        }
        None
    }

    /// A node outside `exclude` (inside `super_node` when given) where `r`'s devices have
    /// ideal interconnect: the fullest such node, then by name; its chosen devices.
    fn destination(
        &self,
        r: &Running,
        exclude: &[&NodeView],
        super_node: Option<&str>,
    ) -> Option<(&'v NodeView, u64)> {
        let g = r.devices.count_ones() as usize;
        self.c
            .view
            .nodes()
            .filter(|nv| exclude.iter().all(|x| x.name != nv.name))
            .filter(|nv| super_node.is_none_or(|s| nv.group() == s))
            .filter_map(|nv| {
                let free = self.free(nv);
                let m = *Self::slots(nv, free, g, 1).first()?;
                Some((free.count_ones(), nv, m))
            })
            .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)))
            .map(|(_, nv, m)| (nv, m))
    }
}

/// One candidate's outcome.
struct Found {
    target: String,
    moves: Vec<Move>,
    freed: u32,
    restarted: u32,
    placement: Vec<Slot>,
}

/// The advice for `unit`: moves in the best candidate (see the module doc).
pub fn advise_unit(c: &Cluster, running: &[Running], unit: &Waiting) -> Advice {
    advice_for(c, running, unit).finished()
}

fn advice_for(c: &Cluster, running: &[Running], unit: &Waiting) -> Advice {
    let base = Advice {
        unit: Some(unit.clone()),
        ..Advice::default()
    };
    if unit.pods == 0 || unit.pod_devices == 0 {
        return Advice {
            reason: Some(format!("{} asks for no devices", unit.name)),
            ..base
        };
    }
    let now = free_now(c, &unit.resource);
    if let Some((target, placement)) = fits_now(c, &now, unit) {
        return Advice {
            reason: Some(format!(
                "{} fits in {target} now; no move needed",
                unit.name
            )),
            target: Some(target),
            placement,
            ..base
        };
    }
    // The movable pods of the unit's resource, by node (read once, not once per candidate).
    let mut by_node: HashMap<&str, Vec<&Running>> = HashMap::new();
    for r in running {
        if r.resource == unit.resource && r.pinned.is_none() {
            by_node.entry(r.node.as_str()).or_default().push(r);
        }
    }
    let mut why: Vec<String> = Vec::new();
    let key = |f: &Found| (f.moves.len(), f.restarted, f.freed);
    // First without destinations (a lower bound on each candidate's moves), then in full, best
    // bound first, while a candidate's bound can still beat the best found: most candidates
    // of a big cluster never get the destination search, which looks at every node.
    let mut bounds = Vec::new();
    for (target, nodes) in domains(c, unit) {
        match try_domain(c, &now, &by_node, unit, &target, &nodes, false) {
            Ok(found) => bounds.push((key(&found), target, nodes)),
            Err(e) => why.push(e),
        }
    }
    bounds.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    let mut best: Option<Found> = None;
    for (bound, target, nodes) in bounds {
        if best.as_ref().is_some_and(|b| key(b) <= bound) {
            break;
        }
        match try_domain(c, &now, &by_node, unit, &target, &nodes, true) {
            Ok(found) => {
                if best.as_ref().is_none_or(|b| key(&found) < key(b)) {
                    best = Some(found);
                }
            }
            Err(e) => why.push(e),
        }
    }
    match best {
        Some(f) => Advice {
            target: Some(f.target),
            moves: f.moves,
            freed: f.freed,
            restarted_pods: f.restarted,
            placement: f.placement,
            ..base
        },
        None => {
            let kind = if unit.one_super_node {
                "super-node"
            } else {
                "node"
            };
            why.sort();
            why.dedup();
            let shown: Vec<&str> = why.iter().take(3).map(String::as_str).collect();
            let more = why.len().saturating_sub(shown.len());
            let mut reason = format!(
                "no move of a movable pod makes room for {} ({} pods of {} {}) in any {kind}",
                unit.name, unit.pods, unit.pod_devices, unit.resource
            );
            if !shown.is_empty() {
                reason.push_str(": ");
                reason.push_str(&shown.join("; "));
                if more > 0 {
                    reason.push_str(&format!("; and {more} more"));
                }
            }
            Advice {
                reason: Some(reason),
                ..base
            }
        }
    }
}

/// The moves that free room for `unit` in `nodes`, or why none do.
#[allow(clippy::too_many_arguments)]
fn try_domain(
    c: &Cluster,
    base: &HashMap<String, u64>,
    movable: &HashMap<&str, Vec<&Running>>,
    unit: &Waiting,
    target: &str,
    nodes: &[&NodeView],
    destinations: bool,
) -> Result<Found, String> {
    let g = unit.pod_devices as usize;
    let need = unit.pods as usize;
    let mut state = State::new(c, &unit.resource, base);
    let capacity: usize = nodes
        .iter()
        .map(|nv| State::slots(nv, state.usable(nv), g, need).len())
        .sum();
    if capacity < need {
        return Err(format!("{target} holds {capacity} such pods even empty"));
    }
    // Each node's movable pods, in the order they are taken.
    let mut queues: Vec<Vec<&Running>> = nodes
        .iter()
        .map(|nv| {
            let mut q: Vec<&Running> = movable
                .get(nv.name.as_str())
                .into_iter()
                .flatten()
                .copied()
                // A unit's pod stays in its super-node, which is the target itself.
                .filter(|r| !(unit.one_super_node && r.in_unit))
                .collect();
            q.sort_by(|a, b| {
                a.job_pods
                    .cmp(&b.job_pods)
                    .then_with(|| b.devices.count_ones().cmp(&a.devices.count_ones()))
                    .then_with(|| a.pod.cmp(&b.pod))
            });
            q
        })
        .collect();
    let mut moves: Vec<Move> = Vec::new();
    let mut restarted_jobs: Vec<(&str, u32)> = Vec::new();
    let mut stuck: Vec<String> = Vec::new();
    let mut freed = 0u32;
    let count = |free: u64, nv: &NodeView| State::slots(nv, free, g, need).len();
    loop {
        let have: usize = nodes.iter().map(|nv| count(state.free(nv), nv)).sum();
        if have >= need {
            break;
        }
        // Per node: the shortest run of its queue that adds a slot.
        let step = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, nv)| {
                let now = count(state.free(nv), nv);
                let mut free = state.free(nv);
                let q = queues.get(i)?;
                for (n, r) in q.iter().enumerate() {
                    free |= r.devices & state.usable(nv);
                    if State::slots(nv, free, g, need).len() > now {
                        let restarts: u32 = q[..=n].iter().map(|r| r.job_pods).sum();
                        return Some((n + 1, restarts, nv.name.clone(), i));
                    }
                }
                None
            })
            .min();
        let Some((len, _, _, i)) = step else {
            let mut reason =
                format!("{target}: moving every movable pod there gives {have} of {need} slots");
            if let Some(s) = stuck.first() {
                reason.push_str(&format!(" ({s})"));
            }
            return Err(reason);
        };
        let nv = nodes[i];
        let run: Vec<&Running> = queues[i][..len].to_vec();
        // Destinations for the run, each as if the earlier ones had moved.
        let mut trial = State {
            free: state.free.clone(),
            ..State::new(c, &unit.resource, base)
        };
        let mut planned = Vec::new();
        let mut blocked = None;
        for r in &run {
            if !destinations {
                // The bound: as if every pod had somewhere to go.
                planned.push((r, nv, 0));
                continue;
            }
            let keep = r.in_unit.then(|| nv.group());
            match trial.destination(r, nodes, keep) {
                Some((to, m)) => {
                    let f = trial.free(to);
                    trial.free.insert(to.name.clone(), f & !m);
                    planned.push((r, to, m));
                }
                None => {
                    blocked = Some(r.pod.clone());
                    break;
                }
            }
        }
        if let Some(pod) = blocked {
            stuck.push(format!("{pod} fits nowhere else"));
            queues[i].retain(|r| r.pod != pod);
            continue;
        }
        let mut free = trial.free(nv);
        for (r, to, m) in planned {
            free |= r.devices & state.usable(nv);
            freed += r.devices.count_ones();
            if !restarted_jobs.iter().any(|(j, _)| *j == r.job) {
                restarted_jobs.push((&r.job, r.job_pods));
            }
            moves.push(Move {
                pod: r.pod.clone(),
                job: r.job.clone(),
                from: r.node.clone(),
                devices: nv.ids_of(&crate::core::view::indices(r.devices)),
                to: to.name.clone(),
                to_devices: to.ids_of(&crate::core::view::indices(m)),
                restarts: r.job_pods,
            });
        }
        trial.free.insert(nv.name.clone(), free);
        state.free = trial.free;
        queues[i].drain(..len);
    }
    let placement = state
        .place(nodes, unit)
        .ok_or_else(|| format!("{target}: the freed room does not hold the unit"))?;
    Ok(Found {
        target: target.to_string(),
        moves,
        freed,
        restarted: restarted_jobs.iter().map(|(_, n)| n).sum(),
        placement,
    })
}

/// The advice as text: a line naming the unit and the gain, then the moves as a table (one
/// row per moved pod: from where, the devices it frees, where it fits now, the pods restarted).
pub fn table(advice: &Advice) -> String {
    let mut out = String::new();
    match &advice.unit {
        Some(u) => out.push_str(&format!(
            "waiting: {} asks {} pods of {} {}{}\n",
            u.name,
            u.pods,
            u.pod_devices,
            u.resource,
            if u.one_super_node {
                " in one super-node"
            } else {
                ""
            }
        )),
        None => out.push_str("waiting: none\n"),
    }
    out.push_str(&advice.gain);
    out.push('\n');
    if advice.moves.is_empty() {
        return out;
    }
    let mut rows = vec![
        [
            "POD",
            "JOB",
            "FROM",
            "DEVICES",
            "TO",
            "TO DEVICES",
            "RESTARTS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for m in &advice.moves {
        rows.push(vec![
            m.pod.clone(),
            m.job.clone(),
            m.from.clone(),
            m.devices.join(","),
            m.to.clone(),
            m.to_devices.join(","),
            m.restarts.to_string(),
        ]);
    }
    out.push_str(&crate::text_table::render(&rows));
    out
}

/// The advice as JSON (pretty, one trailing newline): the [`Advice`] fields in camelCase.
pub fn json(advice: &Advice) -> String {
    let mut s = serde_json::to_string_pretty(advice).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::core::ledger::Ledger;
    use crate::core::view::ClusterView;
    use fumarole_topology::crd::device_topology::SuperNodeInfo;
    use std::time::Instant;

    const GPU: &str = "nvidia.com/gpu";

    /// 4-GPU NVLink nodes in super-nodes: (node, super-node).
    fn view(nodes: &[(&str, &str)]) -> ClusterView {
        let dts: Vec<_> = nodes
            .iter()
            .map(|(name, sn)| {
                let mut t = fumarole_topology::crd::testing::nvlink_node(name, 4, 10, &[], |i| {
                    format!("{name}-g{i}")
                });
                t.spec.super_node = Some(SuperNodeInfo {
                    id: sn.to_string(),
                    source: "config".into(),
                });
                t
            })
            .collect();
        ClusterView::build(&dts, &[], &[], &[]).unwrap()
    }

    /// rack-a (a0, a1), rack-b (b0, b1), rack-c (c0).
    fn racks() -> ClusterView {
        view(&[
            ("a0", "rack-a"),
            ("a1", "rack-a"),
            ("b0", "rack-b"),
            ("b1", "rack-b"),
            ("c0", "rack-c"),
        ])
    }

    /// A running pod on `node` holding device indices `devices`.
    fn pod(name: &str, node: &str, devices: &[usize], job_pods: u32) -> Running {
        Running {
            pod: format!("ml/{name}"),
            job: format!("ml/{name}"),
            node: node.into(),
            resource: GPU.into(),
            devices: devices.iter().fold(0, |m, d| m | 1 << d),
            job_pods,
            in_unit: false,
            pinned: None,
        }
    }

    /// The ledger holding `running`'s devices (as the simulator keeps them).
    fn ledger(v: &ClusterView, running: &[Running]) -> Ledger {
        let mut l = Ledger::default();
        for r in running {
            let nv = v.node(&r.node).unwrap();
            l.commit(
                &r.pod,
                crate::core::ledger::Commit {
                    node: r.node.clone(),
                    resource: GPU.into(),
                    devices: nv.ids_of(&crate::core::view::indices(r.devices)),
                    unit: None,
                    at: Instant::now(),
                    share: false,
                },
            );
        }
        l
    }

    fn unit(pods: u32, g: u32) -> Waiting {
        Waiting {
            name: "unit 0 of job ml/big (atomic part 0)".into(),
            resource: GPU.into(),
            pod_devices: g,
            pods,
            one_super_node: true,
            super_node: None,
        }
    }

    /// A 2-pod x 4-GPU unit must share a super-node: rack-a has a0 whole free and a1 held by
    /// one 1-GPU pod; rack-b is full of large jobs. Exactly that pod moves, to the fullest
    /// node outside rack-a that takes it (b1, 3 free, over c0, 4 free).
    #[test]
    fn one_small_pod_blocking_a_super_node_is_moved_with_its_destination() {
        let v = racks();
        let running = vec![
            pod("small", "a1", &[2], 1),
            pod("big-0", "b0", &[0, 1, 2, 3], 2),
            pod("mid", "b1", &[0], 1),
        ];
        let l = ledger(&v, &running);
        let c = Cluster::new(&v, &l, Instant::now());
        let advice = advise(&c, &running, &[unit(2, 4)]);
        assert_eq!(advice.target.as_deref(), Some("rack-a"), "{advice:?}");
        assert_eq!(advice.moves.len(), 1, "{advice:?}");
        let m = &advice.moves[0];
        assert_eq!(
            (m.pod.as_str(), m.from.as_str(), m.to.as_str()),
            ("ml/small", "a1", "b1")
        );
        assert_eq!(m.devices, vec!["a1-g2".to_string()]);
        assert_eq!(m.restarts, 1);
        assert_eq!((advice.freed, advice.restarted_pods), (1, 1));
        let nodes: Vec<&str> = advice.placement.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(nodes, ["a0", "a1"]);
        assert!(
            advice.gain.contains("becomes placeable in rack-a"),
            "{}",
            advice.gain
        );
        assert!(advice.reason.is_none());
    }

    /// A pinned pod is never moved: with the small pod on a1 pinned, rack-a cannot be freed;
    /// rack-b is, by moving its one 1-GPU pod (to a1, the fullest node outside rack-b).
    #[test]
    fn pinned_pods_are_skipped() {
        let v = racks();
        let mut small = pod("small", "a1", &[2], 1);
        small.pinned = Some("no controller would recreate it".into());
        let running = vec![small, pod("other", "b1", &[0], 1)];
        let l = ledger(&v, &running);
        let c = Cluster::new(&v, &l, Instant::now());
        let advice = advise(&c, &running, &[unit(2, 4)]);
        assert_eq!(advice.target.as_deref(), Some("rack-b"), "{advice:?}");
        let moved: Vec<&str> = advice.moves.iter().map(|m| m.pod.as_str()).collect();
        assert_eq!(moved, ["ml/other"]);
        // Its destination is outside rack-b: a node of rack-a (a1 is the fullest) or c0.
        assert_eq!(advice.moves[0].to, "a1");
    }

    /// Fewest moves first, then single-pod jobs: freeing a node held by one pod of a 4-pod job
    /// or by one single-pod job, the single-pod job goes; its restart count is 1.
    #[test]
    fn single_pod_jobs_are_preferred_and_restarts_counted() {
        let v = view(&[("a0", "rack-a"), ("b0", "rack-b"), ("c0", "rack-c")]);
        let running = vec![
            pod("gang-0", "a0", &[0], 4),
            pod("solo", "b0", &[1], 1),
            pod("fill", "c0", &[0, 1], 1),
        ];
        let l = ledger(&v, &running);
        let c = Cluster::new(&v, &l, Instant::now());
        let advice = advise(&c, &running, &[unit(1, 4)]);
        assert_eq!(advice.target.as_deref(), Some("rack-b"), "{advice:?}");
        assert_eq!(advice.moves[0].pod, "ml/solo");
        assert_eq!(advice.restarted_pods, 1);
        // Only the gang pod movable: it is moved, and its job's 4 pods counted.
        let running = vec![
            pod("gang-0", "a0", &[0], 4),
            Running {
                pinned: Some("x".into()),
                ..pod("solo", "b0", &[1], 1)
            },
            Running {
                pinned: Some("x".into()),
                ..pod("fill", "c0", &[0, 1], 1)
            },
        ];
        let l = ledger(&v, &running);
        let c = Cluster::new(&v, &l, Instant::now());
        let advice = advise(&c, &running, &[unit(1, 4)]);
        assert_eq!(advice.moves[0].pod, "ml/gang-0");
        assert_eq!(advice.moves[0].to, "c0");
        assert_eq!(advice.restarted_pods, 4);
    }

    /// Every node held by pods that fit nowhere else: no advice, and the reason says so.
    #[test]
    fn no_possible_move_gives_empty_advice_with_the_reason() {
        let v = view(&[("a0", "rack-a"), ("b0", "rack-b")]);
        let running = vec![pod("x", "a0", &[0, 1, 2], 1), pod("y", "b0", &[0, 1, 2], 1)];
        let l = ledger(&v, &running);
        let c = Cluster::new(&v, &l, Instant::now());
        let advice = advise(&c, &running, &[unit(1, 4)]);
        assert!(advice.moves.is_empty());
        assert!(advice.target.is_none());
        let why = advice.reason.unwrap();
        assert!(
            why.contains("no move of a movable pod makes room for unit 0 of job ml/big")
                && why.contains("fits nowhere else"),
            "{why}"
        );
        // A unit larger than any super-node: the reason says how much one holds.
        let advice = advise(&c, &running, &[unit(2, 4)]);
        assert!(
            advice
                .reason
                .unwrap()
                .contains("rack-a holds 1 such pods even empty"),
        );
        // Nothing waits.
        assert_eq!(
            advise(&c, &running, &[]).reason.as_deref(),
            Some("nothing waits for devices")
        );
    }

    /// A unit that fits now gets no moves, and where it would go; a pod of a unit keeps its
    /// super-node when moved to make room for a pod on its own.
    #[test]
    fn fitting_units_need_no_move_and_unit_pods_keep_their_super_node() {
        let v = view(&[("a0", "rack-a"), ("a1", "rack-a"), ("b0", "rack-b")]);
        let mut member = pod("member", "a0", &[0], 2);
        member.in_unit = true;
        let running = vec![member, pod("fill", "a1", &[0], 1), pod("b", "b0", &[0], 1)];
        let l = ledger(&v, &running);
        let c = Cluster::new(&v, &l, Instant::now());
        let fits = advise(&c, &running, &[unit(1, 3)]);
        assert!(fits.moves.is_empty());
        assert!(fits.reason.unwrap().contains("fits in rack-a now"));
        let solo = Waiting {
            name: "pod ml/whole".into(),
            one_super_node: false,
            ..unit(1, 4)
        };
        let advice = advise(&c, &running, &[solo]);
        assert_eq!(advice.moves.len(), 1, "{advice:?}");
        let m = &advice.moves[0];
        // a0's pod restarts its 2-pod job; a1's and b0's single-pod jobs cost 1 each, a1
        // first by name. Its destination: a0 and b0 have 3 free each, a0 by name.
        assert_eq!((m.pod.as_str(), m.to.as_str()), ("ml/fill", "a0"));
        assert_eq!(advice.target.as_deref(), Some("a1"));
        // Only the unit's pod may move: it stays in rack-a (a1), never b0.
        let pinned = |mut r: Running| {
            r.pinned = Some("x".into());
            r
        };
        let running = vec![
            running[0].clone(),
            pinned(running[1].clone()),
            pinned(running[2].clone()),
        ];
        let l = ledger(&v, &running);
        let c = Cluster::new(&v, &l, Instant::now());
        let solo = Waiting {
            name: "pod ml/whole".into(),
            one_super_node: false,
            ..unit(1, 4)
        };
        let advice = advise(&c, &running, &[solo]);
        assert_eq!(advice.target.as_deref(), Some("a0"), "{advice:?}");
        assert_eq!(advice.moves[0].to, "a1");
        assert_eq!(advice.moves[0].restarts, 2);
    }

    /// A cluster of 1,024 nodes in 128 super-nodes, each node with one 1-GPU pod: a whole-node
    /// pod gets one move, first node by name, to the next (all equally full); only the best
    /// candidates get the destination search.
    #[test]
    fn a_big_cluster_is_advised_with_one_move() {
        let names: Vec<(String, String)> = (0..1024)
            .map(|i| (format!("n{i:04}"), format!("sn-{:03}", i / 8)))
            .collect();
        let refs: Vec<(&str, &str)> = names
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_str()))
            .collect();
        let dts: Vec<_> = refs
            .iter()
            .map(|(name, sn)| {
                let mut t = fumarole_topology::crd::testing::nvlink_node(name, 8, 10, &[], |i| {
                    format!("{name}-g{i}")
                });
                t.spec.super_node = Some(SuperNodeInfo {
                    id: sn.to_string(),
                    source: "config".into(),
                });
                t
            })
            .collect();
        let v = ClusterView::build(&dts, &[], &[], &[]).unwrap();
        let running: Vec<Running> = refs
            .iter()
            .map(|(n, _)| pod(&format!("{n}-p0"), n, &[0], 1))
            .collect();
        let l = ledger(&v, &running);
        let c = Cluster::new(&v, &l, Instant::now());
        let whole = Waiting {
            name: "pod ml/whole".into(),
            one_super_node: false,
            ..unit(1, 8)
        };
        let started = Instant::now();
        let advice = advise(&c, &running, &[whole]);
        eprintln!(
            "1024 nodes, {} pods: {:?}",
            running.len(),
            started.elapsed()
        );
        assert_eq!(advice.moves.len(), 1, "{:?}", advice.reason);
        assert_eq!(advice.target.as_deref(), Some("n0000"));
        assert_eq!(advice.moves[0].to, "n0001");
    }
}
