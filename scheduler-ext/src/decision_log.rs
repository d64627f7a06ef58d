//! The `/ui` decision log: the last [`DECISIONS_KEPT`] scorings the schedulers asked for
//! (prioritize calls), kept as the verdicts the verb already had and turned into `explain`
//! rows only when the page asks ([`DecisionLog::decisions`]). Start at [`DecisionLog`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;

use crate::core::explain::Row;
use crate::core::request::pod_key;
use crate::core::verdict::{NodeVerdict, best_first};
use crate::core::view::ClusterView;

/// How many scorings `/ui` shows.
pub const DECISIONS_KEPT: usize = 10;

/// A scoring as the verb left it.
#[derive(Debug)]
struct Recorded {
    pod: String,
    at: SystemTime,
    /// Shared with the filter memo when prioritize reused a filter's verdicts.
    verdicts: Arc<Vec<NodeVerdict>>,
}

/// One scoring of a pod over nodes: what `explain` would say, as the scheduler asked it.
#[derive(Clone, Debug)]
pub struct Decision {
    /// `namespace/name`.
    pub pod: String,
    pub at: SystemTime,
    /// Best first.
    pub rows: Vec<Row>,
}

/// The last scorings, oldest first.
#[derive(Debug, Default)]
pub struct DecisionLog {
    kept: Mutex<VecDeque<Recorded>>,
    /// Counts recorded scorings: what `/ui` shows changed when it moves.
    generation: AtomicU64,
}

impl DecisionLog {
    /// Remembers a scoring of `pod` (the last [`DECISIONS_KEPT`] are kept). On the prioritize
    /// path: it only moves the verdicts in; sorting and naming devices wait for `/ui`.
    pub fn record(&self, pod: &Pod, verdicts: Arc<Vec<NodeVerdict>>) {
        let recorded = Recorded {
            pod: pod_key(pod),
            at: SystemTime::now(),
            verdicts,
        };
        let mut kept = self.kept();
        if kept.len() == DECISIONS_KEPT {
            kept.pop_front();
        }
        kept.push_back(recorded);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// The recorded scorings, newest first, as `explain` rows (device ids from `view`, scores
    /// on `scale`).
    pub fn decisions(&self, view: &ClusterView, scale: impl Fn(f64) -> f64) -> Vec<Decision> {
        let kept = self.kept();
        kept.iter()
            .rev()
            .map(|r| {
                let mut verdicts = r.verdicts.to_vec();
                best_first(&mut verdicts);
                Decision {
                    pod: r.pod.clone(),
                    at: r.at,
                    rows: verdicts
                        .into_iter()
                        .map(|v| Row::new(v, &scale, view))
                        .collect(),
                }
            })
            .collect()
    }

    /// Moves whenever a scoring is recorded.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    fn kept(&self) -> MutexGuard<'_, VecDeque<Recorded>> {
        match self.kept.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}
