//! The `fumarole-defrag` policy's extra step: at a job completion, when the oldest waiting job
//! is large (a node's devices or more) and still waits after the pass, ask the scheduler
//! extension's defragmentation advisor ([`scheduler_ext::core::defrag`]) for the moves that
//! make room for it, and make them only when the job then starts.
//!
//! Each atomic part of the job (each pod, for a job without gpu-group-size) is advised in
//! turn, largest first, on the ledger as the earlier parts' moves left it, the room found for
//! an earlier part held while the next is advised. Every running pod may move (simulated jobs
//! have controllers); a pod of a unit stays in its super-node. When every part has room, the
//! job is placed by the policy's own path ([`super::Engine::try_place`]); when it still does
//! not start, nothing is moved.
//!
//! A moved pod restarts its job, from scratch (no checkpoint): the job's end moves to now plus
//! its duration, and the work it had done (device-seconds of all its pods since it last
//! started) is counted as lost ([`DefragStats`]). The job keeps its first start for the
//! queueing delay; its placements are updated to where its pods run afterwards.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::time::Instant;

use scheduler_ext::core::cluster::Cluster;
use scheduler_ext::core::defrag::{self, Running, Waiting};
use scheduler_ext::core::ledger::Commit;
use scheduler_ext::core::view::indices;

use super::{Engine, JobOutcome, PodPlacement};

/// What the moves cost over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct DefragStats {
    /// Completions at which moves were made (and the waiting job started).
    pub applied: usize,
    /// Pods moved.
    pub moves: usize,
    /// Jobs restarted by a move (a job counted once per completion).
    pub restarted_jobs: usize,
    /// Work lost by the restarts: devices x seconds the restarted jobs had run.
    pub lost_device_seconds: f64,
}

/// The running state [`at_completion`] updates.
pub(crate) struct RunState<'r> {
    pub queue: &'r mut Vec<usize>,
    pub jobs: &'r mut [JobOutcome],
    /// Each job's current end (a restart moves it).
    pub ends: &'r mut [u64],
    pub running: &'r mut BinaryHeap<Reverse<(u64, usize)>>,
    pub stats: &'r mut DefragStats,
}

