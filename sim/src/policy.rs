//! The placement policies the simulator compares.
//!
//! - `fumarole`: the service's own path: [`scheduler_ext::core::decide::plan`] (the unit's super-node, with
//!   reservations) then [`scheduler_ext::core::decide::judge`] over every node (gpu-aware fit, `q`, `loss`,
//!   score, devices from `topology::select`, the group checks); the best verdict wins
//!   ([`scheduler_ext::core::score::gpu_aware::best_first`]) and its devices are committed to the ledger.
//! - `fumarole-defrag` (only when asked for by name): `fumarole`, and at each job completion, when the oldest waiting job is
//!   large and still waits, the moves of the scheduler extension's defragmentation advisor that
//!   let it start, each moved pod restarting its job ([`crate::defrag`]).
//! - `binpack`: the node with the fewest free devices that still has enough (kube-scheduler's
//!   `MostAllocated` on the device count); the lowest free device indices.
//! - `spread`: the node with the most free devices (`LeastAllocated`); lowest free indices.
//! - `random`: a node that has enough, uniformly at random (seeded); lowest free indices.
//! - `nvidia`: binpack's node, devices from the NVIDIA device plugin's partition search
//!   ([`fumarole_topology::baseline::nvidia_baseline`]).
//!
//! - `volcano-hard`: Volcano's network-topology-aware scheduling in hard mode with the
//!   super-node as the tier-1 HyperNode: every pod of a gpu-group-size unit inside one
//!   super-node, or the unit waits. The super-node is the fullest (fewest free devices) that
//!   holds the whole unit (Volcano's HyperNode binpack), binpack's node inside it; devices as
//!   `nvidia` (so it differs from `nvidia` only by the super-node rule).
//! - `first-fit`: each atomic part (`atomic-gpu-group-size`, by default the whole unit) in the
//!   first super-node by name that holds it whole, the first node by name with room inside;
//!   devices as `nvidia`. A unit's atomic parts may go to different super-nodes.
//!
//! Ties between nodes go to the first by name. Only `fumarole`, `volcano-hard` and `first-fit`
//! know super-nodes; the last two place a unit (or part) whole or not at all
//! (the engine plans the whole job before it commits), with no reservation while it waits.

use std::fmt;
use std::str::FromStr;

/// One placement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    Fumarole,
    FumaroleDefrag,
    Binpack,
    Spread,
    Random,
    Nvidia,
    VolcanoHard,
    FirstFit,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 7] = [
        Policy::Fumarole,
        Policy::VolcanoHard,
        Policy::FirstFit,
        Policy::Binpack,
        Policy::Spread,
        Policy::Random,
        Policy::Nvidia,
    ];

    /// Policies that run only when asked for by name (`--policy fumarole-defrag`).
    pub const OPT_IN: [Policy; 1] = [Policy::FumaroleDefrag];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Fumarole => "fumarole",
            Policy::FumaroleDefrag => "fumarole-defrag",
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
            Policy::Random => "random",
            Policy::Nvidia => "nvidia",
            Policy::VolcanoHard => "volcano-hard",
            Policy::FirstFit => "first-fit",
        }
    }

    /// Decides through the service's own path (`fumarole`, with or without defragmentation).
    pub fn is_fumarole(self) -> bool {
        matches!(self, Policy::Fumarole | Policy::FumaroleDefrag)
    }

    /// Places a whole unit (`volcano-hard`) or atomic part (`first-fit`) inside one
    /// super-node at once, or none of it.
    pub fn honours_super_nodes(self) -> bool {
        matches!(self, Policy::VolcanoHard | Policy::FirstFit)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is not one of [`Policy::ALL`] or [`Policy::OPT_IN`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown policy {0:?} (known: fumarole, fumarole-defrag, volcano-hard, first-fit, binpack, spread, random, nvidia)"
)]
pub struct UnknownPolicy(pub String);

impl FromStr for Policy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, UnknownPolicy> {
        Policy::ALL
            .into_iter()
            .chain(Policy::OPT_IN)
            .find(|p| p.name() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// The `k` lowest set bits of `free` (`None` when it has fewer).
pub fn lowest(free: u64, k: usize) -> Option<Vec<usize>> {
    let out: Vec<usize> = scheduler_ext::core::view::indices(free)
        .into_iter()
        .take(k)
        .collect();
    (out.len() == k).then_some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_named() {
        for p in Policy::ALL.into_iter().chain(Policy::OPT_IN) {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        assert!(!Policy::ALL.contains(&Policy::FumaroleDefrag));
        assert_eq!(" Binpack".parse::<Policy>().unwrap(), Policy::Binpack);
        let e = "tetris".parse::<Policy>().unwrap_err().to_string();
        assert!(e.starts_with("unknown policy \"tetris\""), "{e}");
        assert_eq!(lowest(0b1011_0100, 3), Some(vec![2, 4, 5]));
        assert_eq!(lowest(0b100, 2), None);
    }
}
