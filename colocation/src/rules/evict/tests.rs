#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::rules::config::Watermarks;
use crate::rules::pod::{QosClass, Requests};
use crate::rules::psi::PsiLine;

fn pod(name: &str, offline: bool, cpu: u64, memory: u64) -> PodFacts {
    PodFacts {
        pod: PodRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        },
        qos_class: QosClass::Burstable,
        offline,
        critical: false,
        deleting: false,
        finished: false,
        requests: Requests {
            cpu_millis: cpu,
            memory_bytes: memory,
            ..Requests::default()
        },
    }
}

fn settings() -> EvictionSettings {
    EvictionSettings::default()
}

fn usage(cpu: f64, memory: f64) -> Sample {
    Sample {
        cpu_percent: Some(cpu),
        memory_percent: Some(memory),
        ..Sample::default()
    }
}

fn psi(some10: f64, full10: Option<f64>) -> Psi {
    Psi {
        some: PsiLine {
            avg10: some10,
            ..PsiLine::default()
        },
        full: full10.map(|avg10| PsiLine {
            avg10,
            ..PsiLine::default()
        }),
    }
}

#[test]
fn six_high_rounds_make_pressure_then_one_eviction_per_round() {
    let pods = vec![
        pod("online", false, 8000, 8 << 30),
        pod("small", true, 500, 1 << 30),
        pod("big", true, 2000, 1 << 30),
    ];
    let mut e = Evictor::new(settings(), false, &pods);
    for i in 0..5 {
        let d = e.round(&usage(85.0, 10.0), &pods);
        assert_eq!(d, Decision::default(), "round {i}");
    }
    let d = e.round(&usage(80.0, 10.0), &pods);
    assert_eq!(d.taint, Some(true));
    assert_eq!(d.evict.as_ref().unwrap().name, "big");
    assert_eq!(
        d.reason.as_deref(),
        Some("cpu pressure: usage 80.0% at or above the high watermark 80% for 6 rounds")
    );
    // The pod went away: the next round evicts the next one, without tainting again.
    let rest: Vec<PodFacts> = pods
        .iter()
        .filter(|p| p.pod.name != "big")
        .cloned()
        .collect();
    let d = e.round(&usage(90.0, 10.0), &rest);
    assert_eq!(d.taint, None);
    assert_eq!(d.evict.unwrap().name, "small");
    // Only online pods are left: pressure stays, nothing to evict.
    let online = vec![pods[0].clone()];
    let d = e.round(&usage(90.0, 10.0), &online);
    assert_eq!((d.taint, d.evict), (None, None));
    assert!(d.pressure.cpu.is_some());
}

#[test]
fn a_low_round_restarts_the_count() {
    let pods = vec![pod("be", true, 1, 1)];
    let mut e = Evictor::new(settings(), false, &pods);
    for _ in 0..5 {
        e.round(&usage(95.0, 0.0), &pods);
    }
    assert!(e.round(&usage(79.9, 0.0), &pods).evict.is_none());
    for _ in 0..5 {
        assert!(e.round(&usage(95.0, 0.0), &pods).evict.is_none());
    }
    assert!(e.round(&usage(95.0, 0.0), &pods).evict.is_some());
}

#[test]
fn unknown_usage_neither_builds_pressure_nor_clears_the_taint() {
    let pods = vec![pod("be", true, 1, 1)];
    let mut e = Evictor::new(settings(), true, &pods);
    for _ in 0..10 {
        let d = e.round(&Sample::default(), &pods);
        assert_eq!((d.taint, d.evict), (None, None));
    }
    assert!(e.tainted());
}

