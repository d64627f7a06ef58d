//! Device health through the real FFI, without hardware: the agent loads stand-ins for
//! `libnvidia-ml.so.1` and `libdcmi.so` (the workspace's `fumarole-standin-nvml` and
//! `fumarole-standin-dcmi` cdylibs, driven by a JSON state file this test rewrites) through
//! the same flags and code path as the real libraries, with the kubelet's own device-plugin
//! client (`kubelet-dm`), the real API server and the scheduler extension.
//!
//! - An XID 79 on GPU 3 (the GPU then lost to NVML) reaches the kubelet (ListAndWatch),
//!   `DeviceTopology` status (health and reason), a Node Event, the metric, and the
//!   extension, which stops choosing the GPU; an ignored XID (13) changes nothing; an NVLink
//!   lane down lowers the published weights of that GPU's pairs and `select`'s choice; and
//!   recovery brings all of it back. Propagation times are printed.
//! - A library that hangs or answers errors and garbage never delays `ListAndWatch` or
//!   `GetPreferredAllocation`; once it answers again, faults are seen again.
//! - No library: today's `/dev` rule.
//! - Ascend through DCMI on atlas-800-910: a chip fault, a RoCE network fault and an HCCS fault
//!   code (lowering the chip's HCCS pairs), and their recovery.
//! - `--ascend-device-info`: Huawei's device-info ConfigMap and Ascend labels from DCMI (A3
//!   super-pod, chip info: `servertype`, `node.kubernetes.io/npu.chip.name`), and the labels
//!   gone with the switch.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fumarole_e2e::cluster::{free_port, http_get, http_post_json, metric_sum};
use fumarole_e2e::fumarole::{device_topologies, fixture_root};
use fumarole_e2e::standin::{StandIn, ascend_chips, dcmi_standin, nvidia_root};
use fumarole_e2e::{AgentBuilder, KubeletDm, NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

const GPU: &str = "nvidia.com/gpu";
const NPU: &str = "huawei.com/Ascend910";
const NODE: &str = "dgx-1";

/// Polls `check` every 10 ms until it is true; returns the time since `since`.
async fn until<F, Fut>(what: &str, since: Instant, timeout: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if check().await {
            return since.elapsed();
        }
        assert!(since.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ids(devices: &[Value]) -> Vec<String> {
    devices
        .iter()
        .map(|d| d["ID"].as_str().unwrap().to_string())
        .collect()
}

/// The latest seq of kubelet-dm's events.
async fn last_seq(kdm: &KubeletDm) -> u64 {
    kdm.events(0, Duration::ZERO)
        .await
        .unwrap()
        .last()
        .map_or(0, |e| e.seq)
}

/// Waits for a ListAndWatch answer of `resource` whose device `id` has `health`; returns the
/// time since `since`.
async fn kubelet_sees(
    kdm: &KubeletDm,
    resource: &str,
    seq: u64,
    id: &str,
    health: &str,
    since: Instant,
) -> Duration {
    kdm.wait_event(seq, Duration::from_secs(20), |e| {
        e.kind == "list_and_watch"
            && e.resource == resource
            && e.devices
                .as_ref()
                .is_some_and(|d| d.iter().any(|x| x["ID"] == id && x["health"] == health))
    })
    .await
    .unwrap();
    since.elapsed()
}

/// The published `DeviceTopology` of `node` as JSON (`Null` before it exists).
async fn dtopo(cluster: &TestCluster, node: &str) -> Value {
    match device_topologies(cluster.client())
        .get_opt(node)
        .await
        .unwrap()
    {
        Some(o) => serde_json::to_value(o).unwrap(),
        None => Value::Null,
    }
}

fn device_status<'a>(dt: &'a Value, id: &str) -> &'a Value {
    &dt["status"]["devices"][id]
}

/// The published weight between devices `a` and `b` (spec indices).
fn weight(dt: &Value, a: usize, b: usize) -> u64 {
    let (a, b) = (a.min(b), a.max(b));
    dt["spec"]["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["a"] == a && l["b"] == b)
        .map(|l| l["weight"].as_u64().unwrap())
        .unwrap()
}

/// The Events recorded on Node `node` as `reason: note`.
async fn node_events(cluster: &TestCluster, node: &str) -> Vec<String> {
    let events: Api<Event> = Api::all(cluster.client());
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Node") && r.name.as_deref() == Some(node)
            })
        })
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

fn gpu_pod(name: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/none",
            "resources": {"limits": {GPU: gpus.to_string()}}}]}
    })
}

/// Whether the extension's kube-scheduler `filter` keeps `node` for a pod of `gpus` GPUs.
async fn extension_keeps(port: u16, node: &str, gpus: u32) -> bool {
    let body = http_post_json(
        port,
        "/kube-scheduler/filter",
        &json!({"Pod": gpu_pod("probe", gpus), "NodeNames": [node]}),
    )
    .await
    .unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    v["NodeNames"]
        .as_array()
        .is_some_and(|n| n.iter().any(|x| x == node))
}

