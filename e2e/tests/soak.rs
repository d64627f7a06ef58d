//! Fault soak: `fumarole-agent run` in cluster mode (device plugins, publishing, co-location)
//! on the dgx-h100 fixture, against the real API server, kubelet-dm and the real kernel's
//! cgroup v1 `cpu` hierarchy, while the test keeps breaking its world for a bounded number of
//! rounds (10 by default, about a minute; `FUMAROLE_SOAK_ROUNDS` sets another count):
//!
//! - every round: the kubelet side restarts (kubelet-dm drops its registrations and re-creates
//!   `kubelet.sock`), pods churn (the last round's pods and their cgroups go, three new ones
//!   come: a BE pod, a CPU-burst pod, a pod with bad QoS and burst annotations) and a pending
//!   pod carries a garbled `fumarole.dev/devices`;
//! - GPU 3's device node disappears on odd rounds and comes back on even ones;
//! - round 3 replaces the co-location ConfigMap with invalid JSON, round 5 restores a valid
//!   one; round 4 stops the API server for a few seconds.
//!
//! Afterwards every object is current (DeviceTopology device health and co-location report,
//! NodeResourceTopology GPU counts, batch resources on the Node), every device is registered
//! with the kubelet with its health, the last round's cgroups hold what their annotations ask
//! (and the badly annotated pod's hold the kubelet's values), the agent never panicked, and its
//! RSS and open descriptors at the end are where they were after warm-up (both printed).
//!
//! The agent runs as the DaemonSet runs it: root without any capability, and in its own mount
//! namespace with only the DaemonSet's mounts of the host's cgroups (the kubelet's pod cgroups
//! of the cpu, cpuacct and memory hierarchies, as the chart's `qos.cgroupMounts` for cgroup v1)
//! and of `/proc` (the pressure files); the host's `/sys/fs/cgroup` is empty to it (checked).
//!
//! Needs root and cgroup v1 `cpu` (with `cpu.idle`, `cpu.cfs_burst_us`), `cpuacct` and
//! `memory` hierarchies; skipped otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure};
use fumarole_e2e::cluster::{eventually, http_get, metric_sum};
use fumarole_e2e::colocation::{self, CgroupTree, config_map, log, read, running_pod};
use fumarole_e2e::fumarole::{device_topologies, fixture_root, node_resource_topologies};
use fumarole_e2e::process::Footprint;
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "soak-1";
const GPU: &str = "nvidia.com/gpu";
const CONFIG: &str = "volcano-agent-configuration";
/// GPU 3 (NUMA node 0) is the one whose device node comes and goes.
const FLIPPED: usize = 3;

fn good_config() -> ConfigMap {
    config_map(&json!({"globalConfig": {
        "cpuQosConfig": {"enable": true},
        "cpuBurstConfig": {"enable": true},
        // The machine's own load and memory pressure are not under test.
        "evictingConfig": {"monitorInterval": 1, "evictingCPUHighWatermark": 100,
            "evictingCPULowWatermark": 99, "evictingMemoryHighWatermark": 100,
            "evictingMemoryLowWatermark": 99, "evictingCPUPressureThreshold": 100,
            "evictingMemoryPressureThreshold": 100},
    }}))
}

fn bad_config() -> ConfigMap {
    let mut cm = good_config();
    cm.data = Some(
        [(
            "colocation-config".to_string(),
            "{\"globalConfig\": {".to_string(),
        )]
        .into(),
    );
    cm
}

/// One round's pods: (name, pod cgroup, container cgroup) each, and the pending pod's name.
struct RoundPods {
    pods: Vec<(String, PathBuf, PathBuf)>,
    pending: String,
}

/// The kubelet's side of a pod: its cgroup and its container's, with the values it sets.
fn kubelet_cgroups(
    tree: &CgroupTree,
    class: &str,
    uid: &str,
    container: &str,
    shares: &str,
    quota: &str,
) -> (PathBuf, PathBuf) {
    let pod = tree
        .mkdir("cpu", &format!("kubepods/{class}/pod{uid}"))
        .unwrap();
    let c = tree
        .mkdir("cpu", &format!("kubepods/{class}/pod{uid}/{container}"))
        .unwrap();
    for dir in [&pod, &c] {
        // The agent may have made a BE pod's group idle already (it acts on the pod from its
        // creation), and the kernel refuses cpu.shares on an idle group: the kubelet's value
        // no longer matters there.
        if let Err(e) = std::fs::write(dir.join("cpu.shares"), shares) {
            assert_eq!(
                read(dir, "cpu.idle"),
                "1",
                "cpu.shares in {}: {e}",
                dir.display()
            );
        }
        std::fs::write(dir.join("cpu.cfs_quota_us"), quota).unwrap();
    }
    (pod, c)
}

