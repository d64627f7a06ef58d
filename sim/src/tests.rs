#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Small clusters and traces whose right answers are known by hand.

use std::collections::BTreeSet;

use super::report::Metrics;
use super::shape::ClusterShape;
use super::*;

fn sim(shape: &str, trace: &str) -> Simulation {
    let cluster = shape.parse::<ClusterShape>().unwrap().build().unwrap();
    Simulation::load(cluster, trace, "test.jsonl").unwrap()
}

fn job(name: &str, arrival: u64, duration: u64, pods: u32, devices: u32) -> String {
    format!(
        r#"{{"job":"{name}","arrival":{arrival},"duration":{duration},"pods":{pods},"devices":{devices}}}"#
    )
}

fn grouped(name: &str, arrival: u64, pods: u32, devices: u32, group: u32, atomic: u32) -> String {
    format!(
        r#"{{"job":"{name}","arrival":{arrival},"duration":100,"pods":{pods},"devices":{devices},"gpu-group-size":{group},"atomic-gpu-group-size":{atomic}}}"#
    )
}

fn metrics(s: &Simulation, p: Policy) -> (Outcome, Metrics) {
    let out = run(s, p, &Options::default());
    let m = Metrics::of(s, &out);
    (out, m)
}

/// One Ascend 910 node (HCCS groups 0-3 and 4-7): a 1-NPU pod, then a 4-NPU pod. Lowest
/// indices give the second pod 1-4, across the groups; fumarole's select gives it the whole
/// idle group 4-7.
#[test]
fn fumarole_keeps_hccs_groups_whole_where_binpack_breaks_them() {
    let trace = [job("one", 0, 1000, 1, 1), job("four", 10, 1000, 1, 4)].join("\n");
    let s = sim("1xatlas-800-910", &trace);
    let (fo, fm) = metrics(&s, Policy::Fumarole);
    assert_eq!(fo.jobs[1].pods[0].devices, [4, 5, 6, 7]);
    assert!(fo.jobs[1].pods[0].ideal);
    assert_eq!((fm.ideal_jobs, fm.placed), (2, 2));
    let (bo, bm) = metrics(&s, Policy::Binpack);
    assert_eq!(bo.jobs[0].pods[0].devices, [0]);
    assert_eq!(bo.jobs[1].pods[0].devices, [1, 2, 3, 4]);
    assert!(!bo.jobs[1].pods[0].ideal);
    assert_eq!((bm.ideal_jobs, bm.ideal_pods, bm.pods), (1, 1, 2));
    // Both start on arrival.
    assert_eq!(bo.jobs[1].start, Some(10));
    assert_eq!(bm.delay_max, 0.0);
}

/// Two super-nodes of two DGX nodes. A whole-node job lands on node-000 (sn-0), then a
/// 2-node unit arrives: binpack takes node-001 (sn-0) and node-002 (sn-1), fumarole plans the
/// unit into sn-1, the super-node that holds it whole.
#[test]
fn fumarole_keeps_a_unit_in_one_super_node_where_binpack_splits_it() {
    let trace = [job("solo", 0, 1000, 1, 8), grouped("pair", 5, 2, 8, 16, 8)].join("\n");
    let s = sim("4xdgx-h100:2", &trace);
    let (bo, bm) = metrics(&s, Policy::Binpack);
    let nodes: Vec<&str> = bo.jobs[1].pods.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(nodes, ["node-001", "node-002"]);
    assert_eq!((bm.units, bm.units_split, bm.ideal_jobs), (1, 1, 1));
    // Its atomic parts are single pods: nothing to split there.
    assert_eq!((bm.atomic_parts, bm.atomic_split), (0, 0));
    let (fo, fm) = metrics(&s, Policy::Fumarole);
    assert_eq!(fo.jobs[0].pods[0].node, "node-000");
    let sns: Vec<&str> = fo.jobs[1]
        .pods
        .iter()
        .map(|p| p.super_node.as_str())
        .collect();
    assert_eq!(sns, ["sn-1", "sn-1"]);
    assert_eq!((fm.units, fm.units_split, fm.ideal_jobs), (1, 0, 2));
    // Without the group annotation fumarole packs the pair as binpack does.
    let plain = s.clone().without_groups();
    let (po, pm) = metrics(&plain, Policy::Fumarole);
    let nodes: Vec<&str> = po.jobs[1].pods.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(nodes, ["node-001", "node-002"]);
    assert_eq!(pm.units, 0);
    assert!(plain.trace_name.ends_with("(without gpu-group-size)"));
    // Spread puts the second unit's pods on the emptiest nodes, first by name.
    let (so, _) = metrics(&s, Policy::Spread);
    assert_eq!(so.jobs[1].pods[0].node, "node-001");
}

