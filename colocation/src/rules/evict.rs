//! Which offline pod to evict, and when the node is tainted against new ones.
//!
//! Start at [`Evictor::round`]: each round (every `monitorInterval`, 10 s by default) it takes the
//! node's usage and pressure ([`Sample`]) and the pods on the node ([`PodFacts`]) and returns a
//! [`Decision`]: add or remove the taint `volcano.sh/offline-job-evicting:NoSchedule`, and at
//! most one pod to evict through the Eviction API. PSI text is [`crate::rules::psi`]; the cgroup
//! layer reads the files.
//!
//! Pressure on a resource is either signal, whichever comes first:
//! - usage at or above its high watermark for `highUsageCountLimit` (6) consecutive rounds, as in
//!   volcano-agent;
//! - PSI above its threshold for `pressureCountLimit` (3) consecutive rounds: an earlier signal,
//!   because stalls show before usage crosses a watermark, and a watermark says nothing about
//!   whether online pods suffer.
//!
//! Default PSI thresholds, and why:
//! - CPU: `some avg10` above 40 %. CPU `full` is undefined at the system level (and missing
//!   before Linux 5.13); at 40 % some online task waits for a CPU 4 s out of every 10 s, which is
//!   clearly harmful, while ordinary contention on a busy node sits far lower.
//! - Memory: `full avg10` above 10 %. `full` (every non-idle task stalled at once) ignores the
//!   refault noise of one streaming job that inflates `some`; a full stall of 1 s in 10 s is
//!   already visible latency, and far below where an OOM killer such as systemd-oomd acts
//!   (60 %), so offline pods go first.
//!
//! Which file the caller reads matters: offline pods run at `cpu.idle` and wait for CPU by
//! design, so for CPU pass the worst [`Psi`] of the online pods' cgroups ([`Psi::worst`]), not
//! `/proc/pressure/cpu`; for memory the node's `/proc/pressure/memory` (or the kubepods cgroup's
//! `memory.pressure`) is right, since one pod at its own limit is not node pressure.
//!
//! Pressure taints the node and evicts, one per round, the offline (`volcano.sh/qos-level: BE`)
//! pod with the largest request of the pressured resource (memory first when both are: it is
//! not compressible), ties by namespace/name. Never a non-BE pod, never a critical pod
//! (`system-node-critical` / `system-cluster-critical`, priority >= 2,000,000,000, static or
//! mirror pods), never a pod already being deleted. The taint is removed once every resource is
//! at or below its low watermark and no PSI is above its threshold.
//!
//! Better than volcano-agent: after an eviction the next waits until that pod is gone (at most
//! [`SETTLE_ROUNDS`] rounds), since its memory is not free before it exits; a pod whose eviction
//! was refused (a PodDisruptionBudget) is skipped for [`REFUSED_SKIP_ROUNDS`] rounds instead of
//! blocking the others; and an agent restart is safe: [`Evictor::new`] takes the node's current
//! taint, so it is neither re-added nor removed before the low watermark, and the offline pods
//! already terminating count as evictions in flight, so a restart does not evict a second pod
//! for the same pressure while the first is still going away.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::config::EvictionSettings;
use super::pod::{PodFacts, PodRef, Resource};
use super::psi::Psi;

pub use fumarole_topology::colocation::{TAINT_EFFECT, TAINT_KEY};
/// Rounds to wait for an evicted pod to go before evicting the next one.
pub const SETTLE_ROUNDS: u32 = 3;
/// Rounds a pod whose eviction was refused is passed over.
pub const REFUSED_SKIP_ROUNDS: u32 = 6;

/// One round's measurements. `None` means unknown this round: it neither builds pressure nor
/// lets the taint go.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// CPU usage in percent of the node's allocatable CPU.
    pub cpu_percent: Option<f64>,
    /// Memory usage (working set) in percent of the node's allocatable memory.
    pub memory_percent: Option<f64>,
    /// CPU pressure of the online workload (see the module docs for which file).
    pub cpu_psi: Option<Psi>,
    /// Memory pressure of the node.
    pub memory_psi: Option<Psi>,
}

/// `used` in percent of `total`; `None` when `total` is 0.
pub fn percent(used: u64, total: u64) -> Option<f64> {
    (total > 0).then(|| used as f64 * 100.0 / total as f64)
}

