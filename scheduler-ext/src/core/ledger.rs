//! What this service decided that the cluster view does not show yet.
//!
//! - Commits: devices handed to a pod on bind (kube-scheduler), `allocateFunc` (Volcano) or
//!   when a pod bound by Volcano without our choice is annotated afterwards. A commit is
//!   dropped on release (`deallocateFunc`, failed bind, pod deletion), once the view shows the
//!   pod bound with its `fumarole.dev/devices` annotation (the view counts it from then on), or
//!   after the commit time-to-live when neither happens (the pod never arrived).
//! - Plans: the super-node chosen for an atomic sub-unit of a gpu-group-size unit, made by the
//!   first pod of the unit that is filtered ([`crate::core::placement`]). A plan reserves the
//!   room the rest of the sub-unit needs there, so other pods do not crowd it out. Every filter or commit
//!   of a member renews it; it expires when no member shows up for the reservation
//!   time-to-live, and ends when the sub-unit is complete.
//!
//! - Share commits: replicas or MIG devices handed to a pod ([`Commit::share`]). No choice is
//!   written for them (the device plugin picks the replica); the commit counts until the
//!   node's status reports the pod holding its share, or the time-to-live.
//!
//! All of it lives behind one lock in [`crate::decider::Decider`]: a commit checks and takes
//! devices under the write lock, so two pods never get one device.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use fumarole_topology::annotation::DeviceChoice;

use crate::core::unit::UnitKey;
use crate::core::view::{ClusterView, NodeView};

/// Devices handed to one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    pub node: String,
    pub resource: String,
    /// Device ids; for a share commit, the device of each share taken (repeated when one
    /// device gives several).
    pub devices: Vec<String>,
    /// The pod's unit and GPU count, for group placement.
    pub unit: Option<(UnitKey, u32)>,
    pub at: Instant,
    /// Shares of the devices (replicas, MIG devices), not whole devices: nothing is written on
    /// the pod.
    pub share: bool,
}

impl Commit {
    /// The annotation value's map.
    pub fn choice(&self) -> DeviceChoice {
        BTreeMap::from([(self.resource.clone(), self.devices.clone())])
    }
}

/// The super-node chosen for an atomic sub-unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub super_node: String,
    /// GPUs of the whole sub-unit (its atomic size).
    pub gpus: u32,
    /// GPUs per pod of the unit.
    pub pod_gpus: u32,
    pub resource: String,
    pub expires: Instant,
    /// Whole nodes the sub-unit keeps free in its super-node (`reserve-nodes` of a super-pod
    /// job placed without eating into the reserve; 0 otherwise).
    pub keep_free: u32,
}

/// Commits and plans.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// `namespace/name` -> commit.
    commits: HashMap<String, Commit>,
    /// Node -> device ids committed there. Looked up for every node a pod is judged on (5,000
    /// times a pod at 5,000 nodes): foldhash, where SipHash was the largest item of judging in
    /// a perf profile of the kube-scheduler plugin.
    by_node: HashMap<String, HashSet<String>, foldhash::fast::RandomState>,
    /// Node -> shares committed there: (resource, device id) -> how many.
    shares_by_node: HashMap<String, HashMap<(String, String), u32>>,
    plans: HashMap<UnitKey, Plan>,
    /// Super-nodes a sub-unit's plan was given up on, until when: the scheduler's other
    /// filters refused every node of it (a taint, say), which fumarole cannot see, so planning
    /// looks elsewhere first ([`Self::give_up_plan`]).
    avoided: HashMap<UnitKey, Vec<(String, Instant)>>,
    /// How many times room was given back: a commit released (not settled: a pod the view
    /// now shows bound holds its devices still) or a plan dropped. A scheduler retries the
    /// pods it found no room for when this moves ([`Self::room_freed`]).
    freed: u64,
    /// Plans of sub-units with nothing placed are renewed while their pods are retried, never
    /// lapsing early ([`crate::core::placement::ensure_plan`]; see
    /// [`Self::keeping_waiting_plans`]).
    keep_waiting_plans: bool,
    /// The node pool this ledger hands devices out in
    /// ([`crate::core::view::NODE_POOL_LABEL`]; `None`: the nodes without the label). Another
    /// scheduler's ledger owns the other pools' devices.
    node_pool: Option<String>,
}

