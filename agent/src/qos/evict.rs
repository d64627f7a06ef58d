//! Which offline pod to evict, and when the node is tainted against new ones.
//!
//! Start at [`Evictor::round`]: each round (every `monitorInterval`, 10 s by default) it takes the
//! node's usage and pressure ([`Sample`]) and the pods on the node ([`PodFacts`]) and returns a
//! [`Decision`]: add or remove the taint `volcano.sh/offline-job-evicting:NoSchedule`, and at
//! most one pod to evict through the Eviction API. Reading `/proc/pressure` and cgroup
//! `*.pressure` files is [`parse_psi`] / [`PsiSource`].
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
use std::path::{Path, PathBuf};

use fumarole_topology::{pod, quantity};
use k8s_openapi::api::core::v1::Pod;

use super::config::EvictionSettings;

/// Taint key put on the node under pressure (value `"true"`, effect [`TAINT_EFFECT`]).
pub const TAINT_KEY: &str = "volcano.sh/offline-job-evicting";
/// Effect of the taint: new offline pods are not scheduled, running ones stay.
pub const TAINT_EFFECT: &str = "NoSchedule";
/// Pod annotation with the QoS level; `BE` marks an offline pod.
pub const QOS_LEVEL_ANNOTATION: &str = "volcano.sh/qos-level";
/// Batch CPU resource name (millicores as the quantity's value).
pub const BATCH_CPU: &str = "kubernetes.io/batch-cpu";
/// Batch memory resource name (bytes).
pub const BATCH_MEMORY: &str = "kubernetes.io/batch-memory";
/// Priority from which a pod is critical (`scheduling.SystemCriticalPriority`).
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// Rounds to wait for an evicted pod to go before evicting the next one.
pub const SETTLE_ROUNDS: u32 = 3;
/// Rounds a pod whose eviction was refused is passed over.
pub const REFUSED_SKIP_ROUNDS: u32 = 6;

const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
const CRITICAL_CLASSES: &[&str] = &["system-node-critical", "system-cluster-critical"];

/// A pod by name and uid; the uid tells a recreated pod of the same name apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Kubernetes QoS class (`status.qosClass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Effective pod requests, as the scheduler counts them (init containers, sidecars, overhead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// `kubernetes.io/batch-cpu`, millicores.
    pub batch_cpu_millis: u64,
    /// `kubernetes.io/batch-memory`, bytes.
    pub batch_memory_bytes: u64,
}

/// What eviction and oversubscription need to know about a pod; [`PodFacts::from_pod`] reads it
/// from the API object, tests build it directly.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFacts {
    pub pod: PodRef,
    pub qos_class: QosClass,
    /// `volcano.sh/qos-level: BE`: offline, may use batch resources and be evicted.
    pub offline: bool,
    /// Never evicted: a critical priority class or priority, or a static / mirror pod.
    pub critical: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Phase `Succeeded` or `Failed`: holds no resources.
    pub finished: bool,
    pub requests: Requests,
}

/// Why a pod could not be read; the caller logs it and leaves the pod out of this round (which
/// never evicts it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// `metadata.name`, `namespace` or `uid` is missing.
    #[error("pod without metadata.{0}")]
    Missing(&'static str),
    /// A request that is not a Kubernetes quantity.
    #[error("pod {pod}: {field} is {value:?}, not a Kubernetes quantity")]
    Quantity {
        pod: String,
        field: String,
        value: String,
    },
}

impl PodFacts {
    /// Reads a pod from the API server's object.
    pub fn from_pod(pod: &Pod) -> Result<Self, PodError> {
        let meta = &pod.metadata;
        let name = meta.name.clone().ok_or(PodError::Missing("name"))?;
        let namespace = meta
            .namespace
            .clone()
            .ok_or(PodError::Missing("namespace"))?;
        let uid = meta.uid.clone().ok_or(PodError::Missing("uid"))?;
        let pod_ref = PodRef {
            namespace,
            name,
            uid,
        };
        let annotations = meta.annotations.as_ref();
        let annotation = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
        let spec = pod.spec.as_ref();
        let priority = spec.and_then(|s| s.priority);
        let class = spec.and_then(|s| s.priority_class_name.as_deref());
        let static_pod = annotation(MIRROR_ANNOTATION).is_some()
            || annotation(SOURCE_ANNOTATION).is_some_and(|s| s != "api");
        let critical = static_pod
            || class.is_some_and(|c| CRITICAL_CLASSES.contains(&c))
            || priority.is_some_and(|p| p >= CRITICAL_PRIORITY);
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        let qos_class = match status.and_then(|s| s.qos_class.as_deref()) {
            Some("Guaranteed") => QosClass::Guaranteed,
            Some("Burstable") => QosClass::Burstable,
            Some("BestEffort") => QosClass::BestEffort,
            _ => spec.map_or(QosClass::BestEffort, computed_qos_class),
        };
        let requests = match spec {
            Some(spec) => {
                let who = pod_ref.to_string();
                Requests {
                    cpu_millis: pod_request(spec, "cpu", quantity::cpu_millis, &who)?,
                    memory_bytes: pod_request(spec, "memory", quantity::units, &who)?,
                    batch_cpu_millis: pod_request(spec, BATCH_CPU, quantity::units, &who)?,
                    batch_memory_bytes: pod_request(spec, BATCH_MEMORY, quantity::units, &who)?,
                }
            }
            None => Requests::default(),
        };
        Ok(Self {
            pod: pod_ref,
            qos_class,
            offline: annotation(QOS_LEVEL_ANNOTATION) == Some("BE"),
            critical,
            deleting: meta.deletion_timestamp.is_some(),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
            requests,
        })
    }

