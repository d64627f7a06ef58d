//! fumarole-sim: replay a job trace over a simulated cluster, once per placement policy, and
//! measure how well each placed the jobs. `fumarole` decides through the scheduler
//! extension's own decision core ([`scheduler_ext::core::decide`]), so the simulator measures
//! the code the service runs; it is a user of that core, not a part of the service.
//!
//! Start at [`Simulation::load`] (a [`shape::ClusterShape`] built into a real
//! [`scheduler_ext::core::view::ClusterView`], and a [`trace`] read into the pods the service
//! would see), then [`run`] one [`policy::Policy`]; [`report`] turns its [`Outcome`] into the
//! figures and [`plot`] draws them; [`sweep`] does it over many generated traces. The binary
//! `fumarole-sim` has the subcommands `run`, `generate-trace` and `sweep`.
//!
//! # The clock
//!
//! Discrete events, in whole seconds: job arrivals (from the trace) and job completions (start
//! plus duration). At each event time, completions first (their devices are released), then
//! arrivals join the queue, then a scheduling pass. Queue: FIFO by arrival; a pass tries each
//! waiting job in order and places those that fit now; a job that does not fit stays queued and
//! later jobs may still go ahead (as kube-scheduler and Volcano do). A pass after a completion
//! tries the whole queue; a pass after arrivals only tries the new jobs (nothing else changed).
//! Gang: a job's pods are placed rank by rank and the job starts only when every pod got a
//! node; otherwise what its pods got is released and it waits. A job still queued when nothing
//! runs and nothing arrives can never be placed; the report counts it.
//!
//! # State
//!
//! Devices in use are commits in the service's [`Ledger`], for every policy, so a node's free
//! devices are [`Cluster::free_mask`] everywhere. The ledger's clock is the simulated one
//! (`Instant` = start + simulated seconds), so the super-node reservations of gpu-group-size
//! units live and expire on simulated time. A waiting unit's reservation is renewed at every
//! pass, as the scheduler's retries of its pods would renew it; a unit placed whole drops it at
//! once, as the service does when its view shows the unit's pods bound. So every reservation
//! belongs to a waiting job; the decision core drops it as soon as the unit cannot start (one
//! of its parts fits nowhere) or its super-node lost the room
//! ([`scheduler_ext::core::placement`]), so a reservation rarely outlives the pass that made it.

pub mod defrag;
pub mod plot;
pub mod policy;
pub mod report;
pub mod shape;
pub mod sharing;
pub mod sweep;
pub mod trace;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

use fumarole_topology::baseline::nvidia_baseline;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use policy::Policy;
use scheduler_ext::core::cluster::Cluster;
use scheduler_ext::core::decide;
use scheduler_ext::core::ledger::{Commit, Ledger};
use scheduler_ext::core::placement::PlanInputs;
use scheduler_ext::core::request::PodRequest;
use scheduler_ext::core::verdict::best_first;
use scheduler_ext::core::view::{ClusterView, NodeView, indices};
use scheduler_ext::decider::Settings;
use shape::SimCluster;
use trace::{Job, TraceError};

/// A pod size counts as common when at least this share of the trace's pods ask for it.
pub const COMMON_SHARE: f64 = 0.10;

/// A cluster and a trace, ready to run.
#[derive(Clone, Debug)]
pub struct Simulation {
    pub cluster: SimCluster,
    pub jobs: Vec<SimJob>,
    /// The trace's common pod sizes and their weights (see [`stranded`]), by size.
    pub common: Vec<(usize, f64)>,
    /// Name of the trace (file name), for reports.
    pub trace_name: String,
}

/// One job and the requests of its pods (rank order).
#[derive(Clone, Debug)]
pub struct SimJob {
    pub job: Job,
    pub pods: Vec<PodRequest>,
}

/// How a run decides, besides the policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Seeds the `random` policy.
    pub seed: u64,
    /// How `fumarole` decides: the scheduler extension's own settings, built the same way
    /// ([`scheduler_ext::cli::settings`]). Read here: the gpu-aware weights, how long a unit's
    /// super-node reservation lives without its pods, and whether waiting reservations are
    /// renewed while their unit waits ([`Ledger::keeping_waiting_plans`]; off by default in
    /// both, they lapse).
    pub settings: Settings,
    /// `fumarole-defrag` moves only pods whose job has run at most this long (a move restarts
    /// the job and throws its work away).
    pub defrag_max_run: Duration,
    /// Under `fumarole`, place shares as the baselines do (spread, [`spread_shares`]) instead
    /// of through the decision core: what its packing buys ([`sharing`]).
    pub spread_shares: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 1,
            settings: Settings::default(),
            defrag_max_run: Duration::from_secs(2 * 3600),
            spread_shares: false,
        }
    }
}

