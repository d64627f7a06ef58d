//! The decider's unit tests (with [`super::testing`]'s small clusters).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::testing::{decider, pod};
use super::*;
use crate::protocol::scale;
use fumarole_topology::crd::device_topology::SuperNodeInfo;

/// A unit's reservation keeps a newcomer off the reserved super-node when the service
/// chooses, but a pod the scheduler already bound there still gets its devices.
#[test]
fn a_bound_pod_gets_devices_whatever_the_reservations() {
    let svc = decider();
    // Unit job-0/1 of 16 GPUs (two pods of 8) reserves a whole super-node: rack-a.
    let unit = pod("job-0", 8, Some(16));
    let planned = svc.evaluate(&unit, &["a0", "a1"], Asker::Volcano).unwrap();
    assert!(planned[0].feasible(), "{planned:?}");
    let stranger = pod("stranger", 4, None);
    let refused = svc.commit(&stranger, "a0").unwrap_err();
    assert!(refused.to_string().contains("reserved for"), "{refused}");
    let c = svc.commit_bound(&stranger, "a0").unwrap().unwrap();
    assert_eq!(c.devices.len(), 4);
    // Only a node without the devices refuses a bound pod.
    let big = pod("big", 8, None);
    let e = svc.commit_bound(&big, "a0").unwrap_err();
    assert!(
        e.to_string().contains("needs 8 nvidia.com/gpu, 4 free"),
        "{e}"
    );
}

/// A unit's plan lapses when its super-node lost the room, but only where the scheduler
/// tells the service where it put the unit's pods: kube-scheduler (bind), Volcano while it
/// calls `allocateFunc`. Under Volcano v1.10 (no `allocateFunc`) the first pod may already
/// be allocated there without the service knowing, so the plan holds.
#[test]
fn plans_lapse_only_where_the_scheduler_reports_its_placements() {
    let unit = pod("job-0", 4, Some(8));
    let lost_room = || {
        let svc = decider();
        // Best fit: rack-b (b0's 8 GPUs are just enough).
        let v = svc.evaluate(&unit, &["a0", "b0"], Asker::Volcano).unwrap();
        assert!(!v[0].feasible() && v[1].feasible(), "{v:?}");
        // A pod bound outside the plans takes half of b0.
        svc.commit_bound(&pod("stranger", 4, None), "b0").unwrap();
        svc
    };
    let b0_passes =
        |svc: &Decider, asker| svc.evaluate(&unit, &["b0"], asker).unwrap()[0].feasible();
    // Volcano without allocateFunc: the plan holds (b0 still has the 4 the pod needs).
    let svc = lost_room();
    assert!(b0_passes(&svc, Asker::Volcano));
    // Volcano calling allocateFunc, and kube-scheduler: it lapses, the unit moves to rack-a.
    let svc = lost_room();
    svc.allocate_func_called();
    assert!(!b0_passes(&svc, Asker::Volcano));
    assert!(!b0_passes(&lost_room(), Asker::KubeScheduler));
    // --keep-waiting-reservations: it holds for everyone.
    let keeping = Decider::new(
        decider().view().as_ref().clone(),
        Settings {
            keep_waiting_reservations: true,
            ..Settings::default()
        },
    );
    assert!(
        keeping
            .evaluate(&unit, &["b0"], Asker::KubeScheduler)
            .unwrap()[0]
            .feasible()
    );
    keeping
        .commit_bound(&pod("stranger", 4, None), "b0")
        .unwrap();
    assert!(b0_passes(&keeping, Asker::KubeScheduler));
}