/// Tries to start the oldest waiting job by moving running pods (see the module doc).
pub(crate) fn at_completion(e: &mut Engine, s: RunState, t: u64, now: Instant) {
    let sim = e.sim;
    let Some(&head) = s.queue.first() else {
        return;
    };
    let hj = &sim.jobs[head];
    if (hj.job.pods as usize) * (hj.job.devices as usize) < sim.cluster.devices_per_node {
        return;
    }
    let view = &sim.cluster.view;
    let resource = sim.cluster.resource.as_str();
    // Every pod of a running job, as the advisor sees it, and where it sits in the trace.
    let mut running: Vec<Running> = Vec::new();
    let mut at: HashMap<String, (usize, usize)> = HashMap::new();
    for (j, jo) in s.jobs.iter().enumerate() {
        if jo.start.is_none() || s.ends[j] <= t {
            continue;
        }
        let sj = &sim.jobs[j];
        for (i, req) in sj.pods.iter().enumerate() {
            let Some(commit) = e.ledger.commit_of(&req.devices.pod) else {
                continue;
            };
            let Some(nv) = view.node(&commit.node) else {
                continue;
            };
            running.push(Running {
                pod: req.devices.pod.clone(),
                job: sj.job.job.clone(),
                node: commit.node.clone(),
                resource: resource.to_string(),
                devices: nv.mask_of_ids(&commit.devices),
                job_pods: sj.job.pods,
                in_unit: req.unit.is_some(),
                pinned: limit_pin(e, sj.job.duration, s.ends[j], t),
            });
            at.insert(req.devices.pod.clone(), (j, i));
        }
    }
    let parts = waiting_parts(e, head, now);
    let saved = (e.ledger.clone(), e.free_total);
    let mut moves = Vec::new();
    let mut holds = Vec::new();
    for part in &parts {
        let advice = defrag::advise_unit(&Cluster::new(view, &e.ledger, now), &running, part);
        if advice.placement.is_empty() {
            (e.ledger, e.free_total) = saved;
            return;
        }
        for m in &advice.moves {
            let (Some(to), Some(r)) = (
                view.node(&m.to),
                running.iter_mut().find(|r| r.pod == m.pod),
            ) else {
                continue;
            };
            let Some(old) = e.ledger.release(&m.pod) else {
                continue;
            };
            e.ledger.commit(
                &m.pod,
                Commit {
                    node: m.to.clone(),
                    devices: m.to_devices.clone(),
                    at: now,
                    share: false,
                    ..old
                },
            );
            r.node = m.to.clone();
            r.devices = to.mask_of_ids(&m.to_devices);
            moves.push(m.clone());
        }
        // Hold the room found for this part while the next one is advised.
        for slot in &advice.placement {
            let Some(nv) = view.node(&slot.node) else {
                continue;
            };
            let name = format!("defrag-hold/{}", holds.len());
            e.ledger.commit(
                &name,
                Commit {
                    node: slot.node.clone(),
                    resource: resource.to_string(),
                    devices: nv.ids_of(&indices(slot.mask)),
                    unit: None,
                    at: now,
                    share: false,
                },
            );
            holds.push(name);
        }
    }
    for h in &holds {
        e.ledger.release(h);
    }
    if moves.is_empty() {
        // The job fits without moves, yet the pass left it waiting (another unit's
        // reservation, or its plan elsewhere): moving pods would not help it.
        (e.ledger, e.free_total) = saved;
        return;
    }
    let Some(pods) = e.try_place(head, now) else {
        (e.ledger, e.free_total) = saved;
        return;
    };
    // Committed: the head starts, the moved pods' jobs restart.
    s.jobs[head] = JobOutcome {
        start: Some(t),
        pods,
    };
    s.ends[head] = t.saturating_add(hj.job.duration);
    s.running.push(Reverse((s.ends[head], head)));
    s.queue.remove(0);
    let mut restarted: BTreeSet<usize> = BTreeSet::new();
    for m in &moves {
        let Some(&(j, i)) = at.get(&m.pod) else {
            continue;
        };
        if let (Some(nv), Some(p)) = (view.node(&m.to), s.jobs[j].pods.get_mut(i)) {
            let devices = indices(nv.mask_of_ids(&m.to_devices));
            let ctx = &nv.select.context;
            *p = PodPlacement {
                node: nv.name.clone(),
                super_node: nv.group().to_string(),
                ideal: ctx.quality(&devices) >= ctx.ideal_quality(devices.len()).unwrap_or(0),
                devices,
            };
        }
        restarted.insert(j);
    }
    for &j in &restarted {
        let job = &sim.jobs[j].job;
        let ran = t.saturating_sub(s.ends[j].saturating_sub(job.duration));
        s.stats.lost_device_seconds += ran as f64 * f64::from(job.pods) * f64::from(job.devices);
        s.ends[j] = t.saturating_add(job.duration);
        s.running.push(Reverse((s.ends[j], j)));
    }
    s.stats.applied += 1;
    s.stats.moves += moves.len();
    s.stats.restarted_jobs += restarted.len();
}

/// Why a job that has run since `ends - duration` may not move at `t`: it ran longer than
/// [`super::Options::defrag_max_run`] (its restart would throw that much away).
fn limit_pin(e: &Engine, duration: u64, end: u64, t: u64) -> Option<String> {
    let ran = t.saturating_sub(end.saturating_sub(duration));
    let max = e.opts.defrag_max_run.as_secs();
    (ran > max).then(|| format!("ran {ran} s, more than {max} s"))
}

/// The parts of job `j` the advisor makes room for, largest first: each atomic part of a unit
/// (in the super-node its reservation holds, if any), each pod without a unit.
fn waiting_parts(e: &Engine, j: usize, now: Instant) -> Vec<Waiting> {
    let sim = e.sim;
    let c = Cluster::new(&sim.cluster.view, &e.ledger, now);
    let mut parts = defrag::waiting_units(&c, &sim.jobs[j].pods);
    parts.sort_by(|a, b| {
        b.devices()
            .cmp(&a.devices())
            .then_with(|| a.name.cmp(&b.name))
    });
    parts
}
