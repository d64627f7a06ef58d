//! Per-device figures on the agent's `/metrics`, read through the NVML stand-in (the library
//! the agent loads exactly as the real one, with figures the test sets and changes) and
//! attributed to pods by the kubelet's real PodResources server (`kubelet-dm`): fumarole's
//! names and dcgm-exporter's, a figure the library does not give left out and counted, a
//! library that hangs leaving the figures stale with their age on show while scrapes and the
//! health thread go on, and each holding pod's use in `DeviceTopology` status (`pods`), idle
//! since its devices' mean over the window fell under 5 %. The same for Ascend NPUs through
//! the DCMI stand-in, under fumarole's names and npu-exporter's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port, http_get, metric_sum};
use fumarole_e2e::fumarole::{device_topologies, fixture_root};
use fumarole_e2e::standin::{ascend_chips, dcmi_standin, nvidia_root};
use fumarole_e2e::{AgentBuilder, NodeSpec, TestCluster};
use serde_json::{Value, json};

const NODE: &str = "dgx-1";
const GPU: &str = "nvidia.com/gpu";

/// GPU `i`'s figures as NVML gives them: utilisation `10 + i` %, `i` GiB used, 300 W, ...
fn figures(i: u64) -> Value {
    json!({
        "utilization": 10 + i, "memoryUtilization": 5, "memoryUsedBytes": i << 30,
        "powerMilliwatts": 300_000, "energyMillijoules": 5_000_000 + i, "temperature": 40 + i,
        "smClockMhz": 1980, "memoryClockMhz": 2619, "throttleReasons": 0,
        "eccCorrected": i, "eccUncorrected": 0, "retiredPagesSingleBit": 2,
        "retiredPagesDoubleBit": 0, "remappedRowsCorrectable": 3, "remappedRowsUncorrectable": 0,
        "pcieTxKilobytesPerSecond": 100, "pcieRxKilobytesPerSecond": 200, "pcieReplays": 0
    })
}

/// The first `/metrics` body for which `ready` holds (the body of the last one in the panic).
async fn scrape_until(port: u16, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let last = std::sync::Mutex::new(String::new());
    let found = eventually(what, Duration::from_secs(60), || async {
        let body = http_get(port, "/metrics").await?;
        let ok = ready(&body);
        *last.lock().unwrap() = body.clone();
        Ok(ok.then_some(body))
    })
    .await;
    match found {
        Ok(body) => body,
        Err(e) => panic!("{e:#}\nlast /metrics:\n{}", last.lock().unwrap()),
    }
}

