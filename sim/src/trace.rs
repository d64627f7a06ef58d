//! Job traces: the file format, reading it (with errors naming the line), turning a job into the
//! pods the service would see, and a seeded generator.
//!
//! # Format
//!
//! JSON lines, one job per line; blank lines and lines starting with `#` are ignored (the
//! generator writes the command that made the file as a `#` line). Fields:
//!
//! | field | meaning |
//! |---|---|
//! | `job` | name, unique in the trace |
//! | `arrival` | seconds from the start of the trace when the job is submitted |
//! | `duration` | seconds the job runs once all its pods are placed (> 0; arrival + duration at most [`MAX_SECONDS`]) |
//! | `pods` | number of pods (ranks `0..pods`, at most [`MAX_PODS`]), placed all or nothing (gang) |
//! | `devices` | accelerators per pod |
//! | `gpu-group-size` | optional: devices of one model-parallel unit (`metax-tech.com/gpu-group-size`) |
//! | `atomic-gpu-group-size` | optional: devices that must share a super-node (`metax-tech.com/atomic-gpu-group-size`) |
//! | `shares` | optional: replicas per pod of the shared resource (`<resource>.shared`, time-sliced GPUs, [`shared_resource`]) instead of whole devices; `devices` is then 0 |
//!
//! ```text
//! {"job":"j0007","arrival":812,"duration":5400,"pods":4,"devices":8,"gpu-group-size":32,"atomic-gpu-group-size":16}
//! ```
//!
//! Each pod becomes a `Pod` object (`sim/<job>-<rank>`, Volcano job name and task index, the
//! group annotations, a container asking `devices` of the cluster's resource) and goes through
//! [`scheduler_ext::core::request::pod_request`], so a group size the service would refuse is refused here,
//! naming the line.
//!
//! # Generator
//!
//! [`generate`]: a ChaCha8 stream from the seed (the same trace for the same arguments on every
//! platform). Jobs arrive as a Poisson process whose rate makes the offered load (devices ×
//! seconds asked per second) `load` × the cluster's devices; durations are log-uniform between
//! 5 minutes and 8 hours. The mix ([`MIX`]): single-pod jobs of 1, 2, 4 and 8 devices, and
//! multi-node jobs of 2, 4 or 8 whole-node pods forming one gpu-group-size unit, half of those
//! of 4 or more pods with atomic halves of 2 nodes.

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use scheduler_ext::core::request::{self, PodRequest};
use scheduler_ext::core::unit::{self, Jobs};

/// The latest second a trace may reach (arrival + duration): 10 years.
pub const MAX_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// Most pods one job may have.
pub const MAX_PODS: u32 = 10_000;

/// One job of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Job {
    pub job: String,
    pub arrival: u64,
    pub duration: u64,
    pub pods: u32,
    pub devices: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_group_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atomic_gpu_group_size: Option<u32>,
    /// Replicas per pod of the shared resource, instead of whole devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<u32>,
}

impl Job {
    /// True when the job's pods ask for shares of devices, not whole devices.
    pub fn shares_devices(&self) -> bool {
        self.shares.is_some()
    }
}

/// The resource under which nodes offer `resource`'s devices in replicas (NVIDIA's
/// `renameByDefault` name, `nvidia.com/gpu.shared`).
pub fn shared_resource(resource: &str) -> String {
    format!("{resource}.shared")
}

/// Why a trace cannot be used. `line` counts from 1.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A line that is not a job object.
    #[error("{source_name} line {line}: {message}")]
    Line {
        source_name: String,
        line: usize,
        message: String,
    },
    /// No job at all.
    #[error("{0}: no jobs")]
    Empty(String),
}

/// A job and its line, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceJob {
    pub line: usize,
    pub job: Job,
}