fn burst_time(round: usize) -> u64 {
    20_000 + 1_000 * round as u64
}

async fn churn(
    tree: &CgroupTree,
    pods: &Api<Pod>,
    round: usize,
    last: Option<RoundPods>,
) -> RoundPods {
    let gone = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    if let Some(last) = last {
        for (name, pod, container) in last.pods {
            pods.delete(&name, &gone).await.unwrap();
            // The kubelet removes the cgroups once the containers are gone.
            std::fs::remove_dir(container).unwrap();
            std::fs::remove_dir(pod).unwrap();
        }
        pods.delete(&last.pending, &gone).await.unwrap();
    }
    let be = format!("be-{round}");
    let burst = format!("burst-{round}");
    let bad = format!("bad-{round}");
    let id = |kind: u32| format!("{kind:04x}{round:04x}");
    let requests = json!({"resources": {"requests": {"cpu": "500m"}}});
    let limited = json!({"resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m"}}});
    let be_uid = running_pod(
        pods,
        NODE,
        &be,
        json!({"volcano.sh/qos-level": "BE"}),
        requests.clone(),
        &id(1),
    )
    .await
    .unwrap();
    let burst_uid = running_pod(
        pods,
        NODE,
        &burst,
        json!({"volcano.sh/enable-quota-burst": "true",
               "volcano.sh/quota-burst-time": burst_time(round).to_string()}),
        limited.clone(),
        &id(2),
    )
    .await
    .unwrap();
    let bad_annotations = [
        json!({"volcano.sh/qos-level": "be", "volcano.sh/enable-quota-burst": "yes"}),
        json!({"volcano.sh/qos-level": "", "volcano.sh/enable-quota-burst": "true",
               "volcano.sh/quota-burst-time": "-5"}),
        json!({"volcano.sh/qos-level": "LC\n", "volcano.sh/enable-quota-burst": "true",
               "volcano.sh/quota-burst-time": "18446744073709551616"}),
    ][round % 3]
        .clone();
    let bad_uid = running_pod(pods, NODE, &bad, bad_annotations, limited, &id(3))
        .await
        .unwrap();
    let (be_pod, be_c) = kubelet_cgroups(tree, "burstable", &be_uid, &id(1), "512", "-1");
    let (burst_pod, burst_c) =
        kubelet_cgroups(tree, "burstable", &burst_uid, &id(2), "256", "50000");
    let (bad_pod, bad_c) = kubelet_cgroups(tree, "burstable", &bad_uid, &id(3), "256", "50000");

    let pending = format!("pending-{round}");
    let garbled: Pod = serde_json::from_value(json!({
        "metadata": {"name": pending, "annotations": {"fumarole.dev/devices": "GPU-1,GPU-2"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "example.invalid/none",
            "resources": {"limits": {GPU: "2"}}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &garbled).await.unwrap();
    RoundPods {
        pods: vec![
            (be, be_pod, be_c),
            (burst, burst_pod, burst_c),
            (bad, bad_pod, bad_c),
        ],
        pending,
    }
}

/// Takes GPU 3's device node away (`present == false`) or puts it back.
fn flip(root: &Path, present: bool) {
    let node = root.join(format!("dev/nvidia{FLIPPED}"));
    let away = root.join(format!("dev/nvidia{FLIPPED}.away"));
    if present && away.exists() {
        std::fs::rename(away, node).unwrap();
    } else if !present && node.exists() {
        std::fs::rename(node, away).unwrap();
    }
}

fn healths(devices: &[Value]) -> Vec<bool> {
    devices.iter().map(|d| d["health"] == "Healthy").collect()
}

/// The agent `pid` sees, of the host's cgroup filesystems, only the `kubepods` cgroup of the
/// cpu, cpuacct and memory hierarchies (under `cgroup_root`), and an empty `/sys/fs/cgroup`.
fn assert_sees_only_the_daemonsets_mounts(pid: u32, cgroup_root: &str) {
    let proc = Path::new("/proc").join(pid.to_string());
    // The mount namespace is set up before the agent starts; wait for its exec.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_link(proc.join("exe"))
        .is_ok_and(|e| e.to_string_lossy().contains("fumarole-agent"))
    {
        assert!(Instant::now() < deadline, "the agent did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mountinfo = std::fs::read_to_string(proc.join("mountinfo")).unwrap();
    let mut cgroup_mounts: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let root = left.split(' ').nth(3)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| format!("{root} {fstype}"))
        })
        .collect();
    cgroup_mounts.sort();
    let kubepods = format!("{cgroup_root}/kubepods");
    assert_eq!(
        cgroup_mounts,
        [0, 1, 2].map(|_| format!("{kubepods} cgroup")),
        "the agent's cgroup mounts (root within the hierarchy, type):\n{mountinfo}"
    );
    let cgroups: Vec<_> = std::fs::read_dir(proc.join("root/sys/fs/cgroup"))
        .unwrap()
        .collect();
    assert!(cgroups.is_empty(), "the agent sees {cgroups:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_survives_restarts_churn_flips_and_bad_input_with_flat_footprint() {
    let Some(tree) = CgroupTree::create(
        "soak",
        &["cpu", "cpuacct", "memory"],
        &[
            ("cpu", "cpu.cfs_burst_us"),
            ("cpu", "cpu.idle"),
            ("cpuacct", "cpuacct.usage"),
            ("memory", "memory.stat"),
        ],
    ) else {
        return;
    };
    let rounds: usize = std::env::var("FUMAROLE_SOAK_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(10);
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(NODE)
                .capacity("cpu", "224")
                .capacity("memory", "2Ti")
                .capacity(GPU, "8")
                .label("volcano.sh/colocation", "true")
                .label("volcano.sh/oversubscription", "true"),
        )
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    configmaps
        .create(&PostParams::default(), &good_config())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let nodes: Api<Node> = Api::all(cluster.client());

    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root("dgx-h100", dir.path()).unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let kdm = cluster.start_kubelet_dm(&plugins).await.unwrap();
    let kubelet_config = tree.kubelet_config(dir.path()).unwrap();
    // The host as the DaemonSet shows it to the agent: of the cgroup tree only the kubelet's
    // pod cgroups, of /proc only the pressure files.
    tree.mkdir("cpu", "kubepods").unwrap();
    let host = dir.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let (mounts, flags) = tree.daemonset_mounts(&host).unwrap();
    let mut agent = colocation::agent(NODE, &kubelet_config, dir.path())
        .unwrap()
        .process("fumarole-agent-soak")
        .on_root(&root)
        .device_plugin_dir(&plugins)
        .flag("--recheck-interval", "2s")
        .flag("--qos-interval", "1s")
        .without_capabilities()
        .in_mount_namespace(&mounts);
    for (flag, value) in &flags {
        agent = agent.flag(flag, value);
    }
    let metrics = agent.metrics_port().unwrap();
    let mut agent = agent.spawn_in(&cluster).unwrap();
    assert_sees_only_the_daemonsets_mounts(agent.pid(), &tree.cgroup_root());

    // Warm-up: registered, published, one round of pods handled.
    kdm.wait_devices(GPU, Duration::from_secs(60), |d| d.len() == 8)
        .await
        .unwrap();
    let mut last = Some(churn(&tree, &pods, 0, None).await);
    let dts = device_topologies(cluster.client());
    eventually(
        "the first co-location report",
        Duration::from_secs(60),
        || {
            let dts = &dts;
            async move {
                let dt = dts.get_opt(NODE).await?;
                let burst = dt
                    .as_ref()
                    .map(|o| o.data["status"]["colocation"]["burstPods"].clone());
                ensure!(burst == Some(json!(1)), "burstPods {burst:?}");
                Ok(Some(()))
            }
        },
    )
    .await
    .unwrap();
    let start = Footprint::of(agent.pid()).unwrap();
    let started = Instant::now();

    for round in 1..=rounds {
        let since = kdm.state().await.unwrap()["generation"].as_u64().unwrap();
        let generation = kdm.restart().await.unwrap();
        assert_eq!(generation, since + 1);
        flip(&root, round.is_multiple_of(2));
        match round {
            3 => {
                configmaps
                    .replace(CONFIG, &PostParams::default(), &bad_config())
                    .await
                    .unwrap();
            }
            5 => {
                configmaps
                    .replace(CONFIG, &PostParams::default(), &good_config())
                    .await
                    .unwrap();
            }
            4 => {
                cluster.stop_apiserver().unwrap();
                tokio::time::sleep(Duration::from_secs(4)).await;
                cluster.start_apiserver().await.unwrap();
            }
            _ => {}
        }
        last = Some(churn(&tree, &pods, round, last.take()).await);
        tokio::time::sleep(Duration::from_secs(3)).await;
        agent.check_running().unwrap();
    }
    let last = last.unwrap();
    let gpu3_healthy = rounds.is_multiple_of(2);
    let mut want_health = vec![true; 8];
    want_health[FLIPPED] = gpu3_healthy;

    // Every device registered with the kubelet, with its health.
    kdm.wait_devices(GPU, Duration::from_secs(60), |d| healths(d) == want_health)
        .await
        .unwrap();
    let state = kdm.state().await.unwrap();
    assert_eq!(state["generation"].as_u64().unwrap() as usize, rounds + 1);
    // A preferred allocation still works, with the garbled pending pod skipped.
    let offered: Vec<Value> = state["devices"][GPU]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["health"] == "Healthy")
        .map(|d| d["ID"].clone())
        .collect();
    let preferred = kdm
        .preferred(
            GPU,
            json!({"container_requests": [{"available_deviceIDs": offered, "must_include_deviceIDs": [],
                "allocation_size": 2}]}),
        )
        .await
        .unwrap();
    assert_eq!(
        preferred["container_responses"][0]["deviceIDs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Every object current.
    let nrts = node_resource_topologies(cluster.client());
    let want_healthy = want_health.iter().filter(|h| **h).count() as u64;
    eventually(
        "DeviceTopology, NodeResourceTopology and the Node to be current",
        Duration::from_secs(60),
        || {
            let (dts, nrts, nodes) = (&dts, &nrts, &nodes);
            async move {
                let dt = dts.get(NODE).await?;
                let status = &dt.data["status"];
                let healthy = status["healthyCount"].as_u64();
                ensure!(healthy == Some(want_healthy), "healthyCount {healthy:?}");
                let colocation = &status["colocation"];
                ensure!(
                    colocation["burstPods"] == json!(1)
                        && colocation["qosLevelPods"]["BE"] == json!(1)
                        && colocation.get("configError").is_none(),
                    "colocation report {colocation}"
                );
                let nrt = nrts.get(NODE).await?;
                let zone0_gpus = nrt.data["zones"]
                    .as_array()
                    .and_then(|z| z.iter().find(|z| z["name"] == "node-0"))
                    .and_then(|z| z["resources"].as_array())
                    .and_then(|r| r.iter().find(|r| r["name"] == GPU))
                    .map(|r| r["allocatable"].clone());
                let want = json!(if gpu3_healthy { "4" } else { "3" });
                ensure!(
                    zone0_gpus == Some(want.clone()),
                    "NUMA node 0 {GPU} allocatable {zone0_gpus:?}, want {want}"
                );
                let node = nodes.get(NODE).await?;
                let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
                ensure!(
                    capacity.contains_key("kubernetes.io/batch-cpu"),
                    "no batch-cpu on the Node"
                );
                Ok(Some(()))
            }
        },
    )
    .await
    .unwrap();

    // Cgroups as desired for the last round's pods.
    let [(_, be_pod, _), (_, burst_pod, burst_c), (_, bad_pod, bad_c)] = &last.pods[..] else {
        unreachable!()
    };
    let want_burst = burst_time(rounds).to_string();
    eventually("the last round's cgroups", Duration::from_secs(30), || {
        let got = [
            read(be_pod, "cpu.idle"),
            read(burst_c, "cpu.cfs_burst_us"),
            read(burst_pod, "cpu.cfs_burst_us"),
        ];
        let want = ["1", want_burst.as_str(), want_burst.as_str()];
        std::future::ready(if got == want {
            Ok(Some(()))
        } else {
            Err(anyhow!("{got:?}"))
        })
    })
    .await
    .unwrap();
    // Bad annotations are skipped: the kubelet's values stay.
    for dir in [bad_pod, bad_c] {
        assert_eq!(read(dir, "cpu.idle"), "0", "{}", dir.display());
        assert_eq!(read(dir, "cpu.cfs_burst_us"), "0", "{}", dir.display());
        assert_eq!(read(dir, "cpu.shares"), "256", "{}", dir.display());
    }
    let metrics_text = http_get(metrics, "/metrics").await.unwrap();
    assert_eq!(
        metric_sum(&metrics_text, "fumarole_colocation_config_valid"),
        1.0
    );

    // Settled again: the footprint is where it was after warm-up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    agent.check_running().unwrap();
    let end = Footprint::of(agent.pid()).unwrap();
    let text = log(&agent);
    eprintln!(
        "soak: {rounds} rounds in {:.0} s; agent RSS {:.1} MiB -> {:.1} MiB, fds {} -> {}; \
         log {} lines",
        started.elapsed().as_secs_f64(),
        start.rss_mib(),
        end.rss_mib(),
        start.fds,
        end.fds,
        text.lines().count()
    );
    assert!(!text.contains("panicked"), "{text}");
    // The faults reached the agent: a registration per kubelet start, the flips, the bad
    // ConfigMap refused (a re-list while it was in force may refuse it again).
    let lines = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    assert!(lines("registered with the kubelet") > rounds, "{text}");
    assert!(lines("device health changed") >= rounds / 2, "{text}");
    assert!(lines("co-location config refused") >= 1, "{text}");
    assert!(
        end.fds <= start.fds + 4,
        "descriptors grew: {} -> {}",
        start.fds,
        end.fds
    );
    assert!(
        end.rss_kib <= start.rss_kib + start.rss_kib / 4,
        "RSS grew: {:.1} MiB -> {:.1} MiB",
        start.rss_mib(),
        end.rss_mib()
    );
}
