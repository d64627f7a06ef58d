//! Pods bound by a scheduler that does not tell the service its choice (Volcano before
//! `allocateFunc`, named in `--annotate-bound-pods-of`) get their devices chosen and written
//! after the fact ([`annotate`]), so the device plugin and the view still agree. The writes run
//! in their own task ([`write_choices`]), fed by the live view after each rebuild: a slow API
//! server delays the writes, never the next view, and a pod bound meanwhile is written as soon
//! as the round before it is done. A write that fails is tried again after a pause that
//! doubles up to [`MAX_PAUSE`] ([`Retries`]), so a refusal that passes (an admission policy not
//! yet in force, an API server restarting) never leaves a bound pod without its devices.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use tokio::sync::mpsc;

use crate::core::pod_facts::PodFacts;
use crate::core::view::ClusterView;
use crate::pod_store::PodStore;
use crate::service::Service;

/// Which pods a round of [`write_choices`] looks at, sent by the live view after a rebuild.
#[derive(Debug)]
pub enum Candidates {
    /// Every pod (after a full build, or when this replica begins to lead).
    All,
    /// The pods (`namespace/name`) that changed.
    Changed(Vec<Arc<str>>),
}

/// The longest a quiet writer sleeps (it also wakes when a failed write is due again).
const IDLE: Duration = Duration::from_secs(5);

/// The writer task: for each batch of [`Candidates`] (those sent while the last round wrote
/// are taken together), and whenever a failed write is due again, gives the bound pods of
/// `schedulers` among them their devices ([`annotate`]) against the service's current view,
/// while this replica leads. Ends when the live view drops its sender.
pub async fn write_choices(
    svc: Arc<Service>,
    pods: PodStore,
    schedulers: Vec<String>,
    mut rx: mpsc::UnboundedReceiver<Candidates>,
) {
    let mut retries = Retries::default();
    loop {
        let wake = retries.next_due().map_or(IDLE, |due| {
            due.saturating_duration_since(Instant::now()).min(IDLE)
        });
        let (mut all, mut changed) = (false, HashSet::new());
        let mut take = |c: Candidates| match c {
            Candidates::All => all = true,
            Candidates::Changed(keys) => changed.extend(keys),
        };
        match tokio::time::timeout(wake, rx.recv()).await {
            Ok(Some(c)) => take(c),
            Ok(None) => return,
            Err(_) => {}
        }
        while let Ok(c) = rx.try_recv() {
            take(c);
        }
        if !svc.leads() {
            continue;
        }
        let candidates = if all {
            pods.state()
        } else {
            let due = retries.due(Instant::now());
            for gone in due.iter().filter(|k| pods.get(k).is_none()) {
                retries.forget(gone);
            }
            changed.extend(due);
            changed.iter().filter_map(|k| pods.get(k)).collect()
        };
        let view = svc.decider().view();
        annotate(&svc, candidates, &view, &schedulers, &mut retries).await;
    }
}

/// The first pause after a failed write: short, for the device plugin waits only
/// `--await-device-choice-timeout` (30 s) for the choice; most failures (a connection the API
/// server closed, a policy a moment from force) pass within it.
const FIRST_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause between two tries of one pod.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// What the after-the-fact annotation remembers between rounds: the pods it has settled (given
/// their devices, or found to need none) and those whose write failed, with when to try again.
#[derive(Debug, Default)]
pub struct Retries {
    settled: HashSet<Arc<str>>,
    failed: HashMap<Arc<str>, Failed>,
}

#[derive(Debug, Clone, Copy)]
struct Failed {
    tries: u32,
    next: Instant,
}

impl Retries {
    /// The failed pods whose pause is over at `now`.
    pub fn due(&self, now: Instant) -> Vec<Arc<str>> {
        self.failed
            .iter()
            .filter(|(_, f)| f.next <= now)
            .map(|(k, _)| Arc::clone(k))
            .collect()
    }

    /// When the first failed pod's pause is over (`None`: none failed).
    pub fn next_due(&self) -> Option<Instant> {
        self.failed.values().map(|f| f.next).min()
    }

    /// Whether `key` is to be tried at `now`: not settled, and not pausing after a failure.
    fn wanted(&self, key: &str, now: Instant) -> bool {
        !self.settled.contains(key) && self.failed.get(key).is_none_or(|f| f.next <= now)
    }

    /// `key` needs nothing more.
    fn settle(&mut self, key: &Arc<str>) {
        self.failed.remove(&**key);
        // Bounded: a pod settled and forgotten is at worst read once more.
        if self.settled.len() > 100_000 {
            self.settled.clear();
        }
        self.settled.insert(Arc::clone(key));
    }

    /// `key`'s try failed at `now`: the next waits twice as long as the last (up to
    /// [`MAX_PAUSE`]). Answers how many tries have failed.
    fn fail(&mut self, key: &Arc<str>, now: Instant) -> u32 {
        let tries = self.failed.get(&**key).map_or(0, |f| f.tries) + 1;
        let pause = FIRST_PAUSE
            .saturating_mul(1 << (tries - 1).min(16))
            .min(MAX_PAUSE);
        self.failed.insert(
            Arc::clone(key),
            Failed {
                tries,
                next: now + pause,
            },
        );
        tries
    }

