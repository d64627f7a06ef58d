//! `fumarole-sim sweep`: many generated traces (every cluster shape × load × seed), every
//! policy on each, and each figure's mean, spread and range per policy, so a claim rests on
//! more than one trace.
//!
//! Start at [`cases`] (which traces), then [`run`] (generate and simulate each) and
//! [`markdown`] (the summary, the per-trace delays and the targets checked against
//! the figures).

use std::fmt::Write as _;

use crate::policy::Policy;
use crate::report::{self, Metrics, share};
use crate::shape::{ClusterShape, ShapeError};
use crate::trace::{self, GenSpec, TraceError};
use crate::{Options, Simulation, compare};

/// Why a sweep cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A cluster shape that does not build.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// A generated trace the simulator refuses (a generator bug).
    #[error(transparent)]
    Trace(#[from] TraceError),
}

/// Which traces a sweep generates: every cluster × load × seed.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepSpec {
    pub clusters: Vec<ClusterShape>,
    pub loads: Vec<f64>,
    /// Seeds `first_seed .. first_seed + seeds` for every cluster and load.
    pub first_seed: u64,
    pub seeds: u64,
    /// Jobs per trace.
    pub jobs: usize,
}

/// One generated trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub cluster: ClusterShape,
    pub load: f64,
    pub seed: u64,
}

impl Case {
    /// A short name: fixture, nodes, load, seed.
    pub fn name(&self) -> String {
        format!(
            "{}-{} load {} seed {}",
            self.cluster.fixture, self.cluster.nodes, self.load, self.seed
        )
    }
}

/// The traces of `spec`, cluster-major. Each seed is distinct across the whole sweep (seed +
/// an offset per cluster and load), so no two traces share a random stream.
pub fn cases(spec: &SweepSpec) -> Vec<Case> {
    let mut out = Vec::new();
    let mut offset = 0;
    for cluster in &spec.clusters {
        for &load in &spec.loads {
            for s in 0..spec.seeds {
                out.push(Case {
                    cluster: cluster.clone(),
                    load,
                    seed: spec.first_seed + offset + s,
                });
            }
            offset += spec.seeds;
        }
    }
    out
}

/// One trace's figures, one per policy (in the order asked).
#[derive(Clone, Debug, PartialEq)]
pub struct CaseRun {
    pub case: Case,
    pub metrics: Vec<Metrics>,
}

/// Generates the trace of `case` (as `generate-trace` would) and runs `policies` on it.
pub fn run_case(
    case: &Case,
    jobs: usize,
    policies: &[Policy],
    opts: &Options,
) -> Result<CaseRun, SweepError> {
    let cluster = case.cluster.build()?;
    let spec = GenSpec {
        seed: case.seed,
        jobs,
        load: case.load,
        capacity: cluster.capacity(),
        devices_per_node: u32::try_from(cluster.devices_per_node).unwrap_or(u32::MAX),
        super_node_size: u32::try_from(cluster.super_node_size()).unwrap_or(u32::MAX),
    };
    let text = trace::write(&trace::generate(&spec), &[]);
    let sim = Simulation::load(cluster, &text, &case.name())?;
    let metrics = compare(&sim, policies, opts)
        .iter()
        .map(|o| Metrics::of(&sim, o))
        .collect();
    Ok(CaseRun {
        case: case.clone(),
        metrics,
    })
}

/// Every case of `spec`, in order; `progress` hears of each as it finishes.
pub fn run(
    spec: &SweepSpec,
    policies: &[Policy],
    opts: &Options,
    mut progress: impl FnMut(usize, usize, &CaseRun),
) -> Result<Vec<CaseRun>, SweepError> {
    let all = cases(spec);
    let mut out = Vec::with_capacity(all.len());
    for (i, case) in all.iter().enumerate() {
        let r = run_case(case, spec.jobs, policies, opts)?;
        progress(i + 1, all.len(), &r);
        out.push(r);
    }
    Ok(out)
}

/// One figure of [`Metrics`], as a number, and how to print it.
pub struct Figure {
    pub name: &'static str,
    pub value: fn(&Metrics) -> f64,
    pub unit: Unit,
}

/// How a figure prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A share, printed as %.
    Share,
    /// Seconds, printed as minutes.
    Minutes,
    /// Seconds, printed as hours.
    Hours,
    /// A count.
    Count,
}

