//! The cost of the C ABI's calls, as the Volcano plugin makes them, over simulated clusters of
//! 1,000 and 5,000 `dgx-h100` nodes in super-nodes of 20 (fumarole-sim's cluster shapes; no API
//! server): judging a plain 2-GPU task on every node (one call per task, what PrePredicate
//! does; answered as text and as the arrays the plugins read), judging a pod of a gpu-group-size unit whose super-node is already planned, planning a
//! unit (its first pod), and an allocation with its undoing. Each call goes through the C
//! functions with the pod as JSON, as the Go side sends it, and frees the answer.
//!
//! ```sh
//! cargo bench -p fumarole-scheduler-abi --bench abi_calls
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::c_char;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use fumarole_scheduler_abi::engine::{Engine, EngineConfig};
use fumarole_scheduler_abi::*;
use fumarole_sim::shape::ClusterShape;
use scheduler_ext::core::view::ClusterView;
use serde_json::json;

const SIZES: [usize; 2] = [1_000, 5_000];

fn view(nodes: usize) -> ClusterView {
    let shape: ClusterShape = format!("{nodes}xdgx-h100:{}", nodes / 20).parse().unwrap();
    shape.build().unwrap().view
}

/// A pod as Volcano's cache holds it; `group` makes it rank `rank` of a Volcano Job whose
/// gpu-group-size is `group` GPUs.
fn pod(name: &str, gpus: u32, group: Option<(&str, u32, u32)>) -> Vec<u8> {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    });
    if let Some((job, size, rank)) = group {
        p["metadata"]["annotations"] = json!({
            "metax-tech.com/gpu-group-size": size.to_string(),
            "volcano.sh/job-name": job,
            "volcano.sh/task-index": rank.to_string(),
        });
        p["metadata"]["labels"] = json!({"volcano.sh/job-name": job});
    }
    serde_json::to_vec(&p).unwrap()
}

/// One evaluation, as the plugin makes it once it holds the node order: knowing the view's
/// generation (learnt from a first call, which also sends the names).
fn evaluate(e: *const Engine, pod: &[u8]) -> i32 {
    evaluate_knowing(e, pod, generation(e, pod))
}

fn evaluate_knowing(e: *const Engine, pod: &[u8], known: u64) -> i32 {
    let mut out: *mut c_char = std::ptr::null_mut();
    let code = unsafe { fumarole_task_evaluate(e, pod.as_ptr(), pod.len(), known, &mut out) };
    unsafe { fumarole_string_free(out) };
    code
}

/// [`evaluate_knowing`] through `fumarole_task_evaluate_arrays`, the plugins' call.
fn evaluate_arrays(e: *const Engine, pod: &[u8], known: u64) -> i32 {
    let mut out: *mut c_char = std::ptr::null_mut();
    let mut v = FumaroleVerdicts {
        len: 0,
        codes: std::ptr::null_mut(),
        scores: std::ptr::null_mut(),
        reasons: std::ptr::null_mut(),
    };
    let code = unsafe {
        fumarole_task_evaluate_arrays(e, pod.as_ptr(), pod.len(), known, &mut out, &mut v)
    };
    unsafe {
        fumarole_string_free(out);
        fumarole_verdicts_free(&mut v);
    }
    code
}

/// The view's generation, from an evaluation of `pod`.
fn generation(e: *const Engine, pod: &[u8]) -> u64 {
    let mut out: *mut c_char = std::ptr::null_mut();
    unsafe { fumarole_task_evaluate(e, pod.as_ptr(), pod.len(), 0, &mut out) };
    // SAFETY: a string the call made (or NULL).
    let text = if out.is_null() {
        String::new()
    } else {
        unsafe { std::ffi::CStr::from_ptr(out) }
            .to_string_lossy()
            .into_owned()
    };
    unsafe { fumarole_string_free(out) };
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("G\t"))
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("abi");
    g.sample_size(20);
    for n in SIZES {
        let view = view(n);
        let engine = Engine::over_view(view.clone(), &EngineConfig::default()).unwrap();
        let e: *const Engine = &engine;

        let plain = pod("plain", 2, None);
        let known = generation(e, &plain);
        assert!(known > 0);
        g.bench_with_input(
            BenchmarkId::new("evaluate-2-gpu-task", n),
            &plain,
            |b, p| b.iter(|| evaluate_knowing(e, p, known)),
        );
        g.bench_with_input(
            BenchmarkId::new("evaluate-2-gpu-task-arrays", n),
            &plain,
            |b, p| b.iter(|| evaluate_arrays(e, p, known)),
        );

        // Two 8-GPU pods per 16-GPU unit: the first call plans the unit's super-node.
        let member = pod("train-worker-1", 8, Some(("train", 16, 1)));
        assert_eq!(
            evaluate(e, &pod("train-worker-0", 8, Some(("train", 16, 0)))),
            FUMAROLE_OK
        );
        g.bench_with_input(
            BenchmarkId::new("evaluate-planned-unit-pod", n),
            &member,
            |b, p| b.iter(|| evaluate_knowing(e, p, known)),
        );

        g.bench_function(BenchmarkId::new("plan-unit", n), |b| {
            b.iter_batched(
                || Engine::over_view(view.clone(), &EngineConfig::default()).unwrap(),
                |fresh| {
                    assert_eq!(
                        evaluate(&fresh, &pod("fresh-worker-0", 8, Some(("fresh", 16, 0)))),
                        FUMAROLE_OK
                    );
                    fresh
                },
                BatchSize::PerIteration,
            )
        });

        let node = view.nodes().next().unwrap().name.clone();
        g.bench_with_input(
            BenchmarkId::new("allocate-and-deallocate", n),
            &plain,
            |b, p| {
                b.iter(|| unsafe {
                    let code = fumarole_task_allocate(
                        e,
                        p.as_ptr(),
                        p.len(),
                        node.as_ptr(),
                        node.len(),
                        std::ptr::null_mut(),
                    );
                    assert_eq!(code, FUMAROLE_OK);
                    assert_eq!(
                        fumarole_task_deallocate(e, p.as_ptr(), p.len(), std::ptr::null_mut()),
                        FUMAROLE_OK
                    );
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