    /// The request that counts for evicting under pressure of `resource`: the native request
    /// plus the batch one, since offline pods usually ask for batch resources instead.
    pub fn request_of(&self, resource: Resource) -> u64 {
        match resource {
            Resource::Cpu => self.requests.cpu_millis + self.requests.batch_cpu_millis,
            Resource::Memory => self.requests.memory_bytes + self.requests.batch_memory_bytes,
        }
    }

    /// Whether eviction may ever pick this pod.
    pub fn evictable(&self) -> bool {
        self.offline && !self.critical && !self.deleting && !self.finished
    }
}

/// `status.qosClass` is set by the API server; this is the fallback for objects without it.
fn computed_qos_class(spec: &k8s_openapi::api::core::v1::PodSpec) -> QosClass {
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let (mut any, mut guaranteed) = (false, true);
    for c in containers {
        let res = c.resources.as_ref();
        let requests = res.and_then(|r| r.requests.as_ref());
        let limits = res.and_then(|r| r.limits.as_ref());
        for name in ["cpu", "memory"] {
            let request = requests.and_then(|r| r.get(name));
            let limit = limits.and_then(|l| l.get(name));
            any |= request.is_some() || limit.is_some();
            guaranteed &= limit.is_some() && (request.is_none() || request == limit);
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

/// The pod's effective CPU request in millicores (as [`PodFacts`] computes it): what the kubelet
/// sizes the pod cgroup's `cpu.shares` by. `who` names the pod in errors.
pub fn pod_cpu_request_millis(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    who: &str,
) -> Result<u64, PodError> {
    pod_request(spec, "cpu", quantity::cpu_millis, who)
}

/// The pod's effective request of `name` ([`fumarole_topology::pod::effective_request`]).
fn pod_request(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    name: &str,
    parse: pod::Parse,
    who: &str,
) -> Result<u64, PodError> {
    pod::effective_request(spec, name, parse).map_err(|e| PodError::Quantity {
        pod: who.into(),
        field: match e.container {
            Some(c) => format!("container {c} {}", e.field),
            None => e.field,
        },
        value: e.value,
    })
}

/// One line of a pressure file: percents of wall time over 10 s, 60 s and 300 s, and the total
/// stall time in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total_us: u64,
}

/// A `/proc/pressure/*` or cgroup `*.pressure` file.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Psi {
    /// Some task stalled.
    pub some: PsiLine,
    /// All non-idle tasks stalled at once; missing for CPU before Linux 5.13.
    pub full: Option<PsiLine>,
}

impl Psi {
    /// The worse of two readings, field by field: for several cgroups (the online pods), the
    /// worst one speaks for them.
    pub fn worst(self, other: Psi) -> Psi {
        fn line(a: PsiLine, b: PsiLine) -> PsiLine {
            PsiLine {
                avg10: a.avg10.max(b.avg10),
                avg60: a.avg60.max(b.avg60),
                avg300: a.avg300.max(b.avg300),
                total_us: a.total_us.max(b.total_us),
            }
        }
        Psi {
            some: line(self.some, other.some),
            full: match (self.full, other.full) {
                (Some(a), Some(b)) => Some(line(a, b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// Why a pressure file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PsiError {
    /// Not readable: no PSI in the kernel (`CONFIG_PSI` off, or `psi=0`: the read fails with
    /// EOPNOTSUPP), a cgroup v1 hierarchy without pressure files, or a cgroup that is gone.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Readable but not in the `some avg10=.. avg60=.. avg300=.. total=..` format.
    #[error("{what}: {reason}")]
    Format { what: String, reason: String },
}

/// Parses a pressure file's text. Tolerant: unknown keys and lines are skipped, a missing `full`
/// line is `None`; a missing `some` line or a missing or non-numeric field is an error.
pub fn parse_psi(text: &str) -> Result<Psi, PsiError> {
    let bad = |reason: String| PsiError::Format {
        what: "pressure file".into(),
        reason,
    };
    let (mut some, mut full) = (None, None);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let slot = match words.next() {
            Some("some") => &mut some,
            Some("full") => &mut full,
            _ => continue,
        };
        let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
        for word in words {
            let Some((k, v)) = word.split_once('=') else {
                return Err(bad(format!("{word:?} is not key=value in {line:?}")));
            };
            let float = || {
                v.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .ok_or_else(|| bad(format!("{k}={v:?} is not a percent in {line:?}")))
            };
            match k {
                "avg10" => avg10 = Some(float()?),
                "avg60" => avg60 = Some(float()?),
                "avg300" => avg300 = Some(float()?),
                "total" => {
                    total = Some(
                        v.parse::<u64>()
                            .map_err(|_| bad(format!("total={v:?} is not a count in {line:?}")))?,
                    )
                }
                _ => {}
            }
        }
        let need =
            |f: Option<f64>, k: &str| f.ok_or_else(|| bad(format!("{k} missing in {line:?}")));
        *slot = Some(PsiLine {
            avg10: need(avg10, "avg10")?,
            avg60: need(avg60, "avg60")?,
            avg300: need(avg300, "avg300")?,
            total_us: total.ok_or_else(|| bad(format!("total missing in {line:?}")))?,
        });
    }
    let some = some.ok_or_else(|| bad("no \"some\" line".into()))?;
    Ok(Psi { some, full })
}

/// Reads and parses a pressure file.
pub fn read_psi(path: &Path) -> Result<Psi, PsiError> {
    let text = std::fs::read_to_string(path).map_err(|source| PsiError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_psi(&text).map_err(|e| match e {
        PsiError::Format { reason, .. } => PsiError::Format {
            what: path.display().to_string(),
            reason,
        },
        other => other,
    })
}

/// A pressure file read every round: `None` when it cannot be used, with the reason logged as a
/// warning the first time and at debug level while it stays so (a kernel without PSI would
/// otherwise warn every 10 s), and an info line when it works again.
#[derive(Debug)]
pub struct PsiSource {
    path: PathBuf,
    failing: bool,
}

impl PsiSource {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            failing: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn read(&mut self) -> Option<Psi> {
        match read_psi(&self.path) {
            Ok(psi) => {
                if self.failing {
                    tracing::info!(path = %self.path.display(), "pressure file readable again");
                    self.failing = false;
                }
                Some(psi)
            }
            Err(e) => {
                if self.failing {
                    tracing::debug!(error = %e, "no pressure signal this round");
                } else {
                    tracing::warn!(error = %e, "no pressure signal; eviction uses watermarks only");
                    self.failing = true;
                }
                None
            }
        }
    }
}

/// The two resources watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Cpu,
    Memory,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        })
    }
}

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

    pub fn settings(&self) -> &EvictionSettings {
        &self.settings
    }

    /// Whether the node carries the taint, as far as this evictor knows.
    pub fn tainted(&self) -> bool {
        self.tainted
    }

    /// Pressure as of the last round.
    pub fn pressure(&self) -> Pressure {
        self.pressure
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::qos::config::Watermarks;

    /// `/proc/pressure/*` of the machine these tests were written on (Linux 6.18).
    const HOST_CPU: &str = "some avg10=0.00 avg60=1.47 avg300=9.91 total=2986686122\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    const HOST_MEMORY: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    const HOST_IO: &str = "some avg10=0.00 avg60=0.12 avg300=0.90 total=204843504\nfull avg10=0.00 avg60=0.06 avg300=0.51 total=121325417\n";
    /// Linux before 5.13: CPU has no `full` line.
    const OLD_CPU: &str = "some avg10=12.50 avg60=3.02 avg300=0.80 total=77123\n";
    /// A cgroup v2 `memory.pressure` of a pod under reclaim.
    const CGROUP_MEMORY: &str = "some avg10=41.27 avg60=20.03 avg300=5.10 total=9912345\nfull avg10=23.81 avg60=11.40 avg300=2.96 total=5123456\n";

    #[test]
    fn parses_pressure_files() {
        let cpu = parse_psi(HOST_CPU).unwrap();
        assert_eq!(
            cpu.some,
            PsiLine {
                avg10: 0.0,
                avg60: 1.47,
                avg300: 9.91,
                total_us: 2_986_686_122
            }
        );
        assert_eq!(cpu.full.unwrap().total_us, 0);
        assert_eq!(parse_psi(HOST_MEMORY).unwrap().some.avg10, 0.0);
        assert_eq!(parse_psi(HOST_IO).unwrap().full.unwrap().avg300, 0.51);
        let old = parse_psi(OLD_CPU).unwrap();
        assert_eq!(old.some.avg10, 12.5);
        assert_eq!(old.full, None);
        let cg = parse_psi(CGROUP_MEMORY).unwrap();
        assert_eq!(cg.full.unwrap().avg10, 23.81);
        // Unknown keys and lines are skipped; no trailing newline is fine.
        let odd =
            parse_psi("some avg10=1.00 avg60=2.00 avg300=3.00 total=4 new=9\nwhat ever\n").unwrap();
        assert_eq!(odd.some.avg300, 3.0);
    }

    #[test]
    fn bad_pressure_files_are_errors() {
        let table = [
            ("", "pressure file: no \"some\" line"),
            (
                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0",
                "pressure file: no \"some\" line",
            ),
            (
                "some avg10=0.00 avg60=0.00 total=0",
                "pressure file: avg300 missing in \"some avg10=0.00 avg60=0.00 total=0\"",
            ),
            (
                "some avg10=x avg60=0.00 avg300=0.00 total=0",
                "pressure file: avg10=\"x\" is not a percent in \"some avg10=x avg60=0.00 avg300=0.00 total=0\"",
            ),
            (
                "some avg10=1 avg60=0.00 avg300=0.00 total=-3",
                "pressure file: total=\"-3\" is not a count in \"some avg10=1 avg60=0.00 avg300=0.00 total=-3\"",
            ),
            (
                "some avg10 avg60=0.00",
                "pressure file: \"avg10\" is not key=value in \"some avg10 avg60=0.00\"",
            ),
        ];
        for (text, want) in table {
            assert_eq!(parse_psi(text).unwrap_err().to_string(), want, "{text:?}");
        }
    }

    #[test]
    fn reads_this_machines_pressure_files_when_present() {
        for name in ["cpu", "memory", "io"] {
            let path = Path::new("/proc/pressure").join(name);
            if !path.exists() {
                continue;
            }
            match read_psi(&path) {
                Ok(psi) => {
                    assert!((0.0..=100.0).contains(&psi.some.avg10), "{name}: {psi:?}");
                    if name == "memory" {
                        assert!(psi.full.is_some());
                    }
                }
                // psi=0 on the kernel command line: the file exists but reading fails.
                Err(PsiError::Read { .. }) => {}
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }

    #[test]
    fn unreadable_pressure_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let mut missing = PsiSource::new(dir.path().join("cpu.pressure"));
        assert_eq!(missing.read(), None);
        assert_eq!(missing.read(), None);
        let e = read_psi(&dir.path().join("cpu.pressure")).unwrap_err();
        assert!(e.to_string().starts_with("reading "), "{e}");
        std::fs::write(dir.path().join("cpu.pressure"), OLD_CPU).unwrap();
        assert_eq!(missing.read().unwrap().some.avg10, 12.5);
        std::fs::write(dir.path().join("memory.pressure"), "garbage").unwrap();
        let e = read_psi(&dir.path().join("memory.pressure")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: no \"some\" line",
                dir.path().join("memory.pressure").display()
            )
        );
    }

    #[test]
    fn worst_of_several_cgroups() {
        let a = parse_psi(OLD_CPU).unwrap();
        let b = parse_psi(HOST_CPU).unwrap();
        let w = a.worst(b);
        assert_eq!(w.some.avg10, 12.5);
        assert_eq!(w.some.avg300, 9.91);
        assert_eq!(w.some.total_us, 2_986_686_122);
        assert_eq!(w.full, b.full);
    }

    fn pod(name: &str, offline: bool, cpu: u64, memory: u64) -> PodFacts {
        PodFacts {
            pod: PodRef {
                namespace: "ns".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            qos_class: QosClass::Burstable,
            offline,
            critical: false,
            deleting: false,
            finished: false,
            requests: Requests {
                cpu_millis: cpu,
                memory_bytes: memory,
                ..Requests::default()
            },
        }
    }

    fn settings() -> EvictionSettings {
        EvictionSettings::default()
    }

    fn usage(cpu: f64, memory: f64) -> Sample {
        Sample {
            cpu_percent: Some(cpu),
            memory_percent: Some(memory),
            ..Sample::default()
        }
    }

    fn psi(some10: f64, full10: Option<f64>) -> Psi {
        Psi {
            some: PsiLine {
                avg10: some10,
                ..PsiLine::default()
            },
            full: full10.map(|avg10| PsiLine {
                avg10,
                ..PsiLine::default()
            }),
        }
    }

    #[test]
    fn six_high_rounds_make_pressure_then_one_eviction_per_round() {
        let pods = vec![
            pod("online", false, 8000, 8 << 30),
            pod("small", true, 500, 1 << 30),
            pod("big", true, 2000, 1 << 30),
        ];
        let mut e = Evictor::new(settings(), false, &pods);
        for i in 0..5 {
            let d = e.round(&usage(85.0, 10.0), &pods);
            assert_eq!(d, Decision::default(), "round {i}");
        }
        let d = e.round(&usage(80.0, 10.0), &pods);
        assert_eq!(d.taint, Some(true));
        assert_eq!(d.evict.as_ref().unwrap().name, "big");
        assert_eq!(
            d.reason.as_deref(),
            Some("cpu pressure: usage 80.0% at or above the high watermark 80% for 6 rounds")
        );
        // The pod went away: the next round evicts the next one, without tainting again.
        let rest: Vec<PodFacts> = pods
            .iter()
            .filter(|p| p.pod.name != "big")
            .cloned()
            .collect();
        let d = e.round(&usage(90.0, 10.0), &rest);
        assert_eq!(d.taint, None);
        assert_eq!(d.evict.unwrap().name, "small");
        // Only online pods are left: pressure stays, nothing to evict.
        let online = vec![pods[0].clone()];
        let d = e.round(&usage(90.0, 10.0), &online);
        assert_eq!((d.taint, d.evict), (None, None));
        assert!(d.pressure.cpu.is_some());
    }

    #[test]
    fn a_low_round_restarts_the_count() {
        let pods = vec![pod("be", true, 1, 1)];
        let mut e = Evictor::new(settings(), false, &pods);
        for _ in 0..5 {
            e.round(&usage(95.0, 0.0), &pods);
        }
        assert!(e.round(&usage(79.9, 0.0), &pods).evict.is_none());
        for _ in 0..5 {
            assert!(e.round(&usage(95.0, 0.0), &pods).evict.is_none());
        }
        assert!(e.round(&usage(95.0, 0.0), &pods).evict.is_some());
    }

    #[test]
    fn unknown_usage_neither_builds_pressure_nor_clears_the_taint() {
        let pods = vec![pod("be", true, 1, 1)];
        let mut e = Evictor::new(settings(), true, &pods);
        for _ in 0..10 {
            let d = e.round(&Sample::default(), &pods);
            assert_eq!((d.taint, d.evict), (None, None));
        }
        assert!(e.tainted());
    }

    #[test]
    fn eviction_order_and_never_evict_rules() {
        let mut critical = pod("critical", true, 9000, 9 << 30);
        critical.critical = true;
        let mut deleting = pod("deleting", true, 8000, 8 << 30);
        deleting.deleting = true;
        let mut finished = pod("finished", true, 7000, 7 << 30);
        finished.finished = true;
        let online = pod("online", false, 6000, 6 << 30);
        let mut batch = pod("batch", true, 0, 0);
        batch.requests.batch_cpu_millis = 3000;
        batch.requests.batch_memory_bytes = 1 << 30;
        let b = pod("b-tie", true, 1000, 2 << 30);
        let a = pod("a-tie", true, 1000, 2 << 30);
        let pods = vec![critical, deleting, finished, online, batch, b, a];

        let e = Evictor::new(settings(), false, &[]);
        // CPU pressure: batch-cpu counts as a CPU request.
        assert_eq!(e.pick(Resource::Cpu, &pods).unwrap().name, "batch");
        // Memory pressure: the two 2 GiB pods tie; the first by name goes.
        assert_eq!(e.pick(Resource::Memory, &pods).unwrap().name, "a-tie");
        let not_evictable: Vec<PodFacts> = pods[..4].to_vec();
        assert_eq!(e.pick(Resource::Cpu, &not_evictable), None);
    }

    #[test]
    fn memory_is_relieved_before_cpu() {
        let pods = vec![
            pod("cpu-heavy", true, 4000, 1),
            pod("mem-heavy", true, 1, 4 << 30),
        ];
        let mut e = Evictor::new(settings(), false, &pods);
        let mut d = Decision::default();
        for _ in 0..6 {
            d = e.round(&usage(90.0, 90.0), &pods);
        }
        assert!(d.pressure.cpu.is_some() && d.pressure.memory.is_some());
        assert_eq!(d.evict.unwrap().name, "mem-heavy");
        assert!(
            d.reason
                .unwrap()
                .starts_with("memory pressure: usage 90.0%")
        );
    }

    #[test]
    fn psi_is_an_earlier_signal() {
        let pods = vec![pod("be", true, 1, 1)];
        let mut e = Evictor::new(settings(), false, &pods);
        let cpu_stall = Sample {
            cpu_psi: Some(psi(55.0, None)),
            ..usage(50.0, 20.0)
        };
        assert_eq!(e.round(&cpu_stall, &pods).taint, None);
        assert_eq!(e.round(&cpu_stall, &pods).taint, None);
        let d = e.round(&cpu_stall, &pods);
        assert_eq!(d.taint, Some(true));
        assert_eq!(d.evict.unwrap().name, "be");
        assert_eq!(
            d.reason.as_deref(),
            Some("cpu pressure: PSI some avg10 55.00% above 40% for 3 rounds")
        );

        // Memory uses the full line: a high `some` alone is not pressure.
        let mut e = Evictor::new(settings(), false, &pods);
        let some_only = Sample {
            memory_psi: Some(psi(90.0, Some(5.0))),
            ..usage(10.0, 10.0)
        };
        for _ in 0..5 {
            assert!(!e.round(&some_only, &pods).pressure.any());
        }
        let full = Sample {
            memory_psi: Some(psi(90.0, Some(10.5))),
            ..usage(10.0, 10.0)
        };
        e.round(&full, &pods);
        e.round(&full, &pods);
        let d = e.round(&full, &pods);
        assert!(matches!(
            d.pressure.memory,
            Some(Signal::Psi { line: "full", .. })
        ));
        assert!(d.evict.is_some());

        // Exactly at the threshold is not above it; a missing reading restarts the count.
        let mut e = Evictor::new(settings(), false, &pods);
        let at = Sample {
            cpu_psi: Some(psi(40.0, None)),
            ..usage(10.0, 10.0)
        };
        for _ in 0..5 {
            assert!(!e.round(&at, &pods).pressure.any());
        }
        e.round(&cpu_stall, &pods);
        e.round(&cpu_stall, &pods);
        e.round(&usage(10.0, 10.0), &pods);
        assert!(!e.round(&cpu_stall, &pods).pressure.any());
    }

    #[test]
    fn taint_hysteresis() {
        let pods = vec![pod("online", false, 1, 1)];
        let mut e = Evictor::new(settings(), false, &pods);
        let mut taints = Vec::new();
        // (cpu %, memory %) per round.
        let rounds = [
            (85.0, 20.0), // 1..6 high
            (85.0, 20.0),
            (85.0, 20.0),
            (85.0, 20.0),
            (85.0, 20.0),
            (85.0, 20.0), // pressure: taint
            (50.0, 20.0), // between the watermarks: keep
            (31.0, 20.0), // just above low: keep
            (30.0, 35.0), // cpu low, memory not: keep
            (30.0, 30.0), // all at or below low: remove
            (50.0, 50.0), // between: nothing
            (85.0, 20.0), // one high round is not pressure
        ];
        for (cpu, memory) in rounds {
            taints.push(e.round(&usage(cpu, memory), &pods).taint);
        }
        assert_eq!(
            taints,
            [
                None,
                None,
                None,
                None,
                None,
                Some(true),
                None,
                None,
                None,
                Some(false),
                None,
                None
            ]
        );
        assert!(!e.tainted());
    }

    #[test]
    fn taint_stays_while_psi_is_high_even_at_low_usage() {
        let mut e = Evictor::new(settings(), true, &[]);
        let stalled = Sample {
            memory_psi: Some(psi(50.0, Some(20.0))),
            ..usage(10.0, 10.0)
        };
        assert_eq!(e.round(&stalled, &[]).taint, None);
        assert_eq!(e.round(&usage(10.0, 10.0), &[]).taint, Some(false));
    }

    #[test]
    fn configured_watermarks_and_limits_apply() {
        let s = EvictionSettings {
            cpu: Watermarks { high: 50, low: 10 },
            high_usage_count_limit: 2,
            ..settings()
        };
        let pods = vec![pod("be", true, 1, 1)];
        let mut e = Evictor::new(s, false, &pods);
        assert_eq!(e.round(&usage(50.0, 0.0), &pods).taint, None);
        assert_eq!(e.round(&usage(50.0, 0.0), &pods).taint, Some(true));
        assert_eq!(e.round(&usage(11.0, 0.0), &[]).taint, None);
        assert_eq!(e.round(&usage(10.0, 0.0), &[]).taint, Some(false));
    }

    #[test]
    fn waits_for_the_evicted_pod_to_go() {
        let pods = vec![
            pod("a", true, 3, 3),
            pod("b", true, 2, 2),
            pod("c", true, 1, 1),
        ];
        let s = EvictionSettings {
            high_usage_count_limit: 1,
            ..settings()
        };
        let mut e = Evictor::new(s, false, &pods);
        let high = usage(95.0, 0.0);
        assert_eq!(e.round(&high, &pods).evict.unwrap().name, "a");
        // "a" is terminating (or the informer has not seen it yet): wait.
        let mut terminating = pods.clone();
        terminating[0].deleting = true;
        assert_eq!(e.round(&high, &pods).evict, None);
        assert_eq!(e.round(&high, &terminating).evict, None);
        // After SETTLE_ROUNDS rounds the next one goes even though "a" is still there.
        assert_eq!(e.round(&high, &terminating).evict.unwrap().name, "b");
        // Once "b" is gone the next round goes at once.
        let left = vec![terminating[0].clone(), pods[2].clone()];
        assert_eq!(e.round(&high, &left).evict.unwrap().name, "c");
    }

    #[test]
    fn an_eviction_that_did_not_happen_is_retried() {
        let pods = vec![pod("a", true, 3, 3), pod("b", true, 2, 2)];
        let s = EvictionSettings {
            high_usage_count_limit: 1,
            ..settings()
        };
        let mut e = Evictor::new(s, false, &pods);
        let high = usage(95.0, 0.0);
        assert_eq!(e.round(&high, &pods).evict.unwrap().name, "a");
        assert_eq!(e.round(&high, &pods).evict, None);
        assert_eq!(e.round(&high, &pods).evict, None);
        // "a" never got a deletion timestamp: it is the largest again.
        assert_eq!(e.round(&high, &pods).evict.unwrap().name, "a");
    }

    #[test]
    fn refused_eviction_moves_on_to_the_next_pod() {
        let pods = vec![pod("a", true, 3, 3), pod("b", true, 2, 2)];
        let s = EvictionSettings {
            high_usage_count_limit: 1,
            ..settings()
        };
        let mut e = Evictor::new(s, false, &pods);
        let high = usage(95.0, 0.0);
        let first = e.round(&high, &pods).evict.unwrap();
        assert_eq!(first.name, "a");
        e.eviction_failed(&first);
        assert_eq!(e.round(&high, &pods).evict.unwrap().name, "b");
        e.eviction_failed(&pods[1].pod);
        // Both refused: nothing until the skip runs out, then "a" again.
        let picks: Vec<Option<String>> = (0..REFUSED_SKIP_ROUNDS)
            .map(|_| e.round(&high, &pods).evict.map(|p| p.name))
            .collect();
        assert_eq!(picks[..4], [None, None, None, None]);
        assert_eq!(picks[4].as_deref(), Some("a"));
    }

    #[test]
    fn restart_neither_flaps_the_taint_nor_evicts_twice() {
        let mut evicted = pod("evicted", true, 4000, 4 << 30);
        evicted.deleting = true;
        let next = pod("next", true, 1000, 1 << 30);
        let pods = vec![evicted.clone(), next.clone()];
        let s = EvictionSettings {
            high_usage_count_limit: 1,
            ..settings()
        };
        // The agent comes back on a tainted node while its last eviction is terminating.
        let mut e = Evictor::new(s, true, &pods);
        assert!(e.in_flight().eq(["uid-evicted"]));
        let d = e.round(&usage(95.0, 10.0), &pods);
        assert_eq!((d.taint, d.evict), (None, None));
        // Usage between the watermarks after restart: the taint is kept, not removed.
        let d = e.round(&usage(50.0, 10.0), &pods);
        assert_eq!(d.taint, None);
        // The terminating pod is gone and pressure persists: now the next one.
        let d = e.round(&usage(95.0, 10.0), &[next]);
        assert_eq!(d.taint, None);
        assert_eq!(d.evict.unwrap().name, "next");
    }

    #[test]
    fn restart_on_an_untainted_quiet_node_does_nothing() {
        let pods = vec![pod("be", true, 1, 1)];
        let mut e = Evictor::new(settings(), false, &pods);
        assert_eq!(e.round(&usage(10.0, 10.0), &pods), Decision::default());
    }

    #[test]
    fn disabled_removes_the_taint_and_evicts_nothing() {
        let s = EvictionSettings {
            enabled: false,
            high_usage_count_limit: 1,
            ..settings()
        };
        let pods = vec![pod("be", true, 1, 1)];
        let mut e = Evictor::new(s, true, &pods);
        let d = e.round(&usage(99.0, 99.0), &pods);
        assert_eq!((d.taint, d.evict), (Some(false), None));
        assert_eq!(e.round(&usage(99.0, 99.0), &pods).taint, None);
    }

    #[test]
    fn failed_taint_patch_is_retried_after_observe() {
        let s = EvictionSettings {
            high_usage_count_limit: 1,
            ..settings()
        };
        let mut e = Evictor::new(s, false, &[]);
        assert_eq!(e.round(&usage(95.0, 0.0), &[]).taint, Some(true));
        e.observe_taint(false);
        assert_eq!(e.round(&usage(95.0, 0.0), &[]).taint, Some(true));
        assert_eq!(e.round(&usage(95.0, 0.0), &[]).taint, None);
    }

    #[test]
    fn reloading_settings_restarts_counts_only_on_change() {
        let pods = vec![pod("be", true, 1, 1)];
        let mut e = Evictor::new(settings(), false, &pods);
        for _ in 0..5 {
            e.round(&usage(90.0, 0.0), &pods);
        }
        e.set_settings(settings());
        assert!(e.round(&usage(90.0, 0.0), &pods).evict.is_some());
        let mut e = Evictor::new(settings(), false, &pods);
        for _ in 0..5 {
            e.round(&usage(90.0, 0.0), &pods);
        }
        e.set_settings(EvictionSettings {
            cpu: Watermarks { high: 85, low: 30 },
            ..settings()
        });
        assert!(e.round(&usage(90.0, 0.0), &pods).evict.is_none());
    }

    fn api_pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn facts_from_api_pods() {
        let p = api_pod(serde_json::json!({
            "metadata": {"name": "job-0", "namespace": "batch", "uid": "u1",
                         "annotations": {"volcano.sh/qos-level": "BE"}},
            "spec": {
                "initContainers": [
                    {"name": "init", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
                    {"name": "sidecar", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "256Mi",
                        "kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "2Gi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "1"}}}
                ],
                "overhead": {"cpu": "10m"}
            },
            "status": {"phase": "Running", "qosClass": "Burstable"}
        }));
        let f = PodFacts::from_pod(&p).unwrap();
        assert_eq!(f.pod.to_string(), "batch/job-0");
        assert!(f.offline && !f.critical && !f.deleting && !f.finished && f.evictable());
        assert_eq!(f.qos_class, QosClass::Burstable);
        assert_eq!(
            f.requests,
            Requests {
                // max(init 3000, app 1500 + sidecar 100) + overhead 10
                cpu_millis: 3010,
                // max(init 1 GiB, app 256 MiB + sidecar 64 MiB)
                memory_bytes: 1 << 30,
                batch_cpu_millis: 1500,
                batch_memory_bytes: 2 << 30,
            }
        );
        assert_eq!(f.request_of(Resource::Cpu), 4510);
    }

    #[test]
    fn critical_deleting_and_qos_from_api_pods() {
        let base = |extra_meta: serde_json::Value, extra_spec: serde_json::Value| {
            let mut meta = serde_json::json!({"name": "p", "namespace": "n", "uid": "u",
                "annotations": {"volcano.sh/qos-level": "BE"}});
            let mut spec = serde_json::json!({"containers": [{"name": "c",
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                              "requests": {"cpu": "1", "memory": "1Gi"}}}]});
            meta.as_object_mut()
                .unwrap()
                .extend(extra_meta.as_object().unwrap().clone());
            spec.as_object_mut()
                .unwrap()
                .extend(extra_spec.as_object().unwrap().clone());
            PodFacts::from_pod(&api_pod(
                serde_json::json!({"metadata": meta, "spec": spec}),
            ))
            .unwrap()
        };
        let plain = base(serde_json::json!({}), serde_json::json!({}));
        assert!(plain.evictable());
        // No status: the class is computed.
        assert_eq!(plain.qos_class, QosClass::Guaranteed);
        let table = [
            (
                serde_json::json!({}),
                serde_json::json!({"priorityClassName": "system-node-critical"}),
            ),
            (
                serde_json::json!({}),
                serde_json::json!({"priorityClassName": "system-cluster-critical"}),
            ),
            (
                serde_json::json!({}),
                serde_json::json!({"priority": 2_000_000_000}),
            ),
            (
                serde_json::json!({"annotations": {"volcano.sh/qos-level": "BE",
                    "kubernetes.io/config.mirror": "abc"}}),
                serde_json::json!({}),
            ),
            (
                serde_json::json!({"annotations": {"volcano.sh/qos-level": "BE",
                    "kubernetes.io/config.source": "file"}}),
                serde_json::json!({}),
            ),
        ];
        for (meta, spec) in table {
            let f = base(meta.clone(), spec.clone());
            assert!(f.critical && !f.evictable(), "{meta} {spec}");
        }
        let deleting = base(
            serde_json::json!({"deletionTimestamp": "2026-01-01T00:00:00Z"}),
            serde_json::json!({}),
        );
        assert!(deleting.deleting && !deleting.evictable());
        let api_source = base(
            serde_json::json!({"annotations": {"volcano.sh/qos-level": "BE",
                "kubernetes.io/config.source": "api"}}),
            serde_json::json!({"priority": 1000}),
        );
        assert!(api_source.evictable());
        for level in ["LC", "LS", "HLS", "be", ""] {
            let f = base(
                serde_json::json!({"annotations": {"volcano.sh/qos-level": level}}),
                serde_json::json!({}),
            );
            assert!(!f.offline && !f.evictable(), "{level}");
        }
    }

    #[test]
    fn computed_qos_classes() {
        let class = |containers: serde_json::Value| {
            PodFacts::from_pod(&api_pod(serde_json::json!({
                "metadata": {"name": "p", "namespace": "n", "uid": "u"},
                "spec": {"containers": containers}
            })))
            .unwrap()
            .qos_class
        };
        assert_eq!(
            class(serde_json::json!([{"name": "c"}])),
            QosClass::BestEffort
        );
        assert_eq!(
            class(serde_json::json!([{"name": "c", "resources": {"requests": {"cpu": "1"}}}])),
            QosClass::Burstable
        );
        assert_eq!(
            class(serde_json::json!([{"name": "c", "resources":
                {"limits": {"cpu": "1", "memory": "1Gi"}}}])),
            QosClass::Guaranteed
        );
        assert_eq!(
            class(serde_json::json!([{"name": "c", "resources":
                {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "1"}}}])),
            QosClass::Burstable
        );
    }

    #[test]
    fn bad_pods_are_errors() {
        let no_uid = api_pod(serde_json::json!({"metadata": {"name": "p", "namespace": "n"}}));
        assert_eq!(
            PodFacts::from_pod(&no_uid).unwrap_err().to_string(),
            "pod without metadata.uid"
        );
        let bad = api_pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "lots"}}}]}
        }));
        assert_eq!(
            PodFacts::from_pod(&bad).unwrap_err().to_string(),
            "pod n/p: container c requests.memory is \"lots\", not a Kubernetes quantity"
        );
    }

    #[test]
    fn percent_of_total() {
        assert_eq!(percent(50, 200), Some(25.0));
        assert_eq!(percent(1, 0), None);
    }
}
