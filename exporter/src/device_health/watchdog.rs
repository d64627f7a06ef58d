//! Telling a vendor library that hangs from one that is slow: the source thread marks each
//! call it makes ([`CallWatch::enter`]), and [`spawn`] logs one line when a call has not
//! returned within its limit (and one when it finally does). Nothing waits on the library: the
//! source's last report simply stays in force meanwhile.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The call a source thread is in, if any. Shared between the thread and the watchdog.
#[derive(Debug, Default)]
pub struct CallWatch {
    current: Mutex<Option<(&'static str, Instant)>>,
}

/// Marks the end of a call when dropped.
pub struct InCall<'a> {
    watch: &'a CallWatch,
}

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        *self
            .watch
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl CallWatch {
    /// Marks the start of `call`; the returned guard marks its end.
    pub fn enter(&self, call: &'static str) -> InCall<'_> {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some((call, Instant::now()));
        InCall { watch: self }
    }

    /// The call in progress and for how long it has run.
    pub fn in_progress(&self) -> Option<(&'static str, Duration)> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|(call, since)| (call, since.elapsed()))
    }
}

/// Watches `watch` from the tokio runtime: a call of `library` running longer than `limit` is
/// logged once as stuck, and once more when it returns.
pub fn spawn(library: &'static str, watch: Arc<CallWatch>, limit: Duration) {
    tokio::spawn(async move {
        let mut stuck: Option<&'static str> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            match (watch.in_progress(), stuck) {
                (Some((call, running)), None) if running > limit => {
                    tracing::warn!(
                        library,
                        call,
                        running = ?running,
                        "vendor library call has not returned: keeping the last health it gave; the device plugins keep answering"
                    );
                    stuck = Some(call);
                }
                (Some((call, _)), Some(was)) if call == was => {}
                (_, Some(was)) => {
                    tracing::info!(library, call = was, "vendor library call returned");
                    stuck = None;
                }
                _ => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enter_marks_and_drop_clears() {
        let w = CallWatch::default();
        assert!(w.in_progress().is_none());
        {
            let _call = w.enter("nvmlEventSetWait_v2");
            assert_eq!(w.in_progress().map(|c| c.0), Some("nvmlEventSetWait_v2"));
        }
        assert!(w.in_progress().is_none());
    }
}