/// What made a resource count as pressured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Signal {
    /// Usage at or above the high watermark for `rounds` rounds; `percent` is the latest.
    Watermark { percent: f64, high: u8, rounds: u32 },
    /// PSI above the threshold for `rounds` rounds; `avg10` is the latest.
    Psi {
        line: &'static str,
        avg10: f64,
        threshold: f64,
        rounds: u32,
    },
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Signal::Watermark {
                percent,
                high,
                rounds,
            } => write!(
                f,
                "usage {percent:.1}% at or above the high watermark {high}% for {rounds} rounds"
            ),
            Signal::Psi {
                line,
                avg10,
                threshold,
                rounds,
            } => write!(
                f,
                "PSI {line} avg10 {avg10:.2}% above {threshold}% for {rounds} rounds"
            ),
        }
    }
}

/// Pressure per resource after a round.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Pressure {
    pub cpu: Option<Signal>,
    pub memory: Option<Signal>,
}

impl Pressure {
    pub fn any(&self) -> bool {
        self.cpu.is_some() || self.memory.is_some()
    }

    /// The resource to relieve first: memory, which cannot be throttled, before CPU.
    pub fn first(&self) -> Option<(Resource, Signal)> {
        self.memory
            .map(|s| (Resource::Memory, s))
            .or(self.cpu.map(|s| (Resource::Cpu, s)))
    }
}

/// What to do after a round. The caller applies it and reports failures back
/// ([`Evictor::observe_taint`], [`Evictor::eviction_failed`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// `Some(true)`: add the taint; `Some(false)`: remove it; `None`: leave the node alone.
    pub taint: Option<bool>,
    /// The pod to evict through the Eviction API.
    pub evict: Option<PodRef>,
    /// Why, for the eviction's Event (e.g. `memory pressure: usage 91.0% at or above ...`).
    pub reason: Option<String>,
    /// Pressure as of this round, for the state report.
    pub pressure: Pressure,
}

/// Consecutive-round counters for one resource.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counters {
    high: u32,
    psi: u32,
}

/// The eviction state machine; see the module docs.
#[derive(Debug, Clone)]
pub struct Evictor {
    settings: EvictionSettings,
    cpu: Counters,
    memory: Counters,
    tainted: bool,
    pressure: Pressure,
    /// Evictions asked for (or found under way at start) and the rounds since.
    in_flight: BTreeMap<String, u32>,
    /// Pods whose eviction was refused, and the rounds left to pass them over.
    refused: BTreeMap<String, u32>,
}

impl Evictor {
    /// Starts from the node as it is: `node_tainted` is whether the node carries [`TAINT_KEY`]
    /// now, `pods` the pods on it; offline pods already being deleted count as evictions in
    /// flight.
    pub fn new(settings: EvictionSettings, node_tainted: bool, pods: &[PodFacts]) -> Self {
        let in_flight = pods
            .iter()
            .filter(|p| p.offline && p.deleting && !p.finished)
            .map(|p| (p.pod.uid.clone(), 0))
            .collect();
        Self {
            settings,
            cpu: Counters::default(),
            memory: Counters::default(),
            tainted: node_tainted,
            pressure: Pressure::default(),
            in_flight,
            refused: BTreeMap::new(),
        }
    }

    /// Takes a reloaded configuration. Pressure counters restart when the settings change (as in
    /// volcano-agent: counts against an old watermark mean nothing); taint and evictions in
    /// flight are kept.
    pub fn set_settings(&mut self, settings: EvictionSettings) {
        if settings != self.settings {
            self.settings = settings;
            self.cpu = Counters::default();
            self.memory = Counters::default();
            self.pressure = Pressure::default();
        }
    }

    /// Whether the node carries the taint, as far as this evictor knows.
    pub fn tainted(&self) -> bool {
        self.tainted
    }

    /// Evictions asked for and not yet finished, by pod uid.
    pub fn in_flight(&self) -> impl Iterator<Item = &str> {
        self.in_flight.keys().map(String::as_str)
    }

    /// Tells the evictor what the node really carries: after a failed taint patch, or when
    /// someone else added or removed the taint. The next round corrects it if needed.
    pub fn observe_taint(&mut self, present: bool) {
        self.tainted = present;
    }

    /// The Eviction API refused `pod` (429 from a PodDisruptionBudget, or an error): it is no
    /// longer in flight and is passed over for [`REFUSED_SKIP_ROUNDS`] rounds, so the next round
    /// picks the next candidate.
    pub fn eviction_failed(&mut self, pod: &PodRef) {
        self.in_flight.remove(&pod.uid);
        self.refused.insert(pod.uid.clone(), REFUSED_SKIP_ROUNDS);
    }

