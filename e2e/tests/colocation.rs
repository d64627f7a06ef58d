//! `fumarole-agent run --colocation` against the real API server and the real kernel's cgroup
//! v1 `cpu` hierarchy: a fake kubelet layout under `/sys/fs/cgroup/cpu/fumarole-e2e-qos-<pid>/`
//! (the kubelet's `cgroupRoot`), pods bound to the node with the container ids the kubelet
//! would report, the volcano annotations, and the `volcano-agent-configuration` ConfigMap
//! switching QoS and burst on. A BE pod's group goes idle, a burst pod's containers and pod get
//! `cpu.cfs_burst_us`; removing the annotations restores the kubelet's values; a restarted
//! agent writes nothing; switching the features off in the ConfigMap restores them too.
//!
//! Needs root and a kernel with `cpu.idle` and `cpu.cfs_burst_us` in the v1 `cpu` hierarchy;
//! skipped (with a message) otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use fumarole_e2e::cluster::eventually;
use fumarole_e2e::colocation::{AgentRun, CgroupTree, config_map, log, read, running_pod};
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "colo-1";
const BE_ID: &str = "aaaa0001";
const BURST_ID: &str = "bbbb0002";
const PLAIN_ID: &str = "cccc0003";

fn write(dir: &Path, file: &str, value: &str) {
    std::fs::write(dir.join(file), value).unwrap();
}

/// The value once the file holds `want`.
async fn file_becomes(dir: &Path, file: &str, want: &str) {
    let what = format!("{} = {want}", dir.join(file).display());
    eventually(&what, Duration::from_secs(30), move || async move {
        Ok((read(dir, file) == want).then_some(()))
    })
    .await
    .unwrap();
}

fn configmap(qos: bool, burst: bool) -> ConfigMap {
    config_map(&json!({"globalConfig": {
        "cpuQosConfig": {"enable": qos},
        "cpuBurstConfig": {"enable": burst},
    }}))
}