/// A unit's plan given up (kube-scheduler's other filters refused its super-node) is made
/// again on another super-node at the next judgement; once a pod of the sub-unit is committed
/// the plan stays (moving it would split the unit), and a pod of no unit has none to give up.
#[test]
fn a_given_up_plan_moves_the_unit_until_it_has_started() {
    let svc = decider();
    let unit = pod("job-0", 4, Some(8));
    let feasible = |svc: &Decider| -> Vec<bool> {
        svc.evaluate(&unit, &["a0", "b0"], Asker::KubeScheduler)
            .unwrap()
            .iter()
            .map(NodeVerdict::feasible)
            .collect()
    };
    // Planned among the two nodes kube-scheduler asks about: rack-a.
    assert_eq!(feasible(&svc), [true, false]);
    assert_eq!(svc.give_up_plan(&unit).unwrap().as_deref(), Some("rack-a"));
    assert_eq!(feasible(&svc), [false, true]);
    svc.commit(&unit, "b0").unwrap().unwrap();
    assert_eq!(svc.give_up_plan(&pod("job-1", 4, Some(8))).unwrap(), None);
    assert_eq!(feasible(&svc), [false, true]);
    assert_eq!(svc.give_up_plan(&pod("stranger", 4, None)).unwrap(), None);
}

/// A commit settles (is dropped) once the view shows its pod bound with its devices; a
/// commit made meanwhile must see either the commit or that view, never neither. Views
/// are replaced in another thread while pods are committed one after another; no device
/// may be chosen twice. (Each commit judged with the view it read before taking the
/// ledger gave some pod a device of the pod settled just then; e2e `scheduler_ext_ha`
/// under kube-scheduler showed it as the node giving that pod other devices.)
#[test]
fn commits_racing_view_replacements_never_choose_a_device_twice() {
    use fumarole_topology::annotation::{DEVICES_ANNOTATION, format};
    let bound = |name: &str, c: &Commit| -> Pod {
        let mut p = pod(name, 1, None);
        p.metadata.annotations = Some(BTreeMap::from([(
            DEVICES_ANNOTATION.to_string(),
            format(&c.choice()),
        )]));
        p.spec.as_mut().unwrap().node_name = Some(c.node.clone());
        p
    };
    let dts: Vec<_> = ["a0", "a1", "b0"]
        .into_iter()
        .map(|name| {
            fumarole_topology::crd::testing::nvlink_node(name, 8, 10, &[], |i| {
                format!("{name}-g{i}")
            })
        })
        .collect();
    for round in 0..300 {
        // Eight one-GPU pods on a0, each committed while the view that settles the one
        // before is being installed.
        let svc = std::sync::Arc::new(Decider::new(
            ClusterView::build(&dts, &[], &[], &[]).unwrap(),
            Settings::default(),
        ));
        let mut placed: Vec<Pod> = Vec::new();
        let mut given: HashSet<String> = HashSet::new();
        for i in 0..8 {
            let name = format!("p{round}-{i}");
            let c = svc.commit(&pod(&name, 1, None), "a0").unwrap().unwrap();
            for d in &c.devices {
                assert!(
                    given.insert(d.clone()),
                    "{d} chosen twice (round {round}, {name})"
                );
            }
            placed.push(bound(&name, &c));
            let view = ClusterView::build(&dts, &[], &[], &placed).unwrap();
            let installer = {
                let svc = std::sync::Arc::clone(&svc);
                std::thread::spawn(move || {
                    svc.replace_view(view);
                })
            };
            // The next commit races the installation.
            if i < 7 {
                let next = format!("p{round}-{}", i + 1);
                let c = svc.commit(&pod(&next, 1, None), "a0").unwrap().unwrap();
                svc.release(&format!("ml/{next}"));
                for d in &c.devices {
                    assert!(
                        !given.contains(d),
                        "{d} chosen twice (round {round}, {next})"
                    );
                }
            }
            installer.join().unwrap();
        }
    }
}