/// A unit whose atomic part needs two nodes in one super-node, on super-nodes of one node:
/// fumarole never places it (and says so in the report) while later jobs go ahead; binpack,
/// which ignores super-nodes, places it split. A gang larger than the cluster never starts,
/// and what its first pods got is given back.
#[test]
fn units_that_never_fit_stay_queued_and_gangs_are_all_or_nothing() {
    let trace = [
        grouped("atomic", 0, 2, 8, 16, 16),
        job("huge", 1, 100, 3, 8),
        job("later", 2, 100, 1, 8),
    ]
    .join("\n");
    let s = sim("2xdgx-h100:2", &trace);
    let (fo, fm) = metrics(&s, Policy::Fumarole);
    assert_eq!(fo.jobs[0].start, None);
    assert_eq!(fo.jobs[1].start, None);
    assert_eq!(fo.jobs[2].start, Some(2));
    assert_eq!((fm.placed, fm.never_placed), (1, 2));
    let (bo, bm) = metrics(&s, Policy::Binpack);
    assert_eq!(bo.jobs[0].start, Some(0));
    assert_eq!(bm.units_split, 1);
    assert_eq!((bm.atomic_parts, bm.atomic_split), (1, 1));
    assert_eq!(fm.atomic_parts, 0);
    // "huge" never fits 2 nodes; "later" waits for "atomic" to end at 100, not for "huge".
    assert_eq!(bo.jobs[1].start, None);
    assert_eq!(bo.jobs[2].start, Some(100));
    assert_eq!(bm.never_placed, 1);
    assert_eq!(bm.delay_max, 98.0);
}

#[test]
fn nvidia_and_random_choose_as_documented_and_random_is_seeded() {
    // Two Ascend nodes; 1-NPU pods: the NVIDIA search and lowest-index both take NPU 0 of the
    // fullest node that fits (binpack), so the second pod goes next to the first.
    let trace = [job("a", 0, 1000, 1, 1), job("b", 1, 1000, 1, 1)].join("\n");
    let s = sim("2xatlas-800-910", &trace);
    let (no, _) = metrics(&s, Policy::Nvidia);
    assert_eq!(no.jobs[0].pods[0].node, "node-000");
    assert_eq!(no.jobs[1].pods[0].node, "node-000");
    assert_eq!(no.jobs[1].pods[0].devices.len(), 1);
    let (so, _) = metrics(&s, Policy::Spread);
    assert_eq!(so.jobs[1].pods[0].node, "node-001");
    let many: Vec<String> = (0..40).map(|i| job(&format!("r{i}"), i, 5, 1, 1)).collect();
    let s = sim("8xdgx-h100", &many.join("\n"));
    let r1 = run(&s, Policy::Random, &Options::default());
    let r2 = run(&s, Policy::Random, &Options::default());
    assert_eq!(r1.jobs, r2.jobs);
    let other = Options {
        seed: 2,
        ..Options::default()
    };
    assert_ne!(r1.jobs, run(&s, Policy::Random, &other).jobs);
}