impl Simulation {
    /// Reads `text` (a trace, see [`trace`]) for `cluster`; `trace_name` names it in errors.
    pub fn load(cluster: SimCluster, text: &str, trace_name: &str) -> Result<Self, TraceError> {
        let parsed = trace::parse(text, trace_name)?;
        let mut jobs = Vec::with_capacity(parsed.len());
        for tj in &parsed {
            let pods = trace::requests(tj, &cluster.resource, trace_name)?;
            if tj.job.shares_devices() && cluster.shared_nodes == 0 {
                return Err(TraceError::Line {
                    source_name: trace_name.to_string(),
                    line: tj.line,
                    message: format!(
                        "job {:?} asks for shares, and no node of the cluster offers them \
                         (--shared-nodes)",
                        tj.job.job
                    ),
                });
            }
            if tj.job.devices as usize > cluster.devices_per_node {
                return Err(TraceError::Line {
                    source_name: trace_name.to_string(),
                    line: tj.line,
                    message: format!(
                        "job {:?}: {} devices per pod, but a {} node has {}",
                        tj.job.job, tj.job.devices, cluster.shape.fixture, cluster.devices_per_node
                    ),
                });
            }
            jobs.push(SimJob {
                job: tj.job.clone(),
                pods,
            });
        }
        let common = common_sizes(jobs.iter().map(|j| &j.job));
        Ok(Simulation {
            cluster,
            jobs,
            common,
            trace_name: trace_name.to_string(),
        })
    }

    /// The same jobs without their `gpu-group-size` / `atomic-gpu-group-size` (every pod on
    /// its own, no super-node rule): what the rules cost, by comparison.
    pub fn without_groups(mut self) -> Self {
        for sj in &mut self.jobs {
            sj.job.gpu_group_size = None;
            sj.job.atomic_gpu_group_size = None;
            for req in &mut sj.pods {
                req.unit = None;
            }
        }
        self.trace_name = format!("{} (without gpu-group-size)", self.trace_name);
        self
    }

    /// The same jobs with every share job asking one whole device per pod instead, on the
    /// same nodes all offering whole devices: what the work needs without sharing.
    pub fn without_sharing(mut self) -> Result<Self, TraceError> {
        self.cluster = self
            .cluster
            .shape
            .build_shared(0, 0)
            .map_err(|e| TraceError::Line {
                source_name: self.trace_name.clone(),
                line: 0,
                message: e.to_string(),
            })?;
        for sj in &mut self.jobs {
            if sj.job.shares.take().is_some() {
                sj.job.devices = 1;
                let tj = trace::TraceJob {
                    line: 0,
                    job: sj.job.clone(),
                };
                sj.pods = trace::requests(&tj, &self.cluster.resource, &self.trace_name)?;
            }
        }
        self.trace_name = format!("{} (without sharing)", self.trace_name);
        Ok(self)
    }

    /// Arrival of the first and the last job, seconds.
    pub fn arrival_window(&self) -> (u64, u64) {
        let first = self.jobs.iter().map(|j| j.job.arrival).min().unwrap_or(0);
        let last = self.jobs.iter().map(|j| j.job.arrival).max().unwrap_or(0);
        (first, last)
    }
}

/// Pod sizes asked by at least [`COMMON_SHARE`] of the pods of `jobs`, each weighted by its
/// share among those pods (the weights sum to 1).
pub fn common_sizes<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> Vec<(usize, f64)> {
    let mut by_size: BTreeMap<usize, u64> = BTreeMap::new();
    for j in jobs.into_iter().filter(|j| !j.shares_devices()) {
        *by_size.entry(j.devices as usize).or_default() += u64::from(j.pods);
    }
    let total: u64 = by_size.values().sum();
    let common: Vec<(usize, u64)> = by_size
        .into_iter()
        .filter(|(_, n)| *n as f64 >= COMMON_SHARE * total as f64)
        .collect();
    let sum: u64 = common.iter().map(|(_, n)| n).sum();
    common
        .into_iter()
        .map(|(k, n)| (k, n as f64 / sum.max(1) as f64))
        .collect()
}

