//! The figures of one policy's run ([`Metrics::of`]) and the tables that print them.
//!
//! - **Ideal interconnect**: a placed job counts when every pod's devices have the link quality
//!   `Q` of the best set of that size on an empty node (`SelectContext::ideal_quality`), and
//!   every gpu-group-size unit of more than one pod stayed within one super-node. Also given per
//!   pod (`Q` only).
//! - **Units split**: gpu-group-size units of more than one pod whose pods ended up in more
//!   than one super-node, out of all such units placed (the unit SHOULD share one). **Atomic
//!   parts split**: the same for the atomic parts (`atomic-gpu-group-size`, by default the
//!   whole unit), which MUST share one: fumarole never splits them, it waits instead.
//! - **Stranded devices**: [`super::stranded`], averaged over time from the first to the last
//!   arrival of the trace (the cluster drains afterwards), in devices and as a share of the
//!   cluster's devices; the plot shows it over time.
//! - **Queueing delay**: start minus arrival of the placed jobs (mean, 95th percentile, and
//!   the mean over the jobs of more than one pod);
//!   **never placed**: jobs still waiting when the simulation ends.
//! - **Utilisation**: devices busy, averaged over the same arrival window, as a share of the
//!   cluster's devices (durations do not depend on placement, so a policy that keeps jobs
//!   waiting keeps devices idle).
//! - **Makespan**: when the last job finished.
//! - **Defragmentation** (`fumarole-defrag`): pods moved, jobs restarted by the moves, and the
//!   work those restarts threw away (device-hours the restarted jobs had run). A restarted job
//!   keeps its first start for the delay, and makespan and utilisation count its first run
//!   only: the rerun is in the lost work, not in those two.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use super::policy::Policy;
use super::{Outcome, Simulation};

/// One policy's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metrics {
    pub policy: Policy,
    pub jobs: usize,
    pub placed: usize,
    pub never_placed: usize,
    /// Placed jobs with ideal interconnect (see the module doc).
    pub ideal_jobs: usize,
    pub pods: usize,
    pub ideal_pods: usize,
    /// Placed gpu-group-size units of more than one pod.
    pub units: usize,
    pub units_split: usize,
    /// Placed atomic parts (`atomic-gpu-group-size`, default the whole unit) of more than one
    /// pod, and those whose pods ended up in more than one super-node: a broken MUST, which
    /// only policies that ignore super-nodes commit.
    pub atomic_parts: usize,
    pub atomic_split: usize,
    /// Time-weighted mean of the stranded devices over the arrival window.
    pub stranded_mean: f64,
    pub stranded_max: f64,
    /// `stranded_mean` over the cluster's devices.
    pub stranded_share: f64,
    /// Busy devices over the arrival window, as a share of the cluster's devices.
    pub utilisation: f64,
    /// Seconds.
    pub delay_mean: f64,
    pub delay_p95: f64,
    pub delay_max: f64,
    /// Mean delay of the placed jobs of more than one pod, seconds.
    pub delay_mean_multi: f64,
    /// Seconds from 0 to the last completion.
    pub makespan: u64,
    /// Pods moved by defragmentation (`fumarole-defrag`), the jobs those moves restarted, and
    /// the work the restarts lost, in device-hours.
    pub defrag_moves: usize,
    pub defrag_restarts: usize,
    pub lost_device_hours: f64,
}

/// `part / whole` as a share (0 when `whole` is 0).
pub fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

