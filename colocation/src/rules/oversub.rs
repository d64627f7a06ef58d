//! Batch resources: the idle part of the node offered to offline pods as
//! `kubernetes.io/batch-cpu` (millicores) and `kubernetes.io/batch-memory` (bytes) in the Node's
//! `status.capacity` and `status.allocatable`.
//!
//! Start at [`oversold`] (one round's raw value from allocatable, pods and usage) and
//! [`Oversubscription::observe`] (smoothing and whether to publish). Usage comes from the
//! kubepods cgroup tree, read by the cgroup layer (`crate::cgroup::usage`); [`CpuMeter`] turns
//! the CPU counter into millicores.
//!
//! As volcano-agent does, every 10 s: total = allocatable, minus the CPU requests of Guaranteed
//! online pods when the kubelet's CPU manager is static (their CPUs are exclusive); oversold =
//! max(0, total - usage) x ratio (60 %); the last 10 values are averaged with weights 1, 2, 4, ...
//! 512: the newest value carries half the weight, so the offer follows a load spike at once
//! while older rounds damp single-round noise. A value is written only when one resource moves
//! more than 10 % from what was last written, or on every 6th report (once a minute) regardless,
//! which keeps Node status writes rare without letting the API server drift.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::config::OversubscriptionSettings;
use super::pod::{BATCH_CPU, BATCH_MEMORY, PodFacts, PodRef, QosClass};

/// Values kept for smoothing.
pub const HISTORY: usize = 10;
/// Every this many reports a value is published even if it did not move.
pub const RESYNC_EVERY: u64 = 6;

/// What goes into the Node status: `kubernetes.io/batch-cpu` in millicores (written as a plain
/// integer quantity, e.g. `"3600"`, as volcano-agent does) and `kubernetes.io/batch-memory` in
/// bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchResources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// The node's allocatable resources and CPU manager policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeAllocatable {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// The kubelet's `cpuManagerPolicy` is `static`.
    pub static_cpu_manager: bool,
}

/// Usage of the kubepods tree. With a static CPU manager volcano-agent leaves the Guaranteed
/// pods' usage out, since their requests already come off the total; passing the whole tree
/// counts them twice, which only makes the offer smaller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Average over the last interval ([`CpuMeter`]).
    pub cpu_millis: u64,
    /// Working set: usage minus inactive file cache.
    pub memory_bytes: u64,
}

/// This round's raw batch resources, before smoothing. A type not listed in
/// `overSubscriptionTypes` is 0 (published as 0, as volcano-agent does).
pub fn oversold(
    node: &NodeAllocatable,
    pods: &[PodFacts],
    usage: Usage,
    settings: &OversubscriptionSettings,
) -> BatchResources {
    let exclusive: u64 = if node.static_cpu_manager {
        pods.iter()
            .filter(|p| p.qos_class == QosClass::Guaranteed && !p.offline && !p.finished)
            .map(|p| p.requests.cpu_millis)
            .fold(0, u64::saturating_add)
    } else {
        0
    };
    let idle = |total: u64, used: u64| {
        let free = u128::from(total.saturating_sub(used));
        // At most 100 % of a u64, so the result fits.
        u64::try_from(free * u128::from(settings.ratio_percent) / 100).unwrap_or(u64::MAX)
    };
    BatchResources {
        cpu_millis: if settings.cpu {
            idle(node.cpu_millis.saturating_sub(exclusive), usage.cpu_millis)
        } else {
            0
        },
        memory_bytes: if settings.memory {
            idle(node.memory_bytes, usage.memory_bytes)
        } else {
            0
        },
    }
}

/// What to do when oversubscription is switched off for the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleanup {
    /// Resource names to remove from the Node's `status.capacity` and `status.allocatable`.
    pub remove: [&'static str; 2],
    /// Offline pods that request batch resources, to evict through the Eviction API (all of
    /// them, largest batch memory first): the resources they were admitted on no longer exist.
    /// Online pods, critical pods and pods already being deleted are never listed.
    pub evict: Vec<PodRef>,
}

/// Smoothing and the publish decision, one node.
#[derive(Debug, Clone, Default)]
pub struct Oversubscription {
    /// Oldest first, at most [`HISTORY`].
    history: VecDeque<BatchResources>,
    last_published: Option<BatchResources>,
    reports: u64,
}

impl Oversubscription {
    pub fn new() -> Self {
        Self::default()
    }

    /// After an agent restart: `published` is what the Node status carries now, so an
    /// unchanged value is not written again at once.
    pub fn resume(published: Option<BatchResources>) -> Self {
        Self {
            last_published: published,
            ..Self::default()
        }
    }