#[tokio::test(flavor = "multi_thread")]
async fn qos_levels_and_burst_on_the_real_kernel_and_no_rewrite_after_restart() {
    let Some(tree) = CgroupTree::create(
        "qos",
        &["cpu"],
        &[("cpu", "cpu.cfs_burst_us"), ("cpu", "cpu.idle")],
    ) else {
        return;
    };
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(NODE)
                .capacity("cpu", "8")
                .capacity("memory", "32Gi")
                .label("volcano.sh/colocation", "true"),
        )
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    configmaps
        .create(&PostParams::default(), &configmap(true, true))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");

    let be_uid = running_pod(
        &pods,
        NODE,
        "offline",
        json!({"volcano.sh/qos-level": "BE"}),
        json!({"resources": {"requests": {"cpu": "500m"}}}),
        BE_ID,
    )
    .await
    .unwrap();
    let burst_uid = running_pod(
        &pods,
        NODE,
        "bursty",
        json!({"volcano.sh/enable-quota-burst": "true", "volcano.sh/quota-burst-time": "30000"}),
        json!({"resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m"}}}),
        BURST_ID,
    )
    .await
    .unwrap();
    let plain_uid = running_pod(&pods, NODE, "plain", json!({}), json!({}), PLAIN_ID)
        .await
        .unwrap();
    let qos = |p: Pod| p.status.unwrap().qos_class.unwrap();
    assert_eq!(qos(pods.get("offline").await.unwrap()), "Burstable");
    assert_eq!(qos(pods.get("plain").await.unwrap()), "BestEffort");

    // The kubelet's side: pod and container cgroups, the burst pod's quota from its limit.
    let mk = |rel: String| tree.mkdir("cpu", &rel).unwrap();
    let be_pod = mk(format!("kubepods/burstable/pod{be_uid}"));
    mk(format!("kubepods/burstable/pod{be_uid}/{BE_ID}"));
    let burst_pod = mk(format!("kubepods/burstable/pod{burst_uid}"));
    let burst_container = mk(format!("kubepods/burstable/pod{burst_uid}/{BURST_ID}"));
    let plain_pod = mk(format!("kubepods/besteffort/pod{plain_uid}"));
    mk(format!("kubepods/besteffort/pod{plain_uid}/{PLAIN_ID}"));
    write(&be_pod, "cpu.shares", "512");
    write(&burst_pod, "cpu.cfs_quota_us", "50000");
    write(&burst_container, "cpu.cfs_quota_us", "50000");
    write(&plain_pod, "cpu.shares", "2");

    let dir = tempfile::tempdir().unwrap();
    let config = tree.kubelet_config(dir.path()).unwrap();
    let start = |name: &str| {
        AgentRun::new(name, NODE, &config, dir.path())
            .args(&["--qos-interval", "1s"])
            .start(&cluster)
            .unwrap()
            .0
    };

    let mut agent = start("fumarole-agent-colo");
    file_becomes(&be_pod, "cpu.idle", "1").await;
    file_becomes(&burst_container, "cpu.cfs_burst_us", "30000").await;
    file_becomes(&burst_pod, "cpu.cfs_burst_us", "30000").await;
    // Never annotated: left as the kubelet set it.
    assert_eq!(read(&plain_pod, "cpu.shares"), "2");
    assert_eq!(read(&plain_pod, "cpu.idle"), "0");

    // Annotations removed: the kubelet's values come back.
    for (name, key) in [
        ("offline", "volcano.sh/qos-level"),
        ("bursty", "volcano.sh/enable-quota-burst"),
        ("bursty", "volcano.sh/quota-burst-time"),
    ] {
        pods.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: null}}})),
        )
        .await
        .unwrap();
    }
    file_becomes(&be_pod, "cpu.idle", "0").await;
    file_becomes(&be_pod, "cpu.shares", "512").await;
    file_becomes(&burst_container, "cpu.cfs_burst_us", "0").await;
    file_becomes(&burst_pod, "cpu.cfs_burst_us", "0").await;
    assert!(
        log(&agent).contains("cgroup value changed"),
        "{}",
        log(&agent)
    );
    agent.stop();

    // A restarted agent finds everything in place: it syncs and writes nothing.
    let again = start("fumarole-agent-colo-restarted");
    let restarted = &again;
    eventually(
        "the restarted agent's first round",
        Duration::from_secs(30),
        move || async move {
            Ok(log(restarted)
                .contains("co-location: pods synced")
                .then_some(()))
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = log(&again);
    assert!(!text.contains("cgroup value changed"), "{text}");
    assert!(!text.contains("not fully applied"), "{text}");
    assert_eq!(read(&be_pod, "cpu.idle"), "0");
    assert_eq!(read(&be_pod, "cpu.shares"), "512");
    assert_eq!(read(&burst_pod, "cpu.cfs_burst_us"), "0");

    // Annotated again, then the ConfigMap switches both features off (hot reload): the
    // kubelet's values come back though the annotations stay.
    pods.patch(
        "offline",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"volcano.sh/qos-level": "BE"}}})),
    )
    .await
    .unwrap();
    pods.patch(
        "bursty",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"volcano.sh/enable-quota-burst": "true"}}}),
        ),
    )
    .await
    .unwrap();
    file_becomes(&be_pod, "cpu.idle", "1").await;
    file_becomes(&burst_container, "cpu.cfs_burst_us", "50000").await;
    configmaps
        .replace(
            "volcano-agent-configuration",
            &PostParams::default(),
            &configmap(false, false),
        )
        .await
        .unwrap();
    file_becomes(&be_pod, "cpu.idle", "0").await;
    file_becomes(&be_pod, "cpu.shares", "512").await;
    file_becomes(&burst_container, "cpu.cfs_burst_us", "0").await;
    file_becomes(&burst_pod, "cpu.cfs_burst_us", "0").await;
    drop(again);
    drop(cluster);
    drop(tree);
}
