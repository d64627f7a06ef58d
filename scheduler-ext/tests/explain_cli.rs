#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `fumarole-scheduler-ext explain` on the committed two-dgx snapshot: the exact-fit node wins,
//! JSON keys are exactly the documented ones, bad input exits 1 with a message.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn explain(pod: &str, extra: &[&str]) -> Output {
    let d = dir();
    Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
        .arg("explain")
        .arg("--cluster-snapshot")
        .arg(d.join("snapshots/two-dgx"))
        .arg("--pod")
        .arg(d.join("pods").join(pod))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn json_has_the_documented_keys_and_the_exact_fit_first() {
    let out = explain("gpu4.yaml", &["--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_slice(&out.stdout).unwrap();
    let keys = [
        "devices", "feasible", "loss", "node", "q", "reason", "score",
    ];
    for r in &rows {
        let mut k: Vec<&str> = r.keys().map(String::as_str).collect();
        k.sort_unstable();
        assert_eq!(k, keys);
    }
    let by_node = |n: &str| rows.iter().find(|r| r["node"] == n).unwrap();
    assert_eq!(rows[0]["node"], "dgx-a");
    let a = by_node("dgx-a");
    assert_eq!(a["feasible"], true);
    assert_eq!(a["q"], 1.0);
    assert_eq!(a["loss"], 0.0);
    assert_eq!(a["score"], 100.0);
    assert_eq!(a["devices"].as_array().unwrap().len(), 4);
    // dgx-b: GPU 0 allocated, GPU 1 assumed by a bound pod, GPU 2's pod has finished: 6 free.
    let b = by_node("dgx-b");
    assert_eq!(b["loss"], 0.5);
    assert_eq!(b["score"], 75.0);
    assert_eq!(b["devices"][0], "GPU-f55b88b0-0000-4000-8000-000000000002");
    let p = by_node("pcie-a");
    assert_eq!(p["feasible"], false);
    assert_eq!(p["reason"], "needs 4 nvidia.com/gpu, 3 free");
    assert!(p["score"].is_null());
    assert_eq!(
        by_node("cpu-0")["reason"],
        "node publishes no DeviceTopology"
    );
}

#[test]
fn table_names_request_and_nodes() {
    let out = explain("gpu4.yaml", &[]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "pod training/train-0 requests 4 nvidia.com/gpu");
    assert!(lines[1].starts_with("NODE"));
    assert!(lines[2].starts_with("dgx-a "));
    assert!(text.contains("needs 4 nvidia.com/gpu, 3 free"));
}

#[test]
fn bad_input_exits_1_with_a_message() {
    for (pod, needle) in [
        ("cpu-only.yaml", "requests no accelerator resource"),
        ("ascend.yaml", "huawei.com/Ascend910, which no node"),
        ("malformed.yaml", "malformed.yaml: not a Pod object"),
        ("missing.yaml", "reading"),
    ] {
        let out = explain(pod, &[]);
        assert_eq!(out.status.code(), Some(1), "{pod}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{pod}: {err}");
        assert!(!err.contains("panicked"), "{pod}: {err}");
    }
    // A malformed snapshot.
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("x.yaml"), "kind: DeviceTopology\nspec: [\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
        .args(["explain", "--pod"])
        .arg(dir().join("pods/gpu4.yaml"))
        .arg("--cluster-snapshot")
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("x.yaml: document 1"));
}