/// Where one pod went.
#[derive(Clone, Debug, PartialEq)]
pub struct PodPlacement {
    pub node: String,
    pub super_node: String,
    /// Device indices on the node, ascending; for shares, the device of each share.
    pub devices: Vec<usize>,
    /// The devices' link quality `Q` equals the best any `k` devices of an empty node of this
    /// shape have (`SelectContext::ideal_quality(k)`); false for shares.
    pub ideal: bool,
}

/// What happened to one job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobOutcome {
    /// When it started (all pods placed); `None` when it never could.
    pub start: Option<u64>,
    pub pods: Vec<PodPlacement>,
}

/// One policy's run over the trace.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub policy: Policy,
    /// By job, in trace order.
    pub jobs: Vec<JobOutcome>,
    /// `(t, stranded devices)` after each event time's pass: a step function.
    pub stranded: Vec<(u64, f64)>,
    /// Time of the last event.
    pub end: u64,
    /// What defragmentation moves cost (`fumarole-defrag` only; zero otherwise).
    pub defrag: defrag::DefragStats,
}

/// Stranded devices of the cluster now: over the common pod sizes `k` with weight `p_k`
/// ([`common_sizes`]), the sum of `p_k ·` (free devices of every node that cannot give `k` of
/// its free devices with ideal interconnect: `Q` of the best `k` free devices, from
/// `topology::select`, below `Q_ideal(k)` of the node, or fewer than `k` free). It is the
/// expected number of free devices sitting on nodes that cannot take the next pod when that
/// pod's size is drawn from the trace's common sizes. Idle nodes strand nothing; a node with 3
/// free GPUs strands all 3 for an 8-GPU pod, none for a 2-GPU pod.
pub fn stranded(c: &Cluster, resource: &str, common: &[(usize, f64)]) -> f64 {
    let mut s = 0.0;
    for nv in c.view.nodes() {
        let free = c.free_mask(nv, resource);
        let n = free.count_ones() as usize;
        if n == 0 {
            continue;
        }
        for &(k, p) in common {
            if !nv.ideal_fit(free, k) {
                s += p * n as f64;
            }
        }
    }
    s
}

/// Runs `policy` over the whole trace (see the module doc).
pub fn run(sim: &Simulation, policy: Policy, opts: &Options) -> Outcome {
    let mut e = Engine {
        sim,
        policy,
        opts,
        ledger: if opts.settings.keep_waiting_reservations {
            Ledger::keeping_waiting_plans()
        } else {
            Ledger::default()
        },
        rng: ChaCha8Rng::seed_from_u64(opts.seed),
        base: Instant::now(),
        free_total: sim.cluster.capacity(),
    };
    let n = sim.jobs.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&j| sim.jobs[j].job.arrival);
    let mut arrivals = order.into_iter().peekable();
    let mut running: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut queue: Vec<usize> = Vec::new();
    let mut jobs = vec![JobOutcome::default(); n];
    let mut series = Vec::new();
    let mut end = 0;
    // Each started job's end; a defragmentation restart moves it (older heap entries are void).
    let mut ends = vec![0u64; n];
    let mut defrag_stats = defrag::DefragStats::default();
    loop {
        let next_arrival = arrivals.peek().map(|&j| sim.jobs[j].job.arrival);
        let next_done = running.peek().map(|Reverse((t, _))| *t);
        let Some(t) = [next_arrival, next_done].into_iter().flatten().min() else {
            break;
        };
        let now = e.at(t);
        let mut freed = false;
        while let Some(&Reverse((done, j))) = running.peek() {
            if done != t {
                break;
            }
            running.pop();
            if ends[j] != done {
                continue;
            }
            e.release_job(j);
            freed = true;
        }
        let mut new = Vec::new();
        while let Some(&j) = arrivals.peek() {
            if sim.jobs[j].job.arrival != t {
                break;
            }
            arrivals.next();
            queue.push(j);
            new.push(j);
        }
        if policy.is_fumarole() {
            e.keep_reservations(&queue, now);
        }
        let tries = if freed { queue.clone() } else { new };
        let mut started = Vec::new();
        for j in tries {
            if let Some(pods) = e.try_place(j, now) {
                jobs[j] = JobOutcome {
                    start: Some(t),
                    pods,
                };
                ends[j] = t.saturating_add(sim.jobs[j].job.duration);
                running.push(Reverse((ends[j], j)));
                started.push(j);
            }
        }
        if !started.is_empty() {
            queue.retain(|j| !started.contains(j));
        }
        if freed && policy == Policy::FumaroleDefrag {
            let state = defrag::RunState {
                queue: &mut queue,
                jobs: &mut jobs,
                ends: &mut ends,
                running: &mut running,
                stats: &mut defrag_stats,
            };
            defrag::at_completion(&mut e, state, t, now);
        }
        let value = stranded(
            &Cluster::new(&sim.cluster.view, &e.ledger, now),
            &sim.cluster.resource,
            &sim.common,
        );
        series.push((t, value));
        end = t;
    }
    Outcome {
        policy,
        jobs,
        stranded: series,
        end,
        defrag: defrag_stats,
    }
}