    /// Forgets `key` (it is gone, finished or annotated by someone).
    pub fn forget(&mut self, key: &str) {
        self.failed.remove(key);
    }
}

/// How many pods' devices are read and written at once: Volcano binds a gang in one session,
/// and the device plugins wait (`--await-device-choice-timeout`, 30 s) for each pod's choice, so
/// a burst is written side by side rather than one round trip after another.
const WRITES_IN_FLIGHT: usize = 16;

/// Gives each bound pod of `schedulers` among `pods` that lacks a choice its devices on its node
/// (chosen by the decider, written by the effects; up to [`WRITES_IN_FLIGHT`] at once).
/// `retries` remembers the pods settled and the failed ones: a failure is logged at its first
/// try and every tenth, and tried again after its pause (the caller adds [`Retries::due`] to
/// `pods`).
pub async fn annotate(
    svc: &Service,
    pods: Vec<Arc<PodFacts>>,
    view: &ClusterView,
    schedulers: &[String],
    retries: &mut Retries,
) {
    if schedulers.is_empty() {
        return;
    }
    let Some(ops) = svc.effects() else {
        return;
    };
    let now = Instant::now();
    let mut wanted = Vec::new();
    for pod in pods {
        let (Some(node), Some(scheduler)) = (&pod.node, &pod.scheduler) else {
            continue;
        };
        // A choice made for another node is no choice here.
        if pod.finished || pod.annotated() || view.reported(&pod.key) {
            retries.forget(&pod.key);
            continue;
        }
        if schedulers.contains(scheduler) && retries.wanted(&pod.key, now) {
            wanted.push((Arc::clone(&pod.key), node.clone(), scheduler.clone()));
        }
    }
    let ops = &ops;
    let mut written = stream::iter(wanted)
        .map(|(key, node, scheduler)| async move {
            let (ns, name) = key.split_once('/').unwrap_or(("default", &key));
            let tried = match ops.pod(ns, name).await {
                // The view that named the pod may be older than the pod: a choice that landed
                // since (the scheduler's own write at allocation) is never overwritten.
                Ok(whole) if PodFacts::of(&whole).annotated() => Ok(None),
                Ok(whole) => svc
                    .assign_bound(&whole, &node)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(format!("reading the pod: {e}")),
            };
            (key, node, scheduler, tried)
        })
        .buffer_unordered(WRITES_IN_FLIGHT);
    while let Some((key, node, scheduler, tried)) = written.next().await {
        match tried {
            Ok(Some(c)) if c.share => {
                retries.settle(&key);
                tracing::info!(pod = %key, node = %node, devices = ?c.devices, "counted the shares of a pod bound by {scheduler}")
            }
            Ok(Some(c)) => {
                retries.settle(&key);
                tracing::info!(pod = %key, node = %node, devices = ?c.devices, "annotated a pod bound by {scheduler}")
            }
            Ok(None) => retries.settle(&key),
            Err(error) => {
                // Paused from the failure, not from the round's start.
                let tries = retries.fail(&key, Instant::now());
                if tries % 10 == 1 {
                    tracing::warn!(pod = %key, node = %node, tries, %error, "cannot give devices to a bound pod yet; trying again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_failed_pod_pauses_twice_as_long_each_time_up_to_the_cap() {
        let mut r = Retries::default();
        let key: Arc<str> = Arc::from("default/p");
        let t0 = Instant::now();
        assert!(r.wanted(&key, t0));
        let mut at = t0;
        let mut pauses = vec![];
        for _ in 0..9 {
            r.fail(&key, at);
            let next = r.failed[&key].next;
            assert!(!r.wanted(&key, next - Duration::from_millis(1)));
            assert!(r.wanted(&key, next));
            assert_eq!(r.due(next), vec![Arc::clone(&key)]);
            assert_eq!(r.next_due(), Some(next));
            assert!(r.due(next - Duration::from_millis(1)).is_empty());
            pauses.push((next - at).as_millis());
            at = next;
        }
        assert_eq!(
            pauses,
            [250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000]
        );
        // Settled: never wanted again, nothing due.
        r.settle(&key);
        assert!(!r.wanted(&key, at + MAX_PAUSE));
        assert!(r.due(at + MAX_PAUSE).is_empty());
        assert_eq!(r.next_due(), None);
    }

    #[test]
    fn a_forgotten_pod_is_wanted_at_once() {
        let mut r = Retries::default();
        let key: Arc<str> = Arc::from("default/p");
        let t0 = Instant::now();
        r.fail(&key, t0);
        assert!(!r.wanted(&key, t0));
        r.forget(&key);
        assert!(r.wanted(&key, t0));
        assert!(r.due(t0 + MAX_PAUSE).is_empty());
    }
}
