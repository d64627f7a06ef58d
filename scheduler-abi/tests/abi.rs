//! The C ABI as a C caller sees it: status codes, strings handed out and freed, bad input
//! answered with a message, never a crash. Over the `two-dgx` snapshot (no API server).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::{CStr, c_char};
use std::path::Path;

use fumarole_scheduler_abi::engine::Engine;
use fumarole_scheduler_abi::*;
use serde_json::json;

fn engine() -> *mut Engine {
    let conf = br#"{"volcano":{"plugins":[{"name":"gpu-aware","arguments":{"weight":2,"loss.weight":0.5,"colour":"blue"}}]}}"#;
    engine_with(conf).unwrap_or_else(|e| panic!("{e}"))
}

/// Copies a returned string and frees it.
fn take(s: *mut c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    unsafe { fumarole_string_free(s) };
    text
}

fn pod(name: &str, gpus: u32) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    }))
    .unwrap()
}

fn evaluate(e: *mut Engine, pod: &[u8]) -> (i32, String) {
    evaluate_knowing(e, pod, 0)
}

fn evaluate_knowing(e: *mut Engine, pod: &[u8], known_generation: u64) -> (i32, String) {
    let mut out = std::ptr::null_mut();
    let code =
        unsafe { fumarole_task_evaluate(e, pod.as_ptr(), pod.len(), known_generation, &mut out) };
    (code, take(out))
}

/// An evaluation's parts: the generation, the node names (if sent), and per node in order
/// `(code, score, reason)`.
struct Answer {
    generation: u64,
    names: Vec<String>,
    verdicts: Vec<(u8, f64, String)>,
}

fn parse(text: &str) -> Answer {
    let mut a = Answer {
        generation: 0,
        names: vec![],
        verdicts: vec![],
    };
    let mut reasons = Vec::new();
    for l in text.lines() {
        if let Some(g) = l.strip_prefix("G\t") {
            a.generation = g.parse().unwrap();
        } else if let Some(name) = l.strip_prefix("N\t") {
            a.names.push(name.to_string());
        } else if let Some(reason) = l.strip_prefix("R\t") {
            reasons.push(reason.to_string());
        } else {
            let f: Vec<&str> = l.splitn(3, '\t').collect();
            assert_eq!(f.len(), 3, "{l:?}");
            let reason = match f[2] {
                "" => String::new(),
                i => reasons[i.parse::<usize>().unwrap()].clone(),
            };
            a.verdicts
                .push((f[0].parse().unwrap(), f[1].parse().unwrap(), reason));
        }
    }
    a
}

/// `name -> (code, score, reason)` from an evaluation that sent the names.
fn lines(text: &str) -> std::collections::BTreeMap<String, (u8, f64, String)> {
    let a = parse(text);
    assert!(a.generation > 0, "{text}");
    assert_eq!(a.names.len(), a.verdicts.len(), "{text}");
    a.names.into_iter().zip(a.verdicts).collect()
}

#[test]
fn node_names_come_only_when_the_caller_does_not_know_the_order() {
    let e = engine();
    let (_, text) = evaluate(e, &pod("four", 4));
    let first = parse(&text);
    assert_eq!(first.names, ["cpu-0", "dgx-a", "dgx-b", "pcie-a"], "{text}");
    // Knowing this generation: verdicts only, in the same order, the same ones.
    let (_, text) = evaluate_knowing(e, &pod("four", 4), first.generation);
    let again = parse(&text);
    assert_eq!(again.generation, first.generation);
    assert!(again.names.is_empty(), "{text}");
    assert_eq!(again.verdicts, first.verdicts);
    // Knowing another: the names again.
    let (_, text) = evaluate_knowing(e, &pod("four", 4), first.generation + 1);
    assert_eq!(parse(&text).names, first.names);
    unsafe { fumarole_engine_free(e) };
}

#[test]
fn a_task_is_judged_on_every_node_in_one_call() {
    let e = engine();
    let (code, text) = evaluate(e, &pod("four", 4));
    assert_eq!(code, FUMAROLE_OK, "{text}");
    let v = lines(&text);
    // two-dgx: dgx-a has exactly 4 free GPUs (the best fit), dgx-b 6, pcie-a 3.
    assert_eq!(v["pcie-a"].0, 2, "{v:?}");
    assert!(v["pcie-a"].2.contains("needs 4"), "{v:?}");
    assert_eq!(v["dgx-a"].0, 0, "{v:?}");
    assert!(
        v["dgx-a"].1 > v["dgx-b"].1,
        "dgx-a fits exactly, so it scores highest: {v:?}"
    );
    // Volcano's scale: 0..100 times the weight (2).
    assert!(v["dgx-a"].1 > 100.0 && v["dgx-a"].1 <= 200.0, "{v:?}");
    unsafe { fumarole_engine_free(e) };
}