#[test]
fn eviction_order_and_never_evict_rules() {
    let mut critical = pod("critical", true, 9000, 9 << 30);
    critical.critical = true;
    let mut deleting = pod("deleting", true, 8000, 8 << 30);
    deleting.deleting = true;
    let mut finished = pod("finished", true, 7000, 7 << 30);
    finished.finished = true;
    let online = pod("online", false, 6000, 6 << 30);
    let mut batch = pod("batch", true, 0, 0);
    batch.requests.batch_cpu_millis = 3000;
    batch.requests.batch_memory_bytes = 1 << 30;
    let b = pod("b-tie", true, 1000, 2 << 30);
    let a = pod("a-tie", true, 1000, 2 << 30);
    let pods = vec![critical, deleting, finished, online, batch, b, a];

    let e = Evictor::new(settings(), false, &[]);
    // CPU pressure: batch-cpu counts as a CPU request.
    assert_eq!(e.pick(Resource::Cpu, &pods).unwrap().name, "batch");
    // Memory pressure: the two 2 GiB pods tie; the first by name goes.
    assert_eq!(e.pick(Resource::Memory, &pods).unwrap().name, "a-tie");
    let not_evictable: Vec<PodFacts> = pods[..4].to_vec();
    assert_eq!(e.pick(Resource::Cpu, &not_evictable), None);
}

#[test]
fn memory_is_relieved_before_cpu() {
    let pods = vec![
        pod("cpu-heavy", true, 4000, 1),
        pod("mem-heavy", true, 1, 4 << 30),
    ];
    let mut e = Evictor::new(settings(), false, &pods);
    let mut d = Decision::default();
    for _ in 0..6 {
        d = e.round(&usage(90.0, 90.0), &pods);
    }
    assert!(d.pressure.cpu.is_some() && d.pressure.memory.is_some());
    assert_eq!(d.evict.unwrap().name, "mem-heavy");
    assert!(
        d.reason
            .unwrap()
            .starts_with("memory pressure: usage 90.0%")
    );
}

#[test]
fn psi_is_an_earlier_signal() {
    let pods = vec![pod("be", true, 1, 1)];
    let mut e = Evictor::new(settings(), false, &pods);
    let cpu_stall = Sample {
        cpu_psi: Some(psi(55.0, None)),
        ..usage(50.0, 20.0)
    };
    assert_eq!(e.round(&cpu_stall, &pods).taint, None);
    assert_eq!(e.round(&cpu_stall, &pods).taint, None);
    let d = e.round(&cpu_stall, &pods);
    assert_eq!(d.taint, Some(true));
    assert_eq!(d.evict.unwrap().name, "be");
    assert_eq!(
        d.reason.as_deref(),
        Some("cpu pressure: PSI some avg10 55.00% above 40% for 3 rounds")
    );

    // Memory uses the full line: a high `some` alone is not pressure.
    let mut e = Evictor::new(settings(), false, &pods);
    let some_only = Sample {
        memory_psi: Some(psi(90.0, Some(5.0))),
        ..usage(10.0, 10.0)
    };
    for _ in 0..5 {
        assert!(!e.round(&some_only, &pods).pressure.any());
    }
    let full = Sample {
        memory_psi: Some(psi(90.0, Some(10.5))),
        ..usage(10.0, 10.0)
    };
    e.round(&full, &pods);
    e.round(&full, &pods);
    let d = e.round(&full, &pods);
    assert!(matches!(
        d.pressure.memory,
        Some(Signal::Psi { line: "full", .. })
    ));
    assert!(d.evict.is_some());

    // Exactly at the threshold is not above it; a missing reading restarts the count.
    let mut e = Evictor::new(settings(), false, &pods);
    let at = Sample {
        cpu_psi: Some(psi(40.0, None)),
        ..usage(10.0, 10.0)
    };
    for _ in 0..5 {
        assert!(!e.round(&at, &pods).pressure.any());
    }
    e.round(&cpu_stall, &pods);
    e.round(&cpu_stall, &pods);
    e.round(&usage(10.0, 10.0), &pods);
    assert!(!e.round(&cpu_stall, &pods).pressure.any());
}

