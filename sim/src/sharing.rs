//! What sharing buys on a mixed trace: whole-device training jobs (the generated mix,
//! [`trace::generate`]) and one-replica inference pods, run five ways ([`compare`]):
//!
//! - **without sharing**: every inference pod takes a whole GPU, on a cluster whose nodes all
//!   offer whole GPUs ([`Simulation::without_sharing`]);
//! - **sharing, packed**: the first `--shared-nodes` nodes offer each GPU as `--replicas`
//!   time-sliced replicas (`nvidia.com/gpu.shared`), the others whole GPUs, and the decision
//!   core places both (shares packed onto GPUs already shared, [`scheduler_ext::core::score`]);
//! - **sharing, spread**: the same cluster, training placed by the core, inference as
//!   kube-scheduler's default and NVIDIA's `distributed` default would ([`super::spread_shares`]);
//! - the two clusters again under the `nvidia` baseline (training by NVIDIA's device-plugin
//!   choice on the least-free node, shares spread): what fractional pods do to a placement that
//!   does not look at the interconnect.
//!
//! Figures per arm ([`Figures`]): the GPUs inference holds (a GPU with at least one replica
//! held counts once; time mean over the arrival window and peak), the inference pods' mean
//! queueing delay, the share of training pods with ideal interconnect and the training jobs'
//! mean queueing delay, and the jobs never placed. The same work means the same trace: the inference pods arrive, run and end at the
//! same times in every arm when they are placed at once.

use std::collections::BTreeMap;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use crate::policy::Policy;
use crate::report::time_mean;
use crate::trace::{self, DURATION_RANGE, GenSpec, Job, TraceError};
use crate::{Options, Outcome, Simulation, run};

/// One arm's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Figures {
    pub arm: &'static str,
    /// GPUs inference pods hold, time mean over the arrival window.
    pub inference_gpus_mean: f64,
    /// The most GPUs inference pods held at once.
    pub inference_gpus_peak: usize,
    /// Training pods placed with ideal interconnect, out of those placed.
    pub training_ideal: f64,
    /// Training jobs' mean queueing delay, seconds.
    pub training_wait_mean: f64,
    /// Inference jobs' mean queueing delay, seconds.
    pub inference_wait_mean: f64,
    /// Jobs still waiting at the end.
    pub never_placed: usize,
}

/// `spec`'s training trace with `inference` one-replica jobs added, arriving uniformly over
/// the training jobs' arrival window with durations drawn as the generator's (seeded with
/// `spec.seed`), in arrival order; inference jobs are `i<N>`.
pub fn mixed_trace(spec: &GenSpec, inference: usize) -> Vec<Job> {
    let mut jobs = trace::generate(spec);
    let last = jobs.iter().map(|j| j.arrival).max().unwrap_or(0);
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ 0x5348_4152_4553);
    let (lo, hi) = DURATION_RANGE;
    for i in 0..inference {
        let d: f64 = rng.random();
        jobs.push(Job {
            job: format!("i{i:05}"),
            arrival: rng.random_range(0..=last),
            duration: (lo * (hi / lo).powf(d)).round() as u64,
            pods: 1,
            devices: 0,
            gpu_group_size: None,
            atomic_gpu_group_size: None,
            shares: Some(1),
        });
    }
    jobs.sort_by_key(|j| j.arrival);
    jobs
}