    /// Takes one round's [`oversold`] value; returns the smoothed value when it should be
    /// written to the Node status (the caller then writes both resources).
    pub fn observe(&mut self, sample: BatchResources) -> Option<BatchResources> {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(sample);
        let value = self.smoothed()?;
        self.reports += 1;
        let moved = match self.last_published {
            None => true,
            Some(last) => {
                moved(last.cpu_millis, value.cpu_millis)
                    || moved(last.memory_bytes, value.memory_bytes)
            }
        };
        if moved || self.reports.is_multiple_of(RESYNC_EVERY) {
            self.last_published = Some(value);
            Some(value)
        } else {
            None
        }
    }

    /// The weighted average of the history: weights 1, 2, 4, ... from the oldest.
    pub fn smoothed(&self) -> Option<BatchResources> {
        if self.history.is_empty() {
            return None;
        }
        let (mut cpu, mut memory, mut total) = (0u128, 0u128, 0u128);
        for (i, s) in self.history.iter().enumerate() {
            let w = 1u128 << i;
            cpu += u128::from(s.cpu_millis) * w;
            memory += u128::from(s.memory_bytes) * w;
            total += w;
        }
        Some(BatchResources {
            cpu_millis: u64::try_from(cpu / total).unwrap_or(u64::MAX),
            memory_bytes: u64::try_from(memory / total).unwrap_or(u64::MAX),
        })
    }

    /// Writing the value [`Self::observe`] returned failed: `on_node` is what the Node status
    /// still carries, so the next round compares against that and writes again if it differs.
    pub fn publish_failed(&mut self, on_node: Option<BatchResources>) {
        self.last_published = on_node;
    }

    /// What was last returned by [`Self::observe`] (or given to [`Self::resume`]).
    pub fn last_published(&self) -> Option<BatchResources> {
        self.last_published
    }

    /// Oversubscription was switched off (config or node label): forget the history so that
    /// switching it on again starts fresh and publishes at once, and say what to clean up.
    pub fn disable(&mut self, pods: &[PodFacts]) -> Cleanup {
        *self = Self::default();
        let mut users: Vec<&PodFacts> = pods
            .iter()
            .filter(|p| p.evictable())
            .filter(|p| p.requests.batch_cpu_millis > 0 || p.requests.batch_memory_bytes > 0)
            .collect();
        users.sort_by(|a, b| {
            b.requests
                .batch_memory_bytes
                .cmp(&a.requests.batch_memory_bytes)
                .then(
                    b.requests
                        .batch_cpu_millis
                        .cmp(&a.requests.batch_cpu_millis),
                )
                .then_with(|| (&a.pod.namespace, &a.pod.name).cmp(&(&b.pod.namespace, &b.pod.name)))
        });
        Cleanup {
            remove: [BATCH_CPU, BATCH_MEMORY],
            evict: users.into_iter().map(|p| p.pod.clone()).collect(),
        }
    }
}

/// More than 10 % away from `last`; from 0, any change.
fn moved(last: u64, now: u64) -> bool {
    let delta = u128::from(last.abs_diff(now));
    if last == 0 {
        delta > 0
    } else {
        delta * 10 > u128::from(last)
    }
}

/// Average millicores between two readings of a cumulative CPU counter `elapsed` apart;
/// `None` when no time passed or the counter went backwards (the cgroup was recreated).
pub fn cpu_millis(prev_ns: u64, now_ns: u64, elapsed: Duration) -> Option<u64> {
    let used = now_ns.checked_sub(prev_ns)?;
    let wall = elapsed.as_nanos();
    if wall == 0 {
        return None;
    }
    u64::try_from(u128::from(used) * 1000 / wall).ok()
}

/// Turns readings of a cumulative CPU counter into millicores over the last interval. The clock
/// is the caller's, so tests pass their own instants.
#[derive(Debug, Clone, Default)]
pub struct CpuMeter {
    last: Option<(u64, Instant)>,
}