#[test]
fn stranded_counts_free_devices_that_cannot_take_a_common_size_ideally() {
    let s = sim("1xatlas-800-910", &job("x", 0, 1, 1, 4));
    let view = &s.cluster.view;
    let nv = view.node("node-000").unwrap();
    let mut ledger = Ledger::default();
    let now = Instant::now();
    let take = |ledger: &mut Ledger, ids: &[usize]| {
        ledger.commit(
            "sim/x-0",
            Commit {
                node: "node-000".into(),
                resource: s.cluster.resource.clone(),
                devices: nv.ids_of(ids),
                unit: None,
                at: now,
                share: false,
            },
        );
    };
    let common = [(4, 1.0)];
    // Free 4-7: one whole HCCS group, nothing stranded.
    take(&mut ledger, &[0, 1, 2, 3]);
    let c = Cluster::new(view, &ledger, now);
    assert_eq!(stranded(&c, &s.cluster.resource, &common), 0.0);
    // Free 2, 3, 6, 7: four NPUs, but no 4 of them in one group: all 4 stranded for size 4,
    // none for size 2 (weights 1/2 each: 2 stranded).
    take(&mut ledger, &[0, 1, 4, 5]);
    let c = Cluster::new(view, &ledger, now);
    assert_eq!(stranded(&c, &s.cluster.resource, &common), 4.0);
    assert_eq!(
        stranded(&c, &s.cluster.resource, &[(2, 0.5), (4, 0.5)]),
        2.0
    );
    assert_eq!(common_sizes(s.jobs.iter().map(|j| &j.job)), [(4, 1.0)]);
}

#[test]
fn pods_larger_than_a_node_are_refused_with_the_line() {
    let cluster = "2xatlas-800-910"
        .parse::<ClusterShape>()
        .unwrap()
        .build()
        .unwrap();
    let e = Simulation::load(cluster, &format!("\n{}", job("big", 0, 1, 1, 16)), "t")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "t line 2: job \"big\": 16 devices per pod, but a atlas-800-910 node has 8"
    );
}

/// A unit placed whole gives up its super-node reservation at once (the service drops a plan
/// when its view shows all the unit's pods bound), so the job behind it starts when the unit's
/// devices come back, as under binpack, not when the reservation would have lapsed (300 s).
#[test]
fn a_placed_unit_keeps_no_reservation() {
    let trace = [
        r#"{"job":"u","arrival":0,"duration":100,"pods":2,"devices":8,"gpu-group-size":16}"#
            .to_string(),
        job("w", 50, 10, 1, 8),
    ]
    .join("\n");
    let s = sim("2xdgx-h100", &trace);
    let (fo, fm) = metrics(&s, Policy::Fumarole);
    assert_eq!(fo.jobs[0].start, Some(0));
    assert_eq!(fo.jobs[1].start, Some(100));
    assert_eq!(fm.never_placed, 0);
    // Binpack has no reservations: the job starts when the unit ends.
    let (bo, _) = metrics(&s, Policy::Binpack);
    assert_eq!(bo.jobs[1].start, Some(100));
}

/// The same start as above (a whole-node job on node-000 in sn-0, then a 2-node unit with
/// single-node atomic parts): `volcano-hard` keeps the unit in one super-node (sn-1, the only
/// one with room for both pods), `first-fit` puts each atomic part in the first super-node
/// with room, so the unit splits (allowed: only its atomic parts must stay whole). A unit
/// that fits in no super-node waits under both, where binpack splits it.
#[test]
fn volcano_hard_keeps_units_and_first_fit_keeps_atomic_parts() {
    let trace = [job("solo", 0, 1000, 1, 8), grouped("pair", 5, 2, 8, 16, 8)].join("\n");
    let s = sim("4xdgx-h100:2", &trace);
    let (vo, vm) = metrics(&s, Policy::VolcanoHard);
    let nodes: Vec<&str> = vo.jobs[1].pods.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(nodes, ["node-002", "node-003"]);
    assert_eq!((vm.units, vm.units_split, vm.ideal_jobs), (1, 0, 2));
    let (fo, fm) = metrics(&s, Policy::FirstFit);
    let nodes: Vec<&str> = fo.jobs[1].pods.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(nodes, ["node-001", "node-002"]);
    assert_eq!((fm.units_split, fm.atomic_split), (1, 0));

    // Atomic part of 2 nodes, super-nodes of 1: neither places it; the later job goes ahead.
    let trace = [
        grouped("atomic", 0, 2, 8, 16, 16),
        job("later", 2, 100, 1, 8),
    ]
    .join("\n");
    let s = sim("2xdgx-h100:2", &trace);
    for p in [Policy::VolcanoHard, Policy::FirstFit] {
        let (o, m) = metrics(&s, p);
        assert_eq!(o.jobs[0].start, None, "{p}");
        assert_eq!(o.jobs[1].start, Some(2), "{p}");
        assert_eq!((m.placed, m.never_placed), (1, 1), "{p}");
    }
}

