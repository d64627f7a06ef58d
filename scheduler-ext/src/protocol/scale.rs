//! Scores on each scheduler's scale: the decision core scores nodes from 0 to 1
//! ([`crate::core::score`]); this is the one place such a score becomes the number a scheduler
//! is answered with. kube-scheduler's extender takes integers 0..10 ([`kube_scheduler`]),
//! Volcano's `extender` plugin 0..100 times its `weight` ([`volcano`]; `explain` shows that one
//! too). A leaf: it imports nothing, so the service's `explain` rows may read it as well.

/// kube-scheduler's score: 0..10, rounded (`MaxExtenderPriority` = 10).
pub fn kube_scheduler(raw: f64) -> i64 {
    (raw * 10.0).round().clamp(0.0, 10.0) as i64
}

/// Volcano's score: 0..100 times `weight` (Volcano's `weight`, `--weight`).
pub fn volcano(raw: f64, weight: f64) -> f64 {
    raw * 100.0 * weight
}