/// The value of the one sample line that starts with `prefix`.
fn value(body: &str, prefix: &str) -> Option<f64> {
    let lines: Vec<&str> = body.lines().filter(|l| l.starts_with(prefix)).collect();
    match lines.as_slice() {
        [line] => line.rsplit(' ').next()?.parse().ok(),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn nvml_figures_reach_metrics_with_their_pods_under_both_names() {
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
    let uuids: Vec<String> = (0..8)
        .map(|i| nvml.state["gpus"][i]["uuid"].as_str().unwrap().to_string())
        .collect();
    let uuid = |i: usize| uuids[i].clone();
    nvml.edit(|s| {
        for (i, g) in s["gpus"].as_array_mut().unwrap().iter_mut().enumerate() {
            g["metrics"] = figures(i as u64);
        }
        // GPU 5's library gives no power figure.
        g_remove(&mut s["gpus"][5]["metrics"], "powerMilliwatts");
        // GPU 0's first NVLink link has carried 1 GiB out and 2 GiB in.
        s["gpus"][0]["nvlinks"][0]["txKib"] = json!(1u64 << 20);
        s["gpus"][0]["nvlinks"][0]["rxKib"] = json!(2u64 << 20);
    });
    assert!(
        nvml.state["gpus"][0]["nvlinks"][0]["up"] != json!(false),
        "the fixture's GPU 0 has an active NVLink link 0"
    );
    let kdm = cluster
        .start_kubelet_dm_with_pod_resources(
            &dir.path().join("device-plugins"),
            &dir.path().join("pod-resources/kubelet.sock"),
        )
        .await
        .unwrap();
    // train-0 holds GPUs 0 and 1; infer-0 one replica of GPU 2; tune-0 GPU 6 through a DRA
    // claim (fumarole's driver, the device by its name in the pool).
    let (gpu0, gpu1, gpu2) = (uuid(0), uuid(1), uuid(2));
    kdm.set_pod_resources(json!([
        {"name": "train-0", "namespace": "ml", "uid": "6f1c8e2a-0000-4000-8000-00000000a001",
         "containers": [{"name": "main", "devices": [{"resource_name": GPU, "device_ids": [gpu0, gpu1]}]}]},
        {"name": "infer-0", "namespace": "web", "uid": "6f1c8e2a-0000-4000-8000-00000000a002",
         "containers": [{"name": "server", "devices": [{"resource_name": "nvidia.com/gpu.shared", "device_ids": [format!("{gpu2}::1")]}]}]},
        {"name": "tune-0", "namespace": "ml", "uid": "6f1c8e2a-0000-4000-8000-00000000a003",
         "containers": [{"name": "main", "dynamic_resources": [{"claim_name": "gpu", "claim_namespace": "ml",
            "claim_resources": [{"driver_name": "gpu.fumarole.dev", "pool_name": NODE, "device_name": "nvidia-6"}]}]}]}
    ]))
    .await
    .unwrap();
    let port = free_port().unwrap();
    AgentBuilder::root(&root)
        .node(NODE)
        .nvml_standin(&lib, &nvml.path)
        .kubelet_config(&dir.path().join("absent.yaml"))
        .cpu_manager_state(&dir.path().join("absent_state"))
        .pod_resources_socket(kdm.pod_resources_socket().unwrap())
        .flag("--device-metrics-interval", "300ms")
        .flag("--device-metric-names", "fumarole,dcgm")
        .flag("--device-usage-window", "2s")
        .flag("--recheck-interval", "1s")
        .flag("--health-poll-interval", "300ms")
        .flag("--health-quiet-period", "2s")
        .metrics_on_port(port)
        .start_in(&cluster)
        .unwrap();

    // Every GPU's figures, GPU 0's with its holder, under fumarole's names.
    let util0 = format!(
        "fumarole_device_utilization_ratio{{device=\"nvidia-0\",uuid=\"{gpu0}\",model=\"NVIDIA H100 80GB HBM3\",node=\"{NODE}\",namespace=\"ml\",pod=\"train-0\",container=\"main\"}}"
    );
    let body = scrape_until(port, "GPU 0's utilisation with its pod", |b| {
        b.contains(&util0)
    })
    .await;
    assert_eq!(value(&body, &util0), Some(0.10), "{body}");
    let util2 = format!(
        "fumarole_device_utilization_ratio{{device=\"nvidia-2\",uuid=\"{gpu2}\",model=\"NVIDIA H100 80GB HBM3\",node=\"{NODE}\",namespace=\"web\",pod=\"infer-0\",container=\"server\"}}"
    );
    assert_eq!(
        value(&body, &util2),
        Some(0.12),
        "a replica's holder: {body}"
    );
    let dra6 = format!(
        "fumarole_device_utilization_ratio{{device=\"nvidia-6\",uuid=\"{}\",model=\"NVIDIA H100 80GB HBM3\",node=\"{NODE}\",namespace=\"ml\",pod=\"tune-0\",container=\"main\"}}",
        uuid(6)
    );
    assert_eq!(
        value(&body, &dra6),
        Some(0.16),
        "a DRA claim's holder: {body}"
    );
    let free7 = format!(
        "fumarole_device_memory_used_bytes{{device=\"nvidia-7\",uuid=\"{}\",model=\"NVIDIA H100 80GB HBM3\",node=\"{NODE}\",namespace=\"\",pod=\"\",container=\"\"}}",
        uuid(7)
    );
    assert_eq!(value(&body, &free7), Some((7u64 << 30) as f64), "{body}");
    assert_eq!(
        value(
            &body,
            "fumarole_device_energy_joules_total{device=\"nvidia-3\""
        ),
        Some(5_000.003),
        "{body}"
    );
    assert_eq!(
        value(&body, "fumarole_device_sm_clock_hertz{device=\"nvidia-4\""),
        Some(1.98e9)
    );
    assert_eq!(
        value(
            &body,
            "fumarole_device_retired_pages_single_bit{device=\"nvidia-4\""
        ),
        Some(2.0),
        "{body}"
    );
    // NVLink data per link: link 0's counters (the other links give none).
    let link0 = |dir: &str| {
        format!(
            "fumarole_device_nvlink_{dir}_bytes_total{{device=\"nvidia-0\",uuid=\"{gpu0}\",model=\"NVIDIA H100 80GB HBM3\",node=\"{NODE}\",link=\"0\",namespace=\"ml\",pod=\"train-0\",container=\"main\"}}"
        )
    };
    assert_eq!(
        value(&body, &link0("transmit")),
        Some((1u64 << 30) as f64),
        "{body}"
    );
    assert_eq!(
        value(&body, &link0("receive")),
        Some((2u64 << 30) as f64),
        "{body}"
    );
    // 7 power figures: GPU 5's is left out, and its failure counted.
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with("fumarole_device_power_watts{"))
            .count(),
        7,
        "{body}"
    );
    assert!(
        value(&body, "fumarole_device_power_watts{device=\"nvidia-5\"").is_none(),
        "{body}"
    );
    assert!(
        metric_sum(
            &body,
            "fumarole_device_metric_errors_total{figure=\"device_power_watts\"}"
        ) >= 1.0,
        "{body}"
    );

    // dcgm-exporter's names, labels and units.
    let dcgm0 = format!(
        "DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\",UUID=\"{gpu0}\",pci_bus_id=\"{}\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{NODE}\",DCGM_FI_DRIVER_VERSION=\"{}\",namespace=\"ml\",pod=\"train-0\",container=\"main\"}}",
        nvml.state["gpus"][0]["pciBusId"].as_str().unwrap(),
        nvml.state["driverVersion"].as_str().unwrap_or("550.90.07"),
    );
    assert_eq!(value(&body, &dcgm0), Some(10.0), "{body}");
    assert_eq!(
        value(&body, "DCGM_FI_DEV_FB_USED{gpu=\"3\""),
        Some(3.0 * 1024.0),
        "MiB: {body}"
    );
    assert_eq!(
        value(&body, "DCGM_FI_DEV_SM_CLOCK{gpu=\"3\""),
        Some(1980.0),
        "MHz: {body}"
    );
    assert_eq!(
        value(&body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"3\""),
        Some(5_000_003.0),
        "mJ: {body}"
    );

    // A figure that changes is read again on the sampler's clock.
    nvml.edit(|s| s["gpus"][0]["metrics"]["utilization"] = json!(95));
    scrape_until(port, "GPU 0 at 95 %", |b| value(b, &util0) == Some(0.95)).await;

    // The library hangs in one call: scrapes still answer, the figures stay as they were and
    // their age grows; the health thread still takes an XID in.
    nvml.edit(|s| s["hang"] = json!(["nvmlDeviceGetTemperature"]));
    let stale = scrape_until(port, "the figures' age past 3 s", |b| {
        value(b, "fumarole_device_metrics_age_seconds").is_some_and(|age| age > 3.0)
    })
    .await;
    assert_eq!(value(&stale, &util0), Some(0.95), "{stale}");
    let gpu3 = uuid(3);
    nvml.event(json!({"gpu": 3, "xid": 79}));
    eventually(
        "GPU 3 unhealthy while the sampler hangs",
        Duration::from_secs(30),
        || {
            let client = cluster.client();
            let gpu3 = gpu3.clone();
            async move {
                let dt = device_topologies(client).get_opt(NODE).await?;
                let dt = serde_json::to_value(dt)?;
                Ok((dt["status"]["devices"][gpu3.as_str()]["health"] == "Unhealthy").then_some(()))
            }
        },
    )
    .await
    .unwrap();
    // Unhung: fresh figures again, with GPU 3's last XID (dcgm-exporter's gauge) and 0 for
    // the GPUs that had none.
    nvml.edit(|s| s["hang"] = json!([]));
    let fresh = scrape_until(port, "fresh figures again with GPU 3's XID", |b| {
        value(b, "fumarole_device_metrics_age_seconds").is_some_and(|age| age < 2.0)
            && value(b, "DCGM_FI_DEV_XID_ERRORS{gpu=\"3\"").is_some()
    })
    .await;
    assert_eq!(
        value(&fresh, "DCGM_FI_DEV_XID_ERRORS{gpu=\"3\""),
        Some(79.0),
        "{fresh}"
    );
    assert_eq!(
        value(&fresh, "fumarole_device_last_xid{device=\"nvidia-3\""),
        Some(79.0)
    );
    assert_eq!(
        value(&fresh, "DCGM_FI_DEV_XID_ERRORS{gpu=\"4\""),
        Some(0.0),
        "{fresh}"
    );

    // Every per-device metric the Grafana dashboard queries is one the agent exports here.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(fumarole_e2e::deploy::deploy_dir().join("grafana/fumarole.json"))
            .unwrap(),
    )
    .unwrap();
    let exported: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    let mut queried = 0;
    for target in dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
    {
        let expr = target["expr"].as_str().unwrap();
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("fumarole_device_"))
        {
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                exported.contains(&family),
                "{name} is not exported: {exported:?}"
            );
            queried += 1;
        }
    }
    assert!(queried >= 8, "{queried}");

    // Each holding pod's use in DeviceTopology: train-0 holds GPUs 0 (95 %) and 1 (11 %),
    // infer-0 a share of GPU 2 (12 %), tune-0 GPU 6 by its claim (16 %); then train-0's GPUs go
    // quiet and it is idle.
    let pods_of = |client: kube::Client| async move {
        let dt = device_topologies(client).get_opt(NODE).await?;
        anyhow::Ok(serde_json::to_value(dt)?["status"]["pods"].clone())
    };
    let busy = eventually(
        "train-0's use in DeviceTopology",
        Duration::from_secs(60),
        || async {
            let pods = pods_of(cluster.client()).await?;
            Ok(
                (pods[0]["pod"] == "train-0" && pods[0]["utilizationPercent"] == 50)
                    .then_some(pods),
            )
        },
    )
    .await
    .unwrap();
    assert_eq!(
        busy,
        json!([
            {"namespace": "ml", "pod": "train-0", "devices": 2, "utilizationPercent": 50},
            {"namespace": "ml", "pod": "tune-0", "devices": 1, "utilizationPercent": 20},
            {"namespace": "web", "pod": "infer-0", "devices": 1, "utilizationPercent": 10}
        ])
    );
    nvml.edit(|s| {
        s["gpus"][0]["metrics"]["utilization"] = json!(0);
        s["gpus"][1]["metrics"]["utilization"] = json!(0);
    });
    let idle = eventually(
        "train-0 idle in DeviceTopology",
        Duration::from_secs(60),
        || async {
            let pods = pods_of(cluster.client()).await?;
            Ok(
                (pods[0]["idleSince"].is_string() && pods[0]["utilizationPercent"] == 0)
                    .then_some(pods),
            )
        },
    )
    .await
    .unwrap();
    assert!(
        idle[2].get("idleSince").is_none(),
        "infer-0 is busy: {idle}"
    );
    // kubectl fumarole top shows the same: one idle pod on the node, train-0, since the
    // moment DeviceTopology says.
    let top = top_node(&cluster, NODE).await;
    assert_eq!(top["idlePods"], 1, "{top}");
    assert_eq!(top["idle"][0]["pod"], "train-0", "{top}");
    assert_eq!(top["idle"][0]["idleSince"], idle[0]["idleSince"], "{top}");

    // The holders follow the kubelet: train-0 gone, GPU 0's figures carry no pod.
    kdm.set_pod_resources(json!([])).await.unwrap();
    let free0 = format!(
        "fumarole_device_utilization_ratio{{device=\"nvidia-0\",uuid=\"{gpu0}\",model=\"NVIDIA H100 80GB HBM3\",node=\"{NODE}\",namespace=\"\",pod=\"\",container=\"\"}}"
    );
    let body = scrape_until(port, "GPU 0 without a holder", |b| b.contains(&free0)).await;
    assert!(!body.contains("pod=\"train-0\""), "{body}");
}

