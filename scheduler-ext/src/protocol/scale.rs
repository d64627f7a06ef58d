//! Scores on each scheduler's scale: the decision core scores nodes from 0 to 1
//! ([`crate::core::score`]); this is the one place such a score becomes the number a scheduler
//! is answered with. kube-scheduler's extender takes integers 0..10 ([`kube_scheduler`]),
//! Volcano's `extender` plugin 0..100 times its `weight` ([`volcano`]). `explain`, `/ui` and the
//! kubectl plugin show Volcano's scale too ([`shown`]): the decider and the decision log take
//! the scale from their callers, so nothing below the protocols imports this module.

use crate::core::score::Scoring;

/// kube-scheduler's score: 0..10, rounded (`MaxExtenderPriority` = 10).
pub fn kube_scheduler(raw: f64) -> i64 {
    (raw * 10.0).round().clamp(0.0, 10.0) as i64
}

/// Volcano's score: 0..100 times `weight` (Volcano's `weight`, `--weight`).
pub fn volcano(raw: f64, weight: f64) -> f64 {
    raw * 100.0 * weight
}

/// The scale `explain` rows are shown on (Volcano's, with the service's `weight`).
pub fn shown(scoring: &Scoring) -> impl Fn(f64) -> f64 + use<> {
    let weight = scoring.weight;
    move |raw| volcano(raw, weight)
}