/// Reads a trace (see the module doc); `source_name` names it in errors.
pub fn parse(text: &str, source_name: &str) -> Result<Vec<TraceJob>, TraceError> {
    let mut jobs = Vec::new();
    let mut names = HashSet::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| TraceError::Line {
            source_name: source_name.to_string(),
            line,
            message,
        };
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let job: Job = serde_json::from_str(t).map_err(|e| err(e.to_string()))?;
        if job.pods == 0 {
            return Err(err(format!("job {:?}: pods must be at least 1", job.job)));
        }
        match (job.shares, job.devices) {
            (None, 0) => {
                return Err(err(format!(
                    "job {:?}: devices must be at least 1",
                    job.job
                )));
            }
            (Some(0), _) => {
                return Err(err(format!("job {:?}: shares must be at least 1", job.job)));
            }
            (Some(_), d) if d > 0 => {
                return Err(err(format!(
                    "job {:?}: a job asks for shares or for devices, not both",
                    job.job
                )));
            }
            (Some(_), _) if job.gpu_group_size.is_some() || job.atomic_gpu_group_size.is_some() => {
                return Err(err(format!(
                    "job {:?}: shares take no gpu-group-size",
                    job.job
                )));
            }
            _ => {}
        }
        if job.duration == 0 {
            return Err(err(format!(
                "job {:?}: duration must be at least 1",
                job.job
            )));
        }
        if job.arrival.saturating_add(job.duration) > MAX_SECONDS {
            return Err(err(format!(
                "job {:?}: arrival + duration = {} s is past the simulator's horizon of {MAX_SECONDS} s (10 years)",
                job.job,
                job.arrival.saturating_add(job.duration)
            )));
        }
        if job.pods > MAX_PODS {
            return Err(err(format!(
                "job {:?}: {} pods; at most {MAX_PODS} per job",
                job.job, job.pods
            )));
        }
        if job.job.is_empty()
            || !job
                .job
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(err(format!(
                "job name {:?} must be letters, digits and '-'",
                job.job
            )));
        }
        if !names.insert(job.job.clone()) {
            return Err(err(format!("job {:?} appears twice", job.job)));
        }
        jobs.push(TraceJob { line, job });
    }
    if jobs.is_empty() {
        return Err(TraceError::Empty(source_name.to_string()));
    }
    Ok(jobs)
}

/// The trace as text (module doc format), after a `#` line per entry of `header`.
pub fn write(jobs: &[Job], header: &[String]) -> String {
    let mut out = String::new();
    for h in header {
        let _ = writeln!(out, "# {h}");
    }
    for j in jobs {
        if let Ok(line) = serde_json::to_string(j) {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// The pod of rank `rank` of `job`, as the service would see it.
pub fn pod(job: &Job, rank: u32, resource: &str) -> Result<Pod, serde_json::Error> {
    let mut annotations = serde_json::Map::new();
    annotations.insert(unit::VOLCANO_JOB_NAME.into(), job.job.clone().into());
    annotations.insert(unit::VOLCANO_TASK_INDEX.into(), rank.to_string().into());
    if let Some(g) = job.gpu_group_size {
        annotations.insert(unit::GROUP_SIZE[0].into(), g.to_string().into());
    }
    if let Some(a) = job.atomic_gpu_group_size {
        annotations.insert(unit::ATOMIC_GROUP_SIZE[0].into(), a.to_string().into());
    }
    let (resource, count) = match job.shares {
        Some(n) => (shared_resource(resource), n),
        None => (resource.to_string(), job.devices),
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{}-{rank}", job.job),
            "namespace": "sim",
            "annotations": annotations,
        },
        "spec": {"containers": [{
            "name": "main",
            "resources": {"limits": {resource: count.to_string()}},
        }]},
    }))
}

/// The requests of every pod of `tj` (rank order), through [`request::pod_request`]; errors
/// name the line.
pub fn requests(
    tj: &TraceJob,
    resource: &str,
    source_name: &str,
) -> Result<Vec<PodRequest>, TraceError> {
    let err = |message: String| TraceError::Line {
        source_name: source_name.to_string(),
        line: tj.line,
        message,
    };
    let shared = shared_resource(resource);
    let offered = BTreeSet::from([resource, shared.as_str()]);
    let jobs = Jobs::default();
    (0..tj.job.pods)
        .map(|rank| {
            let p = pod(&tj.job, rank, resource).map_err(|e| err(e.to_string()))?;
            let req = request::pod_request(&p, &offered, &jobs).map_err(|e| err(e.to_string()))?;
            if let Some(g) = &req.unit {
                // The service accepts a unit that ends past the last pod (it would wait for
                // more pods forever); a trace job must consist of whole units.
                let total = tj.job.pods.saturating_mul(tj.job.devices);
                if !total.is_multiple_of(g.spec.group_size) {
                    return Err(err(format!(
                        "job {:?}: {} pods x {} devices = {total} is not a multiple of gpu-group-size {}",
                        tj.job.job, tj.job.pods, tj.job.devices, g.spec.group_size
                    )));
                }
            }
            Ok(req)
        })
        .collect()
}