/// The super-nodes each unit (by `unit`) or atomic part (by `(unit, atomic)`) of every placed
/// job landed in, read from the outcome itself rather than from the report.
fn super_nodes_per_part(s: &Simulation, o: &Outcome, atomic: bool) -> Vec<BTreeSet<String>> {
    let mut out = Vec::new();
    for (sj, jo) in s.jobs.iter().zip(&o.jobs) {
        let mut parts: BTreeMap<(u32, u32), BTreeSet<String>> = BTreeMap::new();
        for (req, p) in sj.pods.iter().zip(&jo.pods) {
            if let Some(g) = &req.unit {
                let key = (g.spec.unit, if atomic { g.spec.atomic_unit } else { 0 });
                parts.entry(key).or_default().insert(p.super_node.clone());
            }
        }
        out.extend(parts.into_values());
    }
    out
}

/// On a generated trace with multi-node units and atomic pairs, under load: `volcano-hard`
/// never spreads a unit over two super-nodes and `first-fit` never an atomic part, while
/// binpack does both (so the trace can tell).
#[test]
fn the_rule_honouring_baselines_never_split_what_they_keep_whole() {
    let cluster: ClusterShape = "16xdgx-h100:4".parse().unwrap();
    let built = cluster.build().unwrap();
    let spec = trace::GenSpec {
        seed: 11,
        jobs: 300,
        load: 1.0,
        capacity: built.capacity(),
        devices_per_node: 8,
        super_node_size: 4,
    };
    let text = trace::write(&trace::generate(&spec), &[]);
    let s = Simulation::load(built, &text, "gen").unwrap();
    let split = |o: &Outcome, atomic: bool| {
        super_nodes_per_part(&s, o, atomic)
            .iter()
            .filter(|sns| sns.len() > 1)
            .count()
    };
    let v = run(&s, Policy::VolcanoHard, &Options::default());
    let f = run(&s, Policy::FirstFit, &Options::default());
    let b = run(&s, Policy::Binpack, &Options::default());
    assert_eq!(split(&v, false), 0);
    assert_eq!(split(&v, true), 0);
    assert_eq!(split(&f, true), 0);
    assert!(split(&b, true) > 0);
    for o in [&v, &f] {
        let m = Metrics::of(&s, o);
        assert_eq!(m.atomic_split, 0);
        assert!(m.atomic_parts > 0);
        assert_eq!(m.placed, 300);
        // Gangs stay whole: every placed job has all its pods.
        for (sj, jo) in s.jobs.iter().zip(&o.jobs) {
            assert_eq!(jo.pods.len(), sj.pods.len());
        }
    }
    assert_eq!(Metrics::of(&s, &v).units_split, 0);
}

/// `sweep` at its smallest: two tiny traces, every policy; the figures are there and agree
/// with each other, and no policy that honours the rules breaks an atomic part.
#[test]
fn a_tiny_sweep_has_every_policy_and_consistent_figures() {
    let spec = sweep::SweepSpec {
        clusters: vec![
            "8xdgx-h100:2".parse().unwrap(),
            "8xatlas-800-910:2".parse().unwrap(),
        ],
        loads: vec![1.0],
        first_seed: 101,
        seeds: 1,
        jobs: 40,
    };
    let mut heard = 0;
    let runs = sweep::run(&spec, &Policy::ALL, &Options::default(), |_, n, _| {
        heard += 1;
        assert_eq!(n, 2);
    })
    .unwrap();
    assert_eq!((runs.len(), heard), (2, 2));
    for r in &runs {
        let ps: Vec<Policy> = r.metrics.iter().map(|m| m.policy).collect();
        assert_eq!(ps, Policy::ALL);
        for m in &r.metrics {
            assert_eq!(m.jobs, 40);
            assert_eq!(m.placed + m.never_placed, 40);
            assert!(m.ideal_jobs <= m.placed && m.ideal_pods <= m.pods);
            assert!(m.units_split <= m.units && m.atomic_split <= m.atomic_parts);
            assert!((0.0..=1.0).contains(&m.utilisation), "{}", m.utilisation);
            assert!(m.delay_mean <= m.delay_p95.max(m.delay_max));
            assert!(m.delay_p95 <= m.delay_max);
            if m.policy.is_fumarole() || matches!(m.policy, Policy::VolcanoHard | Policy::FirstFit)
            {
                assert_eq!(m.atomic_split, 0, "{}", m.policy);
            }
        }
    }
    let md = sweep::markdown(&spec, &runs);
    for p in Policy::ALL {
        assert!(md.contains(&format!("| {p} |")), "{p}");
    }
    for f in &sweep::FIGURES {
        assert!(md.contains(f.name), "{}", f.name);
    }
    assert!(md.contains("| dgx-h100-8 load 1 seed 101 |"), "{md}");
    assert!(md.contains("Targets for fumarole"));
    assert!(md.contains("atomic parts broken (target 0): 0 of"));
}