/// `fumarole_task_evaluate_arrays`: the header text and the arrays, freed once.
fn evaluate_arrays(e: *mut Engine, pod: &[u8], known: u64) -> (i32, String, Vec<(u8, f64, i32)>) {
    let mut out = std::ptr::null_mut();
    let mut v = FumaroleVerdicts {
        len: 7,
        codes: std::ptr::null_mut(),
        scores: std::ptr::null_mut(),
        reasons: std::ptr::null_mut(),
    };
    let code = unsafe {
        fumarole_task_evaluate_arrays(e, pod.as_ptr(), pod.len(), known, &mut out, &mut v)
    };
    let rows = (0..v.len)
        .map(|i| unsafe { (*v.codes.add(i), *v.scores.add(i), *v.reasons.add(i)) })
        .collect();
    unsafe { fumarole_verdicts_free(&mut v) };
    assert_eq!(v.len, 0, "freeing empties the arrays");
    unsafe { fumarole_verdicts_free(&mut v) };
    (code, take(out), rows)
}

/// The arrays say what the text says, for nodes that fit, that are short of GPUs and that
/// have none; refusals leave them empty.
#[test]
fn the_arrays_answer_what_the_text_answers() {
    let e = engine();
    for gpus in [1, 4, 8] {
        let p = pod(&format!("p{gpus}"), gpus);
        let (code, text) = evaluate(e, &p);
        assert_eq!(code, FUMAROLE_OK, "{text}");
        let (code, header, rows) = evaluate_arrays(e, &p, 0);
        assert_eq!(code, FUMAROLE_OK, "{header}");
        assert!(
            header.lines().all(|l| l.starts_with(['G', 'N', 'R'])),
            "{header}"
        );
        let per_node: Vec<String> = rows
            .iter()
            .map(|(c, s, r)| match r {
                -1 => format!("{c}\t{s}\t"),
                r => format!("{c}\t0\t{r}"),
            })
            .collect();
        assert_eq!(format!("{header}{}\n", per_node.join("\n")), text);
        let a = parse(&text);
        assert_eq!(rows.len(), a.names.len());
        // two-dgx has at most 6 free GPUs on a node, and a node without devices.
        assert_eq!(rows.iter().any(|r| r.0 == 0), gpus < 8, "{text}");
        assert!(rows.iter().any(|r| r.0 != 0), "{text}");
    }
    // Not ours, an unusable pod, a NULL out: no arrays to free.
    let cpu = br#"{"metadata":{"name":"cpu","namespace":"default","uid":"u"},"spec":{"containers":[{"name":"c"}]}}"#;
    let (code, _, rows) = evaluate_arrays(e, cpu, 0);
    assert_eq!((code, rows.len()), (FUMAROLE_NOT_OURS, 0));
    let (code, why, rows) = evaluate_arrays(e, b"{not json", 0);
    assert_eq!((code, rows.len()), (FUMAROLE_ERROR, 0), "{why}");
    let p = pod("x", 1);
    let mut out = std::ptr::null_mut();
    let code = unsafe {
        fumarole_task_evaluate_arrays(e, p.as_ptr(), p.len(), 0, &mut out, std::ptr::null_mut())
    };
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(take(out).contains("NULL"));
    unsafe { fumarole_engine_free(e) };
}

#[test]
fn allocations_go_into_the_ledger_and_come_back_out() {
    let e = engine();
    let node = b"dgx-a";
    let first = pod("first", 4);
    let mut error = std::ptr::null_mut();
    let code = unsafe {
        fumarole_task_allocate(
            e,
            first.as_ptr(),
            first.len(),
            node.as_ptr(),
            node.len(),
            &mut error,
        )
    };
    assert_eq!(code, FUMAROLE_OK, "{}", take(error));
    // dgx-a's last 4 GPUs are held now: another 4-GPU task no longer fits there.
    let (_, text) = evaluate(e, &pod("second", 4));
    assert_eq!(lines(&text)["dgx-a"].0, 2, "{text}");
    let freed = unsafe { fumarole_engine_room_freed(e) };
    let code = unsafe { fumarole_task_deallocate(e, first.as_ptr(), first.len(), &mut error) };
    assert_eq!(code, FUMAROLE_OK, "{}", take(error));
    // The undoing gave room back, which a plugin reads to retry the pods it refused.
    assert_eq!(unsafe { fumarole_engine_room_freed(e) }, freed + 1);
    assert_eq!(unsafe { fumarole_engine_room_freed(std::ptr::null()) }, 0);
    let (_, text) = evaluate(e, &pod("second", 4));
    assert_eq!(lines(&text)["dgx-a"].0, 0, "{text}");
    // Nothing held any more: undoing again says so.
    let code = unsafe { fumarole_task_deallocate(e, first.as_ptr(), first.len(), &mut error) };
    assert_eq!(code, FUMAROLE_NOT_OURS);
    unsafe { fumarole_engine_free(e) };
}