#[test]
fn taint_hysteresis() {
    let pods = vec![pod("online", false, 1, 1)];
    let mut e = Evictor::new(settings(), false, &pods);
    let mut taints = Vec::new();
    // (cpu %, memory %) per round.
    let rounds = [
        (85.0, 20.0), // 1..6 high
        (85.0, 20.0),
        (85.0, 20.0),
        (85.0, 20.0),
        (85.0, 20.0),
        (85.0, 20.0), // pressure: taint
        (50.0, 20.0), // between the watermarks: keep
        (31.0, 20.0), // just above low: keep
        (30.0, 35.0), // cpu low, memory not: keep
        (30.0, 30.0), // all at or below low: remove
        (50.0, 50.0), // between: nothing
        (85.0, 20.0), // one high round is not pressure
    ];
    for (cpu, memory) in rounds {
        taints.push(e.round(&usage(cpu, memory), &pods).taint);
    }
    assert_eq!(
        taints,
        [
            None,
            None,
            None,
            None,
            None,
            Some(true),
            None,
            None,
            None,
            Some(false),
            None,
            None
        ]
    );
    assert!(!e.tainted());
}

#[test]
fn taint_stays_while_psi_is_high_even_at_low_usage() {
    let mut e = Evictor::new(settings(), true, &[]);
    let stalled = Sample {
        memory_psi: Some(psi(50.0, Some(20.0))),
        ..usage(10.0, 10.0)
    };
    assert_eq!(e.round(&stalled, &[]).taint, None);
    assert_eq!(e.round(&usage(10.0, 10.0), &[]).taint, Some(false));
}

#[test]
fn configured_watermarks_and_limits_apply() {
    let s = EvictionSettings {
        cpu: Watermarks { high: 50, low: 10 },
        high_usage_count_limit: 2,
        ..settings()
    };
    let pods = vec![pod("be", true, 1, 1)];
    let mut e = Evictor::new(s, false, &pods);
    assert_eq!(e.round(&usage(50.0, 0.0), &pods).taint, None);
    assert_eq!(e.round(&usage(50.0, 0.0), &pods).taint, Some(true));
    assert_eq!(e.round(&usage(11.0, 0.0), &[]).taint, None);
    assert_eq!(e.round(&usage(10.0, 0.0), &[]).taint, Some(false));
}

#[test]
fn waits_for_the_evicted_pod_to_go() {
    let pods = vec![
        pod("a", true, 3, 3),
        pod("b", true, 2, 2),
        pod("c", true, 1, 1),
    ];
    let s = EvictionSettings {
        high_usage_count_limit: 1,
        ..settings()
    };
    let mut e = Evictor::new(s, false, &pods);
    let high = usage(95.0, 0.0);
    assert_eq!(e.round(&high, &pods).evict.unwrap().name, "a");
    // "a" is terminating (or the informer has not seen it yet): wait.
    let mut terminating = pods.clone();
    terminating[0].deleting = true;
    assert_eq!(e.round(&high, &pods).evict, None);
    assert_eq!(e.round(&high, &terminating).evict, None);
    // After SETTLE_ROUNDS rounds the next one goes even though "a" is still there.
    assert_eq!(e.round(&high, &terminating).evict.unwrap().name, "b");
    // Once "b" is gone the next round goes at once.
    let left = vec![terminating[0].clone(), pods[2].clone()];
    assert_eq!(e.round(&high, &left).evict.unwrap().name, "c");
}

#[test]
fn an_eviction_that_did_not_happen_is_retried() {
    let pods = vec![pod("a", true, 3, 3), pod("b", true, 2, 2)];
    let s = EvictionSettings {
        high_usage_count_limit: 1,
        ..settings()
    };
    let mut e = Evictor::new(s, false, &pods);
    let high = usage(95.0, 0.0);
    assert_eq!(e.round(&high, &pods).evict.unwrap().name, "a");
    assert_eq!(e.round(&high, &pods).evict, None);
    assert_eq!(e.round(&high, &pods).evict, None);
    // "a" never got a deletion timestamp: it is the largest again.
    assert_eq!(e.round(&high, &pods).evict.unwrap().name, "a");
}

