#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Small clusters and traces whose right answers are known by hand.

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
