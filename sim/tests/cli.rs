#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `fumarole-sim run` and `generate-trace` through the real binary: a committed
//! trace end to end (JSON figures, SVG plots), the committed traces are exactly what the
//! command in their first line writes, and bad input exits with a message naming it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces")
}

fn bin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fumarole-sim"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_committed_trace_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let trace = traces().join("atlas-800-910-32.jsonl");
    let out = bin(&[
        "run",
        "--cluster",
        "32xatlas-800-910:4",
        "--trace",
        trace.to_str().unwrap(),
        "--policy",
        "fumarole",
        "--policy",
        "binpack",
        "--format",
        "json",
        "--plot-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cluster"], "32xatlas-800-910:4");
    assert_eq!(v["devices"], 256);
    let ps = v["policies"].as_array().unwrap();
    let names: Vec<&str> = ps.iter().map(|p| p["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["fumarole", "binpack"]);
    let n = |p: &serde_json::Value, k: &str| p[k].as_f64().unwrap();
    for p in ps {
        assert_eq!(n(p, "jobs"), 1000.0);
        assert_eq!(n(p, "placed") + n(p, "never_placed"), 1000.0);
        assert!(n(p, "ideal_jobs") <= n(p, "placed"));
        assert!(n(p, "stranded_share") >= 0.0 && n(p, "stranded_share") <= 1.0);
    }
    let (f, b) = (&ps[0], &ps[1]);
    // fumarole never breaks an atomic part, and on this trace keeps more jobs on ideal links
    // and fewer units split than binpack.
    assert_eq!(n(f, "atomic_split"), 0.0);
    assert!(n(b, "atomic_split") > 0.0);
    assert!(n(f, "ideal_jobs") / n(f, "placed") > n(b, "ideal_jobs") / n(b, "placed"));
    assert!(n(f, "units_split") < n(b, "units_split"));
    for (file, needle) in [
        (
            "atlas-800-910-32.stranded.svg",
            r#"<polyline class="series" data-policy="fumarole""#,
        ),
        (
            "atlas-800-910-32.metrics.svg",
            r#"<rect class="bar" data-policy="binpack""#,
        ),
    ] {
        let svg = std::fs::read_to_string(dir.path().join(file)).unwrap();
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains(needle), "{file}");
    }
    // The table names every policy asked for.
    let out = bin(&[
        "run",
        "--cluster",
        "32xatlas-800-910:4",
        "--trace",
        trace.to_str().unwrap(),
        "--policy",
        "nvidia",
        "--format",
        "markdown",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("| nvidia | "), "{text}");
}

#[test]
fn committed_traces_are_what_their_command_writes() {
    let mut seen = 0;
    for entry in std::fs::read_dir(traces()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap();
        let cmd = first
            .strip_prefix("# fumarole-sim ")
            .unwrap_or_else(|| panic!("{}: first line {first:?}", path.display()));
        let args: Vec<&str> = cmd.split_whitespace().collect();
        let out = bin(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            out.stdout == text.as_bytes(),
            "{} differs from `{cmd}`",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 2);
}

#[test]
fn bad_input_is_named_and_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"job\":\"a\",\"arrival\":0,\"duration\":5,\"pods\":1,\"devices\":1}\n{\"job\":\"b\",\"arrival\":\"soon\"}\n",
    )
    .unwrap();
    let good = traces().join("atlas-800-910-32.jsonl");
    let cases: [(Vec<&str>, &str); 6] = [
        (
            vec!["--cluster", "4xdgx-h100", "--trace", bad.to_str().unwrap()],
            "bad.jsonl line 2: invalid type: string \"soon\"",
        ),
        (
            vec!["--cluster", "4xdgx-a100", "--trace", good.to_str().unwrap()],
            "unknown node fixture \"dgx-a100\"",
        ),
        (
            vec![
                "--cluster",
                "4xdgx-h100",
                "--trace",
                good.to_str().unwrap(),
                "--policy",
                "tetris",
            ],
            "unknown policy \"tetris\"",
        ),
        (
            vec!["--cluster", "4xdgx-h100", "--trace", "/nonexistent/t.jsonl"],
            "reading /nonexistent/t.jsonl",
        ),
        (
            vec![
                "--cluster",
                "4xpcie-4gpu",
                "--trace",
                good.to_str().unwrap(),
            ],
            "8 devices per pod, but a pcie-4gpu node has 4",
        ),
        (
            vec![
                "--cluster",
                "4xdgx-h100",
                "--trace",
                good.to_str().unwrap(),
                "--reservation-ttl",
                "20years",
            ],
            "--reservation-ttl must be at most",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["run"];
        all.extend(args);
        let out = bin(&all);
        let err = stderr(&out);
        assert!(!out.status.success(), "{all:?}");
        assert!(err.contains(want), "{all:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = bin(&["generate-trace", "--cluster", "8xdgx-h100", "--load=-1"]);
    assert!(stderr(&out).contains("--load must be a number > 0, got -1"));
}

/// `sweep` through the binary at its smallest: one tiny trace, two policies, Markdown out.
#[test]
fn a_tiny_sweep_end_to_end() {
    let out = bin(&[
        "sweep",
        "--cluster",
        "8xatlas-800-910:2",
        "--load",
        "0.9",
        "--seeds",
        "1",
        "--jobs",
        "30",
        "--policy",
        "fumarole",
        "--policy",
        "volcano-hard",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("1 traces of 30 jobs: clusters 8xatlas-800-910:2"),
        "{text}"
    );
    assert!(text.contains("| volcano-hard |"), "{text}");
    assert!(
        text.contains("| atlas-800-910-8 load 0.9 seed 101 |"),
        "{text}"
    );
    assert!(
        text.contains("atomic parts broken (target 0): 0 of"),
        "{text}"
    );
    let out = bin(&["sweep", "--load=0", "--jobs", "5"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--load must be a number > 0, got 0"));
}

/// docs/placement.md's figures for the Atlas trace are what the simulator prints today (the two DGX
/// traces take longer in a debug build; they come from the same code).
#[test]
fn documented_figures_are_current() {
    let trace = traces().join("atlas-800-910-32.jsonl");
    let out = bin(&[
        "run",
        "--cluster",
        "32xatlas-800-910:4",
        "--trace",
        trace.to_str().unwrap(),
        "--format",
        "markdown",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/placement.md"))
            .unwrap();
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(rows.len(), 8, "{table}");
    for row in rows {
        assert!(
            doc.contains(row),
            "docs/placement.md lacks this row of `fumarole-sim run` output (rerun the commands there):\n{row}"
        );
    }
}

/// `run --jobs-out` writes one line per job and policy, and its delays are the ones the
/// figures are made of (their mean is the reported mean queueing delay).
#[test]
fn jobs_out_lists_every_job_of_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.jsonl");
    let jobs_out = dir.path().join("jobs.jsonl");
    let out = bin(&[
        "generate-trace",
        "--cluster",
        "8xatlas-800-910:2",
        "--jobs",
        "60",
        "--seed",
        "7",
        "--load",
        "1.1",
        "--out",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = |policies: &[&str], jobs_out: &Path| {
        let mut args = vec![
            "run",
            "--cluster",
            "8xatlas-800-910:2",
            "--trace",
            trace.to_str().unwrap(),
            "--format",
            "json",
            "--jobs-out",
            jobs_out.to_str().unwrap(),
        ];
        for p in policies {
            args.extend(["--policy", p]);
        }
        bin(&args)
    };
    let out = run(&["fumarole", "volcano-hard"], &jobs_out);
    assert!(out.status.success(), "{}", stderr(&out));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&jobs_out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2 * 60);
    for (i, policy) in ["fumarole", "volcano-hard"].into_iter().enumerate() {
        let mine: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l["policy"] == policy).collect();
        assert_eq!(mine.len(), 60, "{policy}");
        let mut delays = Vec::new();
        for l in &mine {
            let Some(start) = l["start"].as_u64() else {
                assert!(l["delay"].is_null() && l["nodes"].as_array().unwrap().is_empty());
                continue;
            };
            let delay = l["delay"].as_u64().unwrap();
            assert_eq!(start - l["arrival"].as_u64().unwrap(), delay, "{l}");
            let pods = l["pods"].as_u64().unwrap() as usize;
            assert_eq!(l["nodes"].as_array().unwrap().len(), pods, "{l}");
            assert_eq!(l["super_nodes"].as_array().unwrap().len(), pods, "{l}");
            delays.push(delay as f64);
        }
        let mean = delays.iter().sum::<f64>() / delays.len() as f64;
        let reported = figures["policies"][i]["delay_mean"].as_f64().unwrap();
        assert!(
            (mean - reported).abs() < 1e-6,
            "{policy}: {mean} vs {reported}"
        );
    }
    // A path that cannot be written is an error naming it, not a panic.
    let out = run(&["binpack"], &dir.path().join("missing/jobs.jsonl"));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("missing/jobs.jsonl"),
        "{}",
        stderr(&out)
    );
}
