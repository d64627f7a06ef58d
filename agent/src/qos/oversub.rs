//! Batch resources: the idle part of the node offered to offline pods as
//! `kubernetes.io/batch-cpu` (millicores) and `kubernetes.io/batch-memory` (bytes) in the Node's
//! `status.capacity` and `status.allocatable`.
//!
//! Start at [`oversold`] (one round's raw value from allocatable, pods and usage) and
//! [`Oversubscription::observe`] (smoothing and whether to publish). Usage comes from the
//! kubepods cgroup tree: [`KubepodsUsage`] for the paths, [`cpu_usage_ns_v1`] and friends for the
//! files, [`CpuMeter`] for turning the CPU counter into millicores.
//!
//! As volcano-agent does, every 10 s: total = allocatable, minus the CPU requests of Guaranteed
//! online pods when the kubelet's CPU manager is static (their CPUs are exclusive); oversold =
//! max(0, total - usage) x ratio (60 %); the last 10 values are averaged with weights 1, 2, 4, ...
//! 512: the newest value carries half the weight, so the offer follows a load spike at once
//! while older rounds damp single-round noise. A value is written only when one resource moves
//! more than 10 % from what was last written, or on every 6th report (once a minute) regardless,
//! which keeps Node status writes rare without letting the API server drift.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::config::OversubscriptionSettings;
use super::evict::{PodFacts, PodRef, QosClass};

pub use super::evict::{BATCH_CPU, BATCH_MEMORY};

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

/// Why a usage file could not be read; the caller skips the round (nothing is published from
/// a guess) and logs the error.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Format { path: PathBuf, reason: String },
}

fn read(path: &Path) -> Result<String, UsageError> {
    std::fs::read_to_string(path).map_err(|source| UsageError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_u64(path: &Path) -> Result<u64, UsageError> {
    let text = read(path)?;
    text.trim().parse().map_err(|_| UsageError::Format {
        path: path.to_owned(),
        reason: format!("{:?} is not a number", text.trim()),
    })
}

/// The value of `key` in a flat-keyed file (`memory.stat`, `cpu.stat`).
fn stat_value(path: &Path, keys: &[&str]) -> Result<u64, UsageError> {
    let text = read(path)?;
    for key in keys {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if words.next() == Some(*key) {
                let v = words.next().unwrap_or_default();
                return v.parse().map_err(|_| UsageError::Format {
                    path: path.to_owned(),
                    reason: format!("{key} {v:?} is not a number"),
                });
            }
        }
    }
    Err(UsageError::Format {
        path: path.to_owned(),
        reason: format!("no {} line", keys.join(" or ")),
    })
}

/// cgroup v1: `cpuacct.usage` of `dir` (a `cpuacct` hierarchy directory), nanoseconds since
/// the group was created.
pub fn cpu_usage_ns_v1(dir: &Path) -> Result<u64, UsageError> {
    read_u64(&dir.join("cpuacct.usage"))
}

/// cgroup v2: `usage_usec` of `dir/cpu.stat`, in nanoseconds.
pub fn cpu_usage_ns_v2(dir: &Path) -> Result<u64, UsageError> {
    Ok(stat_value(&dir.join("cpu.stat"), &["usage_usec"])?.saturating_mul(1000))
}

/// cgroup v1: working set of `dir` (a `memory` hierarchy directory): `memory.usage_in_bytes`
/// minus `total_inactive_file` (the whole subtree's, as the kubelet counts it) from
/// `memory.stat`.
pub fn memory_working_set_v1(dir: &Path) -> Result<u64, UsageError> {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let inactive = stat_value(
        &dir.join("memory.stat"),
        &["total_inactive_file", "inactive_file"],
    )?;
    Ok(usage.saturating_sub(inactive))
}

/// cgroup v2: working set of `dir`: `memory.current` minus `inactive_file` from `memory.stat`.
pub fn memory_working_set_v2(dir: &Path) -> Result<u64, UsageError> {
    let usage = read_u64(&dir.join("memory.current"))?;
    let inactive = stat_value(&dir.join("memory.stat"), &["inactive_file"])?;
    Ok(usage.saturating_sub(inactive))
}

/// Where the kubepods tree's usage files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubepodsUsage {
    /// cgroup v1: the `cpuacct` and `memory` hierarchies' kubepods directories.
    V1 { cpuacct: PathBuf, memory: PathBuf },
    /// cgroup v2: the one kubepods directory.
    V2 { dir: PathBuf },
}

impl KubepodsUsage {
    /// The kubelet's layout under `cgroup_root` (usually `/sys/fs/cgroup`): `kubepods` with the
    /// cgroupfs driver, `kubepods.slice` with systemd; v1 puts the hierarchy name first
    /// (`cpuacct`, or the combined `cpu,cpuacct` where there is no `cpuacct` link).
    pub fn new(cgroup_root: &Path, v2: bool, systemd: bool) -> Self {
        let name = if systemd {
            "kubepods.slice"
        } else {
            "kubepods"
        };
        if v2 {
            return Self::V2 {
                dir: cgroup_root.join(name),
            };
        }
        let cpuacct = ["cpuacct", "cpu,cpuacct"]
            .iter()
            .map(|h| cgroup_root.join(h))
            .find(|p| p.is_dir())
            .unwrap_or_else(|| cgroup_root.join("cpuacct"));
        Self::V1 {
            cpuacct: cpuacct.join(name),
            memory: cgroup_root.join("memory").join(name),
        }
    }