impl Metrics {
    /// The figures of `out`, a run over `sim`.
    pub fn of(sim: &Simulation, out: &Outcome) -> Metrics {
        let mut m = Metrics {
            policy: out.policy,
            jobs: sim.jobs.len(),
            placed: 0,
            never_placed: 0,
            ideal_jobs: 0,
            pods: 0,
            ideal_pods: 0,
            units: 0,
            units_split: 0,
            atomic_parts: 0,
            atomic_split: 0,
            stranded_mean: 0.0,
            stranded_max: 0.0,
            stranded_share: 0.0,
            utilisation: 0.0,
            delay_mean: 0.0,
            delay_p95: 0.0,
            delay_max: 0.0,
            delay_mean_multi: 0.0,
            makespan: 0,
            defrag_moves: out.defrag.moves,
            defrag_restarts: out.defrag.restarted_jobs,
            lost_device_hours: out.defrag.lost_device_seconds / 3600.0,
        };
        let (t0, t1) = sim.arrival_window();
        let mut busy = 0.0;
        let mut delays = Vec::new();
        let mut multi = Vec::new();
        for (sj, jo) in sim.jobs.iter().zip(&out.jobs) {
            let Some(start) = jo.start else {
                m.never_placed += 1;
                continue;
            };
            m.placed += 1;
            let delay = start.saturating_sub(sj.job.arrival) as f64;
            delays.push(delay);
            if sj.job.pods > 1 {
                multi.push(delay);
            }
            let end = start.saturating_add(sj.job.duration);
            m.makespan = m.makespan.max(end);
            let overlap = end.min(t1).saturating_sub(start.max(t0));
            busy += overlap as f64 * f64::from(sj.job.pods) * f64::from(sj.job.devices);
            m.pods += jo.pods.len();
            let ideal_pods = jo.pods.iter().filter(|p| p.ideal).count();
            m.ideal_pods += ideal_pods;
            // Unit -> its super-nodes (only units of more than one pod).
            let mut units: BTreeMap<u32, (usize, BTreeSet<&str>)> = BTreeMap::new();
            let mut atomic: BTreeMap<u32, (usize, BTreeSet<&str>)> = BTreeMap::new();
            for (req, p) in sj.pods.iter().zip(&jo.pods) {
                if let Some(g) = &req.unit {
                    for (map, key) in [(&mut units, g.spec.unit), (&mut atomic, g.spec.atomic_unit)]
                    {
                        let u = map.entry(key).or_default();
                        u.0 += 1;
                        u.1.insert(&p.super_node);
                    }
                }
            }
            for (pods, sns) in atomic.values() {
                if *pods > 1 {
                    m.atomic_parts += 1;
                    if sns.len() > 1 {
                        m.atomic_split += 1;
                    }
                }
            }
            let mut split = 0;
            for (pods, sns) in units.values() {
                if *pods > 1 {
                    m.units += 1;
                    if sns.len() > 1 {
                        split += 1;
                    }
                }
            }
            m.units_split += split;
            if ideal_pods == jo.pods.len() && split == 0 {
                m.ideal_jobs += 1;
            }
        }
        if !delays.is_empty() {
            delays.sort_by(f64::total_cmp);
            m.delay_mean = delays.iter().sum::<f64>() / delays.len() as f64;
            let i = ((delays.len() as f64 * 0.95).ceil() as usize).clamp(1, delays.len()) - 1;
            m.delay_p95 = delays.get(i).copied().unwrap_or(0.0);
            m.delay_max = delays.last().copied().unwrap_or(0.0);
        }
        if !multi.is_empty() {
            m.delay_mean_multi = multi.iter().sum::<f64>() / multi.len() as f64;
        }
        m.stranded_mean = time_mean(&out.stranded, t0, t1);
        if t1 > t0 {
            m.utilisation = busy / (sim.cluster.capacity().max(1) as f64 * (t1 - t0) as f64);
        }
        m.stranded_max = out
            .stranded
            .iter()
            .filter(|(t, _)| *t <= t1)
            .map(|(_, v)| *v)
            .fold(0.0, f64::max);
        m.stranded_share = m.stranded_mean / sim.cluster.capacity().max(1) as f64;
        m
    }
}

/// Mean over `[t0, t1]` of the step function `series` (each value holds until the next point;
/// 0 before the first). With `t1 <= t0`, the value at `t0`.
pub fn time_mean(series: &[(u64, f64)], t0: u64, t1: u64) -> f64 {
    if t1 <= t0 {
        return value_at(series, t0);
    }
    let mut sum = 0.0;
    let mut t = t0;
    let mut v = value_at(series, t0);
    for &(ti, vi) in series.iter().filter(|(ti, _)| *ti > t0 && *ti <= t1) {
        sum += v * (ti - t) as f64;
        t = ti;
        v = vi;
    }
    sum += v * (t1 - t) as f64;
    sum / (t1 - t0) as f64
}

/// The step function's value at `t`.
pub fn value_at(series: &[(u64, f64)], t: u64) -> f64 {
    series
        .iter()
        .take_while(|(ti, _)| *ti <= t)
        .last()
        .map_or(0.0, |(_, v)| *v)
}

pub fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

pub fn minutes(s: f64) -> String {
    format!("{:.1} min", s / 60.0)
}

