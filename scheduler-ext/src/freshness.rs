//! How current the live view is: each watch the view is built from reports whether it has
//! listed and whether it is failing now ([`Freshness`]); `/readyz` fails while a watch has not
//! listed yet or has been failing for longer than the allowed staleness, so a Service routes
//! no scheduler to a replica whose view may be old (and kube-scheduler's `ignorable` setting
//! decides what happens then; see docs/scheduler-extension.md).
//!
//! A watch that restarts after a failure says nothing until an object changes, so in a quiet
//! cluster "works again" is inferred: the view's watches retry at most [`WATCH_BACKOFF_MAX`]
//! apart ([`WatchBackoff`]), so a watch with no new error for longer than that (plus a margin,
//! [`QUIET_AFTER_RETRY`]) has been re-established.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default, Clone, Copy)]
struct WatchState {
    listed: bool,
    failing_since: Option<Instant>,
    last_error: Option<Instant>,
    /// When a failure was last logged at warning (a failing watch retries often).
    warned: Option<Instant>,
}

/// The watches behind the view.
#[derive(Debug)]
pub struct Freshness {
    max_staleness: Duration,
    watches: Mutex<BTreeMap<&'static str, WatchState>>,
}

/// How often one failing watch is logged at warning.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// The longest wait between two tries of a failing watch of the view.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// A failing watch with no error for this long has been re-established.
pub const QUIET_AFTER_RETRY: Duration = Duration::from_secs(15);

/// How the view's watches retry: a bound doubling from 500 ms to [`WATCH_BACKOFF_MAX`] and a
/// random point in its upper half (so replicas and restarts do not retry in step); reset by
/// the first event after a failure.
#[derive(Debug, Default)]
pub struct WatchBackoff {
    failures: u32,
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        let bound = Duration::from_millis(250u64.saturating_mul(1 << self.failures.min(8)))
            .min(WATCH_BACKOFF_MAX);
        Some(bound / 2 + (bound / 2).mul_f64(fastrand::f64()))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

impl Freshness {
    /// Watches failing for longer than `max_staleness` make the view stale.
    pub fn new(max_staleness: Duration) -> Self {
        Freshness {
            max_staleness,
            watches: Mutex::new(BTreeMap::new()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<&'static str, WatchState>) -> R) -> R {
        let mut guard = self
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }

    /// Registers a watch that has not listed yet.
    pub fn track(&self, kind: &'static str) {
        self.with(|w| {
            w.entry(kind).or_default();
        });
    }

    /// The watch delivered an event (or finished a list): it works.
    pub fn ok(&self, kind: &'static str, listed: bool) {
        self.with(|w| {
            let s = w.entry(kind).or_default();
            if s.failing_since.take().is_some() {
                tracing::info!(kind, "watch works again");
            }
            s.listed |= listed;
        });
    }

    /// The watch failed with `error`; logged at warning at most every 30 s per watch.
    pub fn failed(&self, kind: &'static str, error: &dyn std::fmt::Display) {
        let now = Instant::now();
        let warn = self.with(|w| {
            let s = w.entry(kind).or_default();
            let since = *s.failing_since.get_or_insert(now);
            s.last_error = Some(now);
            let warn = s.warned.is_none_or(|t| now.duration_since(t) >= WARN_EVERY);
            if warn {
                s.warned = Some(now);
            }
            warn.then_some(now.duration_since(since))
        });
        match warn {
            Some(for_) => {
                tracing::warn!(kind, error = %error, failing_for = ?for_, "watch failing; retrying")
            }
            None => tracing::debug!(kind, error = %error, "watch failing; retrying"),
        }
    }

    /// `Ok` while every watch has listed and none has been failing for longer than allowed;
    /// else why not.
    pub fn check(&self) -> Result<(), String> {
        let now = Instant::now();
        self.with(|w| {
            let mut problems = Vec::new();
            for (kind, s) in w.iter_mut() {
                if s.failing_since.is_some()
                    && s.last_error
                        .is_some_and(|t| now.duration_since(t) > QUIET_AFTER_RETRY)
                {
                    s.failing_since = None;
                    tracing::info!(kind, "watch works again (no error since its last retry)");
                }
                if !s.listed {
                    problems.push(format!("{kind} watch has not listed yet"));
                } else if let Some(since) = s.failing_since
                    && now.duration_since(since) > self.max_staleness
                {
                    problems.push(format!(
                        "{kind} watch failing for {:?} (allowed {:?})",
                        now.duration_since(since),
                        self.max_staleness
                    ));
                }
            }
            if problems.is_empty() {
                Ok(())
            } else {
                Err(problems.join("; "))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stale_until_listed_and_after_failing_too_long() {
        let f = Freshness::new(Duration::ZERO);
        f.track("Pod");
        assert!(
            f.check()
                .unwrap_err()
                .contains("Pod watch has not listed yet")
        );
        f.ok("Pod", true);
        assert!(f.check().is_ok());
        f.failed("Pod", &"410 Gone");
        std::thread::sleep(Duration::from_millis(2));
        assert!(f.check().unwrap_err().contains("Pod watch failing for"));
        // An event that is not a list still shows the watch works.
        f.ok("Pod", false);
        assert!(f.check().is_ok());
        let lenient = Freshness::new(Duration::from_secs(3600));
        lenient.ok("Node", true);
        lenient.failed("Node", &"403");
        assert!(lenient.check().is_ok());
    }

    #[test]
    fn a_watch_quiet_since_its_last_retry_works_again() {
        let f = Freshness::new(Duration::ZERO);
        f.ok("Node", true);
        f.failed("Node", &"connection reset");
        std::thread::sleep(Duration::from_millis(2));
        assert!(f.check().is_err());
        // No event (a quiet cluster), but no error for longer than any retry takes.
        f.with(|w| {
            if let Some(s) = w.get_mut("Node") {
                s.last_error = s
                    .last_error
                    .map(|t| t - QUIET_AFTER_RETRY - Duration::from_secs(1));
            }
        });
        assert!(f.check().is_ok());
    }

    #[test]
    fn watch_backoff_grows_to_its_bound_spread_and_resets() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff::default();
        let first = b.next().unwrap();
        assert!((Duration::from_millis(250)..=Duration::from_millis(500)).contains(&first));
        let later: Vec<Duration> = (0..20).filter_map(|_| b.next()).collect();
        assert!(later.iter().all(|d| *d <= WATCH_BACKOFF_MAX));
        // From the seventh failure on, at the bound: its upper half.
        assert!(later[6..].iter().all(|d| *d >= WATCH_BACKOFF_MAX / 2));
        assert!(WATCH_BACKOFF_MAX < QUIET_AFTER_RETRY);
        b.reset();
        assert!(b.next().unwrap() <= Duration::from_millis(500));
    }
}
