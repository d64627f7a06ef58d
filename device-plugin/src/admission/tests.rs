#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The admission rules on plain snapshots: which pod is being admitted, when its choice is
//! honoured, waited for, refused, and how `Allocate` is checked.

use super::*;

const GPU: &str = "nvidia.com/gpu";

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn admissions() -> Admissions {
    Admissions::new(GPU, (0..8).map(|i| format!("GPU-{i}")))
}

/// A pod that arrived `arrival`-th, created at `created`.
fn pod(name: &str, created: &str, gpus: u64, choice: Option<&str>) -> BoundPod {
    BoundPod {
        namespace: "ml".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        arrival: 0,
        created: created.into(),
        scheduler: "default-scheduler".into(),
        started: false,
        finished: false,
        deleting: false,
        requests: BTreeMap::from([(GPU.to_string(), gpus)]),
        choice: choice.map(str::to_string),
        ascend_choices: BTreeMap::new(),
        reported: BTreeMap::new(),
    }
}

fn choice(devices: &[&str]) -> String {
    format!(
        r#"{{"nvidia.com/gpu":{}}}"#,
        serde_json::to_string(devices).unwrap()
    )
}

fn all() -> Vec<String> {
    (0..8).map(|i| format!("GPU-{i}")).collect()
}

fn request<'a>(available: &'a [String], size: usize) -> ContainerRequest<'a> {
    ContainerRequest {
        available,
        must_include: &[],
        size,
    }
}

const NOW: Duration = Duration::ZERO;
const LATE: Duration = Duration::from_secs(60);

#[test]
fn the_oldest_waiting_pod_gets_its_choice_and_allocate_confirms_it() {
    let a = admissions();
    let available = all();
    let older = pod(
        "older",
        "2026-01-01T00:00:00Z",
        2,
        Some(&choice(&["GPU-4", "GPU-5"])),
    );
    let newer = pod(
        "newer",
        "2026-01-01T00:00:05Z",
        1,
        Some(&choice(&["GPU-0"])),
    );
    let pods = vec![newer.clone(), older.clone()];
    let d = a.decide(&pods, request(&available, 2), &AwaitChoice::default(), NOW);
    assert_eq!(
        d,
        Decision::Prefer {
            pod: older.clone(),
            devices: ids(&["GPU-4", "GPU-5"])
        }
    );
    let (who, outcome) = a.allocated(&pods, &ids(&["GPU-5", "GPU-4"])).unwrap();
    assert_eq!(who, older);
    assert_eq!(
        outcome,
        Some(Outcome::Honoured {
            devices: ids(&["GPU-5", "GPU-4"])
        })
    );
    // The older pod holds all it asked for: the next admission is the newer pod's.
    let d = a.decide(&pods, request(&available, 1), &AwaitChoice::default(), NOW);
    assert_eq!(
        d,
        Decision::Prefer {
            pod: newer,
            devices: ids(&["GPU-0"])
        }
    );
}

/// The kubelet admits in bind order: a pod created later but bound first is admitted first,
/// and a pod needing fewer devices than asked is not the one being admitted.
#[test]
fn bind_order_not_creation_order() {
    let a = admissions();
    let available = all();
    let mut created_first = pod(
        "created-first",
        "2026-01-01T00:00:00Z",
        2,
        Some(&choice(&["GPU-0", "GPU-1"])),
    );
    created_first.arrival = 2;
    let mut bound_first = pod(
        "bound-first",
        "2026-01-01T00:00:09Z",
        2,
        Some(&choice(&["GPU-6", "GPU-7"])),
    );
    bound_first.arrival = 1;
    let pods = vec![created_first.clone(), bound_first.clone()];
    assert_eq!(
        a.decide(&pods, request(&available, 2), &AwaitChoice::default(), NOW),
        Decision::Prefer {
            pod: bound_first,
            devices: ids(&["GPU-6", "GPU-7"])
        }
    );
    // A 1-GPU pod that arrived first cannot be the one asking for 2.
    let b = admissions();
    let mut small = pod("small", "t", 1, Some(&choice(&["GPU-3"])));
    small.arrival = 0;
    let d = b.decide(
        &[small, created_first.clone()],
        request(&available, 2),
        &AwaitChoice::default(),
        NOW,
    );
    assert!(matches!(d, Decision::Prefer { pod, .. } if pod == created_first));
}