#[tokio::test(flavor = "multi_thread")]
async fn nvidia_faults_reach_kubelet_devicetopology_and_extension_and_recover() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(NODE)
                .capacity("cpu", "224")
                .capacity(GPU, "8"),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (root, lib, mut nvml) = nvidia_root(dir.path()).unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let kdm = KubeletDm::start(&plugins, &dir.path().join("logs"))
        .await
        .unwrap();
    let metrics_port = free_port().unwrap();
    AgentBuilder::root(&root)
        .node(NODE)
        .device_plugin_dir(&plugins)
        .nvml_standin(&lib, &nvml.path)
        .flag("--health-quiet-period", "2s")
        .flag("--health-poll-interval", "500ms")
        .flag("--await-device-choice-timeout", "1s")
        .without_host_kubelet(dir.path())
        .metrics_on_port(metrics_port)
        .start_in(&cluster)
        .unwrap();
    let ext = cluster.start_scheduler_ext(&[]).await.unwrap();

    // The library answers discovery: the uuids are the stand-in's, all healthy.
    let all = ids(&kdm
        .wait_devices(GPU, Duration::from_secs(60), |d| {
            d.len() == 8 && d.iter().all(|x| x["health"] == "Healthy")
        })
        .await
        .unwrap());
    assert_eq!(all[3], nvml.state["gpus"][3]["uuid"]);
    let published = Instant::now();
    until(
        "DeviceTopology with 8 healthy GPUs",
        published,
        Duration::from_secs(60),
        || async { dtopo(&cluster, NODE).await["status"]["healthyCount"] == 8 },
    )
    .await;
    until(
        "the extension to see the node",
        published,
        Duration::from_secs(30),
        || extension_keeps(ext, NODE, 8),
    )
    .await;
    let dt = dtopo(&cluster, NODE).await;
    assert_eq!(weight(&dt, 3, 4), 280, "NV18 between every pair");

    // XID 79 on GPU 3, which falls off the bus: out everywhere, within about a second.
    let seq = last_seq(&kdm).await;
    let t0 = nvml.event(json!({"gpu": 3, "xid": 79}));
    let to_kubelet = kubelet_sees(&kdm, GPU, seq, &all[3], "Unhealthy", t0).await;
    // Lost only once the XID is in: a poll that found it lost first would make the
    // DeviceUnhealthy Event name fell-off-bus alone (the Event is per going out of use).
    nvml.edit(|s| s["gpus"][3]["lost"] = json!(true));
    let to_dtopo = until(
        "DeviceTopology to show GPU 3 unhealthy",
        t0,
        Duration::from_secs(20),
        || async {
            let dt = dtopo(&cluster, NODE).await;
            let s = device_status(&dt, &all[3]);
            s["health"] == "Unhealthy"
                && s["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("XID 79 (GPU has fallen off the bus)"))
        },
    )
    .await;
    let to_extension = until(
        "the extension to refuse 8 GPUs",
        t0,
        Duration::from_secs(20),
        || async { !extension_keeps(ext, NODE, 8).await },
    )
    .await;
    println!(
        "XID 79 -> kubelet ListAndWatch {to_kubelet:?}, DeviceTopology status {to_dtopo:?}, extension filter {to_extension:?}"
    );
    // The periodic check finds it lost too.
    until(
        "the fell-off-bus reason",
        t0,
        Duration::from_secs(20),
        || async {
            let dt = dtopo(&cluster, NODE).await;
            dt["status"]["healthyCount"] == 7
                && device_status(&dt, &all[3])["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("fell-off-bus"))
        },
    )
    .await;
    // The extension binds a 4-GPU pod to the other GPUs.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let mut p4: Pod = serde_json::from_value(gpu_pod("p4", 4)).unwrap();
    p4.metadata.uid = None;
    let p4 = pods.create(&PostParams::default(), &p4).await.unwrap();
    let bound = http_post_json(
        ext,
        "/kube-scheduler/bind",
        &json!({"PodName": "p4", "PodNamespace": "default",
            "PodUID": p4.metadata.uid.clone().unwrap(), "Node": NODE}),
    )
    .await
    .unwrap();
    let bound: Value = serde_json::from_str(&bound).unwrap();
    assert!(
        bound["Error"].as_str().unwrap_or_default().is_empty(),
        "{bound}"
    );
    let p4 = pods.get("p4").await.unwrap();
    let choice: Value =
        serde_json::from_str(&p4.metadata.annotations.unwrap()["fumarole.dev/devices"]).unwrap();
    let chosen: Vec<&str> = choice[GPU]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(chosen.len(), 4);
    assert!(!chosen.contains(&all[3].as_str()), "{chosen:?}");
    // Bound to a node without a kubelet: only a forced delete removes it.
    pods.delete("p4", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    // A Node Event names the device and the fault; the metric counts it.
    until(
        "the DeviceUnhealthy Event",
        t0,
        Duration::from_secs(20),
        || async {
            node_events(&cluster, NODE).await.iter().any(|e| {
                e.starts_with("DeviceUnhealthy")
                    && e.contains(all[3].as_str())
                    && e.contains("XID 79")
            })
        },
    )
    .await;
    let metrics = http_get(metrics_port, "/metrics").await.unwrap();
    let xid_count = |id: &str| {
        metric_sum(
            &metrics,
            &format!("fumarole_device_faults_total{{device=\"{id}\",kind=\"xid\"}}"),
        )
    };
    assert_eq!(xid_count(&all[3]), 1.0, "{metrics}");

    // An ignored XID (13, the application's fault) on GPU 2 changes nothing; a critical one
    // after it (XID 48 on GPU 6) shows the stand-in delivered both, in order.
    let seq = last_seq(&kdm).await;
    nvml.event(json!({"gpu": 2, "xid": 13}));
    let t48 = nvml.event(json!({"gpu": 6, "xid": 48}));
    kubelet_sees(&kdm, GPU, seq, &all[6], "Unhealthy", t48).await;
    let events = kdm.events(seq, Duration::ZERO).await.unwrap();
    assert!(
        events
            .iter()
            .filter_map(|e| e.devices.as_ref())
            .all(|d| d[2]["health"] == "Healthy"),
        "{events:#?}"
    );
    let dt = dtopo(&cluster, NODE).await;
    assert_eq!(device_status(&dt, &all[2])["health"], "Healthy");
    assert!(device_status(&dt, &all[2]).get("reason").is_none());
    // XID 48 clears by itself: quiet period (2 s) passed and a check found GPU 6 healthy.
    let seq = last_seq(&kdm).await;
    let back = kubelet_sees(&kdm, GPU, seq, &all[6], "Healthy", t48).await;
    println!("XID 48 (no lasting condition) given back after {back:?} (quiet period 2 s)");

    // An NVLink lane of GPU 5 goes down: its pairs drop from NV18 (280) to NV17 (270) in the
    // published spec, the device stays in use, and select stops pairing it first.
    assert_eq!(
        kdm.preferred_ids(GPU, &[all[4].clone(), all[5].clone(), all[6].clone()], 2)
            .await
            .unwrap(),
        vec![all[4].clone(), all[5].clone()]
    );
    let t_lane = nvml.edit(|s| s["gpus"][5]["nvlinks"][4]["up"] = json!(false));
    let to_weight = until(
        "GPU 5's pairs at NV17",
        t_lane,
        Duration::from_secs(20),
        || async {
            // The spec and the status are two writes: wait for both.
            let dt = dtopo(&cluster, NODE).await;
            dt.is_object()
                && weight(&dt, 4, 5) == 270
                && device_status(&dt, &all[5])["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("nvlink-down"))
        },
    )
    .await;
    println!("NVLink lane down -> DeviceTopology link weight {to_weight:?}");
    let dt = dtopo(&cluster, NODE).await;
    assert_eq!(weight(&dt, 5, 7), 270);
    assert_eq!(weight(&dt, 4, 6), 280);
    assert_eq!(device_status(&dt, &all[5])["health"], "Healthy");
    assert!(
        device_status(&dt, &all[5])["reason"]
            .as_str()
            .is_some_and(|r| r.contains("nvlink-down: NVLink lane 4 down")),
        "{dt}"
    );
    until(
        "select to prefer the full pair",
        t_lane,
        Duration::from_secs(10),
        || async {
            kdm.preferred_ids(GPU, &[all[4].clone(), all[5].clone(), all[6].clone()], 2)
                .await
                .unwrap()
                == vec![all[4].clone(), all[6].clone()]
        },
    )
    .await;
    until(
        "the DeviceLinkDegraded Event",
        t_lane,
        Duration::from_secs(20),
        || async {
            node_events(&cluster, NODE)
                .await
                .iter()
                .any(|e| e.starts_with("DeviceLinkDegraded") && e.contains(all[5].as_str()))
        },
    )
    .await;

    // Recovery: GPU 3 back on the bus, the lane up again. Everything returns.
    let seq = last_seq(&kdm).await;
    let t_back = nvml.edit(|s| {
        s["gpus"][3]["lost"] = json!(false);
        s["gpus"][5]["nvlinks"][4]["up"] = json!(true);
    });
    let to_kubelet = kubelet_sees(&kdm, GPU, seq, &all[3], "Healthy", t_back).await;
    let to_dtopo = until(
        "DeviceTopology all healthy, NV18 everywhere",
        t_back,
        Duration::from_secs(20),
        || async {
            let dt = dtopo(&cluster, NODE).await;
            dt["status"]["healthyCount"] == 8
                && weight(&dt, 4, 5) == 280
                && dt["status"]["devices"]
                    .as_object()
                    .unwrap()
                    .values()
                    .all(|d| d.get("reason").is_none())
        },
    )
    .await;
    let to_extension = until(
        "the extension to take 8 GPUs again",
        t_back,
        Duration::from_secs(30),
        || extension_keeps(ext, NODE, 8),
    )
    .await;
    println!(
        "recovery (back on the bus + 2 s quiet period) -> kubelet {to_kubelet:?}, DeviceTopology {to_dtopo:?}, extension {to_extension:?}"
    );
    until(
        "the DeviceRecovered Event",
        t_back,
        Duration::from_secs(20),
        || async {
            node_events(&cluster, NODE)
                .await
                .iter()
                .any(|e| e.starts_with("DeviceRecovered") && e.contains(all[3].as_str()))
        },
    )
    .await;
    assert_eq!(
        kdm.preferred_ids(GPU, &[all[4].clone(), all[5].clone(), all[6].clone()], 2)
            .await
            .unwrap(),
        vec![all[4].clone(), all[5].clone()]
    );
}

/// `fumarole-agent run --standalone` on `root`, serving its device plugins in `plugins`.
fn standalone_agent(root: &Path, plugins: &Path) -> AgentBuilder {
    AgentBuilder::root(root)
        .standalone()
        .device_plugin_dir(plugins)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_library_that_hangs_or_answers_garbage_never_delays_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let (root, lib, mut nvml) = nvidia_root(dir.path()).unwrap();
    let plugins = dir.path().join("device-plugins");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&plugins).unwrap();
    let kdm = KubeletDm::start(&plugins, &logs).await.unwrap();
    let _agent = standalone_agent(&root, &plugins)
        .nvml_standin(&lib, &nvml.path)
        .flag("--health-quiet-period", "1s")
        .flag("--health-poll-interval", "300ms")
        .spawn(&logs)
        .unwrap();
    let all = ids(&kdm
        .wait_devices(GPU, Duration::from_secs(60), |d| d.len() == 8)
        .await
        .unwrap());

    // Every call the health thread makes hangs. The plugin answers as ever: a preferred
    // allocation, and ListAndWatch after a kubelet restart.
    nvml.edit(|s| s["hang"] = json!(["*"]));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    assert_eq!(kdm.preferred_ids(GPU, &all, 2).await.unwrap().len(), 2);
    let preferred = t.elapsed();
    let seq = last_seq(&kdm).await;
    let t = Instant::now();
    assert_eq!(kdm.restart().await.unwrap(), 2);
    let again = kdm
        .wait_event(seq, Duration::from_secs(10), |e| {
            e.kind == "list_and_watch" && e.generation == 2
        })
        .await
        .unwrap();
    let relisted = t.elapsed();
    assert_eq!(again.devices.unwrap().len(), 8);
    println!(
        "library hung: GetPreferredAllocation answered in {preferred:?}, ListAndWatch after a kubelet restart in {relisted:?}"
    );
    assert!(preferred < Duration::from_secs(5) && relisted < Duration::from_secs(10));

    // Errors, then garbage, from every health call: nothing changes, answers still come.
    nvml.edit(|s| {
        s["hang"] = json!([]);
        s["fail"] = json!({"*": 999});
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    nvml.edit(|s| {
        s["fail"] = json!({});
        s["garbage"] = json!([
            "nvmlDeviceGetNvLinkState",
            "nvmlDeviceGetRetiredPagesPendingStatus"
        ]);
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    assert_eq!(kdm.preferred_ids(GPU, &all, 4).await.unwrap().len(), 4);
    assert!(t.elapsed() < Duration::from_secs(5));
    let st = kdm.state().await.unwrap();
    assert!(
        st["devices"][GPU]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["health"] == "Healthy"),
        "{st}"
    );

    // The library answers properly again: a fault is seen again, and cleared again.
    let seq = last_seq(&kdm).await;
    let t0 = nvml.edit(|s| {
        s["garbage"] = json!([]);
        s["gpus"][0]["rowRemapFailed"] = json!(true);
    });
    let seen = kubelet_sees(&kdm, GPU, seq, &all[0], "Unhealthy", t0).await;
    let seq = last_seq(&kdm).await;
    let t1 = nvml.edit(|s| s["gpus"][0]["rowRemapFailed"] = json!(false));
    kubelet_sees(&kdm, GPU, seq, &all[0], "Healthy", t1).await;
    println!("after the hang: row-remap failure seen in {seen:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_library_device_nodes_decide() {
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root("dgx-h100", dir.path()).unwrap();
    let plugins = dir.path().join("device-plugins");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&plugins).unwrap();
    let kdm = KubeletDm::start(&plugins, &logs).await.unwrap();
    let _agent = standalone_agent(&root, &plugins)
        .flag("--nvml-library", "/nonexistent/libnvidia-ml.so.1")
        .spawn(&logs)
        .unwrap();
    // Ids from the driver's /proc entries (the same uuids NVML would give), all healthy.
    let all = ids(&kdm
        .wait_devices(GPU, Duration::from_secs(60), |d| {
            d.len() == 8 && d.iter().all(|x| x["health"] == "Healthy")
        })
        .await
        .unwrap());
    assert_eq!(all[0], "GPU-f55b88b0-0000-4000-8000-000000000000");
    let seq = last_seq(&kdm).await;
    let t = Instant::now();
    std::fs::remove_file(root.join("dev/nvidia3")).unwrap();
    kubelet_sees(&kdm, GPU, seq, &all[3], "Unhealthy", t).await;
    let seq = last_seq(&kdm).await;
    std::fs::write(root.join("dev/nvidia3"), "").unwrap();
    kubelet_sees(&kdm, GPU, seq, &all[3], "Healthy", t).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ascend_chip_network_and_hccs_faults_through_dcmi() {
    let node = "atlas-1";
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(node)
                .capacity("cpu", "192")
                .capacity(NPU, "8"),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root("atlas-800-910", dir.path()).unwrap();
    let chips = ascend_chips(8, |_| json!({}));
    let (lib, mut dcmi) = dcmi_standin(dir.path(), json!({"chips": chips})).unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let kdm = KubeletDm::start(&plugins, &dir.path().join("logs"))
        .await
        .unwrap();
    AgentBuilder::root(&root)
        .node(node)
        .device_plugin_dir(&plugins)
        .dcmi_standin(&lib, &dcmi.path)
        .flag("--hccs-fault-codes", "0x8C204E00")
        .flag("--health-poll-interval", "300ms")
        .without_host_kubelet(dir.path())
        .metrics_on_port(free_port().unwrap())
        .start_in(&cluster)
        .unwrap();
    let all = ids(&kdm
        .wait_devices(NPU, Duration::from_secs(60), |d| d.len() == 8)
        .await
        .unwrap());
    assert_eq!(all[2], "Ascend910-2");
    let start = Instant::now();
    until(
        "DeviceTopology with 8 healthy NPUs",
        start,
        Duration::from_secs(60),
        || async { dtopo(&cluster, node).await["status"]["healthyCount"] == 8 },
    )
    .await;
    let dt = dtopo(&cluster, node).await;
    assert_eq!(weight(&dt, 0, 1), 200, "HCCS inside a group of four");
    let cross = weight(&dt, 1, 4);
    assert!(cross < 200);

    // A critical chip alarm on Ascend910-2 and a RoCE port that cannot reach its peer on
    // Ascend910-5: both out, each with its reason.
    let seq = last_seq(&kdm).await;
    let t0 = dcmi.edit(|s| {
        s["chips"][2]["health"] = json!(3);
        s["chips"][2]["errorCodes"] = json!([0x80E0_1801u32]);
        s["chips"][5]["network"] = json!(3);
    });
    let chip = kubelet_sees(&kdm, NPU, seq, "Ascend910-2", "Unhealthy", t0).await;
    kubelet_sees(&kdm, NPU, seq, "Ascend910-5", "Unhealthy", t0).await;
    let published = until(
        "DeviceTopology reasons",
        t0,
        Duration::from_secs(20),
        || async {
            let dt = dtopo(&cluster, node).await;
            device_status(&dt, "Ascend910-2")["reason"]
                .as_str()
                .is_some_and(|r| {
                    r.contains("dcmi-chip: chip health 3 (critical alarm), error codes 0x80E01801")
                })
                && device_status(&dt, "Ascend910-5")["reason"]
                    .as_str()
                    .is_some_and(|r| {
                        r.contains("dcmi-network: RoCE network unhealthy: peer unreachable")
                    })
        },
    )
    .await;
    println!("DCMI chip fault -> kubelet {chip:?}, DeviceTopology {published:?} (poll 300 ms)");

    // An HCCS fault code on Ascend910-1: it stays in use, its HCCS pairs drop to PCIe.
    let t1 = dcmi.edit(|s| s["chips"][1]["errorCodes"] = json!([0x8C20_4E00u32]));
    until(
        "Ascend910-1's HCCS pairs lowered",
        t1,
        Duration::from_secs(20),
        || async {
            let dt = dtopo(&cluster, node).await;
            weight(&dt, 0, 1) < 200 && weight(&dt, 1, 3) < 200
        },
    )
    .await;
    let dt = dtopo(&cluster, node).await;
    assert_eq!(
        weight(&dt, 0, 3),
        200,
        "pairs without Ascend910-1 keep HCCS"
    );
    assert_eq!(device_status(&dt, "Ascend910-1")["health"], "Healthy");
    let seq = last_seq(&kdm).await;
    assert!(
        kdm.state().await.unwrap()["devices"][NPU]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["ID"] == "Ascend910-1" && d["health"] == "Healthy")
    );

    // Recovery: health OK again on the next poll.
    let t2 = dcmi.edit(|s| {
        for c in s["chips"].as_array_mut().unwrap() {
            c["health"] = json!(0);
            c["errorCodes"] = json!([]);
            c["network"] = json!(0);
        }
    });
    kubelet_sees(&kdm, NPU, seq, "Ascend910-2", "Healthy", t2).await;
    let back = until(
        "DeviceTopology healthy, HCCS restored",
        t2,
        Duration::from_secs(20),
        || async {
            let dt = dtopo(&cluster, node).await;
            dt["status"]["healthyCount"] == 8 && weight(&dt, 0, 1) == 200
        },
    )
    .await;
    println!("DCMI recovery -> DeviceTopology {back:?}");
}

/// `--compat-labels` with the live library (the stand-in): GFD's labels carry what NVML
/// answers (CUDA version, compute capability, MIG mode NotSupported -> not capable).
#[tokio::test(flavor = "multi_thread")]
async fn compat_labels_from_the_library() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let node = "nvml-labels";
    cluster
        .create_node(&NodeSpec::new(node).capacity("cpu", "224"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (root, lib, mut nvml) = nvidia_root(dir.path()).unwrap();
    nvml.edit(|s| {
        s["driverVersion"] = json!("570.124.06");
        s["cudaDriverVersion"] = json!(12080);
        for g in s["gpus"].as_array_mut().unwrap() {
            g["migCapable"] = json!(false);
        }
    });
    AgentBuilder::root(&root)
        .node(node)
        .nvml_standin(&lib, &nvml.path)
        .arg("--compat-labels")
        .without_host_kubelet(dir.path())
        .metrics_on_port(free_port().unwrap())
        .start_in(&cluster)
        .unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client());
    let labels = fumarole_e2e::cluster::eventually(
        "GFD labels from the library",
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move {
                let labels = nodes.get(node).await?.metadata.labels.unwrap_or_default();
                Ok(labels
                    .contains_key("nvidia.com/gpu.family")
                    .then_some(labels))
            }
        },
    )
    .await
    .unwrap();
    for (key, value) in [
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/gpu.compute.major", "9"),
        ("nvidia.com/gpu.compute.minor", "0"),
        ("nvidia.com/mig.capable", "false"),
        ("nvidia.com/cuda.driver-version.full", "570.124.06"),
        ("nvidia.com/cuda.driver-version.revision", "06"),
        ("nvidia.com/cuda.runtime-version.full", "12.8"),
        ("nvidia.com/cuda.runtime.minor", "8"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
    }
}

/// Huawei's device-info ConfigMap as the Ascend scheduler plugin reads it (types written here
/// from the reference, not the agent's).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AscendCfg {
    #[serde(rename = "DeviceInfo")]
    device_info: AscendDeviceInfo,
    #[serde(rename = "CheckCode")]
    check_code: String,
    #[serde(rename = "SuperPodID")]
    super_pod_id: i64,
    #[serde(rename = "ServerIndex")]
    server_index: i64,
    #[serde(rename = "RackID")]
    rack_id: i64,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AscendDeviceInfo {
    #[serde(rename = "DeviceList")]
    device_list: std::collections::BTreeMap<String, String>,
    #[serde(rename = "UpdateTime")]
    update_time: i64,
}

/// `kube-system/mindx-dl-deviceinfo-<node>`, parsed; `None` before it exists.
async fn ascend_cfg(cluster: &TestCluster, node: &str) -> Option<AscendCfg> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(cluster.client(), "kube-system");
    let cm = cms
        .get_opt(&format!("mindx-dl-deviceinfo-{node}"))
        .await
        .unwrap()?;
    assert_eq!(
        cm.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("mx-consumer-cim")),
        Some(&"true".to_string())
    );
    let text = cm.data.as_ref()?.get("DeviceInfoCfg")?.clone();
    Some(serde_json::from_str(&text).unwrap())
}

/// Writes to the node's device-info ConfigMap in the audit log so far.
fn configmap_writes(cluster: &TestCluster, node: &str) -> usize {
    writes(
        cluster,
        "configmaps",
        &format!("mindx-dl-deviceinfo-{node}"),
    )
}

/// Writes to the object `resource/name` itself (not a subresource) in the audit log so far.
fn writes(cluster: &TestCluster, resource: &str, name: &str) -> usize {
    cluster
        .audited_writes()
        .unwrap()
        .iter()
        .filter(|e| e["objectRef"]["resource"] == resource && e["objectRef"]["name"] == name)
        .filter(|e| e["objectRef"]["subresource"].is_null())
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch")))
        .count()
}

/// The agent for fixture root `root` as node `node`, its Ascend health from the DCMI stand-in
/// `lib` answering from `state` (polled every 300 ms, the node re-checked every second), its
/// kubelet files absent under `dir`.
fn dcmi_agent(root: &Path, node: &str, lib: &Path, state: &Path, dir: &Path) -> AgentBuilder {
    AgentBuilder::root(root)
        .node(node)
        .dcmi_standin(lib, state)
        .flag("--health-poll-interval", "300ms")
        .flag("--recheck-interval", "1s")
        .metrics_on_port(free_port().unwrap())
        .without_host_kubelet(dir)
}

/// Starts a cluster with node `node` (`npus` NPUs) and writes fixture `fixture` for it: the
/// cluster, the temporary directory, the fixture's root, a copy of the DCMI stand-in library,
/// and the stand-in's state (the fixture's recorded DCMI answers).
async fn ascend_setup(
    fixture: &str,
    node: &str,
    npus: &str,
) -> (TestCluster, tempfile::TempDir, PathBuf, PathBuf, StandIn) {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(node)
                .capacity("cpu", "192")
                .capacity(NPU, npus),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root(fixture, dir.path()).unwrap();
    let recorded: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("fumarole/dcmi-standin.json")).unwrap(),
    )
    .unwrap();
    let (lib, dcmi) = dcmi_standin(dir.path(), recorded).unwrap();
    (cluster, dir, root, lib, dcmi)
}

/// `--ascend-device-info` on the A3 fixture with the DCMI stand-in answering from the
/// fixture's recorded answers: the super-pod id and server index the chips give become the
/// node's super-node (DeviceTopology, labels) and the ConfigMap's SuperPodID / ServerIndex;
/// the ConfigMap follows a chip fault, a RoCE fault and the recovery, its UpdateTime moving
/// only then, and is not written in steady state.
#[tokio::test(flavor = "multi_thread")]
async fn ascend_device_info_follows_dcmi_health_and_super_pod() {
    let node = "a3-1";
    // The fixture's recorded DCMI answers: 16 healthy chips, two per card, in super-pod 7.
    let (cluster, dir, root, lib, mut dcmi) = ascend_setup("atlas-a3-16", node, "16").await;
    let agent = dcmi_agent(&root, node, &lib, &dcmi.path, dir.path()).arg("--ascend-device-info");
    agent.start_in(&cluster).unwrap();
    let healthy_key = "huawei.com/Ascend910";
    let all: Vec<String> = (0..16).map(|i| format!("Ascend910-{i}")).collect();
    let start = Instant::now();
    until(
        "the device-info ConfigMap with 16 healthy NPUs in super-pod 7",
        start,
        Duration::from_secs(60),
        || async {
            ascend_cfg(&cluster, node).await.is_some_and(|c| {
                c.device_info.device_list.get(healthy_key) == Some(&all.join(","))
                    && c.super_pod_id == 7
            })
        },
    )
    .await;
    let cfg = ascend_cfg(&cluster, node).await.unwrap();
    assert_eq!(
        (cfg.super_pod_id, cfg.server_index, cfg.rack_id),
        (7, 3, -1)
    );
    for suffix in ["-Unhealthy", "-NetworkUnhealthy", "-Recovering"] {
        assert_eq!(
            cfg.device_info.device_list[&format!("{healthy_key}{suffix}")],
            ""
        );
    }
    // The hardware's super-pod is the node's super-node, with its source.
    until(
        "DeviceTopology's super-node",
        start,
        Duration::from_secs(20),
        || async {
            dtopo(&cluster, node).await["spec"]["superNode"]
                == json!({"id": "7", "source": "hardware"})
        },
    )
    .await;
    let labels = |n: k8s_openapi::api::core::v1::Node| n.metadata.labels.unwrap_or_default();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client());
    until(
        "the Ascend labels",
        start,
        Duration::from_secs(20),
        || async {
            let l = labels(nodes.get(node).await.unwrap());
            l.get("fumarole.dev/super-node").map(String::as_str) == Some("7")
                && l.get("accelerator").map(String::as_str) == Some("huawei-Ascend910")
                && l.get("accelerator-type").map(String::as_str) == Some("module-a3-16-super-pod")
        },
    )
    .await;
    // The chips' DCMI chip info (the fixture's: name "Ascend910", 24 AI cores) on A3 hardware.
    let l = labels(nodes.get(node).await.unwrap());
    assert_eq!(l["servertype"], "Ascend910A3-24");
    assert_eq!(l["node.kubernetes.io/npu.chip.name"], "Ascend910");

    // Steady state: with a 1 s re-check, no write for 5 s.
    let before = configmap_writes(&cluster, node);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        configmap_writes(&cluster, node),
        before,
        "writes in steady state"
    );
    let first = ascend_cfg(&cluster, node).await.unwrap();
    assert_eq!(first.device_info.update_time, cfg.device_info.update_time);
    // Someone overwrites the data: restored as it was, UpdateTime included.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(cluster.client(), "kube-system");
    cms.patch(
        &format!("mindx-dl-deviceinfo-{node}"),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"data": {"DeviceInfoCfg": "{}"}})),
    )
    .await
    .unwrap();
    let t = Instant::now();
    until(
        "the ConfigMap restored",
        t,
        Duration::from_secs(20),
        || async {
            let cms = cms.clone();
            let text = cms
                .get(&format!("mindx-dl-deviceinfo-{node}"))
                .await
                .unwrap()
                .data
                .unwrap_or_default()
                .remove("DeviceInfoCfg")
                .unwrap_or_default();
            serde_json::from_str::<AscendCfg>(&text)
                .is_ok_and(|c| c.device_info.update_time == first.device_info.update_time)
        },
    )
    .await;

    // A critical chip alarm on Ascend910-2 and a RoCE fault on Ascend910-5 (UpdateTime is in
    // seconds: the fault comes a second after the last change).
    let t0 = dcmi.edit(|s| {
        s["chips"][2]["health"] = json!(3);
        s["chips"][5]["network"] = json!(3);
    });
    let fault = until(
        "the faults in the ConfigMap",
        t0,
        Duration::from_secs(20),
        || async {
            ascend_cfg(&cluster, node).await.is_some_and(|c| {
                c.device_info.device_list[&format!("{healthy_key}-Unhealthy")] == "Ascend910-2"
                    && c.device_info.device_list[&format!("{healthy_key}-NetworkUnhealthy")]
                        == "Ascend910-5"
            })
        },
    )
    .await;
    let faulty = ascend_cfg(&cluster, node).await.unwrap();
    let healthy: Vec<&str> = faulty.device_info.device_list[healthy_key]
        .split(',')
        .collect();
    assert_eq!(healthy.len(), 14);
    assert!(!healthy.contains(&"Ascend910-2") && !healthy.contains(&"Ascend910-5"));
    assert!(faulty.device_info.update_time > first.device_info.update_time);
    assert!(!faulty.check_code.is_empty());
    println!("DCMI fault -> device-info ConfigMap {fault:?} (poll 300 ms)");
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Recovery: all 16 healthy again, UpdateTime moves again.
    let t1 = dcmi.edit(|s| {
        s["chips"][2]["health"] = json!(0);
        s["chips"][5]["network"] = json!(0);
    });
    until(
        "recovery in the ConfigMap",
        t1,
        Duration::from_secs(20),
        || async {
            ascend_cfg(&cluster, node)
                .await
                .is_some_and(|c| c.device_info.device_list.get(healthy_key) == Some(&all.join(",")))
        },
    )
    .await;
    let back = ascend_cfg(&cluster, node).await.unwrap();
    assert_eq!(
        back.device_info.device_list[&format!("{healthy_key}-Unhealthy")],
        ""
    );
    assert!(back.device_info.update_time > faulty.device_info.update_time);
    // And quiet again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = configmap_writes(&cluster, node);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        configmap_writes(&cluster, node),
        before,
        "writes after recovery"
    );

    // An agent restart: the ConfigMap keeps its content (UpdateTime from the live object, the
    // super-pod fields from the hardware's answer, awaited before the first round).
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(cluster.client(), "kube-system");
    let name = format!("mindx-dl-deviceinfo-{node}");
    let version = |cm: k8s_openapi::api::core::v1::ConfigMap| cm.metadata.resource_version;
    let rv = version(cms.get(&name).await.unwrap());
    let dt_rv = dtopo(&cluster, node).await["metadata"]["resourceVersion"].clone();
    cluster.stop("fumarole-agent").unwrap();
    let restart = configmap_writes(&cluster, node);
    agent.start_in(&cluster).unwrap();
    let t = Instant::now();
    until(
        "the restarted agent's apply",
        t,
        Duration::from_secs(30),
        || async { configmap_writes(&cluster, node) > restart },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        version(cms.get(&name).await.unwrap()),
        rv,
        "ConfigMap changed by a restart"
    );
    assert_eq!(
        dtopo(&cluster, node).await["metadata"]["resourceVersion"],
        dt_rv,
        "DeviceTopology changed by a restart"
    );
    let after = ascend_cfg(&cluster, node).await.unwrap();
    assert_eq!(after.device_info.update_time, back.device_info.update_time);
    assert_eq!((after.super_pod_id, after.server_index), (7, 3));
}

