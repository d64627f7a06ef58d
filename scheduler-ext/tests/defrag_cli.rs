#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `fumarole-scheduler-ext defrag` on the committed `defrag` snapshot: the one movable pod that
//! keeps a super-node from the waiting 2 x 8-GPU unit is named with its destination; without
//! its controller it is not moved and the reason says why; bad input exits 1 with a message.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn snapshot() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/defrag")
}

fn defrag(path: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
        .arg("defrag")
        .arg("--cluster-snapshot")
        .arg(path)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn json_names_the_one_move_and_its_destination() {
    let out = defrag(&snapshot(), &["-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["unit"]["name"], "unit 0 of job ml/train (atomic part 0)");
    assert_eq!(v["unit"]["pods"], 2);
    assert_eq!(v["target"], "rack-a");
    let moves = v["moves"].as_array().unwrap();
    assert_eq!(moves.len(), 1, "{v}");
    assert_eq!(moves[0]["pod"], "ml/web-7d9f");
    assert_eq!(moves[0]["from"], "a1");
    assert_eq!(moves[0]["devices"][0], "GPU-a1-3");
    // b0 is the only node outside rack-a; its pinned pods hold GPUs 0-2.
    assert_eq!(moves[0]["to"], "b0");
    assert_eq!(moves[0]["toDevices"][0], "GPU-b0-3");
    assert_eq!(moves[0]["restarts"], 1);
    assert_eq!(v["freed"], 1);
    let nodes: Vec<&str> = v["placement"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["a0", "a1"]);
    assert!(v["reason"].is_null());
}

#[test]
fn table_has_the_gain_and_one_row_per_move() {
    let out = defrag(&snapshot(), &[]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "waiting: unit 0 of job ml/train (atomic part 0) asks 2 pods of 8 nvidia.com/gpu in one super-node"
    );
    assert!(lines[1].contains("becomes placeable in rack-a"), "{text}");
    assert!(lines[2].starts_with("POD "), "{text}");
    assert!(lines[3].starts_with("ml/web-7d9f "), "{text}");
    assert_eq!(lines.len(), 4, "{text}");
}

/// The same cluster with web's pod owned by nobody: nothing may move, and the reason says so.
#[test]
fn a_pod_without_controller_is_not_moved() {
    let d = tempfile::tempdir().unwrap();
    for f in ["devicetopologies.yaml", "nodes.yaml"] {
        std::fs::copy(snapshot().join(f), d.path().join(f)).unwrap();
    }
    let pods = std::fs::read_to_string(snapshot().join("pods.yaml")).unwrap();
    let bare = pods.replacen("      controller: true\n", "      controller: false\n", 1);
    assert_ne!(bare, pods);
    std::fs::write(d.path().join("pods.yaml"), bare).unwrap();
    let out = defrag(d.path(), &["-o", "json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["moves"].as_array().unwrap().is_empty(), "{v}");
    let why = v["reason"].as_str().unwrap();
    assert!(
        why.contains("no move of a movable pod makes room for unit 0 of job ml/train")
            && why.contains("rack-b holds 1 such pods even empty"),
        "{why}"
    );
}

#[test]
fn bad_input_exits_1_with_a_message() {
    let d = tempfile::tempdir().unwrap();
    let out = defrag(&d.path().join("missing"), &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("reading"), "{err}");
    let bad = d.path().join("bad.yaml");
    std::fs::write(&bad, "kind: DeviceTopology\nspec: [\n").unwrap();
    let out = defrag(&bad, &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml: document 1"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let empty = d.path().join("empty.yaml");
    std::fs::write(&empty, "kind: ConfigMap\nmetadata:\n  name: x\n").unwrap();
    let out = defrag(&empty, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no DeviceTopology or Node objects"));
}