/// [`run`] for each of `policies`, in order.
pub fn compare(sim: &Simulation, policies: &[Policy], opts: &Options) -> Vec<Outcome> {
    policies
        .iter()
        .map(|&p| {
            let started = Instant::now();
            let out = run(sim, p, opts);
            tracing::info!(policy = %p, seconds = started.elapsed().as_secs_f64(), "simulated");
            out
        })
        .collect()
}

/// The running state of one policy's run.
struct Engine<'a> {
    sim: &'a Simulation,
    policy: Policy,
    opts: &'a Options,
    ledger: Ledger,
    rng: ChaCha8Rng,
    base: Instant,
    /// Free devices in the cluster (kept as pods are committed and released).
    free_total: usize,
}

impl<'a> Engine<'a> {
    fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_secs(t)
    }

    /// Releases the devices of job `j`'s pods.
    fn release_job(&mut self, j: usize) {
        for req in &self.sim.jobs[j].pods {
            if let Some(c) = self.ledger.release(&req.devices.pod)
                && !c.share
            {
                self.free_total += c.devices.len();
            }
        }
    }

    /// Renews the reservations of the waiting units (their pods are retried all along), then
    /// drops expired ones.
    fn keep_reservations(&mut self, queue: &[usize], now: Instant) {
        let until = now + self.opts.settings.reservation_ttl;
        for &j in queue {
            for req in &self.sim.jobs[j].pods {
                if let Some(g) = &req.unit {
                    self.ledger.renew_plan(&g.key, until);
                }
            }
        }
        // Commits live as long as their job runs: nothing in the view ever replaces them.
        self.ledger
            .prune(&self.sim.cluster.view, now, Duration::MAX);
    }

    /// Places every pod of job `j` or none; the placements, rank order.
    fn try_place(&mut self, j: usize, now: Instant) -> Option<Vec<PodPlacement>> {
        let sim: &'a Simulation = self.sim;
        let sj = &sim.jobs[j];
        let need = sj.job.pods as usize * sj.job.devices as usize;
        if need > self.free_total {
            return None;
        }
        // The super-node policies choose for the whole job at once (a unit or part goes whole).
        let mut planned = if self.policy.honours_super_nodes() {
            Some(self.super_node_plan(j, now)?.into_iter())
        } else {
            None
        };
        let mut placed: Vec<PodPlacement> = Vec::with_capacity(sj.pods.len());
        for req in &sj.pods {
            let choice = match (&mut planned, self.policy) {
                (Some(plan), _) => plan.next(),
                (None, Policy::Fumarole | Policy::FumaroleDefrag)
                    if !(self.opts.spread_shares
                        && req.devices.resource != sim.cluster.resource) =>
                {
                    self.fumarole_pod(req, now)
                }
                (None, _) => self.baseline_pod(req, now),
            };
            let Some((nv, devices)) = choice else {
                for r in &sj.pods[..placed.len()] {
                    self.ledger.release(&r.devices.pod);
                }
                if !sj.job.shares_devices() {
                    self.free_total += placed.iter().map(|p| p.devices.len()).sum::<usize>();
                }
                return None;
            };
            let share = nv.offers_shares(&req.devices.resource);
            let ctx = &nv.select.context;
            let ideal =
                !share && ctx.quality(&devices) >= ctx.ideal_quality(devices.len()).unwrap_or(0);
            self.ledger.commit(
                &req.devices.pod,
                Commit {
                    node: nv.name.clone(),
                    resource: req.devices.resource.clone(),
                    devices: nv.ids_of(&devices),
                    unit: req.unit.as_ref().map(|g| (g.key.clone(), g.gpus)),
                    at: now,
                    share,
                },
            );
            if let Some(g) = &req.unit {
                self.ledger
                    .renew_plan(&g.key, now + self.opts.settings.reservation_ttl);
            }
            if !share {
                self.free_total = self.free_total.saturating_sub(devices.len());
            }
            placed.push(PodPlacement {
                node: nv.name.clone(),
                super_node: nv.group().to_string(),
                devices,
                ideal,
            });
        }
        // Placed whole: in the service the view now shows the unit's pods bound, and the next
        // prune drops its plan; the simulated view never changes, so drop it here.
        for req in &sj.pods {
            if let Some(g) = &req.unit {
                self.ledger.drop_plan(&g.key);
            }
        }
        Some(placed)
    }

    /// The service's decision for one pod: plan its unit, judge every node, take the best.
    fn fumarole_pod(
        &mut self,
        req: &PodRequest,
        now: Instant,
    ) -> Option<(&'a NodeView, Vec<usize>)> {
        let sim: &'a Simulation = self.sim;
        let view = &sim.cluster.view;
        // Traces carry no sp-block jobs: Huawei's parameters stay off. Plans may lapse: the
        // simulator places a gang's pods one after the other and commits each, so the
        // scheduler tells the service where every pod went.
        let inputs = PlanInputs::new(now, self.opts.settings.reservation_ttl);
        let planned = decide::plan(view, &mut self.ledger, req, inputs).ok()?;
        let mut verdicts = decide::judge(
            Cluster::new(view, &self.ledger, now),
            &self.opts.settings.scorer,
            req,
            planned.as_deref(),
            view.nodes().map(|n| n.name.as_str()),
        );
        best_first(&mut verdicts);
        let best = verdicts.into_iter().next().filter(|v| v.feasible())?;
        let devices = best.selection.as_ref()?.devices.clone();
        Some((view.node(&best.node)?, devices))
    }

    /// A baseline's node and devices for one pod (see [`policy`]).
    fn baseline_pod(
        &mut self,
        req: &PodRequest,
        now: Instant,
    ) -> Option<(&'a NodeView, Vec<usize>)> {
        let sim: &'a Simulation = self.sim;
        let view = &sim.cluster.view;
        let c = Cluster::new(view, &self.ledger, now);
        let k = req.devices.count;
        let resource = req.devices.resource.as_str();
        if resource != sim.cluster.resource {
            return spread_shares(&c, view, req);
        }
        let fits: Vec<(&NodeView, u64)> = view
            .nodes()
            .map(|nv| (nv, c.free_mask(nv, resource)))
            .filter(|(_, free)| free.count_ones() as usize >= k)
            .collect();
        let count = |free: &u64| free.count_ones();
        // fumarole, volcano-hard and first-fit never get here (they decide elsewhere); listed
        // so that a new policy has to choose its arm.
        let (nv, free) = match self.policy {
            Policy::Binpack
            | Policy::Nvidia
            | Policy::Fumarole
            | Policy::FumaroleDefrag
            | Policy::VolcanoHard
            | Policy::FirstFit => fits.iter().min_by_key(|(_, f)| count(f)).copied()?,
            // max_by_key keeps the last of equal keys; reversed, the first by name.
            Policy::Spread => fits.iter().rev().max_by_key(|(_, f)| count(f)).copied()?,
            Policy::Random => {
                if fits.is_empty() {
                    return None;
                }
                let i = self.rng.random_range(0..fits.len());
                fits.get(i).copied()?
            }
        };
        let devices = if self.policy == Policy::Nvidia {
            let d = nvidia_baseline(&sim.cluster.nvidia_scores, &indices(free), &[], k);
            (d.len() == k).then_some(d)?
        } else {
            policy::lowest(free, k)?
        };
        Some((nv, devices))
    }

    /// Nodes and devices for every pod of job `j` (rank order) under `volcano-hard` or
    /// `first-fit`, or `None` when one of its units (parts) fits in no single super-node now.
    /// Pods without a group are parts of their own with no super-node rule.
    fn super_node_plan(&self, j: usize, now: Instant) -> Option<Vec<(&'a NodeView, Vec<usize>)>> {
        let sim: &'a Simulation = self.sim;
        let view = &sim.cluster.view;
        let c = Cluster::new(view, &self.ledger, now);
        let resource = sim.cluster.resource.as_str();
        let mut free: Vec<(&'a NodeView, u64)> = view
            .nodes()
            .map(|nv| (nv, c.free_mask(nv, resource)))
            .collect();
        let pods = &sim.jobs[j].pods;
        let mut out: Vec<Option<(&'a NodeView, Vec<usize>)>> = vec![None; pods.len()];
        for (constrained, part) in parts(pods, self.policy) {
            let mut candidates: Vec<Option<&str>> = if constrained {
                view.super_nodes()
                    .keys()
                    .map(|s| Some(s.as_str()))
                    .collect()
            } else {
                vec![None]
            };
            if self.policy == Policy::VolcanoHard {
                // Binpack among HyperNodes: the fullest first (stable: ties stay by name).
                candidates.sort_by_key(|sn| {
                    free.iter()
                        .filter(|(nv, _)| sn.is_none_or(|s| nv.group() == s))
                        .map(|(_, f)| f.count_ones())
                        .sum::<u32>()
                });
            }
            let placed = candidates.into_iter().find_map(|sn| {
                let mut trial = free.clone();
                let mut got = Vec::with_capacity(part.len());
                for &i in &part {
                    let k = pods[i].devices.count;
                    let mut fits = trial.iter_mut().filter(|(nv, f)| {
                        f.count_ones() as usize >= k && sn.is_none_or(|s| nv.group() == s)
                    });
                    let slot = if self.policy == Policy::VolcanoHard {
                        fits.min_by_key(|(_, f)| f.count_ones())
                    } else {
                        fits.next()
                    }?;
                    // The device plugin picks the devices, as under `nvidia`, so the two
                    // differ from it only in the super-node rule.
                    let devices =
                        nvidia_baseline(&sim.cluster.nvidia_scores, &indices(slot.1), &[], k);
                    if devices.len() != k {
                        return None;
                    }
                    for &d in &devices {
                        slot.1 &= !(1u64 << d);
                    }
                    got.push((i, (slot.0, devices)));
                }
                Some((trial, got))
            })?;
            free = placed.0;
            for (i, choice) in placed.1 {
                out[i] = Some(choice);
            }
        }
        out.into_iter().collect()
    }
}

/// Shares for `req` as the baselines place them: on the node with the most free shares
/// (kube-scheduler's default, least allocated), from the devices with the most free (NVIDIA's
/// device plugin's default, `distributed`); `None` when no node has them.
fn spread_shares<'a>(
    c: &Cluster<'_>,
    view: &'a ClusterView,
    req: &PodRequest,
) -> Option<(&'a NodeView, Vec<usize>)> {
    let resource = req.devices.resource.as_str();
    let free_of = |nv: &NodeView| -> Vec<(usize, u32)> {
        c.free_shares(nv, resource)
            .into_iter()
            .map(|(device, free, _)| (device, free))
            .collect()
    };
    let total = |free: &[(usize, u32)]| free.iter().map(|(_, f)| *f as usize).sum::<usize>();
    // The most free, the first by name of equals.
    let (nv, mut free) = view
        .nodes()
        .map(|nv| (nv, free_of(nv)))
        .filter(|(_, free)| total(free) >= req.devices.count)
        .fold(
            None,
            |best: Option<(&NodeView, Vec<(usize, u32)>)>, x| match best {
                Some(b) if total(&b.1) >= total(&x.1) => Some(b),
                _ => Some(x),
            },
        )?;
    let mut devices = Vec::with_capacity(req.devices.count);
    for _ in 0..req.devices.count {
        // The device with the most free replicas, the first of equals.
        let at = (0..free.len()).fold(None, |best: Option<usize>, i| match best {
            Some(b) if free[b].1 >= free[i].1 => Some(b),
            _ => Some(i),
        })?;
        free[at].1 = free[at].1.checked_sub(1)?;
        devices.push(free[at].0);
    }
    Some((nv, devices))
}

/// The pods of a job as the parts `policy` keeps whole (by first rank), each with whether it
/// must share one super-node: `volcano-hard` the gpu-group-size units, `first-fit` the atomic
/// parts; a pod without a group is its own part, unconstrained.
fn parts(pods: &[PodRequest], policy: Policy) -> Vec<(bool, Vec<usize>)> {
    let mut keyed: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    let mut out: Vec<(bool, Vec<usize>)> = Vec::new();
    for (i, req) in pods.iter().enumerate() {
        let Some(g) = &req.unit else {
            out.push((false, vec![i]));
            continue;
        };
        let key = match policy {
            Policy::FirstFit => (g.spec.unit, g.spec.atomic_unit),
            _ => (g.spec.unit, 0),
        };
        match keyed.get(&key) {
            Some(&at) => out[at].1.push(i),
            None => {
                keyed.insert(key, out.len());
                out.push((true, vec![i]));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
