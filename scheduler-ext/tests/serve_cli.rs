#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `fumarole-scheduler-ext serve --cluster-snapshot DIR` answers over real HTTP on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 exchange with `Connection: close`: (status line, body).
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}

/// `serve --cluster-snapshot tests/snapshots/<snapshot>` on a free port, healthy; `/ui` on
/// another free port.
/// Waits up to 20 s for the server on `port` to answer `/healthz` with 200.
fn wait_healthy(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match http(port, "GET", "/healthz", "") {
            Ok((status, _)) if status.contains(" 200 ") => return,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("server never became healthy: {other:?}"),
        }
    }
}

fn serve_snapshot(snapshot: &str) -> (Server, u16, u16) {
    let port = free_port();
    let ui = free_port();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(snapshot);
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
            .arg("serve")
            .arg("--cluster-snapshot")
            .arg(&dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--ui-listen")
            .arg(format!("127.0.0.1:{ui}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_healthy(port);
    (server, port, ui)
}

#[test]
fn serves_healthz_and_filter_from_a_snapshot() {
    let (_server, port, _ui) = serve_snapshot("two-dgx");
    let args = serde_json::json!({
        "Pod": {"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}},
        "NodeNames": ["dgx-a", "pcie-a"]
    });
    let (status, body) = http(port, "POST", "/kube-scheduler/filter", &args.to_string()).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    let r: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["NodeNames"], serde_json::json!(["dgx-a"]));
    assert_eq!(r["FailedNodes"]["pcie-a"], "needs 4 nvidia.com/gpu, 3 free");
    let (status, body) = http(port, "POST", "/kube-scheduler/filter", "{oops").unwrap();
    assert!(status.contains(" 400 "), "{status}");
    assert!(body.contains("malformed ExtenderArgs"), "{body}");
    // The binary serves /metrics with both filter calls counted.
    let (status, body) = http(port, "GET", "/metrics", "").unwrap();
    assert!(status.contains(" 200 "), "{status}");
    for line in [
        r#"fumarole_scheduler_ext_requests_total{protocol="kube-scheduler",verb="filter",code="200"} 1"#,
        r#"fumarole_scheduler_ext_requests_total{protocol="kube-scheduler",verb="filter",code="400"} 1"#,
    ] {
        assert!(body.lines().any(|l| l == line), "{line} missing:\n{body}");
    }
}

#[test]
fn ui_shows_super_nodes_devices_pending_pods_and_decisions() {
    let (_server, port, ui) = serve_snapshot("ui-cluster");
    // Never on the schedulers' port.
    let (status, _) = http(port, "GET", "/ui", "").unwrap();
    assert!(status.contains(" 404 "), "{status}");
    let page = |path: &str| {
        let (status, body) = http(ui, "GET", path, "").unwrap();
        assert!(status.contains(" 200 "), "{status}");
        body
    };
    let html = page("/ui");
    // Totals: dgx-a 4 free of 8, dgx-b 5 free (GPU 1 assumed for infer-0, GPU 7 unhealthy),
    // pcie-a 3 free of 4.
    assert!(
        html.contains("3 nodes · 12 free · 7 in use · 0 shared · 1 unhealthy accelerators"),
        "{html}"
    );
    assert!(html.contains(r#"http-equiv="refresh""#));
    // rack-1 holds dgx-a and dgx-b; each node's largest NVLink block is all it has free.
    let rack = &html[html.find(r#"data-id="rack-1""#).unwrap()..];
    let rack = &rack[..rack.find("</table>").unwrap()];
    assert!(rack.contains(r#"data-node="dgx-a""#) && rack.contains(r#"data-node="dgx-b""#));
    assert!(!rack.contains("pcie-a"));
    assert!(rack.contains(r#"<b class="fits">9</b> GPUs"#), "{rack}");
    assert_eq!(rack.matches(r#"class="dev unhealthy""#).count(), 1);
    // Pending pods and why: 8 GPUs fit nowhere, 2 fit now.
    assert!(html.contains(r#"data-pod="training/train-8""#));
    let train = &html[html.find(r#"data-pod="training/train-8""#).unwrap()..];
    let train = &train[..train.find("</tr>").unwrap()];
    assert!(train.contains("needs 8 nvidia.com/gpu"), "{train}");
    let infer = &html[html.find(r#"data-pod="serving/infer-2""#).unwrap()..];
    assert!(infer[..infer.find("</tr>").unwrap()].contains("waiting for the scheduler"));
    assert!(html.contains("no scoring asked for yet"));

    // A scoring shows up under Last decisions, with the same rows as explain.
    let args = serde_json::json!({
        "Pod": {"metadata": {"name": "p4", "namespace": "ml"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}},
        "NodeNames": ["dgx-a", "dgx-b", "pcie-a"]
    });
    let (status, _) = http(
        port,
        "POST",
        "/kube-scheduler/prioritize",
        &args.to_string(),
    )
    .unwrap();
    assert!(status.contains(" 200 "), "{status}");
    let html = page("/ui");
    let decision = &html[html.find(r#"class="decision" data-pod="ml/p4""#).unwrap()..];
    let decision = &decision[..decision.find("</table>").unwrap()];
    assert!(
        decision.contains("needs 4 nvidia.com/gpu, 3 free"),
        "{decision}"
    );
    assert_eq!(
        decision.matches(r#"class="ok">yes"#).count(),
        2,
        "{decision}"
    );
}

#[test]
fn serve_with_a_bad_snapshot_exits_1() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
        .arg("serve")
        .arg("--cluster-snapshot")
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no DeviceTopology or Node objects"));
}

#[test]
fn serve_flags_are_checked() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
            .args(args)
            .output()
            .unwrap()
    };
    let snapshot = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/two-dgx");
    // A certificate without its key is refused before anything starts.
    let out = run(&[
        "serve",
        "--cluster-snapshot",
        snapshot,
        "--tls-cert-file",
        "/x.pem",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key-file"));
    // Missing TLS files name the file.
    let out = run(&[
        "serve",
        "--cluster-snapshot",
        snapshot,
        "--listen",
        "127.0.0.1:0",
        "--tls-cert-file",
        "/nonexistent/cert.pem",
        "--tls-key-file",
        "/nonexistent/key.pem",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A live service's verbs without credentials on an address other than loopback are
    // refused (before the API server is even looked for)...
    let out = Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kube-scheduler and Volcano verbs would be open to anyone"),
        "{err}"
    );
    // ... and a client CA needs TLS to check certificates with.
    let out = run(&[
        "serve",
        "--cluster-snapshot",
        snapshot,
        "--client-ca-file",
        "/ca.pem",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-cert-file"));
    // Bad durations are refused by clap.
    let out = run(&[
        "serve",
        "--cluster-snapshot",
        snapshot,
        "--commit-ttl",
        "soon",
    ]);
    assert_eq!(out.status.code(), Some(2));
    // Without a snapshot and without an API server the error says where it looked.
    let out = Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("API server") || err.contains("kubeconfig"),
        "{err}"
    );
}

/// `serve --config FILE`: the file's settings hold (the snapshot, `/ui` off) and a flag wins
/// over the file (`--listen`); `explain` takes the settings it shares from the `serve` section;
/// a bad value stops it before anything starts, naming the file and the field.
#[test]
fn serve_and_explain_read_a_configuration_file_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx");
    let file = dir.path().join("scheduler-ext.yaml");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(
        &file,
        format!(
            "apiVersion: fumarole.dev/v1alpha1\nkind: SchedulerExtConfiguration\nserve:\n  \
             clusterSnapshot: {}\n  listen: {}\n  uiListen: 'off'\n  schedulerNames: [default-scheduler]\n",
            snapshot.display(),
            busy.local_addr().unwrap()
        ),
    )
    .unwrap();
    let port = free_port();
    let bin = env!("CARGO_BIN_EXE_fumarole-scheduler-ext");
    let _server = Server(
        Command::new(bin)
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .arg(format!("--listen=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_healthy(port);
    let pod = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pods/gpu4.yaml");
    let explain = |extra: &[&str]| {
        Command::new(bin)
            .arg("explain")
            .arg("--config")
            .arg(&file)
            .arg("--pod")
            .arg(&pod)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = explain(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("dgx-a"));
    let out = explain(&["--cluster-snapshot", "/nonexistent/from-flag"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/from-flag"));

    std::fs::write(
        &file,
        "apiVersion: fumarole.dev/v1alpha1\nkind: SchedulerExtConfiguration\nserve:\n  commitTtl: soon\n",
    )
    .unwrap();
    let out = Command::new(bin)
        .arg("serve")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: serve.commitTtl: invalid value \"soon\"",
            file.display()
        )),
        "{stderr}"
    );
}