    /// One round: update pressure from `sample`, then decide the taint and at most one eviction
    /// among `pods`. The decision is assumed applied; report failures back.
    pub fn round(&mut self, sample: &Sample, pods: &[PodFacts]) -> Decision {
        let s = self.settings;
        let cpu_psi = sample.cpu_psi.map(|p| p.some.avg10);
        let memory_psi = sample.memory_psi.and_then(|p| p.full.map(|f| f.avg10));
        let cpu = step(
            &mut self.cpu,
            sample.cpu_percent,
            s.cpu.high,
            s.high_usage_count_limit,
            cpu_psi.map(|v| ("some", v)),
            s.cpu_pressure_threshold,
            s.pressure_count_limit,
        );
        let memory = step(
            &mut self.memory,
            sample.memory_percent,
            s.memory.high,
            s.high_usage_count_limit,
            memory_psi.map(|v| ("full", v)),
            s.memory_pressure_threshold,
            s.pressure_count_limit,
        );
        self.pressure = Pressure { cpu, memory };
        self.age(pods);

        let mut decision = Decision {
            pressure: self.pressure,
            ..Decision::default()
        };
        if !s.enabled {
            // Switched off for this node: clean up, evict nothing.
            if self.tainted {
                self.tainted = false;
                decision.taint = Some(false);
            }
            return decision;
        }
        let Some((resource, signal)) = self.pressure.first() else {
            let low = |v: Option<f64>, low: u8| v.is_some_and(|v| v <= f64::from(low));
            let psi_quiet = cpu_psi.is_none_or(|v| v <= s.cpu_pressure_threshold)
                && memory_psi.is_none_or(|v| v <= s.memory_pressure_threshold);
            if self.tainted
                && low(sample.cpu_percent, s.cpu.low)
                && low(sample.memory_percent, s.memory.low)
                && psi_quiet
            {
                self.tainted = false;
                decision.taint = Some(false);
            }
            return decision;
        };
        if !self.tainted {
            self.tainted = true;
            decision.taint = Some(true);
        }
        if !self.in_flight.is_empty() {
            return decision;
        }
        if let Some(pod) = self.pick(resource, pods) {
            self.in_flight.insert(pod.uid.clone(), 0);
            decision.reason = Some(format!("{resource} pressure: {signal}"));
            decision.evict = Some(pod);
        }
        decision
    }

    /// Ages evictions in flight and refusals: a pod that is gone or finished has released its
    /// resources; one still there after [`SETTLE_ROUNDS`] no longer holds the next eviction back
    /// (if it is not even being deleted, the eviction did not happen and it may be picked again).
    fn age(&mut self, pods: &[PodFacts]) {
        let live: BTreeSet<&str> = pods
            .iter()
            .filter(|p| !p.finished)
            .map(|p| p.pod.uid.as_str())
            .collect();
        self.in_flight.retain(|uid, rounds| {
            *rounds += 1;
            live.contains(uid.as_str()) && *rounds < SETTLE_ROUNDS
        });
        self.refused.retain(|_, left| {
            *left = left.saturating_sub(1);
            *left > 0
        });
    }

    fn pick(&self, resource: Resource, pods: &[PodFacts]) -> Option<PodRef> {
        pods.iter()
            .filter(|p| p.evictable())
            .filter(|p| !self.refused.contains_key(&p.pod.uid))
            .max_by(|a, b| {
                a.request_of(resource)
                    .cmp(&b.request_of(resource))
                    // Ties: the first by namespace/name wins, so reverse for max_by.
                    .then_with(|| {
                        (&b.pod.namespace, &b.pod.name).cmp(&(&a.pod.namespace, &a.pod.name))
                    })
            })
            .map(|p| p.pod.clone())
    }
}

/// Advances one resource's counters and says whether it is pressured now.
fn step(
    c: &mut Counters,
    usage: Option<f64>,
    high: u8,
    high_limit: u32,
    psi: Option<(&'static str, f64)>,
    threshold: f64,
    psi_limit: u32,
) -> Option<Signal> {
    c.high = match usage {
        Some(u) if u >= f64::from(high) => c.high.saturating_add(1),
        _ => 0,
    };
    c.psi = match psi {
        Some((_, v)) if v > threshold => c.psi.saturating_add(1),
        _ => 0,
    };
    if let Some(percent) = usage
        && c.high >= high_limit
    {
        return Some(Signal::Watermark {
            percent,
            high,
            rounds: c.high,
        });
    }
    match psi {
        Some((line, avg10)) if c.psi >= psi_limit => Some(Signal::Psi {
            line,
            avg10,
            threshold,
            rounds: c.psi,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