/// NPU `i`'s figures as DCMI gives them: AI cores at 40 %, `i` GB of HBM used of 64, 180.5 W,
/// ...
fn npu_figures(i: u64) -> Value {
    json!({
        "aicore": 40, "temperature": 50 + i, "power": 1805, "aicoreFreq": 1800,
        "hbmTotal": 65536, "hbmUsed": i * 1024
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn dcmi_figures_reach_metrics_with_their_pods_under_npu_exporter_names() {
    const NODE: &str = "atlas-1";
    const NPU: &str = "huawei.com/Ascend910";
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(NODE)
                .capacity("cpu", "192")
                .capacity(NPU, "8"),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root("atlas-800-910", dir.path()).unwrap();
    // Chip 5 gives no power figure.
    let chips = ascend_chips(8, |i| {
        let mut figures = npu_figures(i);
        if i == 5 {
            g_remove(&mut figures, "power");
        }
        if i == 0 {
            // HCCS rates per link, GB/s: link 1 carries 0.25 out, link 0 2 in.
            figures["hccsTx"] = json!([1.5, 0.25]);
            figures["hccsRx"] = json!([2.0]);
        }
        json!({"metrics": figures,
               "chipInfo": {"chipType": "Ascend", "chipName": "910B3", "chipVer": "V1", "aicoreCnt": 20}})
    });
    let (lib, mut dcmi) = dcmi_standin(dir.path(), json!({"chips": chips})).unwrap();
    let kdm = cluster
        .start_kubelet_dm_with_pod_resources(
            &dir.path().join("device-plugins"),
            &dir.path().join("pod-resources/kubelet.sock"),
        )
        .await
        .unwrap();
    // train-0 holds NPUs 0 and 1.
    kdm.set_pod_resources(json!([
        {"name": "train-0", "namespace": "ml", "uid": "6f1c8e2a-0000-4000-8000-00000000b001",
         "containers": [{"name": "main", "devices": [{"resource_name": NPU, "device_ids": ["Ascend910-0", "Ascend910-1"]}]}]}
    ]))
    .await
    .unwrap();
    let port = free_port().unwrap();
    AgentBuilder::root(&root)
        .node(NODE)
        .dcmi_standin(&lib, &dcmi.path)
        .kubelet_config(&dir.path().join("absent.yaml"))
        .cpu_manager_state(&dir.path().join("absent_state"))
        .pod_resources_socket(kdm.pod_resources_socket().unwrap())
        .flag("--device-metrics-interval", "300ms")
        .flag("--device-metric-names", "fumarole,npu-exporter")
        .flag("--device-usage-window", "2s")
        .flag("--recheck-interval", "1s")
        .flag("--health-poll-interval", "300ms")
        .metrics_on_port(port)
        .start_in(&cluster)
        .unwrap();

    // npu-exporter's names, labels and units, NPU 0's with its holder.
    let util0 = "npu_chip_info_utilization{id=\"0\",model_name=\"Ascend910B3\",namespace=\"ml\",pod_name=\"train-0\",container_name=\"main\"}";
    let body = scrape_until(port, "NPU 0's utilisation with its pod", |b| {
        b.contains(util0)
    })
    .await;
    assert_eq!(value(&body, util0), Some(40.0), "{body}");
    let free7 = "npu_chip_info_hbm_used_memory{id=\"7\",model_name=\"Ascend910B3\",namespace=\"\",pod_name=\"\",container_name=\"\"}";
    assert_eq!(value(&body, free7), Some(7.0 * 1024.0), "MB: {body}");
    for (prefix, expected) in [
        ("npu_chip_info_hbm_total_memory{id=\"3\"", 65536.0),
        ("npu_chip_info_power{id=\"3\"", 180.5),
        ("npu_chip_info_temperature{id=\"3\"", 53.0),
        ("npu_chip_info_aicore_current_freq{id=\"3\"", 1800.0),
        ("npu_chip_info_health_status{id=\"3\"", 1.0),
        // fumarole's names: base units.
        (
            "fumarole_device_memory_used_bytes{device=\"ascend-3\"",
            (3u64 << 30) as f64,
        ),
        (
            "fumarole_device_aicore_clock_hertz{device=\"ascend-3\"",
            1.8e9,
        ),
        ("fumarole_device_utilization_ratio{device=\"ascend-3\"", 0.4),
    ] {
        assert_eq!(value(&body, prefix), Some(expected), "{prefix}: {body}");
    }
    // HCCS rates per link (bytes/s), with the link before the holder's labels; NPU 0 answers
    // all 16 links, the others no HCCS figure (not supported, counted).
    let hccs = |dir: &str, link: u32| {
        format!(
            "fumarole_device_hccs_{dir}_bytes_per_second{{device=\"ascend-0\",uuid=\"\",model=\"Ascend910B3\",node=\"{NODE}\",link=\"{link}\",namespace=\"ml\",pod=\"train-0\",container=\"main\"}}"
        )
    };
    assert_eq!(value(&body, &hccs("transmit", 1)), Some(0.25e9), "{body}");
    assert_eq!(value(&body, &hccs("receive", 0)), Some(2e9), "{body}");
    assert_eq!(value(&body, &hccs("receive", 15)), Some(0.0), "{body}");
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with("fumarole_device_hccs_transmit_bytes_per_second{"))
            .count(),
        16,
        "{body}"
    );
    // 7 power figures: NPU 5's is left out, and its failure counted.
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with("npu_chip_info_power{"))
            .count(),
        7,
        "{body}"
    );
    assert!(
        metric_sum(
            &body,
            "fumarole_device_metric_errors_total{figure=\"device_power_watts\"}"
        ) >= 1.0,
        "{body}"
    );
    assert!(!body.contains("DCGM_"), "{body}");

    // A figure that changes is read again on the sampler's clock.
    dcmi.edit(|s| s["chips"][0]["metrics"]["aicore"] = json!(90));
    scrape_until(port, "NPU 0 at 90 %", |b| value(b, util0) == Some(90.0)).await;

    // The library hangs in one figure call: scrapes still answer, the figures stay, their age
    // grows; the DCMI health thread (its own handle) still takes a critical alarm in.
    dcmi.edit(|s| s["hang"] = json!(["dcmi_get_device_temperature"]));
    let age = "fumarole_device_metrics_age_seconds{library=\"dcmi\"}";
    let stale = scrape_until(port, "the figures' age past 3 s", |b| {
        value(b, age).is_some_and(|a| a > 3.0)
    })
    .await;
    assert_eq!(value(&stale, util0), Some(90.0), "{stale}");
    dcmi.edit(|s| s["chips"][2]["health"] = json!(3));
    eventually(
        "Ascend910-2 unhealthy while the sampler hangs",
        Duration::from_secs(30),
        || async {
            let dt = device_topologies(cluster.client()).get_opt(NODE).await?;
            let dt = serde_json::to_value(dt)?;
            Ok((dt["status"]["devices"]["Ascend910-2"]["health"] == "Unhealthy").then_some(()))
        },
    )
    .await
    .unwrap();
    dcmi.edit(|s| s["hang"] = json!([]));
    let body = scrape_until(port, "fresh figures again", |b| {
        value(b, age).is_some_and(|a| a < 2.0)
    })
    .await;
    assert_eq!(
        value(&body, "npu_chip_info_health_status{id=\"2\""),
        Some(0.0),
        "{body}"
    );

    // train-0's use in DeviceTopology: NPUs 0 (90 %) and 1 (40 %); then quiet, idle.
    let pods_of = |client: kube::Client| async move {
        let dt = device_topologies(client).get_opt(NODE).await?;
        anyhow::Ok(serde_json::to_value(dt)?["status"]["pods"].clone())
    };
    let busy = eventually(
        "train-0's use in DeviceTopology",
        Duration::from_secs(60),
        || async {
            let pods = pods_of(cluster.client()).await?;
            Ok((pods[0]["utilizationPercent"] == 70).then_some(pods))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        busy,
        json!([{"namespace": "ml", "pod": "train-0", "devices": 2, "utilizationPercent": 70}])
    );
    dcmi.edit(|s| {
        s["chips"][0]["metrics"]["aicore"] = json!(0);
        s["chips"][1]["metrics"]["aicore"] = json!(0);
    });
    let idle = eventually(
        "train-0 idle in DeviceTopology",
        Duration::from_secs(60),
        || async {
            let pods = pods_of(cluster.client()).await?;
            Ok(pods[0]["idleSince"].is_string().then_some(pods))
        },
    )
    .await
    .unwrap();
    let top = top_node(&cluster, NODE).await;
    assert_eq!(top["idlePods"], 1, "{top}");
    assert_eq!(top["idle"][0]["idleSince"], idle[0]["idleSince"], "{top}");
}

/// `kubectl fumarole top -o json` against the test's cluster: the node's entry.
async fn top_node(cluster: &TestCluster, node: &str) -> Value {
    let out = tokio::process::Command::new(fumarole_e2e::fumarole::kubectl_plugin_bin().unwrap())
        .arg(format!(
            "--kubeconfig={}",
            cluster.admin_kubeconfig().display()
        ))
        .args(["top", "-o", "json"])
        .env_remove("KUBECONFIG")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["node"] == node)
        .cloned()
        .unwrap_or_else(|| panic!("{node} not in top: {v}"))
}

fn g_remove(v: &mut Value, key: &str) {
    if let Some(o) = v.as_object_mut() {
        o.remove(key);
    }
}