/// A pod asking through a claim is judged by the same gpu-aware logic as the pod asking
/// for the extended resource: on `a` (NPUs 0-2 held by an allocated claim) one NPU is the
/// last of a broken HCCS group, so `a` scores 10 where the untouched `b`, whose whole group
/// it would break, scores 8 (what `e2e/tests/dra_extension.rs` shows with kube-scheduler).
/// No device is chosen for it.
#[test]
fn claim_pods_are_scored_like_extended_resource_pods_and_get_no_device_choice() {
    use crate::core::claims::Claims;
    use crate::core::claims::testing::{ascend_node, claim, claim_pod};
    use crate::core::view::ContextCache;
    const NPU: &str = "npu.fumarole.dev";
    let holder = claim_pod("holder", &["held"], Some("a"), serde_json::json!({}));
    let view = ClusterView::build_with_jobs(
        &mut ContextCache::default(),
        &[ascend_node("a"), ascend_node("b")],
        &[],
        &[],
        &[crate::core::pod_facts::PodFacts::of(&holder)],
        Claims::new(&[
            claim("held", NPU, 3, Some(("a", &[0, 1, 2]))),
            claim("one", NPU, 1, None),
            claim("five", NPU, 5, None),
        ]),
        crate::core::unit::JobSources::default(),
    )
    .unwrap();
    let svc = Decider::new(view, Settings::default());
    let by_claim = claim_pod("single", &["one"], None, serde_json::json!({}));
    let v = svc
        .evaluate(&by_claim, &["a", "b"], Asker::KubeScheduler)
        .unwrap();
    let (a, b) = (v[0].raw.unwrap(), v[1].raw.unwrap());
    assert_eq!(
        (scale::kube_scheduler(a), scale::kube_scheduler(b)),
        (10, 8),
        "{v:?}"
    );
    // The extended-resource pod of the same size gets the same verdicts.
    let by_resource = pod_asking("huawei.com/Ascend910", 1);
    let e = svc
        .evaluate(&by_resource, &["a", "b"], Asker::KubeScheduler)
        .unwrap();
    assert_eq!((e[0].raw, e[1].raw), (v[0].raw, v[1].raw));
    // Fit counts the held NPUs: a has 5 free, enough for five, not for eight.
    let five = claim_pod("five", &["five"], None, serde_json::json!({}));
    assert!(svc.evaluate(&five, &["a"], Asker::KubeScheduler).unwrap()[0].feasible());
    let eight = pod_asking("huawei.com/Ascend910", 8);
    let r = svc
        .evaluate(&eight, &["a", "b"], Asker::KubeScheduler)
        .unwrap();
    assert!(!r[0].feasible() && r[1].feasible(), "{r:?}");
    assert!(
        r[0].reason().unwrap().contains("5 free"),
        "{:?}",
        r[0].reason()
    );
    // Placed, not given devices: kube-scheduler's DRA allocator picks them.
    assert!(svc.commit(&by_claim, "a").unwrap().is_none());
    assert!(svc.asks_through_claims(&by_claim));
    assert!(svc.asks_through_claims(&holder), "allocated or not");
    assert!(!svc.asks_through_claims(&by_resource));
    assert!(svc.commit(&by_resource, "a").unwrap().is_some());
    // A pod whose claim is missing gets the reason, not a panic.
    let lost = claim_pod("lost", &["gone"], None, serde_json::json!({}));
    let e = svc
        .evaluate(&lost, &["a"], Asker::KubeScheduler)
        .unwrap_err();
    assert!(e.to_string().contains("ml/gone"), "{e}");
}