#[test]
fn a_different_allocation_is_reported() {
    let a = admissions();
    let available = all();
    let p = pod("p", "t", 2, Some(&choice(&["GPU-1", "GPU-2"])));
    let pods = vec![p.clone()];
    assert!(matches!(
        a.decide(&pods, request(&available, 2), &AwaitChoice::default(), NOW),
        Decision::Prefer { .. }
    ));
    let (_, outcome) = a.allocated(&pods, &ids(&["GPU-1", "GPU-7"])).unwrap();
    assert_eq!(
        outcome,
        Some(Outcome::Differs {
            preferred: ids(&["GPU-1", "GPU-2"]),
            allocated: ids(&["GPU-1", "GPU-7"]),
        })
    );
    // Without a GetPreferredAllocation before (the kubelet had no choice to make), Allocate
    // is still checked against the pod's choice.
    let q = pod("q", "t", 1, Some(&choice(&["GPU-3"])));
    let pods = vec![q.clone()];
    let (who, outcome) = a.allocated(&pods, &ids(&["GPU-6"])).unwrap();
    assert_eq!(who, q);
    assert!(
        matches!(outcome, Some(Outcome::Differs { .. })),
        "{outcome:?}"
    );
}

#[test]
fn bad_choices_are_ignored_with_a_reason() {
    let available = all();
    let cases = [
        ("not json", "is not a JSON object"),
        (
            r#"{"nvidia.com/gpu":["GPU-1","GPU-2","GPU-3"]}"#,
            "names 3 nvidia.com/gpu devices, the pod requests 2",
        ),
        (
            r#"{"huawei.com/Ascend910":["Ascend910-0"]}"#,
            "names huawei.com/Ascend910, which the pod does not request",
        ),
        (
            r#"{"nvidia.com/gpu":["GPU-9","GPU-1"]}"#,
            "\"GPU-9\" is not a nvidia.com/gpu device of this node",
        ),
        (r#"{"nvidia.com/gpu":["GPU-1","GPU-1"]}"#, "twice"),
    ];
    for (value, want) in cases {
        let a = admissions();
        let p = pod("p", "t", 2, Some(value));
        match a.decide(
            std::slice::from_ref(&p),
            request(&available, 2),
            &AwaitChoice::default(),
            NOW,
        ) {
            Decision::Select {
                pod: Some(who),
                outcome: Outcome::Invalid { reason, .. },
            } => {
                assert_eq!(who, p);
                assert!(reason.contains(want), "{value}: {reason}");
            }
            other => panic!("{value}: {other:?}"),
        }
    }
}

#[test]
fn unavailable_devices_and_must_include_fall_back() {
    let a = admissions();
    let p = pod("p", "t", 2, Some(&choice(&["GPU-1", "GPU-2"])));
    let available = ids(&["GPU-1", "GPU-3", "GPU-4"]);
    match a.decide(
        std::slice::from_ref(&p),
        request(&available, 2),
        &AwaitChoice::default(),
        NOW,
    ) {
        Decision::Select {
            outcome: Outcome::NotHonoured { reason, .. },
            ..
        } => assert!(reason.contains("GPU-2 is not available"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let all = all();
    let must = ids(&["GPU-5"]);
    let req = ContainerRequest {
        available: &all,
        must_include: &must,
        size: 2,
    };
    match a.decide(&[p], req, &AwaitChoice::default(), NOW) {
        Decision::Select {
            outcome: Outcome::NotHonoured { reason, .. },
            ..
        } => assert!(reason.contains("must include GPU-5"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn waits_for_a_late_pod_or_choice_then_falls_back() {
    let a = admissions();
    let available = all();
    let wait = AwaitChoice::default();
    // The pod source has not seen the pod yet.
    assert_eq!(
        a.decide(&[], request(&available, 1), &wait, NOW),
        Decision::Wait
    );
    assert_eq!(
        a.decide(&[], request(&available, 1), &wait, LATE),
        Decision::Select {
            pod: None,
            outcome: Outcome::NoChoice
        }
    );
    // Volcano bound it; the extension writes the choice right after.
    let mut p = pod("v", "t", 1, None);
    p.scheduler = "volcano".into();
    assert_eq!(
        a.decide(&[p.clone()], request(&available, 1), &wait, NOW),
        Decision::Wait
    );
    assert!(matches!(
        a.decide(&[p.clone()], request(&available, 1), &wait, LATE),
        Decision::Select {
            outcome: Outcome::NoChoiceInTime { .. },
            ..
        }
    ));
    // Pods of other schedulers without a choice do not wait.
    let plain = pod("plain", "t", 1, None);
    assert_eq!(
        a.decide(
            std::slice::from_ref(&plain),
            request(&available, 1),
            &wait,
            NOW
        ),
        Decision::Select {
            pod: Some(plain),
            outcome: Outcome::NoChoice
        }
    );
}

#[test]
fn a_pod_deleted_before_its_admission_is_admitted_without_waiting_and_keeps_its_place() {
    let a = admissions();
    let available = all();
    let wait = AwaitChoice::default();
    // Volcano bound it, then it was deleted before the extension wrote a choice: the kubelet
    // still admits it, first; nobody will write its choice now.
    let mut gone = pod("gone", "2020-01-01T00:00:00Z", 2, None);
    gone.scheduler = "volcano".into();
    gone.deleting = true;
    let next = pod(
        "next",
        "2020-01-01T00:00:01Z",
        2,
        Some(&choice(&["GPU-6", "GPU-7"])),
    );
    let pods = [gone.clone(), next.clone()];
    assert_eq!(
        a.decide(&pods, request(&available, 2), &wait, NOW),
        Decision::Select {
            pod: Some(gone.clone()),
            outcome: Outcome::Deleting
        }
    );
    assert!(!Outcome::Deleting.is_warning());
    // Its devices are its own, not the next pod's.
    let (who, outcome) = a.allocated(&pods, &ids(&["GPU-0", "GPU-1"])).unwrap();
    assert_eq!((who.name.as_str(), outcome), ("gone", None));
    assert_eq!(
        a.decide(&pods, request(&available, 2), &wait, NOW),
        Decision::Prefer {
            pod: next,
            devices: ids(&["GPU-6", "GPU-7"])
        }
    );
    // A deleted pod that had its choice still gets it (the ledger holds it until it goes).
    let mut chosen = pod("chosen", "t", 1, Some(&choice(&["GPU-3"])));
    chosen.deleting = true;
    let b = admissions();
    assert_eq!(
        b.decide(
            std::slice::from_ref(&chosen),
            request(&available, 1),
            &wait,
            NOW
        ),
        Decision::Prefer {
            pod: chosen,
            devices: ids(&["GPU-3"])
        }
    );
}

#[test]
fn started_pods_and_pods_holding_their_devices_are_not_admitted_again() {
    let a = admissions();
    let available = all();
    let mut running = pod(
        "running",
        "2020-01-01T00:00:00Z",
        1,
        Some(&choice(&["GPU-0"])),
    );
    running.started = true;
    // Admitted before a plugin restart: PodResources reports its devices.
    let mut held = pod("held", "2021-01-01T00:00:00Z", 1, Some(&choice(&["GPU-1"])));
    held.reported.insert(GPU.into(), ids(&["GPU-1"]));
    let next = pod("next", "2022-01-01T00:00:00Z", 1, Some(&choice(&["GPU-2"])));
    let d = a.decide(
        &[running, held, next.clone()],
        request(&available, 1),
        &AwaitChoice::default(),
        NOW,
    );
    assert_eq!(
        d,
        Decision::Prefer {
            pod: next,
            devices: ids(&["GPU-2"])
        }
    );
}

#[test]
fn containers_take_the_choice_in_order() {
    let a = admissions();
    let available = all();
    let p = pod("p", "t", 3, Some(&choice(&["GPU-6", "GPU-2", "GPU-3"])));
    let pods = vec![p];
    let first = a.decide(&pods, request(&available, 1), &AwaitChoice::default(), NOW);
    assert!(matches!(&first, Decision::Prefer { devices, .. } if *devices == ids(&["GPU-6"])));
    a.allocated(&pods, &ids(&["GPU-6"]));
    let second = a.decide(&pods, request(&available, 2), &AwaitChoice::default(), NOW);
    assert!(
        matches!(&second, Decision::Prefer { devices, .. } if *devices == ids(&["GPU-2", "GPU-3"])),
        "{second:?}"
    );
}

/// A fallback keeps off the devices chosen for the other pods waiting on the node, minus what
/// they already got.
#[test]
fn other_waiting_pods_choices_are_spoken_for() {
    let a = admissions();
    let mut first = pod("first", "t", 2, Some(&choice(&["GPU-0", "GPU-1"])));
    first.arrival = 1;
    let mut second = pod("second", "t", 2, Some(&choice(&["GPU-2", "GPU-3"])));
    second.arrival = 2;
    let mut running = pod("running", "t", 1, Some(&choice(&["GPU-7"])));
    running.started = true;
    let garbled = pod("garbled", "t", 1, Some("GPU-5"));
    let pods = vec![first.clone(), second, running, garbled];
    let spoken: Vec<String> = a.spoken_for(&pods, Some(&first.uid)).into_iter().collect();
    assert_eq!(spoken, ids(&["GPU-2", "GPU-3"]));
    let all: Vec<String> = a.spoken_for(&pods, None).into_iter().collect();
    assert_eq!(all, ids(&["GPU-0", "GPU-1", "GPU-2", "GPU-3"]));
}

const NPU: &str = "huawei.com/Ascend910";

/// An Ascend resource whose device ids are not Huawei's names, so the tests see the mapping by
/// physical id (davinci number) at work.
fn npu_admissions() -> Admissions {
    Admissions::new(NPU, (0..8).map(|i| format!("npu-{i}")))
        .with_ascend_names("Ascend910", (0..8).map(|i| (i, format!("npu-{i}"))))
}

fn npus() -> Vec<String> {
    (0..8).map(|i| format!("npu-{i}")).collect()
}

/// A pod asking for `n` NPUs, with Huawei's annotation `huawei` and fumarole's `ours`.
fn npu_pod(n: u64, huawei: Option<&str>, ours: Option<&str>) -> BoundPod {
    BoundPod {
        requests: BTreeMap::from([(NPU.to_string(), n)]),
        ascend_choices: huawei
            .map(|v| BTreeMap::from([(NPU.to_string(), v.to_string())]))
            .unwrap_or_default(),
        choice: ours.map(str::to_string),
        ..pod("npu", "t", 0, None)
    }
}

#[test]
fn huaweis_choice_is_honoured_by_physical_id_and_ascend_real_names_it() {
    let a = npu_admissions();
    let available = npus();
    let p = npu_pod(2, Some("Ascend910-3,Ascend910-2"), None);
    let d = a.decide(
        std::slice::from_ref(&p),
        request(&available, 2),
        &AwaitChoice::default(),
        NOW,
    );
    assert_eq!(
        d,
        Decision::Prefer {
            pod: p.clone(),
            devices: ids(&["npu-3", "npu-2"])
        }
    );
    assert_eq!(a.overruled(&p), None);
    assert_eq!(a.ascend_real(&p), None, "nothing mounted yet");
    let (who, outcome) = a
        .allocated(std::slice::from_ref(&p), &ids(&["npu-2", "npu-3"]))
        .unwrap();
    assert_eq!(who, p);
    assert!(matches!(outcome, Some(Outcome::Honoured { .. })));
    assert_eq!(
        a.ascend_real(&p).as_deref(),
        Some("Ascend910-2,Ascend910-3")
    );
}

#[test]
fn huaweis_choice_arrives_with_the_pod_so_volcano_pods_do_not_wait() {
    let a = npu_admissions();
    let available = npus();
    let p = BoundPod {
        scheduler: "volcano".into(),
        ..npu_pod(1, Some("Ascend910-5"), None)
    };
    let d = a.decide(
        std::slice::from_ref(&p),
        request(&available, 1),
        &AwaitChoice::default(),
        NOW,
    );
    assert!(matches!(d, Decision::Prefer { devices, .. } if devices == ids(&["npu-5"])));
}

#[test]
fn bad_huawei_choices_are_ignored_with_a_reason() {
    let available = npus();
    let cases = [
        ("", "empty"),
        ("  ", "empty"),
        ("Ascend910-2,,Ascend910-3", "is not a device name"),
        ("npu-2,npu-3", "\"npu-2\" is not an Ascend910 device"),
        ("Ascend910-2;Ascend910-3", "is not a device name"),
        ("Ascend910-x,Ascend910-3", "is not a device name"),
        ("Ascend910-2,Ascend910-2", "listed twice"),
        ("Ascend310P-2,Ascend310P-3", "is not an Ascend910 device"),
        (
            "Ascend910-9,Ascend910-3",
            "\"Ascend910-9\" is not a huawei.com/Ascend910 device of this node",
        ),
        (
            "Ascend910-1,Ascend910-2,Ascend910-3",
            "names 3 huawei.com/Ascend910 devices, the pod requests 2",
        ),
    ];
    for (value, want) in cases {
        let a = npu_admissions();
        let p = npu_pod(2, Some(value), None);
        match a.decide(
            std::slice::from_ref(&p),
            request(&available, 2),
            &AwaitChoice::default(),
            NOW,
        ) {
            Decision::Select {
                pod: Some(who),
                outcome: outcome @ Outcome::Invalid { .. },
            } => {
                assert_eq!(who, p);
                let text = outcome.to_string();
                assert!(
                    text.starts_with("ignoring huawei.com/Ascend910: "),
                    "{text}"
                );
                assert!(text.contains(want), "{value:?}: {text}");
                assert!(outcome.is_warning());
            }
            other => panic!("{value:?}: {other:?}"),
        }
        // Nothing of a bad choice is kept off for other pods either.
        assert!(a.spoken_for(std::slice::from_ref(&p), None).is_empty());
    }
}

#[test]
fn huaweis_devices_in_use_or_too_few_fall_back_with_a_reason() {
    let a = npu_admissions();
    let p = npu_pod(2, Some("Ascend910-2,Ascend910-3"), None);
    // npu-3 taken by another pod, or unhealthy: the kubelet does not offer it.
    let available = ids(&["npu-0", "npu-1", "npu-2", "npu-4"]);
    match a.decide(
        std::slice::from_ref(&p),
        request(&available, 2),
        &AwaitChoice::default(),
        NOW,
    ) {
        Decision::Select {
            outcome: Outcome::NotHonoured { reason, .. },
            ..
        } => assert!(reason.contains("npu-3 is not available"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // One name for a container of two.
    let a = npu_admissions();
    let p = npu_pod(2, Some("Ascend910-2"), None);
    match a.decide(
        std::slice::from_ref(&p),
        request(&npus(), 2),
        &AwaitChoice::default(),
        NOW,
    ) {
        Decision::Select {
            outcome: Outcome::NotHonoured { reason, .. },
            ..
        } => assert!(
            reason.contains("needs 2 devices, 1 of the choice"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn fumaroles_choice_wins_over_huaweis_and_a_difference_is_reported() {
    let ours = |d: &[&str]| format!(r#"{{"{NPU}":{}}}"#, serde_json::to_string(d).unwrap());
    let available = npus();
    let decide = |a: &Admissions, p: &BoundPod| {
        a.decide(
            std::slice::from_ref(p),
            request(&available, 2),
            &AwaitChoice::default(),
            NOW,
        )
    };
    // They differ: fumarole's is preferred, Huawei's overruled.
    let a = npu_admissions();
    let p = npu_pod(
        2,
        Some("Ascend910-2,Ascend910-3"),
        Some(&ours(&["npu-4", "npu-5"])),
    );
    assert!(
        matches!(decide(&a, &p), Decision::Prefer { devices, .. } if devices == ids(&["npu-4", "npu-5"]))
    );
    let overruled = a.overruled(&p).unwrap();
    assert!(overruled.is_warning());
    assert_eq!(
        overruled.to_string(),
        "huawei.com/Ascend910 names npu-2,npu-3 but fumarole.dev/devices names npu-4,npu-5; following fumarole.dev/devices"
    );
    // They agree (the extension writes both): nothing to report.
    let p = npu_pod(
        2,
        Some("Ascend910-2,Ascend910-3"),
        Some(&ours(&["npu-3", "npu-2"])),
    );
    assert_eq!(a.overruled(&p), None);
    // fumarole's is unusable: it still decides (ignored, the node chooses).
    let a = npu_admissions();
    let p = npu_pod(2, Some("Ascend910-2,Ascend910-3"), Some("garbled"));
    assert!(matches!(
        decide(&a, &p),
        Decision::Select { outcome: Outcome::Invalid { annotation, .. }, .. } if annotation == "fumarole.dev/devices"
    ));
    // fumarole's names only other resources: Huawei's decides this one.
    let a = npu_admissions();
    let p = BoundPod {
        requests: BTreeMap::from([(NPU.to_string(), 2), (GPU.to_string(), 1)]),
        ..npu_pod(
            2,
            Some("Ascend910-6,Ascend910-7"),
            Some(r#"{"nvidia.com/gpu":["GPU-0"]}"#),
        )
    };
    assert!(
        matches!(decide(&a, &p), Decision::Prefer { devices, .. } if devices == ids(&["npu-6", "npu-7"]))
    );
}

#[test]
fn huawei_annotations_mean_nothing_to_other_resources() {
    let a = admissions();
    let available = all();
    let p = BoundPod {
        ascend_choices: BTreeMap::from([(GPU.to_string(), "Ascend910-1".to_string())]),
        ..pod("p", "t", 1, None)
    };
    let d = a.decide(
        std::slice::from_ref(&p),
        request(&available, 1),
        &AwaitChoice::default(),
        NOW,
    );
    assert!(matches!(
        d,
        Decision::Select {
            outcome: Outcome::NoChoice,
            ..
        }
    ));
    assert_eq!(a.ascend_real(&p), None);
}

#[test]
fn huaweis_choice_never_takes_what_fumaroles_choice_promised_another_waiting_pod() {
    let a = npu_admissions();
    let available = npus();
    // The older pod carries Huawei's annotation naming npu-2; a younger one waits with
    // fumarole's choice of npu-2 (the extension's ledger promised it).
    let theirs = BoundPod {
        uid: "u-theirs".into(),
        name: "theirs".into(),
        arrival: 1,
        ..npu_pod(1, Some("Ascend910-2"), None)
    };
    let ours = BoundPod {
        uid: "u-ours".into(),
        name: "ours".into(),
        arrival: 2,
        ..npu_pod(1, None, Some(&format!(r#"{{"{NPU}":["npu-2"]}}"#)))
    };
    let pods = [theirs.clone(), ours.clone()];
    match a.decide(&pods, request(&available, 1), &AwaitChoice::default(), NOW) {
        Decision::Select {
            pod: Some(p),
            outcome: Outcome::NotHonoured { reason, .. },
        } => {
            assert_eq!(p, theirs);
            assert!(
                reason.contains("npu-2 is promised to pod ml/ours"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Not promised to anyone else: Huawei's choice stands.
    let alone = [theirs.clone()];
    assert!(matches!(
        a.decide(&alone, request(&available, 1), &AwaitChoice::default(), NOW),
        Decision::Prefer { devices, .. } if devices == ids(&["npu-2"])
    ));
}

/// A preference whose `Allocate` never came (the kubelet gave up on that pod, which was then
/// deleted) is not taken for the next pod's `Allocate`: preferences are kept per pod.
#[test]
fn a_preference_left_without_its_allocate_is_not_the_next_pods() {
    let a = admissions();
    let available = all();
    let gone = BoundPod {
        arrival: 1,
        ..pod("gone", "t", 2, Some(&choice(&["GPU-4", "GPU-5"])))
    };
    let next = BoundPod {
        arrival: 2,
        ..pod("next", "t", 1, Some(&choice(&["GPU-0"])))
    };
    let d = a.decide(
        &[gone.clone(), next.clone()],
        request(&available, 2),
        &AwaitChoice::default(),
        NOW,
    );
    assert!(matches!(d, Decision::Prefer { pod, .. } if pod == gone));
    // No Allocate for it; it is deleted, and the kubelet allocates the next pod's device
    // without asking for a preference.
    let pods = [next.clone()];
    let (who, outcome) = a.allocated(&pods, &ids(&["GPU-0"])).unwrap();
    assert_eq!(who, next);
    assert_eq!(
        outcome,
        Some(Outcome::Honoured {
            devices: ids(&["GPU-0"])
        })
    );
}

/// `Allocate` matched to the wrong pod (the plugin's watch showed `late` first, the kubelet
/// admitted `early`): once PodResources reports `early`'s devices, the account follows the
/// kubelet's, `early` hears of it, and `late` is the pod being admitted again, with its own
/// choice. A finished pod's report (the kubelet frees its devices; the report may be stale)
/// moves nothing.
#[test]
fn podresources_corrects_an_allocate_matched_to_the_wrong_pod() {
    let a = admissions();
    let available = all();
    let mut late = pod("late", "t", 2, Some(&choice(&["GPU-6", "GPU-7"])));
    late.arrival = 1;
    let mut early = pod("early", "t", 2, None);
    early.arrival = 2;
    let pods = vec![late.clone(), early.clone()];
    let (matched, _) = a.allocated(&pods, &ids(&["GPU-0", "GPU-1"])).unwrap();
    assert_eq!(
        matched, late,
        "the plugin's guess: the earliest-arrived pod"
    );
    assert!(a.reconcile(&pods).is_empty(), "nothing reported yet");

    let mut finished = pod("finished", "t", 2, None);
    finished.started = true;
    finished.finished = true;
    finished.reported = BTreeMap::from([(GPU.to_string(), ids(&["GPU-0"]))]);
    assert!(a.reconcile(&[late.clone(), finished]).is_empty());

    early.started = true;
    early.reported = BTreeMap::from([(GPU.to_string(), ids(&["GPU-0", "GPU-1"]))]);
    let pods = vec![late.clone(), early.clone()];
    assert_eq!(
        a.reconcile(&pods),
        vec![(
            early.clone(),
            Outcome::Misattributed {
                devices: ids(&["GPU-0", "GPU-1"]),
                counted_for: "ml/late".into(),
            }
        )]
    );
    assert!(a.reconcile(&pods).is_empty(), "corrected once");
    assert_eq!(
        a.decide(&pods, request(&available, 2), &AwaitChoice::default(), NOW),
        Decision::Prefer {
            pod: late,
            devices: ids(&["GPU-6", "GPU-7"])
        }
    );
}