/// Two super-nodes of two DGX nodes (sn-0: node-000, node-001; sn-1: node-002, node-003).
/// fumarole puts the 1-GPU job and the 7-GPU job together on node-000, w1 on node-001, w2 on
/// node-002; a 2-node unit that must share a super-node arrives and waits. When w1 ends,
/// `fumarole` leaves the unit waiting until the long jobs end; `fumarole-defrag` moves w2 to
/// node-001 (one move, where freeing sn-0 would take two), restarting it (100 s of 8 GPUs
/// lost; it ends 100 s later), and starts the unit at once in sn-1. With moves limited to jobs
/// that ran at most 60 s, nothing moves.
#[test]
fn defrag_moves_the_fewest_pods_and_starts_the_unit_at_the_completion() {
    let trace = [
        job("small", 0, 10_000, 1, 1),
        job("w1", 0, 100, 1, 8),
        job("w2", 0, 10_000, 1, 8),
        job("w3", 0, 10_000, 1, 7),
        grouped("pair", 1, 2, 8, 16, 16),
    ]
    .join("\n");
    let s = sim("4xdgx-h100:2", &trace);
    let (fo, fm) = metrics(&s, Policy::Fumarole);
    let nodes: Vec<&str> = fo.jobs[..4]
        .iter()
        .map(|j| j.pods[0].node.as_str())
        .collect();
    assert_eq!(nodes, ["node-000", "node-001", "node-002", "node-000"]);
    assert!(fo.jobs[4].start.unwrap() >= 10_000, "{:?}", fo.jobs[4]);
    assert_eq!(fo.defrag, defrag::DefragStats::default());
    assert_eq!(fm.defrag_moves, 0);
    let (o, m) = metrics(&s, Policy::FumaroleDefrag);
    assert_eq!(o.jobs[4].start, Some(100));
    let sns: BTreeSet<&str> = o.jobs[4]
        .pods
        .iter()
        .map(|p| p.super_node.as_str())
        .collect();
    assert_eq!(sns, BTreeSet::from(["sn-1"]));
    assert_eq!(o.jobs[2].pods[0].node, "node-001");
    assert!(o.jobs[2].pods[0].ideal);
    assert_eq!(o.jobs[0].pods[0].node, "node-000");
    assert_eq!(
        (o.defrag.applied, o.defrag.moves, o.defrag.restarted_jobs),
        (1, 1, 1)
    );
    assert_eq!(o.defrag.lost_device_seconds, 800.0);
    assert_eq!((m.defrag_moves, m.defrag_restarts), (1, 1));
    assert!((m.lost_device_hours - 800.0 / 3600.0).abs() < 1e-9);
    // The moved job restarted: it ends 100 s after the others.
    assert_eq!(o.end, 10_100);
    assert_eq!(m.atomic_split, 0);
    assert!(m.delay_max < fm.delay_max);
    let limited = Options {
        defrag_max_run: Duration::from_secs(60),
        ..Options::default()
    };
    let o = run(&s, Policy::FumaroleDefrag, &limited);
    assert_eq!(o.defrag, defrag::DefragStats::default());
    assert_eq!(o.jobs[4].start, fo.jobs[4].start);
}
