//! `fumarole-agent run --standalone --device-plugin-config FILE` against the kubelet's own
//! device-manager client (`kubelet-dm`): a renamed resource registers, its devices follow the
//! configured device nodes (health both ways), and `Allocate` returns the configured env var,
//! value, device nodes and CDI names; a bad file stops the agent with a message naming the file,
//! the entry and the field.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fumarole_e2e::fumarole::fixture_root;
use fumarole_e2e::{AgentBuilder, KubeletDm};
use serde_json::{Value, json};
/// The agent, standalone, on a fixture node written out as a root, its device plugins
/// configured by `config`.
fn agent(root: &Path, plugins: &Path, config: &Path) -> AgentBuilder {
    AgentBuilder::root(root)
        .standalone()
        .device_plugin_dir(plugins)
        .path_flag("--device-plugin-config", config)
}

const CONFIG: &str = r#"
resources:
  # The L40S GPUs as a renamed resource with their own variable and an extra node per GPU.
  - match: {vendor: nvidia, model: "NVIDIA L40S"}
    resourceName: example.com/l40s
    env: EXAMPLE_VISIBLE_DEVICES
    envValue: index
    deviceNodes: ["/dev/nvidia{index}", "/dev/example/ctl{index}"]
    sharedDeviceNodes: [/dev/nvidiactl]
    cdi: true
"#;

const L40S: &str = "example.com/l40s";

#[tokio::test(flavor = "multi_thread")]
async fn configured_resource_reaches_the_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root("pcie-4gpu", dir.path()).unwrap();
    // The configured per-device nodes: GPU 3's is missing at start.
    let example = root.join("dev/example");
    std::fs::create_dir_all(&example).unwrap();
    for i in 0..3 {
        std::fs::write(example.join(format!("ctl{i}")), "").unwrap();
    }
    let config = dir.path().join("device-plugins.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let logs = dir.path().join("logs");
    let kdm = KubeletDm::start(&plugins, &logs).await.unwrap();
    let _agent = agent(&root, &plugins, &config).spawn(&logs).unwrap();

    let reg = kdm
        .wait_event(0, Duration::from_secs(30), |e| {
            e.kind == "registered" && e.resource == L40S
        })
        .await
        .unwrap();
    assert_eq!(
        reg.endpoint
            .as_deref()
            .map(|p| p.ends_with("fumarole-example.com_l40s.sock")),
        Some(true)
    );
    let devices = kdm
        .wait_devices(L40S, Duration::from_secs(20), |d| d.len() == 4)
        .await
        .unwrap();
    let health: Vec<&str> = devices
        .iter()
        .map(|d| d["health"].as_str().unwrap())
        .collect();
    // GPU 3 lacks its configured node; it turns healthy when the node appears.
    assert_eq!(health, ["Healthy", "Healthy", "Healthy", "Unhealthy"]);
    let t = Instant::now();
    std::fs::write(example.join("ctl3"), "").unwrap();
    kdm.wait_devices(L40S, Duration::from_secs(10), |d| {
        d.len() == 4 && d.iter().all(|x| x["health"] == "Healthy")
    })
    .await
    .unwrap();
    println!(
        "configured device node appeared: healthy after {:?}",
        t.elapsed()
    );
    let ids: Vec<String> = devices
        .iter()
        .map(|d| d["ID"].as_str().unwrap().to_string())
        .collect();

    // Allocate: the configured variable with indices, the configured nodes, CDI names.
    let alloc = kdm
        .allocate(
            L40S,
            json!({"container_requests": [{"devices_ids": [ids[1], ids[3]]}]}),
        )
        .await
        .unwrap();
    let c = &alloc["container_responses"][0];
    assert_eq!(c["envs"], json!({"EXAMPLE_VISIBLE_DEVICES": "1,3"}));
    let paths: Vec<&str> = c["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["host_path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/dev/nvidia1",
            "/dev/example/ctl1",
            "/dev/nvidia3",
            "/dev/example/ctl3",
            "/dev/nvidiactl"
        ]
    );
    let cdi: Vec<&str> = c["cdi_devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cdi,
        [format!("{L40S}={}", ids[1]), format!("{L40S}={}", ids[3])]
    );

    // The default name is not served: every device went to the configured resource.
    let events = kdm.events(0, Duration::ZERO).await.unwrap();
    let registered: Vec<&str> = events
        .iter()
        .filter(|e| e.kind == "registered")
        .map(|e| e.resource.as_str())
        .collect();
    assert_eq!(registered, [L40S]);
    let state: Value = kdm.state().await.unwrap();
    assert!(state["devices"]["nvidia.com/gpu"].is_null(), "{state}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_config_stops_the_agent_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root("pcie-4gpu", dir.path()).unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for (text, want) in [
        (
            "resources:\n  - match: {vendor: nvidia}\n    resourceName: l40s\n",
            "bad.yaml: resources[0].resourceName: \"l40s\" is not domain-qualified",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n  - match: {vendor: nvidia}\n    env: X\n",
            "bad.yaml: resources[1].match: the same match as resources[0]",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    resouceName: example.com/x\n",
            "resouceName",
        ),
    ] {
        let config = dir.path().join("bad.yaml");
        std::fs::write(&config, text).unwrap();
        let mut child = agent(&root, &plugins, &config)
            .command()
            .unwrap()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                panic!("agent kept running with a bad config: {text}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!status.success(), "{stderr}");
        assert!(
            stderr.contains("--device-plugin-config") && stderr.contains(want),
            "want {want:?} in:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        // Nothing was served.
        assert_eq!(std::fs::read_dir(&plugins).unwrap().count(), 0);
    }
}