/// `--ascend-device-info` on the Atlas 800T A2 fixture with the DCMI stand-in: while the
/// chip-info call hangs the node is published without `servertype` and
/// `node.kubernetes.io/npu.chip.name`; once it answers, the first chip's answer is garbled (a
/// name filling its 32 bytes, no NUL), which the agent skips, and the next chip's (910B3, 20 AI
/// cores) gives `servertype` `Ascend910B-20` and `node.kubernetes.io/npu.chip.name` `910B3`. No Node write in steady state; an agent
/// restarted without the switch removes them (with `accelerator` and `accelerator-type`).
#[tokio::test(flavor = "multi_thread")]
async fn ascend_chip_labels_from_dcmi_follow_the_switch() {
    let node = "a2-1";
    let (cluster, dir, root, lib, mut dcmi) = ascend_setup("atlas-800t-a2", node, "8").await;
    assert_eq!(dcmi.state["chips"][1]["chipInfo"]["chipName"], "910B3");
    // The chip-info call hangs at first: the node is published without the two labels.
    dcmi.edit(|s| {
        s["chips"][0]["chipInfo"]["chipName"] = json!("9".repeat(40));
        s["hang"] = json!(["dcmi_get_device_chip_info"]);
    });
    let state = dcmi.path.clone();
    let start_agent = |lib: &Path, extra: &'static [&'static str]| {
        dcmi_agent(&root, node, lib, &state, dir.path())
            .args(extra)
            .start_in(&cluster)
            .unwrap();
    };
    start_agent(&lib, &["--ascend-device-info"]);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client());
    let labels = || async {
        nodes
            .get(node)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default()
    };
    let start = Instant::now();
    until(
        "the Ascend labels without chip info",
        start,
        Duration::from_secs(60),
        || async { labels().await.contains_key("accelerator-type") },
    )
    .await;
    let l = labels().await;
    assert!(!l.contains_key("servertype") && !l.contains_key("node.kubernetes.io/npu.chip.name"));
    // The late answer: the labels follow.
    let answered = dcmi.edit(|s| s["hang"] = json!([]));
    let took = until(
        "servertype and npu.chip.name",
        answered,
        Duration::from_secs(30),
        || async { labels().await.contains_key("servertype") },
    )
    .await;
    let l = labels().await;
    assert_eq!(l["servertype"], "Ascend910B-20");
    assert_eq!(l["node.kubernetes.io/npu.chip.name"], "910B3");
    assert_eq!(l["accelerator"], "huawei-Ascend910");
    assert_eq!(l["accelerator-type"], "module-910b-8");
    println!("late DCMI chip info -> Node labels {took:?} (re-check 1 s)");

    // Steady state: with a 1 s re-check, no Node write for 5 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = writes(&cluster, "nodes", node);
    assert!(before >= 1);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        writes(&cluster, "nodes", node),
        before,
        "Node writes in steady state"
    );

    // The switch off: the Ascend labels go, fumarole's own stay.
    cluster.stop("fumarole-agent").unwrap();
    start_agent(&lib, &[]);
    let t = Instant::now();
    until(
        "the Ascend labels removed",
        t,
        Duration::from_secs(60),
        || async {
            let l = labels().await;
            ![
                "servertype",
                "node.kubernetes.io/npu.chip.name",
                "accelerator",
                "accelerator-type",
            ]
            .iter()
            .any(|k| l.contains_key(*k))
        },
    )
    .await;
    assert_eq!(labels().await["fumarole.dev/accelerator-count"], "8");

    // An older DCMI without dcmi_get_device_chip_info (the stand-in with that symbol's name
    // changed in its dynamic symbol table): the switch's other labels and the ConfigMap, and
    // not these two; the agent keeps running.
    let old_lib = dir.path().join("libdcmi-old.so");
    std::fs::write(
        &old_lib,
        without_symbol(&std::fs::read(&lib).unwrap(), "dcmi_get_device_chip_info"),
    )
    .unwrap();
    cluster.stop("fumarole-agent").unwrap();
    start_agent(&old_lib, &["--ascend-device-info"]);
    let t = Instant::now();
    until(
        "the Ascend labels back, without chip info",
        t,
        Duration::from_secs(60),
        || async { labels().await.contains_key("accelerator-type") },
    )
    .await;
    until(
        "the device-info ConfigMap",
        t,
        Duration::from_secs(30),
        || async { ascend_cfg(&cluster, node).await.is_some() },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let l = labels().await;
    assert!(!l.contains_key("servertype") && !l.contains_key("node.kubernetes.io/npu.chip.name"));
    cluster.check_processes().unwrap();
}

/// `library` with the dynamic symbol `symbol` renamed (its last letter changed, the string
/// table entry kept the same length), so the loader no longer finds it.
fn without_symbol(library: &[u8], symbol: &str) -> Vec<u8> {
    let entry = format!("\0{symbol}\0").into_bytes();
    let mut renamed = entry.clone();
    let last = renamed.len() - 2;
    renamed[last] = b'X';
    let mut out = library.to_vec();
    let mut hits = 0;
    let mut i = 0;
    while i + entry.len() <= out.len() {
        if out[i..i + entry.len()] == entry[..] {
            out[i..i + entry.len()].copy_from_slice(&renamed);
            hits += 1;
            i += entry.len();
        } else {
            i += 1;
        }
    }
    assert!(hits > 0, "{symbol} not in the library's string tables");
    out
}
