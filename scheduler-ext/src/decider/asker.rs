//! Who asks: the scheduler whose question the decider answers ([`Asker`]), and Volcano's
//! allocate clock ([`AllocateClock`]), which says whether Volcano tells the decider where it
//! puts its pods. Together they decide whether a unit's waiting plan may lapse.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The scheduler whose question the service answers, for what it tells the service afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asker {
    /// kube-scheduler's `filter` / `prioritize`: it passes only the nodes its own filters kept
    /// (a new plan is made among them), and `bind` tells the service where each pod goes
    /// (and may be refused), so waiting plans may lapse.
    KubeScheduler,
    /// Volcano's `predicate` / `prioritize`. Volcano tells the service where a pod goes only
    /// through `allocateFunc`, which Volcano v1.10 never calls: the pods it allocates in a
    /// session are unknown here until their binds show in the view, so a unit's plan must
    /// not lapse (its next pod would be planned without the first, and the unit split; seen
    /// in e2e `scheduler_ext_ha`). Waiting plans lapse only while `allocateFunc` calls come
    /// ([`ALLOCATE_FUNC_FRESH`]).
    Volcano,
    /// fumarole's own plugins compiled into the scheduler (`fumarole-scheduler-abi`: Volcano's
    /// and kube-scheduler's): every allocation (reservation) and its undoing reach the decider
    /// in process before the next task is judged, so waiting plans may always lapse.
    Plugin,
}

/// How long after Volcano's last `allocateFunc` call its plans may still lapse: a Volcano
/// started again without that verb configured stops them lapsing within this (its restart
/// takes longer); a busy Volcano that has the verb allocates far more often.
pub const ALLOCATE_FUNC_FRESH: Duration = Duration::from_secs(60);

/// When Volcano last called `allocateFunc`: while it does, it tells the decider where it puts
/// each pod, and Volcano's plans may lapse ([`Asker::Volcano`]).
#[derive(Debug, Default)]
pub struct AllocateClock {
    last: Mutex<Option<Instant>>,
}

impl AllocateClock {
    /// Notes a call of Volcano's `allocateFunc` now.
    pub fn called(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// True while Volcano calls `allocateFunc` ([`ALLOCATE_FUNC_FRESH`]).
    pub fn fresh(&self) -> bool {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < ALLOCATE_FUNC_FRESH)
    }
}