impl CpuMeter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a reading taken at `at`; `None` on the first reading and after a counter reset.
    pub fn sample(&mut self, usage_ns: u64, at: Instant) -> Option<u64> {
        let prev = self.last.replace((usage_ns, at));
        let (prev_ns, prev_at) = prev?;
        cpu_millis(prev_ns, usage_ns, at.checked_duration_since(prev_at)?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::rules::pod::Requests;

    const GI: u64 = 1 << 30;

    fn settings() -> OversubscriptionSettings {
        OversubscriptionSettings {
            enabled: true,
            cpu: true,
            memory: true,
            ratio_percent: 60,
        }
    }

    fn pod(name: &str, class: QosClass, offline: bool, cpu: u64) -> PodFacts {
        PodFacts {
            pod: PodRef {
                namespace: "ns".into(),
                name: name.into(),
                uid: name.into(),
            },
            qos_class: class,
            offline,
            critical: false,
            deleting: false,
            finished: false,
            requests: Requests {
                cpu_millis: cpu,
                ..Requests::default()
            },
        }
    }

    fn br(cpu: u64, memory: u64) -> BatchResources {
        BatchResources {
            cpu_millis: cpu,
            memory_bytes: memory,
        }
    }

    #[test]
    fn oversold_is_idle_times_ratio() {
        let node = NodeAllocatable {
            cpu_millis: 16_000,
            memory_bytes: 64 * GI,
            static_cpu_manager: false,
        };
        let usage = Usage {
            cpu_millis: 6_000,
            memory_bytes: 24 * GI,
        };
        let pods = vec![pod("g", QosClass::Guaranteed, false, 4000)];
        // (16000 - 6000) x 60 % = 6000; (64 - 24) GiB x 60 % = 24 GiB.
        assert_eq!(
            oversold(&node, &pods, usage, &settings()),
            br(6000, 24 * GI)
        );
        // Usage above allocatable: nothing, not negative.
        let busy = Usage {
            cpu_millis: 20_000,
            memory_bytes: 70 * GI,
        };
        assert_eq!(oversold(&node, &pods, busy, &settings()), br(0, 0));
    }

    #[test]
    fn static_cpu_manager_takes_guaranteed_online_requests_off() {
        let node = NodeAllocatable {
            cpu_millis: 16_000,
            memory_bytes: 10_000,
            static_cpu_manager: true,
        };
        let mut finished = pod("done", QosClass::Guaranteed, false, 8000);
        finished.finished = true;
        let pods = vec![
            pod("g1", QosClass::Guaranteed, false, 4000),
            pod("g2", QosClass::Guaranteed, false, 2000),
            pod("g-offline", QosClass::Guaranteed, true, 3000),
            pod("burstable", QosClass::Burstable, false, 5000),
            finished,
        ];
        let usage = Usage {
            cpu_millis: 5_000,
            memory_bytes: 0,
        };
        // (16000 - 6000 - 5000) x 60 % = 3000; memory 10000 x 60 % = 6000.
        assert_eq!(oversold(&node, &pods, usage, &settings()), br(3000, 6000));
    }

    #[test]
    fn types_and_ratio_come_from_settings() {
        let node = NodeAllocatable {
            cpu_millis: 1000,
            memory_bytes: 1000,
            static_cpu_manager: false,
        };
        let s = OversubscriptionSettings {
            memory: false,
            ratio_percent: 25,
            ..settings()
        };
        assert_eq!(oversold(&node, &[], Usage::default(), &s), br(250, 0));
        let huge = NodeAllocatable {
            cpu_millis: u64::MAX,
            memory_bytes: u64::MAX,
            static_cpu_manager: false,
        };
        let all = OversubscriptionSettings {
            ratio_percent: 100,
            ..settings()
        };
        assert_eq!(
            oversold(&huge, &[], Usage::default(), &all),
            br(u64::MAX, u64::MAX)
        );
    }

    #[test]
    fn smoothing_weights_newest_heaviest() {
        let mut o = Oversubscription::new();
        o.observe(br(1000, 100));
        assert_eq!(o.smoothed(), Some(br(1000, 100)));
        // (1000 x 1 + 4000 x 2) / 3 = 3000; (100 + 400) / 3 = 166 (integer).
        o.observe(br(4000, 200));
        assert_eq!(o.smoothed(), Some(br(3000, 166)));
        // (1000 + 8000 + 7000 x 4) / 7 = 37000 / 7 = 5285.
        o.observe(br(7000, 0));
        assert_eq!(o.smoothed(), Some(br(5285, 71)));
    }

    #[test]
    fn smoothing_keeps_the_last_ten() {
        let mut o = Oversubscription::new();
        // Eleven samples 0, 1000, ..., 10000: the first falls out, weights 1..512 on 1000..10000.
        for i in 0..=10u64 {
            o.observe(br(i * 1000, 0));
        }
        // sum(i x 1000 x 2^(i-1), i = 1..10) = 1000 x 9217 = 9,217,000; / 1023 = 9009.77
        assert_eq!(o.smoothed().unwrap().cpu_millis, 9009);
        // A load spike (offer 0) halves it at once: the window is 2000..10000 then 0, so
        // sum(i x 1000 x 2^(i-2), i = 2..10) = 1000 x (9217 - 1) / 2 = 4,608,000; / 1023 = 4504.
        o.observe(br(0, 0));
        let window: Vec<u64> = (2..=10).map(|i| i * 1000).chain([0]).collect();
        let num: u64 = window.iter().enumerate().map(|(i, v)| v << i).sum();
        assert_eq!(num, 4_608_000);
        assert_eq!(o.smoothed().unwrap().cpu_millis, num / 1023);
        assert_eq!(num / 1023, 4504);
    }

    #[test]
    fn publishes_on_more_than_ten_percent_or_every_sixth_report() {
        let mut o = Oversubscription::new();
        let mut published = Vec::new();
        // Constant input: published at once, then only on reports 6 and 12.
        for _ in 0..12 {
            published.push(o.observe(br(1000, 1000)).is_some());
        }
        assert_eq!(
            published,
            [
                true, false, false, false, false, true, false, false, false, false, false, true
            ]
        );
    }

    #[test]
    fn ten_percent_is_not_enough_more_is() {
        let mut o = Oversubscription::resume(Some(br(1000, 1000)));
        // Smoothed over [1000]: equal: nothing.
        let mut o2 = o.clone();
        assert_eq!(o2.observe(br(1000, 1000)), None);
        // A first sample of 1100 is exactly 10 % up: not published.
        assert_eq!(o.observe(br(1100, 1000)), None);
        // (1100 + 2 x 1300) / 3 = 1233: 23 % up: published.
        assert_eq!(o.observe(br(1300, 1000)), Some(br(1233, 1000)));
        assert_eq!(o.last_published(), Some(br(1233, 1000)));
        // Memory alone moving is enough: (1100 + 2600 + 4 x 1233) / 7 = 1233 cpu;
        // memory (1000 + 2000 + 4 x 500) / 7 = 714: 28.6 % down.
        assert_eq!(o.observe(br(1233, 500)), Some(br(1233, 714)));
    }

    #[test]
    fn from_zero_any_change_publishes() {
        let mut o = Oversubscription::resume(Some(br(0, 0)));
        assert_eq!(o.observe(br(0, 0)), None);
        // (0 + 2 x 3) / 3 = 2
        assert_eq!(o.observe(br(3, 0)), Some(br(2, 0)));
    }

    #[test]
    fn resume_avoids_rewriting_an_unchanged_value() {
        let mut fresh = Oversubscription::new();
        assert!(fresh.observe(br(5000, 5000)).is_some());
        let mut resumed = Oversubscription::resume(Some(br(5100, 4900)));
        assert_eq!(resumed.observe(br(5000, 5000)), None);
    }

    #[test]
    fn disable_resets_and_lists_batch_users() {
        let mut o = Oversubscription::new();
        o.observe(br(1, 1));
        o.observe(br(1, 1));
        let mut small = pod("small", QosClass::BestEffort, true, 0);
        small.requests.batch_cpu_millis = 500;
        let mut big = pod("big", QosClass::BestEffort, true, 0);
        big.requests.batch_memory_bytes = GI;
        let mut also_big = pod("also-big", QosClass::BestEffort, true, 0);
        also_big.requests.batch_memory_bytes = GI;
        let mut online = pod("online", QosClass::Burstable, false, 0);
        online.requests.batch_cpu_millis = 100;
        let mut critical = pod("critical", QosClass::BestEffort, true, 0);
        critical.critical = true;
        critical.requests.batch_cpu_millis = 100;
        let mut leaving = pod("leaving", QosClass::BestEffort, true, 0);
        leaving.deleting = true;
        leaving.requests.batch_cpu_millis = 100;
        let no_batch = pod("no-batch", QosClass::BestEffort, true, 1000);
        let pods = vec![small, big, also_big, online, critical, leaving, no_batch];
        let c = o.disable(&pods);
        assert_eq!(
            c.remove,
            ["kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"]
        );
        let names: Vec<&str> = c.evict.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["also-big", "big", "small"]);
        assert_eq!(o.smoothed(), None);
        assert_eq!(o.last_published(), None);
        // Switched on again: publishes at once.
        assert!(o.observe(br(7, 7)).is_some());
    }

    #[test]
    fn cpu_meter_turns_counters_into_millicores() {
        let t0 = Instant::now();
        let mut m = CpuMeter::new();
        assert_eq!(m.sample(1_000_000_000, t0), None);
        // 25 s of CPU in 10 s: 2.5 CPUs.
        assert_eq!(
            m.sample(26_000_000_000, t0 + Duration::from_secs(10)),
            Some(2500)
        );
        // Counter reset (cgroup recreated): skip one round, then fine again.
        assert_eq!(m.sample(5, t0 + Duration::from_secs(20)), None);
        assert_eq!(
            m.sample(500_000_005, t0 + Duration::from_secs(30)),
            Some(50)
        );
        assert_eq!(cpu_millis(0, 10, Duration::ZERO), None);
    }
}