impl Ledger {
    /// An empty ledger whose waiting plans hold while their pods are retried, instead of
    /// lapsing when their super-node lost the room or their unit cannot start
    /// (`--keep-waiting-reservations`, in the service and the simulator).
    pub fn keeping_waiting_plans() -> Self {
        Ledger {
            keep_waiting_plans: true,
            ..Ledger::default()
        }
    }

    /// This ledger, handing devices out only on the nodes of `pool` (`None`: the nodes of no
    /// pool).
    pub fn in_node_pool(self, pool: Option<String>) -> Self {
        Ledger {
            node_pool: pool,
            ..self
        }
    }

    /// True when this ledger may hand out `nv`'s devices: the node is in its pool.
    pub fn places_on(&self, nv: &NodeView) -> bool {
        nv.node_pool == self.node_pool
    }

    /// The node pool this ledger hands devices out in.
    pub fn node_pool(&self) -> Option<&str> {
        self.node_pool.as_deref()
    }

    /// True when waiting plans never lapse early ([`Self::keeping_waiting_plans`]).
    pub fn keeps_waiting_plans(&self) -> bool {
        self.keep_waiting_plans
    }

    /// Records `commit` for `pod`, replacing an earlier one.
    pub fn commit(&mut self, pod: &str, commit: Commit) {
        self.release(pod);
        if commit.share {
            let on_node = self.shares_by_node.entry(commit.node.clone()).or_default();
            for d in &commit.devices {
                *on_node
                    .entry((commit.resource.clone(), d.clone()))
                    .or_default() += 1;
            }
        } else {
            self.by_node
                .entry(commit.node.clone())
                .or_default()
                .extend(commit.devices.iter().cloned());
        }
        self.commits.insert(pod.to_string(), commit);
    }

    /// Drops the commit of `pod`, returning it: its devices are free again.
    pub fn release(&mut self, pod: &str) -> Option<Commit> {
        let c = self.forget_commit(pod)?;
        self.freed = self.freed.wrapping_add(1);
        Some(c)
    }

    /// How many times room was given back so far (a counter that only moves forward).
    pub fn room_freed(&self) -> u64 {
        self.freed
    }

    /// Drops the commit of `pod` from the books, freeing nothing by itself.
    fn forget_commit(&mut self, pod: &str) -> Option<Commit> {
        let c = self.commits.remove(pod)?;
        if c.share {
            if let Some(on_node) = self.shares_by_node.get_mut(&c.node) {
                for d in &c.devices {
                    let key = (c.resource.clone(), d.clone());
                    if let Some(n) = on_node.get_mut(&key) {
                        *n -= 1;
                        if *n == 0 {
                            on_node.remove(&key);
                        }
                    }
                }
                if on_node.is_empty() {
                    self.shares_by_node.remove(&c.node);
                }
            }
            return Some(c);
        }
        if let Some(set) = self.by_node.get_mut(&c.node) {
            for d in &c.devices {
                set.remove(d);
            }
            if set.is_empty() {
                self.by_node.remove(&c.node);
            }
        }
        Some(c)
    }

    /// The commit of `pod`.
    pub fn commit_of(&self, pod: &str) -> Option<&Commit> {
        self.commits.get(pod)
    }

    /// The device ids committed on `node`, if any.
    pub fn committed_on(&self, node: &str) -> Option<&HashSet<String>> {
        self.by_node.get(node)
    }

    /// Shares of `resource` committed on `node`'s device `device` (an id) and not yet
    /// reported held.
    pub fn shares_committed(&self, node: &str, resource: &str, device: &str) -> u32 {
        self.shares_by_node.get(node).map_or(0, |on_node| {
            on_node
                .iter()
                .filter(|((r, d), _)| r == resource && d == device)
                .map(|(_, n)| *n)
                .sum()
        })
    }

