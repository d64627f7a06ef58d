//! `fumarole-demo` (`scripts/demo.sh`), run as a user runs it, with both plugins (the default)
//! and with the extension: the whole default cluster comes up, every workload lands, the
//! scheduler's device choice is what each kubelet gave, the job's units each sit in one
//! super-node; Ctrl-C (SIGINT) stops every process it started; a busy `/ui` port is refused
//! before anything starts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fumarole_e2e::cluster::free_port;
use fumarole_e2e::fumarole::kubectl_plugin_bin;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const DEMO: &str = env!("CARGO_BIN_EXE_fumarole-demo");

/// Processes whose command line names `root` (every process the demo starts gets a path under
/// its temp dir).
fn processes_under(root: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(root) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// The demo's temp dir, from its `kubectl: export KUBECONFIG=<root>/admin.kubeconfig` line.
fn root_of(output: &str) -> String {
    let line = output
        .lines()
        .find_map(|l| l.strip_prefix("kubectl: export KUBECONFIG="))
        .unwrap_or_else(|| panic!("no KUBECONFIG line in:\n{output}"));
    line.trim_end_matches("/admin.kubeconfig").to_string()
}

/// The placement table's row for `pod`, split in columns.
fn row<'a>(output: &'a str, pod: &str) -> Vec<&'a str> {
    output
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pod))
        .unwrap_or_else(|| panic!("no row for {pod} in:\n{output}"))
        .split_whitespace()
        .collect()
}

/// The running demo; interrupted and waited for when dropped, so a failing test leaves no demo
/// (and no cluster) behind.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGINT);
        let _ = self.0.wait();
    }
}

/// One demo at a time: each runs seven nodes and agents, two would crowd the machine.
static ONE_DEMO: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The default: both plugins, the DGX nodes Volcano's and the Atlas and PCIe nodes
/// kube-scheduler's (node pools).
#[test]
fn the_demo_places_every_workload_and_stops_on_ctrl_c() {
    demo_places_every_workload_and_stops_on_ctrl_c("plugins");
}

/// The same through the extension (one ledger for both schedulers, and the `/ui` page).
#[test]
fn the_demo_with_the_extender_places_every_workload_and_stops_on_ctrl_c() {
    demo_places_every_workload_and_stops_on_ctrl_c("extender");
}

fn demo_places_every_workload_and_stops_on_ctrl_c(with: &str) {
    let _one = ONE_DEMO
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ui_port = free_port().unwrap();
    let mut demo = Demo(
        Command::new(DEMO)
            .arg(format!("--with={with}"))
            .arg(format!("--ui-port={ui_port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = &mut demo.0;
    let mut output = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        output.push_str(&line);
        output.push('\n');
        if line.starts_with("Running; Ctrl-C") {
            break;
        }
    }
    if !output.contains("Running; Ctrl-C") {
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        panic!(
            "the demo stopped early:\n{output}\n{stderr}\nexit: {:?}",
            child.wait()
        );
    }
    eprintln!("{output}");

    // pytorch-demo: one 8-GPU node each, through Volcano, two units of two pods, each unit in
    // one super-node and the two units in different ones.
    for pod in [
        "pytorch-demo-master-0",
        "pytorch-demo-worker-0",
        "pytorch-demo-worker-1",
        "pytorch-demo-worker-2",
    ] {
        let r = row(&output, pod);
        assert_eq!(r[1], "volcano", "{r:?}");
        assert_eq!((r[5], r[6], r[7]), ("0-7", "0-7", "yes"), "{r:?}");
    }
    let sn = |pod: &str| row(&output, pod)[3].to_string();
    assert_eq!(sn("pytorch-demo-master-0"), sn("pytorch-demo-worker-0"));
    assert_eq!(sn("pytorch-demo-worker-1"), sn("pytorch-demo-worker-2"));
    assert_ne!(sn("pytorch-demo-master-0"), sn("pytorch-demo-worker-1"));
    assert!(output.contains("unit 0: whole in super-node"), "{output}");
    assert!(output.contains("unit 1: whole in super-node"), "{output}");
    // The 4-GPU pod: only the PCIe server has 4 GPUs left, and the explain rows say so.
    let r = row(&output, "train-4gpu");
    assert_eq!(
        (r[1], r[2], r[5], r[6], r[7]),
        ("default-scheduler", "pcie-0", "0-3", "0-3", "yes")
    );
    assert!(
        output.contains("needs 4 nvidia.com/gpu, 0 free"),
        "{output}"
    );
    // The NPU pod: one Ascend 910 on an Atlas node, the same one chosen and given.
    let r = row(&output, "infer-1npu");
    assert!(r[2].starts_with("atlas-"), "{r:?}");
    assert_eq!(r[5], r[6], "{r:?}");
    assert_eq!(r[7], "yes", "{r:?}");
    // The best-effort pod: placed without devices, its QoS level shown.
    let r = row(&output, "batch-be");
    assert_eq!((r[4], r[5], r[6]), ("BE", "-", "-"), "{r:?}");
    assert!(
        !output.lines().any(|l| l.ends_with("  NO")),
        "a choice differs from what a kubelet gave:\n{output}"
    );
    if with == "plugins" {
        assert!(
            output.contains("starting kube-scheduler-fumarole (node pool \"kube\")"),
            "{output}"
        );
        // kube-scheduler's explain rows: the DGX nodes are Volcano's pool.
        assert!(
            output.contains("this scheduler places accelerator pods in node pool \"kube\""),
            "{output}"
        );
    } else {
        let page = format!("http://127.0.0.1:{ui_port}/ui");
        assert!(output.contains(&page), "{output}");
    }

    let root = root_of(&output);
    // The demo's cluster through `kubectl fumarole top`, with the KUBECONFIG it printed: every
    // GPU of the four DGX nodes is in use (the job), 4 of the PCIe server's (train-4gpu) and
    // one NPU (infer-1npu).
    let top = Command::new(kubectl_plugin_bin().unwrap())
        .args(["top", "-o", "json"])
        .env("KUBECONFIG", format!("{root}/admin.kubeconfig"))
        .output()
        .unwrap();
    assert!(top.status.success(), "{top:?}");
    let usage: serde_json::Value = serde_json::from_slice(&top.stdout).unwrap();
    let in_use = |node: &str| {
        usage["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == node)
            .unwrap_or_else(|| panic!("{node} not in {usage}"))["inUse"]
            .as_u64()
            .unwrap()
    };
    for dgx in ["dgx-a0", "dgx-a1", "dgx-b0", "dgx-b1"] {
        assert_eq!(in_use(dgx), 8, "{usage}");
    }
    assert_eq!(in_use("pcie-0"), 4, "{usage}");
    assert_eq!(in_use("atlas-a") + in_use("atlas-b"), 1, "{usage}");

    let running = processes_under(&root);
    // etcd, kube-apiserver, 7 harness nodes, 7 agents, the two schedulers (and the extension).
    let least = if with == "plugins" { 18 } else { 19 };
    assert!(running.len() >= least, "{running:#?}");

    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {rest:?}");
    assert!(
        rest.iter()
            .any(|l| l.contains("nothing it started is left running")),
        "{rest:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_under(&root).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(processes_under(&root), Vec::<String>::new());
    assert!(!std::path::Path::new(&root).exists(), "{root} left behind");
}

#[test]
fn a_busy_ui_port_is_refused_before_anything_starts() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let out = Command::new(DEMO)
        .args(["--with=extender", &format!("--ui-port={port}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "port {port} on 127.0.0.1 (the /ui page) is not free"
        )) && stderr.contains("--ui-port"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("starting"), "{stdout}");
}
