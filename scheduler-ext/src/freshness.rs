//! How current the live view is: each watch the view is built from reports whether it has
//! listed and whether it is failing now ([`Freshness`]); `/readyz` fails while a watch has not
//! listed yet or has been failing for longer than the allowed staleness, so a Service routes
//! no scheduler to a replica whose view may be old (and kube-scheduler's `ignorable` setting
//! decides what happens then; see docs/scheduler-extension.md).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default, Clone, Copy)]
struct WatchState {
    listed: bool,
    failing_since: Option<Instant>,
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
            for (kind, s) in w.iter() {
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
}