/// The after-the-fact choice for a bound pod (Volcano's scheduler binding without telling the
/// service) never replaces the choice the view already shows for that node: a choice written
/// beside the bind (fumarole's Volcano plugin writes it in the background) can settle the
/// pod's commit between the writer's read of the pod and its commit, and choosing again then
/// gave the pod other devices than the node had already handed out (e2e `device_chain`,
/// `volcano_plugin_choice_is_what_every_container_gets`, 2 mismatches in one CI run).
#[test]
fn a_bound_pods_choice_the_view_shows_is_not_chosen_again() {
    use fumarole_topology::annotation::{DEVICES_ANNOTATION, DEVICES_NODE_ANNOTATION, format};
    let dts: Vec<_> = ["a0", "a1"]
        .into_iter()
        .map(|name| {
            fumarole_topology::crd::testing::nvlink_node(name, 8, 10, &[], |i| {
                format!("{name}-g{i}")
            })
        })
        .collect();
    let svc = Decider::new(
        ClusterView::build(&dts, &[], &[], &[]).unwrap(),
        Settings::default(),
    );
    let unbound = pod("p", 2, None);
    let allocated = svc.commit(&unbound, "a0").unwrap().unwrap();
    // Bound with its choice; the view showing it settles the commit.
    let mut bound = unbound.clone();
    bound.spec.as_mut().unwrap().node_name = Some("a0".into());
    bound.metadata.annotations = Some(BTreeMap::from([
        (DEVICES_ANNOTATION.to_string(), format(&allocated.choice())),
        (DEVICES_NODE_ANNOTATION.to_string(), "a0".to_string()),
    ]));
    let settled = svc.replace_view(ClusterView::build(&dts, &[], &[], &[bound]).unwrap());
    assert_eq!(settled.len(), 1, "{settled:?}");
    // The writer's copy of the pod, read before the choice landed: bound, no choice.
    let mut read_before = unbound.clone();
    read_before.spec.as_mut().unwrap().node_name = Some("a0".into());
    assert_eq!(svc.commit_bound(&read_before, "a0").unwrap(), None);
    // Bound to another node than its choice names: a choice there is still made.
    let c = svc.commit_bound(&read_before, "a1").unwrap().unwrap();
    assert_eq!((c.node.as_str(), c.devices.len()), ("a1", 2));
}