    /// Committed pods of `unit` not yet bound in `view`: (pod, node, GPUs).
    pub fn unit_commits<'a>(
        &'a self,
        unit: &'a UnitKey,
        view: &'a ClusterView,
    ) -> impl Iterator<Item = (&'a str, &'a str, u32)> + 'a {
        self.commits.iter().filter_map(move |(pod, c)| {
            let (k, gpus) = c.unit.as_ref()?;
            (k == unit && view.annotated_on(pod).is_none()).then_some((
                pod.as_str(),
                c.node.as_str(),
                *gpus,
            ))
        })
    }

    /// The live plan of `unit`.
    pub fn plan(&self, unit: &UnitKey, now: Instant) -> Option<&Plan> {
        self.plans.get(unit).filter(|p| p.expires > now)
    }

    /// Every live plan.
    pub fn plans(&self, now: Instant) -> impl Iterator<Item = (&UnitKey, &Plan)> {
        self.plans.iter().filter(move |(_, p)| p.expires > now)
    }

    /// True when no plan is recorded (the common case: no group pods pending).
    pub fn has_plans(&self) -> bool {
        !self.plans.is_empty()
    }

    /// Records a plan.
    pub fn set_plan(&mut self, unit: UnitKey, plan: Plan) {
        self.plans.insert(unit, plan);
    }

    /// Forgets `unit`'s plan (the simulator's stand-in for the view showing the whole unit
    /// placed, after which [`Ledger::prune`] drops it).
    pub fn drop_plan(&mut self, unit: &UnitKey) {
        if self.plans.remove(unit).is_some() {
            self.freed = self.freed.wrapping_add(1);
        }
    }

    /// Gives up `unit`'s plan: its super-node is avoided for the unit until `until` (planning
    /// takes it again only when no other super-node has the room). Returns the super-node, or
    /// `None` when the unit had no plan.
    pub fn give_up_plan(&mut self, unit: &UnitKey, until: Instant) -> Option<String> {
        let plan = self.plans.remove(unit)?;
        self.freed = self.freed.wrapping_add(1);
        let avoided = self.avoided.entry(unit.clone()).or_default();
        avoided.retain(|(sn, _)| *sn != plan.super_node);
        avoided.push((plan.super_node.clone(), until));
        Some(plan.super_node)
    }

    /// True when `unit`'s plan was given up on `super_node` and that still holds at `now`.
    pub fn avoids(&self, unit: &UnitKey, super_node: &str, now: Instant) -> bool {
        self.avoided
            .get(unit)
            .is_some_and(|l| l.iter().any(|(sn, until)| sn == super_node && *until > now))
    }

    /// Pushes the expiry of `unit`'s plan to `until`.
    pub fn renew_plan(&mut self, unit: &UnitKey, until: Instant) {
        if let Some(p) = self.plans.get_mut(unit) {
            p.expires = p.expires.max(until);
        }
    }

    /// [`Self::renew_plan`], and moves the plan to `super_node` where its sub-unit's pods are:
    /// a scheduler that went on when this service refused a node (Volcano's `allocateFunc`)
    /// may have put them elsewhere, and a plan naming another super-node would reserve room
    /// there for pods that will not come.
    pub fn follow_plan(&mut self, unit: &UnitKey, super_node: &str, until: Instant) {
        if let Some(p) = self.plans.get_mut(unit) {
            p.expires = p.expires.max(until);
            super_node.clone_into(&mut p.super_node);
        }
    }

    /// Drops what the view now shows or what timed out: commits whose pod the view shows
    /// bound with its annotation, commits older than `commit_ttl`, expired plans and plans whose
    /// sub-unit is complete in the view. Returns the pods whose commits were dropped, with them.
    pub fn prune(
        &mut self,
        view: &ClusterView,
        now: Instant,
        commit_ttl: Duration,
    ) -> Vec<(String, Commit)> {
        // (pod, settled): the view shows the pod holding its devices, or its commit timed out.
        let stale: Vec<(String, bool)> = self
            .commits
            .iter()
            .filter_map(|(pod, c)| {
                // A share commit writes no choice: it settles when the node reports it held.
                let settled = if c.share {
                    view.reported(pod)
                } else {
                    view.annotated_on(pod).is_some()
                };
                (settled || now.saturating_duration_since(c.at) > commit_ttl)
                    .then(|| (pod.clone(), settled))
            })
            .collect();
        let dropped = stale
            .into_iter()
            .filter_map(|(pod, settled)| {
                // A settled commit frees nothing: its pod holds the devices still.
                let c = if settled {
                    self.forget_commit(&pod)
                } else {
                    self.release(&pod)
                };
                c.map(|c| (pod, c))
            })
            .collect();
        let plans = self.plans.len();
        self.plans.retain(|unit, p| {
            let placed: u32 = view.members(unit).iter().map(|m| m.gpus).sum();
            p.expires > now && placed < p.gpus
        });
        let gone = (plans - self.plans.len()) as u64;
        self.freed = self.freed.wrapping_add(gone);
        self.avoided.retain(|_, l| {
            l.retain(|(_, until)| *until > now);
            !l.is_empty()
        });
        dropped
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn commit(node: &str, devices: &[&str], at: Instant) -> Commit {
        Commit {
            node: node.into(),
            resource: "nvidia.com/gpu".into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            unit: None,
            at,
            share: false,
        }
    }

    #[test]
    fn commit_replace_release_and_ttl() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        l.commit("ns/a", commit("n1", &["g0", "g1"], t0));
        l.commit("ns/b", commit("n1", &["g2"], t0));
        let committed = |l: &Ledger, node: &str, device: &str| {
            l.committed_on(node).is_some_and(|s| s.contains(device))
        };
        assert!(committed(&l, "n1", "g1") && committed(&l, "n1", "g2"));
        // A new commit for the same pod replaces the old one.
        l.commit("ns/a", commit("n2", &["g0"], t0));
        assert!(!committed(&l, "n1", "g0") && committed(&l, "n2", "g0"));
        // Replacing a commit and releasing one each give room back.
        assert_eq!(l.room_freed(), 1);
        assert_eq!(l.release("ns/b").unwrap().devices, ["g2"]);
        assert_eq!(l.room_freed(), 2);
        assert!(l.committed_on("n1").is_none());
        let view = ClusterView::default();
        assert!(
            l.prune(&view, t0 + Duration::from_secs(5), Duration::from_secs(10))
                .is_empty()
        );
        assert_eq!(
            l.prune(&view, t0 + Duration::from_secs(11), Duration::from_secs(10))
                .into_iter()
                .map(|(pod, _)| pod)
                .collect::<Vec<_>>(),
            ["ns/a"]
        );
        assert!(l.committed_on("n2").is_none());
        assert_eq!(l.room_freed(), 3, "a commit timed out gives its room back");
    }

    #[test]
    fn plans_expire_and_renew() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let k = UnitKey {
            job: "ns/j".into(),
            unit: 0,
            atomic: 0,
        };
        l.set_plan(
            k.clone(),
            Plan {
                super_node: "rack-a".into(),
                gpus: 8,
                pod_gpus: 2,
                resource: "nvidia.com/gpu".into(),
                expires: t0 + Duration::from_secs(10),
                keep_free: 0,
            },
        );
        assert!(l.plan(&k, t0).is_some());
        assert!(l.plan(&k, t0 + Duration::from_secs(10)).is_none());
        l.renew_plan(&k, t0 + Duration::from_secs(30));
        assert!(l.plan(&k, t0 + Duration::from_secs(20)).is_some());
        let view = ClusterView::default();
        let before = l.room_freed();
        l.prune(&view, t0 + Duration::from_secs(31), Duration::from_secs(60));
        assert!(!l.has_plans());
        assert_eq!(
            l.room_freed(),
            before + 1,
            "an expired plan gives its room back"
        );
    }
}