#[test]
fn refused_eviction_moves_on_to_the_next_pod() {
    let pods = vec![pod("a", true, 3, 3), pod("b", true, 2, 2)];
    let s = EvictionSettings {
        high_usage_count_limit: 1,
        ..settings()
    };
    let mut e = Evictor::new(s, false, &pods);
    let high = usage(95.0, 0.0);
    let first = e.round(&high, &pods).evict.unwrap();
    assert_eq!(first.name, "a");
    e.eviction_failed(&first);
    assert_eq!(e.round(&high, &pods).evict.unwrap().name, "b");
    e.eviction_failed(&pods[1].pod);
    // Both refused: nothing until the skip runs out, then "a" again.
    let picks: Vec<Option<String>> = (0..REFUSED_SKIP_ROUNDS)
        .map(|_| e.round(&high, &pods).evict.map(|p| p.name))
        .collect();
    assert_eq!(picks[..4], [None, None, None, None]);
    assert_eq!(picks[4].as_deref(), Some("a"));
}

#[test]
fn restart_neither_flaps_the_taint_nor_evicts_twice() {
    let mut evicted = pod("evicted", true, 4000, 4 << 30);
    evicted.deleting = true;
    let next = pod("next", true, 1000, 1 << 30);
    let pods = vec![evicted.clone(), next.clone()];
    let s = EvictionSettings {
        high_usage_count_limit: 1,
        ..settings()
    };
    // The agent comes back on a tainted node while its last eviction is terminating.
    let mut e = Evictor::new(s, true, &pods);
    assert!(e.in_flight().eq(["uid-evicted"]));
    let d = e.round(&usage(95.0, 10.0), &pods);
    assert_eq!((d.taint, d.evict), (None, None));
    // Usage between the watermarks after restart: the taint is kept, not removed.
    let d = e.round(&usage(50.0, 10.0), &pods);
    assert_eq!(d.taint, None);
    // The terminating pod is gone and pressure persists: now the next one.
    let d = e.round(&usage(95.0, 10.0), &[next]);
    assert_eq!(d.taint, None);
    assert_eq!(d.evict.unwrap().name, "next");
}

#[test]
fn restart_on_an_untainted_quiet_node_does_nothing() {
    let pods = vec![pod("be", true, 1, 1)];
    let mut e = Evictor::new(settings(), false, &pods);
    assert_eq!(e.round(&usage(10.0, 10.0), &pods), Decision::default());
}

#[test]
fn disabled_removes_the_taint_and_evicts_nothing() {
    let s = EvictionSettings {
        enabled: false,
        high_usage_count_limit: 1,
        ..settings()
    };
    let pods = vec![pod("be", true, 1, 1)];
    let mut e = Evictor::new(s, true, &pods);
    let d = e.round(&usage(99.0, 99.0), &pods);
    assert_eq!((d.taint, d.evict), (Some(false), None));
    assert_eq!(e.round(&usage(99.0, 99.0), &pods).taint, None);
}

#[test]
fn failed_taint_patch_is_retried_after_observe() {
    let s = EvictionSettings {
        high_usage_count_limit: 1,
        ..settings()
    };
    let mut e = Evictor::new(s, false, &[]);
    assert_eq!(e.round(&usage(95.0, 0.0), &[]).taint, Some(true));
    e.observe_taint(false);
    assert_eq!(e.round(&usage(95.0, 0.0), &[]).taint, Some(true));
    assert_eq!(e.round(&usage(95.0, 0.0), &[]).taint, None);
}

#[test]
fn reloading_settings_restarts_counts_only_on_change() {
    let pods = vec![pod("be", true, 1, 1)];
    let mut e = Evictor::new(settings(), false, &pods);
    for _ in 0..5 {
        e.round(&usage(90.0, 0.0), &pods);
    }
    e.set_settings(settings());
    assert!(e.round(&usage(90.0, 0.0), &pods).evict.is_some());
    let mut e = Evictor::new(settings(), false, &pods);
    for _ in 0..5 {
        e.round(&usage(90.0, 0.0), &pods);
    }
    e.set_settings(EvictionSettings {
        cpu: Watermarks { high: 85, low: 30 },
        ..settings()
    });
    assert!(e.round(&usage(90.0, 0.0), &pods).evict.is_none());
}

#[test]
fn percent_of_total() {
    assert_eq!(percent(50, 200), Some(25.0));
    assert_eq!(percent(1, 0), None);
}
