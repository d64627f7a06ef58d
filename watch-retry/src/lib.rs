//! kube watches that back off while their lists fail.
//!
//! kube-rs' watcher yields a synthetic [`watcher::Event::Init`] before every list it makes,
//! also after a failed one, and its `StreamBackoff` resets the backoff on any `Ok` item. So a
//! watch whose list kept failing was retried at the backoff's first step forever (0.8 to
//! 1.6 s with kube's default): a fleet of agents hammering an API server that is trying to
//! recover. [`retry_with`] backs off the same way but counts only what the API server said (a
//! listed object, a finished list, a watch event) as the watch working again.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

struct Retrying<S, B> {
    stream: Pin<Box<S>>,
    backoff: B,
    /// The wait before the next poll, after a failure.
    pause: Option<Duration>,
}

/// `stream` (a kube watcher, or a reflector over one) with `backoff` between a failure and
/// the next try. The backoff is reset by the first event from the API server after a
/// failure, never by `Init`; when it gives up (`next()` is `None`) the stream ends after the
/// error, as with kube's `StreamBackoff`.
pub fn retry_with<S, K, B>(
    stream: S,
    backoff: B,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    B: Backoff,
{
    let start = Retrying {
        stream: Box::pin(stream),
        backoff,
        pause: None,
    };
    futures::stream::unfold(Some(start), |state| async move {
        let mut state = state?;
        if let Some(pause) = state.pause.take() {
            tokio::time::sleep(pause).await;
        }
        let item = state.stream.next().await?;
        match &item {
            Err(_) => match state.backoff.next() {
                Some(pause) => state.pause = Some(pause),
                None => return Some((item, None)),
            },
            // Made up by the watcher before it lists: says nothing about the API server.
            Ok(watcher::Event::Init) => {}
            Ok(_) => state.backoff.reset(),
        }
        Some((item, Some(state)))
    })
}

/// [`retry_with`] and kube's default backoff (800 ms doubling to 30 s, with jitter).
pub fn retry<S, K>(stream: S) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    retry_with(stream, watcher::DefaultBackoff::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    /// Doubles from 1 s; records its resets.
    #[derive(Clone, Default)]
    struct Doubling {
        failures: u32,
        resets: Arc<Mutex<u32>>,
        give_up_after: Option<u32>,
    }

    impl Iterator for Doubling {
        type Item = Duration;
        fn next(&mut self) -> Option<Duration> {
            if self.give_up_after == Some(self.failures) {
                return None;
            }
            self.failures += 1;
            Some(Duration::from_secs(1 << (self.failures - 1)))
        }
    }

    impl Backoff for Doubling {
        fn reset(&mut self) {
            self.failures = 0;
            *self.resets.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        }
    }

    type Item = Result<watcher::Event<ConfigMap>, watcher::Error>;

    fn failed() -> Item {
        Err(watcher::Error::NoResourceVersion)
    }

    /// Each item with the whole seconds since the start at which it came.
    async fn timed(items: Vec<Item>, backoff: Doubling) -> Vec<(u64, String)> {
        let start = Instant::now();
        retry_with(futures::stream::iter(items), backoff)
            .map(|item| {
                let what = match item {
                    Ok(watcher::Event::Init) => "init",
                    Ok(watcher::Event::InitApply(_)) => "object",
                    Ok(watcher::Event::InitDone) => "listed",
                    Ok(_) => "event",
                    Err(_) => "failed",
                };
                (start.elapsed().as_secs(), what.to_string())
            })
            .collect()
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn failed_lists_back_off_through_the_watchers_init_and_a_list_resets() {
        let backoff = Doubling::default();
        let resets = backoff.resets.clone();
        let items = vec![
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(ConfigMap::default())),
            Ok(watcher::Event::InitDone),
            failed(),
            Ok(watcher::Event::Init),
        ];
        let got = timed(items, backoff).await;
        let want: Vec<(u64, String)> = [
            (0, "init"),
            (0, "failed"),
            (1, "init"),
            (1, "failed"),
            // 2 s after the second failure, not 1 s again: the Init did not reset it.
            (3, "init"),
            (3, "failed"),
            (7, "init"),
            (7, "object"),
            (7, "listed"),
            (7, "failed"),
            // The list worked: back to the first step.
            (8, "init"),
        ]
        .into_iter()
        .map(|(t, w)| (t, w.to_string()))
        .collect();
        assert_eq!(got, want);
        // Reset by the listed object and the end of the list, never by an Init.
        assert_eq!(*resets.lock().unwrap_or_else(|e| e.into_inner()), 2);
    }

    /// Why this crate exists: kube's own `StreamBackoff` over the same failing lists resets
    /// on every `Init` and retries at the first step each time. If this fails, kube changed
    /// and this crate may no longer be needed.
    #[tokio::test(start_paused = true)]
    async fn kubes_stream_backoff_retries_failing_lists_at_its_first_step() {
        use kube::runtime::WatchStreamExt;
        let items = vec![
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
        ];
        let start = Instant::now();
        let at: Vec<u64> = futures::stream::iter(items)
            .backoff(Doubling::default())
            .map(|_| start.elapsed().as_secs())
            .collect()
            .await;
        assert_eq!(at, [0, 0, 1, 1, 2, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_backoff_that_gives_up_ends_the_stream_after_the_error() {
        let backoff = Doubling {
            give_up_after: Some(1),
            ..Doubling::default()
        };
        let items = vec![failed(), Ok(watcher::Event::Init), failed(), failed()];
        let got = timed(items, backoff).await;
        let what: Vec<&str> = got.iter().map(|(_, w)| w.as_str()).collect();
        assert_eq!(what, ["failed", "init", "failed"]);
    }
}
