//! `fumarole-agent discover` as a user meets it: this host, hwloc XML input, and bad input
//! (each error names the path and the problem, exits 1, never panics); `run --config FILE`
//! and `config check FILE`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fumarole-agent"))
        .args(args)
        .output()
        .unwrap()
}

fn corpus(name: &str) -> String {
    let dir = std::env::var("FUMAROLE_HWLOC_CORPUS").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/fixtures/hwloc-linux")
            .display()
            .to_string()
    });
    format!("{dir}/{name}")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Exit status 1 and an `error:` line that mentions every `needle`.
fn fails_with(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in {stderr}");
    }
}

#[test]
fn discovers_this_host_by_default() {
    let v = json(&agent(&["discover", "--format", "json"]));
    let pus = v["summary"]["pus"].as_u64().unwrap();
    assert!(pus >= 1);
    assert_eq!(v["processingUnits"].as_array().unwrap().len() as u64, pus);
    let table = agent(&["discover"]);
    assert!(String::from_utf8_lossy(&table.stdout).starts_with("Node "));
}

#[test]
fn reads_hwloc_xml() {
    // hwloc's XML output for a machine with a PCI tree whose only display device is a Matrox
    // BMC VGA: not an accelerator.
    let v = json(&agent(&[
        "discover",
        "--format",
        "json",
        "--from-xml",
        &corpus("40intel64-2g2n4c+pci.output"),
    ]));
    let s = &v["summary"];
    assert_eq!(
        (
            s["packages"].as_u64(),
            s["cores"].as_u64(),
            s["accelerators"].as_u64()
        ),
        (Some(4), Some(40), Some(0))
    );
    // A Xeon Phi co-processor (class 0x0b40) is an accelerator of kind "other".
    let v = json(&agent(&[
        "discover",
        "--format",
        "json",
        "--from-xml",
        &corpus("32em64t-2n8c+1mic.output"),
    ]));
    assert_eq!(v["summary"]["accelerators"], 1);
    assert_eq!(v["devices"][0]["kind"], "other");
    assert_eq!(v["devices"][0]["numaNode"], 1);
}

#[test]
fn yaml_and_matrix_formats() {
    let out = agent(&["discover", "--fixture", "pcie-4gpu", "--format", "yaml"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("summary:\n  packages: 1\n"), "{text}");
    let out = agent(&["discover", "--fixture", "pcie-4gpu", "--format", "matrix"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().nth(1).unwrap();
    assert!(
        first.starts_with("GPU0  X     PIX   PHB   PHB   0-63"),
        "{text}"
    );
    assert!(text.contains("PIX  = at most a single PCIe bridge"));
}

#[test]
fn bad_input_is_a_clear_error() {
    fails_with(
        &agent(&["discover", "--root", "/nonexistent/root"]),
        &["/nonexistent/root", "no such directory"],
    );
    fails_with(
        &agent(&["discover", "--from-xml", "/nonexistent.xml"]),
        &["/nonexistent.xml", "no such file"],
    );
    fails_with(
        &agent(&["discover", "--fixture", "dgx-h900"]),
        &["dgx-h900", "dgx-h100, atlas-800t-a2"],
    );

    let dir = tempfile::tempdir().unwrap();
    let corrupt = dir.path().join("corrupt.xml");
    std::fs::write(&corrupt, "<topology><object type=").unwrap();
    let corrupt = corrupt.to_str().unwrap();
    fails_with(
        &agent(&["discover", "--from-xml", corrupt]),
        &[corrupt, "cannot be read as hwloc XML"],
    );

    let bad = dir.path().join("override.yaml");
    std::fs::write(
        &bad,
        "linkZones: {class: hccs, zones: [[\"0000:99:00.0\"]]}",
    )
    .unwrap();
    let bad = bad.to_str().unwrap();
    fails_with(
        &agent(&["discover", "--fixture", "metax-c500-8", "--override", bad]),
        &[bad, "0000:99:00.0", "not an accelerator on this node"],
    );
    fails_with(
        &agent(&[
            "discover",
            "--fixture",
            "metax-c500-8",
            "--override",
            "/nonexistent/override.yaml",
        ]),
        &["/nonexistent/override.yaml"],
    );
    let nvml = dir.path().join("nvml.json");
    std::fs::write(&nvml, "{\"gpus\": [{\"pciBusId\": 7}]}").unwrap();
    let nvml = nvml.to_str().unwrap();
    fails_with(
        &agent(&["discover", "--fixture", "dgx-h100", "--nvml-answers", nvml]),
        &[nvml, "recorded NVML answers"],
    );

    // A root with garbage in the files accelerators are read from still discovers.
    let root = dir.path().join("root");
    let fixture = fumarole_exporter::fixtures::get("pcie-4gpu").unwrap();
    fixture.materialize(&root).unwrap();
    for entry in std::fs::read_dir(root.join("sys/bus/pci/devices")).unwrap() {
        let dev = entry.unwrap().path();
        std::fs::write(dev.join("numa_node"), "garbage\0").unwrap();
        std::fs::write(dev.join("local_cpulist"), "0-\u{fffd}").unwrap();
    }
    std::fs::write(
        root.join("proc/driver/nvidia/gpus/0000:44:00.0/information"),
        [0xff, 0xfe, 0x00],
    )
    .unwrap();
    let v = json(&agent(&[
        "discover",
        "--format",
        "json",
        "--root",
        root.to_str().unwrap(),
    ]));
    assert_eq!(v["summary"]["accelerators"], 4);
}

#[test]
fn deployed_crd_matches_the_rust_types() {
    let out = agent(&["crd"]);
    assert!(out.status.success());
    let deployed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/crds/devicetopologies.topology.fumarole.dev.yaml"),
    )
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        deployed,
        "deploy/crds is stale: run `fumarole-agent crd > deploy/crds/devicetopologies.topology.fumarole.dev.yaml`"
    );
}

#[test]
fn run_reads_a_configuration_file_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.yaml");
    let head = "apiVersion: fumarole.dev/v1alpha1\nkind: AgentConfiguration\n";
    std::fs::write(
        &file,
        format!("{head}run:\n  root: /nonexistent/from-file\n  recheckInterval: 30s\n  compatLabels: true\n"),
    )
    .unwrap();
    let f = file.to_str().unwrap();
    fails_with(
        &agent(&["run", "--config", f]),
        &["--root /nonexistent/from-file: no such directory"],
    );
    fails_with(
        &agent(&["run", "--config", f, "--root", "/nonexistent/from-flag"]),
        &["--root /nonexistent/from-flag: no such directory"],
    );
    // One of a group: a --fixture on the command line drops the file's --root.
    let out = agent(&["run", "--config", f, "--fixture", "cpu-only"]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("from-file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = agent(&["config", "check", f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "run\n--root=/nonexistent/from-file\n--recheck-interval=30s\n--compat-labels\n"
    );

    // A bad file: exit 2 before anything starts, naming the file and the field.
    std::fs::write(&file, format!("{head}run:\n  recheckInterval: ten\n")).unwrap();
    let out = agent(&["run", "--config", f]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{f}: run.recheckInterval: invalid duration \"ten\""
        )),
        "{stderr}"
    );
    std::fs::write(&file, format!("{head}run:\n  recheckEvery: 1s\n")).unwrap();
    let out = agent(&["config", "check", f]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("run.recheckEvery: unknown field"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