#[test]
fn a_pod_without_accelerators_is_not_ours() {
    let e = engine();
    let cpu_only = serde_json::to_vec(&json!({"metadata": {"name": "cpu", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}))
    .unwrap();
    assert_eq!(evaluate(e, &cpu_only), (FUMAROLE_NOT_OURS, String::new()));
    let node = b"dgx-a";
    let code = unsafe {
        fumarole_task_allocate(
            e,
            cpu_only.as_ptr(),
            cpu_only.len(),
            node.as_ptr(),
            node.len(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(code, FUMAROLE_NOT_OURS);
    unsafe { fumarole_engine_free(e) };
}

#[test]
fn bad_input_is_an_error_with_a_message_never_a_crash() {
    let e = engine();
    let (code, text) = evaluate(e, b"{not json");
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(text.contains("pod"), "{text}");
    let mut bad = serde_json::from_slice::<serde_json::Value>(&pod("bad", 2)).unwrap();
    bad["metadata"]["annotations"] = json!({"metax-tech.com/gpu-group-size": "lots"});
    let (code, text) = evaluate(e, &serde_json::to_vec(&bad).unwrap());
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(text.contains("gpu-group-size"), "{text}");
    // A node the view lacks.
    let p = pod("nowhere", 2);
    let node = b"no-such-node";
    let mut error = std::ptr::null_mut();
    let code = unsafe {
        fumarole_task_allocate(
            e,
            p.as_ptr(),
            p.len(),
            node.as_ptr(),
            node.len(),
            &mut error,
        )
    };
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(take(error).contains("no-such-node"));
    // NULL engine and NULL buffers.
    let (code, text) = evaluate(std::ptr::null_mut(), &pod("x", 1));
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(text.contains("NULL"), "{text}");
    let mut out = std::ptr::null_mut();
    let code = unsafe { fumarole_task_evaluate(e, std::ptr::null(), 10, 0, &mut out) };
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(take(out).contains("NULL"));
    unsafe { fumarole_engine_free(e) };
}

#[test]
fn unimplemented_arguments_are_named_and_a_bad_configuration_refused() {
    let e = engine();
    let mut out = std::ptr::null_mut();
    assert_eq!(unsafe { fumarole_engine_notes(e, &mut out) }, FUMAROLE_OK);
    let notes = take(out);
    assert!(notes.contains("gpu-aware argument \"colour\""), "{notes}");
    unsafe { fumarole_engine_free(e) };

    let conf = br#"{"volcano":{"plugins":[{"name":"gpu-aware","arguments":{"weight":"heavy"}}]}}"#;
    let error = engine_with(conf).unwrap_err();
    assert!(error.contains("\"weight\" must be a number"), "{error}");
}

#[test]
fn prebind_keeps_the_allocated_choice_and_passes_other_pods_through() {
    let e = engine();
    let mut error = std::ptr::null_mut();
    assert_eq!(
        unsafe { fumarole_engine_write_choices_at_prebind(e, &mut error) },
        FUMAROLE_OK
    );
    let node = b"dgx-a";
    let four = pod("four", 4);
    let mut allocate = |p: &[u8]| unsafe {
        fumarole_task_allocate(
            e,
            p.as_ptr(),
            p.len(),
            node.as_ptr(),
            node.len(),
            &mut error,
        )
    };
    let prebind = |p: &[u8], n: &[u8]| unsafe {
        let mut error = std::ptr::null_mut();
        let code = fumarole_task_prebind(e, p.as_ptr(), p.len(), n.as_ptr(), n.len(), &mut error);
        (code, take(error))
    };
    assert_eq!(allocate(&four), FUMAROLE_OK);
    // The same pod on the same node: its allocation stands (dgx-a's 4 free GPUs stay held).
    assert_eq!(prebind(&four, node), (FUMAROLE_OK, String::new()));
    let (_, text) = evaluate(e, &pod("other", 4));
    assert_eq!(lines(&text)["dgx-a"].0, 2, "{text}");
    // A pod without accelerators is not ours; a node the view lacks is refused, with why.
    let cpu_only = serde_json::to_vec(&json!({"metadata": {"name": "cpu", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}))
    .unwrap();
    assert_eq!(prebind(&cpu_only, node).0, FUMAROLE_NOT_OURS);
    let (code, why) = prebind(&pod("lost", 1), b"nowhere");
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(why.contains("nowhere"), "{why}");
    unsafe { fumarole_engine_free(e) };
}

#[test]
fn write_choice_keeps_the_allocated_choice_and_commits_a_pod_not_allocated() {
    let e = engine();
    let mut error = std::ptr::null_mut();
    assert_eq!(
        unsafe { fumarole_engine_write_choices_at_prebind(e, &mut error) },
        FUMAROLE_OK
    );
    let write = |p: &[u8], n: &[u8]| unsafe {
        let mut error = std::ptr::null_mut();
        let code =
            fumarole_task_write_choice(e, p.as_ptr(), p.len(), n.as_ptr(), n.len(), &mut error);
        (code, take(error))
    };
    let allocate = |p: &[u8], n: &[u8]| unsafe {
        let mut error = std::ptr::null_mut();
        fumarole_task_allocate(e, p.as_ptr(), p.len(), n.as_ptr(), n.len(), &mut error)
    };
    let four = pod("four", 4);
    assert_eq!(allocate(&four, b"dgx-a"), FUMAROLE_OK);
    assert_eq!(write(&four, b"dgx-a"), (FUMAROLE_OK, String::new()));
    // Still one allocation: dgx-a's 4 free GPUs held, dgx-b's 6 free.
    let (_, text) = evaluate(e, &pod("other", 4));
    assert_eq!(lines(&text)["dgx-a"].0, 2, "{text}");
    assert_eq!(lines(&text)["dgx-b"].0, 0, "{text}");
    // A pod bound without an allocation of this engine's (another session's) is committed now.
    assert_eq!(
        write(&pod("late", 4), b"dgx-b"),
        (FUMAROLE_OK, String::new())
    );
    let (_, text) = evaluate(e, &pod("other", 4));
    assert_eq!(lines(&text)["dgx-b"].0, 2, "{text}");
    let (code, why) = write(&pod("lost", 1), b"nowhere");
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(why.contains("nowhere"), "{why}");
    unsafe { fumarole_engine_free(e) };
}

/// Volcano may bind a pod, and the writer of bound pods' choices write its allocated one,
/// before the session that bound it closes: the close's write then finds the choice in the
/// view and chooses nothing more (choosing again would hold a second set of devices).
#[test]
fn write_choice_leaves_a_choice_the_view_shows() {
    let e = engine();
    let mut error = std::ptr::null_mut();
    assert_eq!(
        unsafe { fumarole_engine_write_choices_at_prebind(e, &mut error) },
        FUMAROLE_OK
    );
    // two-dgx: serving/infer-0 is bound to dgx-b with its 1 GPU written; 6 of dgx-b's are free.
    let infer = serde_json::to_vec(&json!({
        "metadata": {"name": "infer-0", "namespace": "serving", "uid": "uid-infer-0"},
        "spec": {"schedulerName": "volcano", "nodeName": "dgx-b", "containers": [{"name": "main",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    let (n, mut error) = (b"dgx-b", std::ptr::null_mut());
    let code = unsafe {
        fumarole_task_write_choice(
            e,
            infer.as_ptr(),
            infer.len(),
            n.as_ptr(),
            n.len(),
            &mut error,
        )
    };
    assert_eq!((code, take(error)), (FUMAROLE_NOT_OURS, String::new()));
    let (_, text) = evaluate(e, &pod("six", 6));
    assert_eq!(lines(&text)["dgx-b"].0, 0, "{text}");
    unsafe { fumarole_engine_free(e) };
}

/// An engine over the `two-dgx` snapshot with the JSON configuration `conf`, or its error.
fn engine_with(conf: &[u8]) -> Result<*mut Engine, String> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scheduler-ext/tests/snapshots/two-dgx");
    let dir = dir.to_str().unwrap().as_bytes();
    let mut error = std::ptr::null_mut();
    let e = unsafe {
        fumarole_engine_over_snapshot(
            dir.as_ptr(),
            dir.len(),
            conf.as_ptr(),
            conf.len(),
            &mut error,
        )
    };
    if e.is_null() { Err(take(error)) } else { Ok(e) }
}

/// kube-scheduler's side: the profile's name and typed args, scores on kube-scheduler's
/// 0..100 scale (no Volcano weight), a bad argument refused by name, and a bind with no API
/// server an error (never a crash); nothing of ours passes through to the default binder.
#[test]
fn the_kube_scheduler_configuration_scores_0_to_100_and_bind_needs_an_api_server() {
    let bad = engine_with(br#"{"kubeScheduler":{"args":{"lossWieght":0.5}}}"#).unwrap_err();
    assert!(bad.contains("lossWieght"), "{bad}");
    let both = engine_with(br#"{"volcano":{},"kubeScheduler":{}}"#).unwrap_err();
    assert!(both.contains("one engine serves one scheduler"), "{both}");

    let e = engine_with(
        br#"{"kubeScheduler":{"schedulerNames":["default-scheduler"],"args":{"lossWeight":0.5}}}"#,
    )
    .unwrap();
    let four = serde_json::to_vec(&json!({
        "metadata": {"name": "four", "namespace": "default", "uid": "uid-four"},
        "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    }))
    .unwrap();
    let (code, lines) = evaluate(e, &four);
    assert_eq!(code, FUMAROLE_OK, "{lines}");
    let scores: Vec<f64> = lines
        .lines()
        .filter(|l| l.starts_with("0\t"))
        .map(|l| l.split('\t').nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(!scores.is_empty(), "{lines}");
    assert!(
        scores.iter().all(|s| (0.0..=100.0).contains(s)),
        "{scores:?}"
    );

    let node = b"dgx-a";
    let mut error = std::ptr::null_mut();
    let code = unsafe {
        fumarole_task_bind(
            e,
            four.as_ptr(),
            four.len(),
            node.as_ptr(),
            node.len(),
            &mut error,
        )
    };
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(take(error).contains("no API server"));
    let cpu = serde_json::to_vec(&json!({
        "metadata": {"name": "cpu", "namespace": "default", "uid": "uid-cpu"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}
    }))
    .unwrap();
    let code = unsafe {
        fumarole_task_bind(
            e,
            cpu.as_ptr(),
            cpu.len(),
            node.as_ptr(),
            node.len(),
            &mut error,
        )
    };
    assert_eq!(code, FUMAROLE_NOT_OURS);
    assert_eq!(unsafe { fumarole_engine_device_views(e) }, 0);
    assert_eq!(unsafe { fumarole_engine_device_views(std::ptr::null()) }, 0);
    unsafe { fumarole_engine_free(e) };
}

fn give_up_plan(e: *mut Engine, pod: &[u8]) -> (i32, String) {
    let mut out = std::ptr::null_mut();
    let code = unsafe { fumarole_task_give_up_plan(e, pod.as_ptr(), pod.len(), &mut out) };
    (code, take(out))
}

/// The nodes a pod fits on, by name.
fn fitting(e: *mut Engine, pod: &[u8]) -> Vec<String> {
    let (code, text) = evaluate(e, pod);
    assert_eq!(code, FUMAROLE_OK, "{text}");
    lines(&text)
        .into_iter()
        .filter(|(_, (code, _, _))| *code == 0)
        .map(|(node, _)| node)
        .collect()
}

/// A unit's plan given up through the ABI (kube-scheduler's other filters refused its
/// super-node) names the super-node, and the unit's next judgement plans it elsewhere; a pod
/// of no unit has nothing to give up (OK, no string); bad JSON is an error.
#[test]
fn a_units_plan_given_up_moves_it_to_another_super_node() {
    let e = engine();
    let mut unit = serde_json::from_slice::<serde_json::Value>(&pod("job-0", 2)).unwrap();
    unit["metadata"]["annotations"] = json!({"metax-tech.com/gpu-group-size": "4"});
    let unit = serde_json::to_vec(&unit).unwrap();
    let first = fitting(e, &unit);
    assert!(!first.is_empty());
    let (code, given_up) = give_up_plan(e, &unit);
    assert_eq!(code, FUMAROLE_OK, "{given_up}");
    assert!(!given_up.is_empty());
    let second = fitting(e, &unit);
    assert!(
        !second.is_empty() && second.iter().all(|n| !first.contains(n)),
        "planned on {first:?} first, then on {second:?} after giving up {given_up}"
    );
    assert_eq!(
        give_up_plan(e, &pod("lone", 2)),
        (FUMAROLE_OK, String::new())
    );
    let (code, text) = give_up_plan(e, b"{not json");
    assert_eq!(code, FUMAROLE_ERROR);
    assert!(text.contains("pod"), "{text}");
    unsafe { fumarole_engine_free(e) };
}