/// One kind of job in the generated mix: its weight, pods, devices per pod (0 = a whole node)
/// and whether the job is one gpu-group-size unit with atomic halves of 2 nodes.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    pub weight: f64,
    pub pods: u32,
    pub devices: u32,
    pub grouped: bool,
    pub atomic_pairs: bool,
}

/// The generated mix (weights sum to 1).
pub const MIX: [Kind; 9] = [
    kind(0.28, 1, 1, false, false),
    kind(0.18, 1, 2, false, false),
    kind(0.16, 1, 4, false, false),
    kind(0.16, 1, 0, false, false),
    kind(0.10, 2, 0, true, false),
    kind(0.04, 4, 0, true, false),
    kind(0.04, 4, 0, true, true),
    kind(0.02, 8, 0, true, false),
    kind(0.02, 8, 0, true, true),
];

const fn kind(weight: f64, pods: u32, devices: u32, grouped: bool, atomic_pairs: bool) -> Kind {
    Kind {
        weight,
        pods,
        devices,
        grouped,
        atomic_pairs,
    }
}

/// Shortest and longest generated duration, seconds.
pub const DURATION_RANGE: (f64, f64) = (300.0, 28_800.0);

/// What [`generate`] makes.
#[derive(Clone, Debug, PartialEq)]
pub struct GenSpec {
    pub seed: u64,
    pub jobs: usize,
    /// Offered load as a share of the cluster's devices (0.9 = 90 %).
    pub load: f64,
    /// Devices in the cluster.
    pub capacity: usize,
    /// Devices per node (the size of a whole-node pod).
    pub devices_per_node: u32,
    /// Nodes per super-node: multi-node jobs larger than this are left out of the mix.
    pub super_node_size: u32,
}