/// The three arms over `sim` (a cluster with shared nodes and a mixed trace).
pub fn compare(sim: &Simulation, opts: &Options) -> Result<Vec<Figures>, TraceError> {
    let inference: Vec<bool> = sim.jobs.iter().map(|j| j.job.shares_devices()).collect();
    let without = sim.clone().without_sharing()?;
    let spread = Options {
        spread_shares: true,
        ..opts.clone()
    };
    let arms: [(&'static str, &Simulation, Policy, &Options); 5] = [
        ("without sharing", &without, Policy::Fumarole, opts),
        ("sharing, packed", sim, Policy::Fumarole, opts),
        ("sharing, spread", sim, Policy::Fumarole, &spread),
        ("without sharing, nvidia", &without, Policy::Nvidia, opts),
        ("sharing, nvidia", sim, Policy::Nvidia, opts),
    ];
    Ok(arms
        .into_iter()
        .map(|(arm, s, policy, o)| figures(arm, s, &run(s, policy, o), &inference))
        .collect())
}

/// The figures of one run; `inference[j]` says job `j` is an inference job.
pub fn figures(arm: &'static str, sim: &Simulation, out: &Outcome, inference: &[bool]) -> Figures {
    // (time, +1 / -1, GPU): inference pods taking and giving back GPUs.
    let mut events: Vec<(u64, i32, (String, usize))> = Vec::new();
    let (mut ideal, mut placed, mut waits) = (0usize, 0usize, Vec::new());
    let mut inference_waits = Vec::new();
    for ((sj, o), &inf) in sim.jobs.iter().zip(&out.jobs).zip(inference) {
        let Some(start) = o.start else { continue };
        if inf {
            inference_waits.push(start.saturating_sub(sj.job.arrival) as f64);
            let end = start.saturating_add(sj.job.duration);
            for p in &o.pods {
                let mut gpus = p.devices.clone();
                gpus.dedup();
                for d in gpus {
                    events.push((start, 1, (p.node.clone(), d)));
                    events.push((end, -1, (p.node.clone(), d)));
                }
            }
        } else {
            placed += o.pods.len();
            ideal += o.pods.iter().filter(|p| p.ideal).count();
            waits.push(start.saturating_sub(sj.job.arrival) as f64);
        }
    }
    // Ends before starts at one instant: a GPU given back and taken again is not held twice.
    events.sort_by_key(|(t, delta, _)| (*t, *delta));
    let mut held: BTreeMap<(String, usize), u32> = BTreeMap::new();
    let mut series: Vec<(u64, f64)> = vec![(0, 0.0)];
    let mut peak = 0;
    for (t, delta, gpu) in events {
        let n = held.entry(gpu.clone()).or_default();
        if delta > 0 {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        if *n == 0 {
            held.remove(&gpu);
        }
        peak = peak.max(held.len());
        series.push((t, held.len() as f64));
    }
    let (t0, t1) = sim.arrival_window();
    Figures {
        arm,
        inference_gpus_mean: time_mean(&series, t0, t1),
        inference_gpus_peak: peak,
        training_ideal: if placed == 0 {
            0.0
        } else {
            ideal as f64 / placed as f64
        },
        training_wait_mean: mean(&waits),
        inference_wait_mean: mean(&inference_waits),
        never_placed: out.jobs.iter().filter(|j| j.start.is_none()).count(),
    }
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// The figures as a Markdown table.
pub fn markdown(caption: &str, rows: &[Figures]) -> String {
    let mut out = format!(
        "{caption}\n\n| arm | GPUs inference holds (mean) | (peak) | inference mean wait | \
         training pods with ideal interconnect | training mean wait | never placed |\n\
         |---|---:|---:|---:|---:|---:|---:|\n"
    );
    for f in rows {
        out.push_str(&format!(
            "| {} | {:.1} | {} | {:.0} s | {:.1} % | {:.0} s | {} |\n",
            f.arm,
            f.inference_gpus_mean,
            f.inference_gpus_peak,
            f.inference_wait_mean,
            100.0 * f.training_ideal,
            f.training_wait_mean,
            f.never_placed
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::shape::ClusterShape;

    /// Six one-replica inference pods at once beside a training job, on 4 dgx-h100 nodes the
    /// first of which offers 4 replicas per GPU: packed they hold 2 GPUs, spread 6, and
    /// without sharing (a whole GPU each) 6; every job runs in every arm.
    #[test]
    fn packed_shares_hold_fewer_gpus_than_spread_or_whole() {
        let cluster = "4xdgx-h100"
            .parse::<ClusterShape>()
            .unwrap()
            .build_shared(1, 4)
            .unwrap();
        assert_eq!(cluster.capacity(), 24);
        let mut text = String::from(
            "{\"job\":\"train\",\"arrival\":0,\"duration\":100,\"pods\":2,\"devices\":8,\"gpu-group-size\":16}\n",
        );
        for i in 0..6 {
            text.push_str(&format!(
                "{{\"job\":\"i{i}\",\"arrival\":{i},\"duration\":50,\"pods\":1,\"devices\":0,\"shares\":1}}\n"
            ));
        }
        let sim = Simulation::load(cluster, &text, "t").unwrap();
        let rows = compare(&sim, &Options::default()).unwrap();
        let peaks: Vec<(&str, usize, usize)> = rows
            .iter()
            .map(|f| (f.arm, f.inference_gpus_peak, f.never_placed))
            .collect();
        assert_eq!(
            peaks[..3],
            [
                ("without sharing", 6, 0),
                ("sharing, packed", 2, 0),
                ("sharing, spread", 6, 0)
            ]
        );
        assert!(
            rows[..3].iter().all(|f| f.training_ideal == 1.0),
            "{rows:?}"
        );
        let md = markdown("caption", &rows);
        assert!(md.contains("| sharing, packed | "), "{md}");
    }

    /// A trace asking for shares on a cluster without shared nodes is refused by name.
    #[test]
    fn shares_need_shared_nodes() {
        let cluster = "2xdgx-h100"
            .parse::<ClusterShape>()
            .unwrap()
            .build()
            .unwrap();
        let e = Simulation::load(
            cluster,
            "{\"job\":\"i0\",\"arrival\":0,\"duration\":5,\"pods\":1,\"devices\":0,\"shares\":1}",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no node of the cluster offers them"), "{e}");
        let e = "2xatlas-800-910"
            .parse::<ClusterShape>()
            .unwrap()
            .build_shared(1, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("replicas need an NVIDIA fixture"), "{e}");
    }
}