/// The header and one row per policy, as cells.
fn cells(ms: &[Metrics]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "policy",
        "placed",
        "ideal interconnect (jobs)",
        "ideal pods",
        "units split across super-nodes",
        "atomic parts split (MUST broken)",
        "stranded devices (mean)",
        "utilisation",
        "queueing delay (mean)",
        "queueing delay (p95)",
        "queueing delay, multi-pod jobs (mean)",
        "never placed",
        "makespan",
    ];
    let rows = ms
        .iter()
        .map(|m| {
            vec![
                m.policy.to_string(),
                format!("{}/{}", m.placed, m.jobs),
                pct(share(m.ideal_jobs, m.placed)),
                pct(share(m.ideal_pods, m.pods)),
                format!(
                    "{}/{} ({})",
                    m.units_split,
                    m.units,
                    pct(share(m.units_split, m.units))
                ),
                format!(
                    "{}/{} ({})",
                    m.atomic_split,
                    m.atomic_parts,
                    pct(share(m.atomic_split, m.atomic_parts))
                ),
                format!("{:.1} ({})", m.stranded_mean, pct(m.stranded_share)),
                pct(m.utilisation),
                minutes(m.delay_mean),
                minutes(m.delay_p95),
                minutes(m.delay_mean_multi),
                m.never_placed.to_string(),
                format!("{:.1} h", m.makespan as f64 / 3600.0),
            ]
        })
        .collect();
    (header, rows)
}

/// What the run was, in one line.
pub fn caption(sim: &Simulation) -> String {
    let sizes: Vec<String> = sim
        .common
        .iter()
        .map(|(k, p)| format!("{k} ({:.0} %)", p * 100.0))
        .collect();
    format!(
        "trace {} ({} jobs) on {} ({} devices); common pod sizes: {}",
        sim.trace_name,
        sim.jobs.len(),
        sim.cluster.shape,
        sim.cluster.capacity(),
        sizes.join(", ")
    )
}

/// A plain-text table, columns aligned.
pub fn table(sim: &Simulation, ms: &[Metrics]) -> String {
    let (header, rows) = cells(ms);
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "{}", caption(sim));
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let _ = writeln!(out, "{}", line(&head));
    for r in &rows {
        let _ = writeln!(out, "{}", line(r));
    }
    out
}

/// A Markdown table (for the README), after the caption.
pub fn markdown(sim: &Simulation, ms: &[Metrics]) -> String {
    let (header, rows) = cells(ms);
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", caption(sim));
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(
        out,
        "|{}",
        header.iter().map(|_| "---|").collect::<String>()
    );
    for r in &rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out
}

/// Every figure, as JSON.
pub fn json(sim: &Simulation, ms: &[Metrics]) -> String {
    let v = serde_json::json!({
        "trace": sim.trace_name,
        "cluster": sim.cluster.shape.to_string(),
        "devices": sim.cluster.capacity(),
        "common_sizes": sim.common,
        "policies": ms,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// Every job's outcome under every policy, one JSON object a line (`run --jobs-out`): the job
/// as traced, the policy, its start and queueing delay in seconds (`null` when never placed),
/// and the super-nodes and nodes its pods went to, in rank order. For comparing policies job
/// by job (which jobs wait longer, and where their pods went).
pub fn jobs_jsonl(sim: &Simulation, outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    for o in outcomes {
        for (sj, jo) in sim.jobs.iter().zip(&o.jobs) {
            let line = serde_json::json!({
                "policy": o.policy,
                "job": sj.job.job,
                "arrival": sj.job.arrival,
                "duration": sj.job.duration,
                "pods": sj.job.pods,
                "devices": sj.job.devices,
                "gpu_group_size": sj.job.gpu_group_size,
                "atomic_gpu_group_size": sj.job.atomic_gpu_group_size,
                "start": jo.start,
                "delay": jo.start.map(|s| s.saturating_sub(sj.job.arrival)),
                "super_nodes": jo.pods.iter().map(|p| p.super_node.as_str()).collect::<Vec<_>>(),
                "nodes": jo.pods.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(),
            });
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn step_means() {
        let s = [(0, 2.0), (10, 4.0), (30, 0.0)];
        // 10 s of 2, 20 s of 4, 10 s of 0.
        assert!((time_mean(&s, 0, 40) - (20.0 + 80.0) / 40.0).abs() < 1e-12);
        assert!((time_mean(&s, 5, 15) - (10.0 + 20.0) / 10.0).abs() < 1e-12);
        assert_eq!(time_mean(&s, 12, 12), 4.0);
        assert_eq!(value_at(&s, 9), 2.0);
        assert_eq!(value_at(&[(5, 1.0)], 4), 0.0);
    }
}