/// A trace as described in the module doc.
pub fn generate(spec: &GenSpec) -> Vec<Job> {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let dpn = spec.devices_per_node.max(1);
    let mix: Vec<Kind> = MIX
        .iter()
        .copied()
        .filter(|k| k.pods <= spec.super_node_size.max(1) && k.devices <= dpn)
        .map(|k| Kind {
            devices: if k.devices == 0 { dpn } else { k.devices },
            ..k
        })
        .collect();
    let total_weight: f64 = mix.iter().map(|k| k.weight).sum();
    let mean_devices: f64 = mix
        .iter()
        .map(|k| k.weight * f64::from(k.pods * k.devices))
        .sum::<f64>()
        / total_weight;
    let (lo, hi) = DURATION_RANGE;
    let mean_duration = (hi - lo) / (hi / lo).ln();
    // Arrivals per second so that the devices asked times their durations match the load.
    let rate = spec.load.max(1e-6) * spec.capacity.max(1) as f64 / (mean_devices * mean_duration);
    let mut t = 0.0f64;
    let mut out = Vec::with_capacity(spec.jobs);
    for i in 0..spec.jobs {
        let u: f64 = rng.random();
        t += -(1.0 - u).ln() / rate;
        let mut pick = rng.random::<f64>() * total_weight;
        let mut chosen = mix.last().copied().unwrap_or(MIX[0]);
        for k in &mix {
            if pick < k.weight {
                chosen = *k;
                break;
            }
            pick -= k.weight;
        }
        let d: f64 = rng.random();
        let duration = (lo * (hi / lo).powf(d)).round();
        let total = chosen.pods * chosen.devices;
        out.push(Job {
            job: format!("j{i:05}"),
            arrival: t.round() as u64,
            duration: duration as u64,
            pods: chosen.pods,
            devices: chosen.devices,
            gpu_group_size: chosen.grouped.then_some(total),
            atomic_gpu_group_size: chosen.atomic_pairs.then_some(2 * chosen.devices),
            shares: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn spec(seed: u64) -> GenSpec {
        GenSpec {
            seed,
            jobs: 300,
            load: 0.9,
            capacity: 512,
            devices_per_node: 8,
            super_node_size: 8,
        }
    }

    #[test]
    fn generator_is_deterministic_per_seed_and_reads_back() {
        let a = generate(&spec(7));
        assert_eq!(a, generate(&spec(7)));
        assert_ne!(a, generate(&spec(8)));
        assert_eq!(a.len(), 300);
        assert!(a.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        // Every kind of the mix shows up in 300 jobs, and every job is valid.
        for (pods, devices) in [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8)] {
            assert!(
                a.iter().any(|j| j.pods == pods && j.devices == devices),
                "{pods}x{devices}"
            );
        }
        assert!(a.iter().any(|j| j.atomic_gpu_group_size == Some(16)));
        let text = write(&a, &["made by a test".into()]);
        let back = parse(&text, "t.jsonl").unwrap();
        assert_eq!(back.iter().map(|t| &t.job).cloned().collect::<Vec<_>>(), a);
        assert_eq!(back[0].line, 2);
        for tj in &back {
            let reqs = requests(tj, "nvidia.com/gpu", "t.jsonl").unwrap();
            assert_eq!(reqs.len(), tj.job.pods as usize);
        }
    }

    #[test]
    fn small_super_nodes_leave_big_jobs_out() {
        let mut s = spec(1);
        s.super_node_size = 2;
        assert!(generate(&s).iter().all(|j| j.pods <= 2));
    }

    #[test]
    fn bad_lines_are_named() {
        let e = parse("# c\n{\"job\":\"a\",\"arrival\":0,\"duration\":5,\"pods\":1,\"devices\":1}\n{\"job\":\"b\"}\n", "x.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.jsonl line 3: missing field"), "{e}");
        let e = parse(
            "{\"job\":\"a\",\"arrival\":0,\"duration\":5,\"pods\":1,\"devices\":1,\"gpus\":2}",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1: unknown field `gpus`"), "{e}");
        let e = parse(
            "{\"job\":\"a\",\"arrival\":-1,\"duration\":5,\"pods\":1,\"devices\":1}",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1: invalid value: integer `-1`"), "{e}");
        let e = parse(
            "{\"job\":\"a\",\"arrival\":0,\"duration\":5,\"pods\":0,\"devices\":1}",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("pods must be at least 1"), "{e}");
        let e = parse(
            "{\"job\":\"a\",\"arrival\":18446744073709551615,\"duration\":5,\"pods\":1,\"devices\":1}",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("past the simulator's horizon"), "{e}");
        let e = parse(
            "{\"job\":\"a\",\"arrival\":0,\"duration\":5,\"pods\":4000000000,\"devices\":1}",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("4000000000 pods; at most 10000 per job"), "{e}");
        assert!(parse("\n# only comments\n", "e").unwrap_err().to_string() == "e: no jobs");
        let share = |rest: &str| {
            parse(
                &format!("{{\"job\":\"a\",\"arrival\":0,\"duration\":5,\"pods\":1,{rest}}}"),
                "x",
            )
        };
        let ok = share("\"devices\":0,\"shares\":1").unwrap();
        assert_eq!(ok[0].job.shares, Some(1));
        let both = share("\"devices\":1,\"shares\":1").unwrap_err().to_string();
        assert!(both.contains("shares or for devices, not both"), "{both}");
        let none = share("\"devices\":0,\"shares\":0").unwrap_err().to_string();
        assert!(none.contains("shares must be at least 1"), "{none}");
        let grouped = share("\"devices\":0,\"shares\":1,\"gpu-group-size\":8")
            .unwrap_err()
            .to_string();
        assert!(
            grouped.contains("shares take no gpu-group-size"),
            "{grouped}"
        );
        let reqs = requests(&ok[0], "nvidia.com/gpu", "x").unwrap();
        assert_eq!(reqs[0].devices.resource, "nvidia.com/gpu.shared");
        assert_eq!(reqs[0].devices.count, 1);
        let tj = TraceJob {
            line: 4,
            job: Job {
                job: "g".into(),
                arrival: 0,
                duration: 1,
                pods: 2,
                devices: 4,
                gpu_group_size: Some(6),
                atomic_gpu_group_size: None,
                shares: None,
            },
        };
        let e = requests(&tj, "nvidia.com/gpu", "x")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x line 4: pod sim/g-0:"), "{e}");
        assert!(e.contains("not a multiple of the pod's 4 GPUs"), "{e}");
        let tj = TraceJob {
            line: 5,
            job: Job {
                pods: 3,
                gpu_group_size: Some(8),
                ..tj.job
            },
        };
        let e = requests(&tj, "nvidia.com/gpu", "x")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("12 is not a multiple of gpu-group-size 8"),
            "{e}"
        );
    }
}