    /// Cumulative CPU time in nanoseconds.
    pub fn cpu_ns(&self) -> Result<u64, UsageError> {
        match self {
            Self::V1 { cpuacct, .. } => cpu_usage_ns_v1(cpuacct),
            Self::V2 { dir } => cpu_usage_ns_v2(dir),
        }
    }

    /// Memory working set in bytes.
    pub fn memory_bytes(&self) -> Result<u64, UsageError> {
        match self {
            Self::V1 { memory, .. } => memory_working_set_v1(memory),
            Self::V2 { dir } => memory_working_set_v2(dir),
        }
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
    use crate::qos::evict::Requests;

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

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    /// Excerpt of a real cgroup v1 `memory.stat` (this machine's root).
    const V1_MEMORY_STAT: &str = "cache 9240576\nrss 5136384\ninactive_file 0\nactive_file 155648\n\
        total_cache 15732736\ntotal_rss 10235904\ntotal_inactive_anon 4980736\n\
        total_active_anon 1560576\ntotal_inactive_file 1769472\ntotal_active_file 8208384\n";
    const V2_CPU_STAT: &str = "usage_usec 123456789\nuser_usec 100000000\nsystem_usec 23456789\n\
        nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n";
    const V2_MEMORY_STAT: &str = "anon 1048576\nfile 4194304\nkernel 65536\nactive_file 1048576\n\
        inactive_file 3145728\n";

    #[test]
    fn reads_cgroup_v1_usage() {
        let root = tempfile::tempdir().unwrap();
        write(
            &root.path().join("cpuacct/kubepods"),
            "cpuacct.usage",
            "16166877621793\n",
        );
        write(
            &root.path().join("memory/kubepods"),
            "memory.usage_in_bytes",
            "25825280\n",
        );
        write(
            &root.path().join("memory/kubepods"),
            "memory.stat",
            V1_MEMORY_STAT,
        );
        let k = KubepodsUsage::new(root.path(), false, false);
        assert_eq!(k.cpu_ns().unwrap(), 16_166_877_621_793);
        assert_eq!(k.memory_bytes().unwrap(), 25_825_280 - 1_769_472);
    }

    #[test]
    fn reads_cgroup_v1_combined_hierarchy_and_systemd_names() {
        let root = tempfile::tempdir().unwrap();
        write(
            &root.path().join("cpu,cpuacct/kubepods.slice"),
            "cpuacct.usage",
            "42",
        );
        let k = KubepodsUsage::new(root.path(), false, true);
        assert_eq!(
            k,
            KubepodsUsage::V1 {
                cpuacct: root.path().join("cpu,cpuacct/kubepods.slice"),
                memory: root.path().join("memory/kubepods.slice"),
            }
        );
        assert_eq!(k.cpu_ns().unwrap(), 42);
        // A memory.stat of a leaf group without total_* lines still works.
        write(
            &root.path().join("memory/kubepods.slice"),
            "memory.usage_in_bytes",
            "1000",
        );
        write(
            &root.path().join("memory/kubepods.slice"),
            "memory.stat",
            "inactive_file 300\n",
        );
        assert_eq!(k.memory_bytes().unwrap(), 700);
    }

    #[test]
    fn reads_cgroup_v2_usage() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("kubepods.slice");
        write(&dir, "cpu.stat", V2_CPU_STAT);
        write(&dir, "memory.current", "8388608\n");
        write(&dir, "memory.stat", V2_MEMORY_STAT);
        let k = KubepodsUsage::new(root.path(), true, true);
        assert_eq!(k.cpu_ns().unwrap(), 123_456_789_000);
        assert_eq!(k.memory_bytes().unwrap(), 8_388_608 - 3_145_728);
        // Inactive file above usage (racy reads): 0, not a wrap-around.
        write(&dir, "memory.current", "1000\n");
        assert_eq!(k.memory_bytes().unwrap(), 0);
    }

    #[test]
    fn bad_usage_files_are_errors() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("kubepods");
        let k = KubepodsUsage::new(root.path(), true, false);
        let e = k.cpu_ns().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("reading {}", dir.join("cpu.stat").display())),
            "{e}"
        );
        write(&dir, "cpu.stat", "user_usec 5\n");
        assert_eq!(
            k.cpu_ns().unwrap_err().to_string(),
            format!("{}: no usage_usec line", dir.join("cpu.stat").display())
        );
        write(&dir, "cpu.stat", "usage_usec many\n");
        assert_eq!(
            k.cpu_ns().unwrap_err().to_string(),
            format!(
                "{}: usage_usec \"many\" is not a number",
                dir.join("cpu.stat").display()
            )
        );
        write(&dir, "memory.current", "max\n");
        assert_eq!(
            k.memory_bytes().unwrap_err().to_string(),
            format!(
                "{}: \"max\" is not a number",
                dir.join("memory.current").display()
            )
        );
        write(&dir, "memory.current", "10\n");
        write(&dir, "memory.stat", "anon 1\n");
        assert_eq!(
            k.memory_bytes().unwrap_err().to_string(),
            format!(
                "{}: no inactive_file line",
                dir.join("memory.stat").display()
            )
        );
    }

    #[test]
    fn reads_this_machines_root_cgroup_when_v1() {
        let root = Path::new("/sys/fs/cgroup");
        if root.join("cpuacct/cpuacct.usage").exists() {
            assert!(cpu_usage_ns_v1(&root.join("cpuacct")).unwrap() > 0);
        }
        if root.join("memory/memory.usage_in_bytes").exists() {
            memory_working_set_v1(&root.join("memory")).unwrap();
        }
        if root.join("cpu.stat").exists() {
            cpu_usage_ns_v2(root).unwrap();
        }
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