impl Unit {
    fn show(self, x: f64) -> String {
        match self {
            Unit::Share => format!("{:.1}", x * 100.0),
            Unit::Minutes => format!("{:.1}", x / 60.0),
            Unit::Hours => format!("{:.1}", x / 3600.0),
            Unit::Count => format!("{x:.1}"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Unit::Share => "%",
            Unit::Minutes => "min",
            Unit::Hours => "h",
            Unit::Count => "",
        }
    }
}

/// The figures the sweep summarises, in order.
pub const FIGURES: [Figure; 15] = [
    Figure {
        name: "placed",
        value: |m| share(m.placed, m.jobs),
        unit: Unit::Share,
    },
    Figure {
        name: "ideal interconnect (jobs)",
        value: |m| share(m.ideal_jobs, m.placed),
        unit: Unit::Share,
    },
    Figure {
        name: "ideal pods",
        value: |m| share(m.ideal_pods, m.pods),
        unit: Unit::Share,
    },
    Figure {
        name: "units split",
        value: |m| share(m.units_split, m.units),
        unit: Unit::Share,
    },
    Figure {
        name: "atomic parts split",
        value: |m| m.atomic_split as f64,
        unit: Unit::Count,
    },
    Figure {
        name: "stranded devices",
        value: |m| m.stranded_share,
        unit: Unit::Share,
    },
    Figure {
        name: "utilisation",
        value: |m| m.utilisation,
        unit: Unit::Share,
    },
    Figure {
        name: "queueing delay (mean)",
        value: |m| m.delay_mean,
        unit: Unit::Minutes,
    },
    Figure {
        name: "queueing delay (p95)",
        value: |m| m.delay_p95,
        unit: Unit::Minutes,
    },
    Figure {
        name: "queueing delay, multi-pod (mean)",
        value: |m| m.delay_mean_multi,
        unit: Unit::Minutes,
    },
    Figure {
        name: "never placed",
        value: |m| m.never_placed as f64,
        unit: Unit::Count,
    },
    Figure {
        name: "makespan",
        value: |m| m.makespan as f64,
        unit: Unit::Hours,
    },
    Figure {
        name: "defrag moves",
        value: |m| m.defrag_moves as f64,
        unit: Unit::Count,
    },
    Figure {
        name: "jobs restarted by moves",
        value: |m| m.defrag_restarts as f64,
        unit: Unit::Count,
    },
    Figure {
        name: "device-hours lost to restarts",
        value: |m| m.lost_device_hours,
        unit: Unit::Count,
    },
];

/// Mean, population standard deviation, minimum and maximum of `xs` (zeros when empty).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(xs: &[f64]) -> Spread {
        if xs.is_empty() {
            return Spread {
                mean: 0.0,
                sd: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        Spread {
            mean,
            sd: var.sqrt(),
            min: xs.iter().copied().fold(f64::INFINITY, f64::min),
            max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// The values of `figure` for the policy at `index`, one per trace.
fn values(runs: &[CaseRun], index: usize, figure: &Figure) -> Vec<f64> {
    runs.iter()
        .filter_map(|r| r.metrics.get(index))
        .map(|m| (figure.value)(m))
        .collect()
}

/// The policies of the runs (those of the first; every run has the same).
fn policies(runs: &[CaseRun]) -> Vec<Policy> {
    runs.first()
        .map(|r| r.metrics.iter().map(|m| m.policy).collect())
        .unwrap_or_default()
}

/// The summary (mean ± sd [min, max] of each figure per policy), the mean and p95 delay per
/// trace, and the targets checked for `fumarole`.
pub fn markdown(spec: &SweepSpec, runs: &[CaseRun]) -> String {
    let mut out = String::new();
    let ps = policies(runs);
    let clusters: Vec<String> = spec.clusters.iter().map(|c| c.to_string()).collect();
    let loads: Vec<String> = spec.loads.iter().map(|l| l.to_string()).collect();
    let _ = writeln!(
        out,
        "{} traces of {} jobs: clusters {}; loads {}; {} seed(s) each from {}.\n",
        runs.len(),
        spec.jobs,
        clusters.join(", "),
        loads.join(", "),
        spec.seeds,
        spec.first_seed
    );
    let _ = writeln!(
        out,
        "Each cell: mean ± standard deviation over the traces [min, max].\n"
    );
    let _ = write!(out, "| policy |");
    for f in &FIGURES {
        let unit = f.unit.label();
        if unit.is_empty() {
            let _ = write!(out, " {} |", f.name);
        } else {
            let _ = write!(out, " {} ({unit}) |", f.name);
        }
    }
    let _ = writeln!(out, "\n|---|{}", "---|".repeat(FIGURES.len()));
    for (i, p) in ps.iter().enumerate() {
        let _ = write!(out, "| {p} |");
        for f in &FIGURES {
            let s = Spread::of(&values(runs, i, f));
            let _ = write!(
                out,
                " {} ± {} [{}, {}] |",
                f.unit.show(s.mean),
                f.unit.show(s.sd),
                f.unit.show(s.min),
                f.unit.show(s.max)
            );
        }
        let _ = writeln!(out);
    }
    out.push_str(&by_cluster_and_load(runs, &ps));
    let _ = writeln!(
        out,
        "\nQueueing delay per trace, mean / p95 (min); ideal interconnect of fumarole's jobs:\n"
    );
    let _ = write!(out, "| trace |");
    for p in &ps {
        let _ = write!(out, " {p} |");
    }
    let has_fumarole = ps.contains(&Policy::Fumarole);
    if has_fumarole {
        let _ = write!(out, " fumarole ideal |");
    }
    let _ = writeln!(
        out,
        "\n|---|{}{}",
        "---|".repeat(ps.len()),
        if has_fumarole { "---|" } else { "" }
    );
    for r in runs {
        let _ = write!(out, "| {} |", r.case.name());
        for m in &r.metrics {
            let _ = write!(
                out,
                " {:.1} / {:.1} |",
                m.delay_mean / 60.0,
                m.delay_p95 / 60.0
            );
        }
        if let Some(f) = r.metrics.iter().find(|m| m.policy == Policy::Fumarole) {
            let _ = write!(out, " {} |", report::pct(share(f.ideal_jobs, f.placed)));
        }
        let _ = writeln!(out);
    }
    out.push_str(&targets(runs));
    out
}

/// Per cluster and load, averaged over its seeds: each policy's mean / p95 delay, on how many
/// traces fumarole's mean and p95 are at most volcano-hard's, and fumarole's ideal jobs.
fn by_cluster_and_load(runs: &[CaseRun], ps: &[Policy]) -> String {
    let mut out = String::new();
    let vs = ps.contains(&Policy::Fumarole) && ps.contains(&Policy::VolcanoHard);
    let _ = writeln!(
        out,
        "\nBy cluster and load, averaged over the seeds: queueing delay mean / p95 (min){}:\n",
        if vs {
            "; traces where fumarole's mean (p95) is at most volcano-hard's; fumarole's ideal jobs"
        } else {
            ""
        }
    );
    let _ = write!(out, "| cluster | load | traces |");
    for p in ps {
        let _ = write!(out, " {p} |");
    }
    let extra = if vs { 3 } else { 0 };
    if vs {
        let _ = write!(
            out,
            " fumarole <= volcano-hard (mean) | (p95) | fumarole ideal |"
        );
    }
    let _ = writeln!(out, "\n|---|---|---|{}", "---|".repeat(ps.len() + extra));
    let mut groups: Vec<(&ClusterShape, f64, Vec<&CaseRun>)> = Vec::new();
    for r in runs {
        match groups
            .iter_mut()
            .find(|g| *g.0 == r.case.cluster && g.1 == r.case.load)
        {
            Some(g) => g.2.push(r),
            None => groups.push((&r.case.cluster, r.case.load, vec![r])),
        }
    }
    for (cluster, load, rs) in groups {
        let _ = write!(out, "| {cluster} | {load} | {} |", rs.len());
        for &p in ps {
            let ms: Vec<&Metrics> = rs.iter().filter_map(|r| of(r, p)).collect();
            let mean = Spread::of(&ms.iter().map(|m| m.delay_mean).collect::<Vec<_>>()).mean;
            let p95 = Spread::of(&ms.iter().map(|m| m.delay_p95).collect::<Vec<_>>()).mean;
            let _ = write!(out, " {:.1} / {:.1} |", mean / 60.0, p95 / 60.0);
        }
        if vs {
            let at_most = |get: fn(&Metrics) -> f64| {
                rs.iter()
                    .filter(|r| {
                        matches!((of(r, Policy::Fumarole), of(r, Policy::VolcanoHard)),
                            (Some(f), Some(v)) if get(f) <= get(v))
                    })
                    .count()
            };
            let ideal: Vec<f64> = rs
                .iter()
                .filter_map(|r| of(r, Policy::Fumarole))
                .map(|m| share(m.ideal_jobs, m.placed))
                .collect();
            let _ = write!(
                out,
                " {}/{} | {}/{} | {} |",
                at_most(|m| m.delay_mean),
                rs.len(),
                at_most(|m| m.delay_p95),
                rs.len(),
                report::pct(Spread::of(&ideal).mean)
            );
        }
        let _ = writeln!(out);
    }
    out
}

/// The figures of `policy` on `run`.
fn of(run: &CaseRun, policy: Policy) -> Option<&Metrics> {
    run.metrics.iter().find(|m| m.policy == policy)
}

/// The targets for `fumarole`, checked trace by trace (only for the policies present).
pub fn targets(runs: &[CaseRun]) -> String {
    let mut out = String::new();
    let ps = policies(runs);
    if !ps.contains(&Policy::Fumarole) {
        return out;
    }
    let _ = writeln!(out, "\nTargets for fumarole:\n");
    let n = runs.len();
    for base in [Policy::VolcanoHard, Policy::FirstFit] {
        if !ps.contains(&base) {
            continue;
        }
        for (what, get) in [
            ("mean", (|m: &Metrics| m.delay_mean) as fn(&Metrics) -> f64),
            ("p95", |m: &Metrics| m.delay_p95),
        ] {
            // (fumarole, baseline, trace) where fumarole's delay is the higher.
            let worse: Vec<(f64, f64, String)> = runs
                .iter()
                .filter_map(|r| {
                    let (f, b) = (get(of(r, Policy::Fumarole)?), get(of(r, base)?));
                    (f > b).then(|| (f, b, r.case.name()))
                })
                .collect();
            let excess = Spread::of(&worse.iter().map(|w| w.0 - w.1).collect::<Vec<_>>());
            let worst = worse
                .iter()
                .max_by(|a, b| (a.0 - a.1).total_cmp(&(b.0 - b.1)));
            let _ = write!(
                out,
                "- {what} queueing delay at most {base}'s: {}/{n} traces",
                n - worse.len()
            );
            if let Some((f, b, name)) = worst {
                let _ = write!(
                    out,
                    "; where above, by {:.1} min on average [{:.1}, {:.1}], most on {name} ({:.1} vs {:.1} min)",
                    excess.mean / 60.0,
                    excess.min / 60.0,
                    excess.max / 60.0,
                    f / 60.0,
                    b / 60.0
                );
            }
            let _ = writeln!(out);
        }
    }
    if ps.contains(&Policy::Binpack) {
        for (what, get) in [
            ("mean", (|m: &Metrics| m.delay_mean) as fn(&Metrics) -> f64),
            ("p95", |m: &Metrics| m.delay_p95),
        ] {
            let pairs: Vec<(f64, f64)> = runs
                .iter()
                .filter_map(|r| Some((get(of(r, Policy::Fumarole)?), get(of(r, Policy::Binpack)?))))
                .collect();
            let f: f64 = pairs.iter().map(|p| p.0).sum();
            let b: f64 = pairs.iter().map(|p| p.1).sum();
            let ratios: Vec<f64> = pairs
                .iter()
                .filter(|p| p.1 > 0.0)
                .map(|p| p.0 / p.1)
                .collect();
            let s = Spread::of(&ratios);
            let _ = writeln!(
                out,
                "- {what} queueing delay / binpack's (target at most 1.25): {:.2} averaged over the traces ({:.1} vs {:.1} min); per trace {:.2} ± {:.2} [{:.2}, {:.2}] over the {} traces where binpack's is above 0",
                if b > 0.0 { f / b } else { 0.0 },
                f / 60.0 / n.max(1) as f64,
                b / 60.0 / n.max(1) as f64,
                s.mean,
                s.sd,
                s.min,
                s.max,
                ratios.len()
            );
        }
    }
    let fum: Vec<&Metrics> = runs
        .iter()
        .filter_map(|r| of(r, Policy::Fumarole))
        .collect();
    let broken: usize = fum.iter().map(|m| m.atomic_split).sum();
    let parts: usize = fum.iter().map(|m| m.atomic_parts).sum();
    let _ = writeln!(out, "- atomic parts broken (target 0): {broken} of {parts}");
    let ideal: Vec<f64> = fum.iter().map(|m| share(m.ideal_jobs, m.placed)).collect();
    let s = Spread::of(&ideal);
    let under: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            let m = of(r, Policy::Fumarole)?;
            let x = share(m.ideal_jobs, m.placed);
            (x < 0.95).then(|| format!("{} ({})", r.case.name(), report::pct(x)))
        })
        .collect();
    let _ = writeln!(
        out,
        "- jobs with ideal interconnect (target at least 95 %): mean {}, min {}; {}/{n} traces at or above 95 %{}",
        report::pct(s.mean),
        report::pct(s.min),
        n - under.len(),
        if under.is_empty() {
            String::new()
        } else {
            format!("; below on {}", under.join(", "))
        }
    );
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn spreads_and_cases() {
        let s = Spread::of(&[1.0, 3.0]);
        assert_eq!((s.mean, s.sd, s.min, s.max), (2.0, 1.0, 1.0, 3.0));
        assert_eq!(Spread::of(&[]).mean, 0.0);
        let spec = SweepSpec {
            clusters: vec![
                "8xdgx-h100:2".parse().unwrap(),
                "8xpcie-4gpu:2".parse().unwrap(),
            ],
            loads: vec![0.8, 1.1],
            first_seed: 100,
            seeds: 2,
            jobs: 10,
        };
        let cs = cases(&spec);
        assert_eq!(cs.len(), 8);
        let mut seeds: Vec<u64> = cs.iter().map(|c| c.seed).collect();
        seeds.dedup();
        assert_eq!(seeds, (100..108).collect::<Vec<_>>());
        assert_eq!(cs[3].name(), "dgx-h100-8 load 1.1 seed 103");
    }
}
