//! `fumarole-scheduler-ext serve --cluster-snapshot` with its `/ui` page in a real headless
//! Chromium (Debian's, driven by playwright-core from `e2e/ui/`): the page shows the snapshot's
//! super-nodes, device grids, pending pods and reasons; a scoring asked for afterwards appears
//! by itself when the page refreshes. The screenshot is saved (path printed) for people to look
//! at.
//!
//! Needs `node`, `/usr/bin/chromium` and `e2e/ui/node_modules` (`e2e/ci.sh` installs them).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port, http_get, http_post_json};
use fumarole_e2e::fumarole::scheduler_ext_bin;
use fumarole_e2e::process::Proc;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn ui_in_headless_chromium() {
    let ui_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui");
    assert!(
        ui_dir.join("node_modules/playwright-core").is_dir()
            && Path::new("/usr/bin/chromium").exists(),
        "needs e2e/ui/node_modules and /usr/bin/chromium: run e2e/ci.sh, which installs them"
    );
    let logs = tempfile::tempdir().unwrap();
    let snapshot =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scheduler-ext/tests/snapshots/ui-cluster");
    let port = free_port().unwrap();
    let ui = free_port().unwrap();
    let _ext = Proc::spawn(
        "fumarole-scheduler-ext",
        &scheduler_ext_bin().unwrap(),
        &[
            "serve".to_string(),
            format!("--cluster-snapshot={}", snapshot.display()),
            format!("--listen=127.0.0.1:{port}"),
            format!("--ui-listen=127.0.0.1:{ui}"),
        ],
        logs.path(),
    )
    .unwrap();
    eventually("/healthz", Duration::from_secs(20), || async move {
        Ok(http_get(port, "/healthz")
            .await
            .ok()
            .filter(|r| r.contains(" 200 "))
            .map(drop))
    })
    .await
    .unwrap();

    let shot = std::env::temp_dir().join("fumarole-ui.png");
    let mut browser = Command::new("node")
        .current_dir(&ui_dir)
        .args([
            "screenshot.mjs",
            &format!("http://127.0.0.1:{ui}/ui"),
            "h2.super-node",
            &shot.display().to_string(),
            r#"h3.decision[data-pod="ml/p4"]"#,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(browser.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();

    assert_eq!(first["title"], "fumarole cluster");
    assert!(
        first["totals"]
            .as_str()
            .unwrap()
            .starts_with("3 nodes · 12 free · 7 in use · 0 shared · 1 unhealthy"),
        "{first}"
    );
    assert_eq!(first["superNodes"], json!(["rack-1", ""]));
    assert_eq!(
        first["nodes"],
        json!([
            {"node": "dgx-a", "free": 4, "used": 4, "unhealthy": 0},
            {"node": "dgx-b", "free": 5, "used": 2, "unhealthy": 1},
            {"node": "pcie-a", "free": 3, "used": 1, "unhealthy": 0},
        ])
    );
    // Pending pods are listed in pod-key order (ml/infer-2, ml/train-8).
    let pending: Vec<&str> = first["pending"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert_eq!(pending.len(), 2, "{first}");
    assert!(
        pending[0].contains("waiting for the scheduler"),
        "{pending:?}"
    );
    assert!(pending[1].contains("needs 8 nvidia.com/gpu"), "{pending:?}");
    assert_eq!(first["decisions"], json!([]));
    // The grid is drawn: 16 px squares in the free colour.
    assert_eq!(first["deviceBox"], json!([16, 16]));
    assert_eq!(first["freeColor"], "rgb(67, 160, 71)");

    // A scoring made now shows up when the page refreshes itself (no reload from the test).
    let args = json!({
        "Pod": {"metadata": {"name": "p4", "namespace": "ml"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}},
        "NodeNames": ["dgx-a", "dgx-b", "pcie-a"]
    });
    http_post_json(port, "/kube-scheduler/prioritize", &args)
        .await
        .unwrap();
    let second: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(second["decisions"], json!(["ml/p4"]));
    assert!(browser.wait().unwrap().success());
    let size = std::fs::metadata(&shot).unwrap().len();
    assert!(
        size > 10_000,
        "screenshot {} is {size} bytes",
        shot.display()
    );
    eprintln!("screenshot: {}", shot.display());
}