/// Huawei's job annotations for an Ascend pod: the rank group placement uses, the block and
/// the super-node's id where it is a number, with the record of what the extension added; a
/// value the pod already has stands unless the extension added it and the pod is not bound;
/// GPUs and pods whose rank is only guessed from their name get none.
#[test]
fn job_annotations_follow_the_rank_and_the_super_node() {
    let node = |name: &str, super_node: Option<&str>| {
        let mut t = fumarole_topology::crd::testing::atlas_800_910(name, &[]);
        t.spec.super_node = super_node.map(|id| SuperNodeInfo {
            id: id.into(),
            source: "config".into(),
        });
        t
    };
    let worker = |i: u32, extra: serde_json::Value| -> Pod {
        let mut annotations = serde_json::json!({"volcano.sh/task-index": i.to_string()});
        if i == 0 {
            annotations["sp-block"] = "16".into();
        }
        if let (Some(a), Some(extra)) = (annotations.as_object_mut(), extra.as_object()) {
            a.extend(extra.clone());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("sp-worker-{i}"), "namespace": "ml",
                         "labels": {"volcano.sh/job-name": "sp", "volcano.sh/task-spec": "worker"},
                         "annotations": annotations},
            "spec": {"containers": [{"name": "c",
                "resources": {"limits": {"huawei.com/Ascend910": "8"}}}]}
        }))
        .unwrap()
    };
    let pods: Vec<Pod> = (0..4).map(|i| worker(i, serde_json::json!({}))).collect();
    let view = ClusterView::build(
        &[
            node("n0", Some("7")),
            node("r0", Some("rack-r")),
            node("solo", None),
        ],
        &[],
        &[],
        &pods,
    )
    .unwrap();
    let svc = Decider::new(view, Settings::default());
    let commit = |node: &str, resource: &str| Commit {
        node: node.into(),
        resource: resource.into(),
        devices: (0..8).map(|i| format!("Ascend910-{i}")).collect(),
        unit: None,
        at: Instant::now(),
        share: false,
    };
    let npu = "huawei.com/Ascend910";
    const RECORD: &str = "fumarole.dev/job-annotations";
    let map = |pairs: &[(&str, Option<&str>)]| -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    };
    assert_eq!(
        svc.job_annotations(&pods[2], &commit("n0", npu)),
        map(&[
            ("hccl/rankIndex", Some("2")),
            ("super-pod-id", Some("7")),
            ("super-pod-rank", Some("1")),
            (RECORD, Some("hccl/rankIndex,super-pod-id,super-pod-rank")),
        ])
    );
    assert_eq!(
        svc.job_annotations(&pods[1], &commit("r0", npu)),
        map(&[
            ("hccl/rankIndex", Some("1")),
            ("super-pod-rank", Some("0")),
            (RECORD, Some("hccl/rankIndex,super-pod-rank")),
        ])
    );
    assert_eq!(
        svc.job_annotations(&pods[3], &commit("solo", npu)),
        map(&[
            ("hccl/rankIndex", Some("3")),
            (RECORD, Some("hccl/rankIndex"))
        ])
    );
    // A value already on the pod stands (ours is left out, the same value too: not ours).
    let preset = worker(
        3,
        serde_json::json!({"hccl/rankIndex": "garbled", "super-pod-id": "7"}),
    );
    assert_eq!(
        svc.job_annotations(&preset, &commit("n0", npu)),
        map(&[
            ("super-pod-rank", Some("1")),
            (RECORD, Some("super-pod-rank"))
        ])
    );
    // What the extension added for a placement that did not bind is replaced, or removed
    // where this placement has none; what it did not add stands.
    let earlier = worker(
        3,
        serde_json::json!({"hccl/rankIndex": "9", "super-pod-id": "4", "super-pod-rank": "5",
            RECORD: "super-pod-id,super-pod-rank"}),
    );
    assert_eq!(
        svc.job_annotations(&earlier, &commit("r0", npu)),
        map(&[
            ("super-pod-id", None),
            ("super-pod-rank", Some("1")),
            (RECORD, Some("super-pod-rank"))
        ])
    );
    assert_eq!(
        svc.job_annotations(&earlier, &commit("solo", npu)),
        map(&[
            ("super-pod-id", None),
            ("super-pod-rank", None),
            (RECORD, None)
        ])
    );
    // Once bound, nothing of the pod's is replaced, whoever added it.
    let mut bound = earlier.clone();
    bound.spec.as_mut().unwrap().node_name = Some("n0".into());
    assert!(svc.job_annotations(&bound, &commit("n0", npu)).is_empty());
    // Not an Ascend resource: nothing.
    assert!(
        svc.job_annotations(&pods[2], &commit("n0", "nvidia.com/gpu"))
            .is_empty()
    );
    // A lone pod whose only rank is the number ending its name: no rank written; a
    // StatefulSet's ordinal is a rank.
    let lone = pod_asking(npu, 8);
    assert!(svc.job_annotations(&lone, &commit("solo", npu)).is_empty());
    let mut sts = lone.clone();
    sts.metadata.labels = Some(BTreeMap::from([(
        "apps.kubernetes.io/pod-index".to_string(),
        "4".to_string(),
    )]));
    assert_eq!(
        svc.job_annotations(&sts, &commit("solo", npu)),
        map(&[
            ("hccl/rankIndex", Some("4")),
            (RECORD, Some("hccl/rankIndex"))
        ])
    );
}

fn pod_asking(resource: &str, n: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("ext-{n}"), "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: n.to_string()}}}]}
    }))
    .unwrap()
}

/// The decider stays usable without an API client or an async runtime (the next step puts it
/// behind a C ABI inside the schedulers): none of its files names `kube`, `tokio` or awaits.
#[test]
fn the_decider_does_no_io() {
    let files = [
        ("mod.rs", include_str!("mod.rs")),
        ("asker.rs", include_str!("asker.rs")),
        ("job_annotations.rs", include_str!("job_annotations.rs")),
        ("settings.rs", include_str!("settings.rs")),
    ];
    for (name, text) in files {
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for word in [
                "kube::",
                "tokio",
                "async ",
                ".await",
                "crate::effects",
                "crate::service",
            ] {
                assert!(
                    !line.contains(word),
                    "decider/{name}: {line:?} names {word:?}"
                );
            }
        }
    }
}
