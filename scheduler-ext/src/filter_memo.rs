//! The verdicts of kube-scheduler's last `filter` calls, for the `prioritize` call that
//! follows each. kube-scheduler asks an extender `filter` and then `prioritize` about the same
//! pod in one scheduling cycle, over one snapshot of its own, and prioritizes only nodes that
//! passed the filter: judging them again would repeat the request's most costly half. The
//! score of a reused verdict is the one the filter computed: the cluster as the cycle's filter
//! saw it, as kube-scheduler's own scores are its snapshot's. `bind` judges afresh under the
//! ledger's lock, so a reused score never gives a device away. Start at [`FilterMemo`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::core::verdict::NodeVerdict;

/// Filters remembered at once: kube-scheduler places one pod at a time per profile, so a
/// handful covers several profiles or schedulers sharing one extender.
pub const FILTERS_KEPT: usize = 16;

/// How long a filter's verdicts serve its prioritize: a cycle's two calls are milliseconds
/// apart; an older filter belongs to a cycle that ended without prioritizing.
pub const FILTER_REUSE_WINDOW: Duration = Duration::from_secs(5);

/// Which pod a filter was for: its uid and the `resourceVersion` kube-scheduler sent (a pod
/// changed between the calls is judged again).
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodVersion {
    uid: String,
    resource_version: Option<String>,
}

impl PodVersion {
    /// `None` for a pod without a uid (never one kube-scheduler sends): nothing to key it by.
    fn of(pod: &Pod) -> Option<Self> {
        let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
        Some(PodVersion {
            uid: uid.to_string(),
            resource_version: pod.metadata.resource_version.clone(),
        })
    }
}

#[derive(Debug)]
struct Filtered {
    pod: PodVersion,
    at: Instant,
    /// The verdicts of the nodes that passed, in the order the filter was asked.
    passed: Arc<Vec<NodeVerdict>>,
}

/// The last [`FILTERS_KEPT`] filters' passing verdicts, newest last.
#[derive(Debug, Default)]
pub struct FilterMemo {
    kept: Mutex<Vec<Filtered>>,
}

impl FilterMemo {
    /// Remembers the verdicts of the nodes `pod` passed, in the filter's order (replacing an
    /// earlier filter of the same pod).
    pub fn remember(&self, pod: &Pod, passed: Vec<NodeVerdict>) {
        let Some(version) = PodVersion::of(pod) else {
            return;
        };
        let mut kept = self.kept();
        kept.retain(|f| f.pod.uid != version.uid);
        if kept.len() == FILTERS_KEPT {
            kept.remove(0);
        }
        kept.push(Filtered {
            pod: version,
            at: Instant::now(),
            passed: Arc::new(passed),
        });
    }

    /// The verdicts `pod`'s last filter gave `nodes`, in their order, when that filter was
    /// for this version of the pod, at most [`FILTER_REUSE_WINDOW`] ago, and passed every
    /// node of `nodes` with `nodes` in the filter's order (what kube-scheduler sends: the
    /// filter's answer less what its other filters refused). `None`: judge again.
    pub fn reuse<N: AsRef<str>>(&self, pod: &Pod, nodes: &[N]) -> Option<Arc<Vec<NodeVerdict>>> {
        let version = PodVersion::of(pod)?;
        let passed = {
            let kept = self.kept();
            let f = kept.iter().rev().find(|f| f.pod == version)?;
            if f.at.elapsed() > FILTER_REUSE_WINDOW {
                return None;
            }
            Arc::clone(&f.passed)
        };
        if passed.len() == nodes.len()
            && passed.iter().zip(nodes).all(|(v, n)| v.node == n.as_ref())
        {
            return Some(passed);
        }
        // An ordered subset: one walk over the filter's list.
        let mut rest = passed.iter();
        let subset: Option<Vec<NodeVerdict>> = nodes
            .iter()
            .map(|n| rest.find(|v| v.node == n.as_ref()).cloned())
            .collect();
        subset.map(Arc::new)
    }

    fn kept(&self) -> MutexGuard<'_, Vec<Filtered>> {
        match self.kept.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::core::verdict::Unfit;

    fn pod(uid: &str, rv: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.resource_version = Some(rv.into());
        p
    }

    fn passed(names: &[&str]) -> Vec<NodeVerdict> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| NodeVerdict {
                raw: Some(i as f64 / 10.0),
                ..NodeVerdict::filtered(n, Unfit::UnknownNode)
            })
            .map(|v| NodeVerdict { unfit: None, ..v })
            .collect()
    }

    fn names(v: &[NodeVerdict]) -> Vec<&str> {
        v.iter().map(|v| v.node.as_str()).collect()
    }

    #[test]
    fn the_filters_list_or_an_ordered_part_of_it_is_reused() {
        let memo = FilterMemo::default();
        let p = pod("u1", "7");
        memo.remember(&p, passed(&["a", "b", "c", "d"]));
        let all = memo.reuse(&p, &["a", "b", "c", "d"]).unwrap();
        assert_eq!(names(&all), ["a", "b", "c", "d"]);
        let part = memo.reuse(&p, &["b", "d"]).unwrap();
        assert_eq!(names(&part), ["b", "d"]);
        assert_eq!(part[1].raw, Some(0.3), "d's verdict, not another node's");
    }

    #[test]
    fn anything_the_filter_did_not_pass_in_that_order_is_judged_again() {
        let memo = FilterMemo::default();
        let p = pod("u1", "7");
        memo.remember(&p, passed(&["a", "b", "c"]));
        assert!(memo.reuse(&p, &["a", "x"]).is_none(), "x did not pass");
        assert!(
            memo.reuse(&p, &["c", "a"]).is_none(),
            "not the filter's order"
        );
        assert!(memo.reuse(&pod("u1", "8"), &["a"]).is_none(), "pod changed");
        assert!(memo.reuse(&pod("u2", "7"), &["a"]).is_none(), "another pod");
        let mut no_uid = pod("", "7");
        no_uid.metadata.uid = None;
        memo.remember(&no_uid, passed(&["a"]));
        assert!(memo.reuse(&no_uid, &["a"]).is_none());
    }

    #[test]
    fn a_new_filter_of_the_pod_replaces_the_old_and_the_oldest_goes_first() {
        let memo = FilterMemo::default();
        let p = pod("u1", "7");
        memo.remember(&p, passed(&["a", "b"]));
        memo.remember(&p, passed(&["c"]));
        assert!(memo.reuse(&p, &["a"]).is_none());
        assert!(memo.reuse(&p, &["c"]).is_some());
        for i in 0..FILTERS_KEPT {
            memo.remember(&pod(&format!("other-{i}"), "1"), passed(&["a"]));
        }
        assert!(memo.reuse(&p, &["c"]).is_none(), "pushed out");
        assert!(memo.reuse(&pod("other-1", "1"), &["a"]).is_some());
    }
}
