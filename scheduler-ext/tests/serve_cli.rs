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

#[test]
fn serves_healthz_and_filter_from_a_snapshot() {
    let port = free_port();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx");
    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_fumarole-scheduler-ext"))
            .arg("serve")
            .arg("--cluster-snapshot")
            .arg(&dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match http(port, "GET", "/healthz", "") {
            Ok((status, _)) if status.contains(" 200 ") => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("server never became healthy: {other:?}"),
        }
    }
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
