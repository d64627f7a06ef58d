//! `fumarole-agent run --colocation` against the real API server and the real kernel's cgroup
//! v1 `cpu` hierarchy: a fake kubelet layout under `/sys/fs/cgroup/cpu/fumarole-e2e-qos-<pid>/`
//! (the kubelet's `cgroupRoot`), pods bound to the node with the container ids the kubelet
//! would report, the volcano annotations, and the `volcano-agent-configuration` ConfigMap
//! switching QoS and burst on. A BE pod's group goes idle, a burst pod's containers and pod get
//! `cpu.cfs_burst_us`; removing the annotations restores the kubelet's values; a restarted
//! agent writes nothing; switching the features off in the ConfigMap restores them too.
//!
//! And in the v1 `cpu` and `memory` hierarchies: a BestEffort pod asking for
//! `kubernetes.io/batch-cpu` / `batch-memory` gets them as `cpu.shares`, `cpu.cfs_quota_us` and
//! `memory.limit_in_bytes` of its container and pod, without any configuration; a Burstable pod
//! asking for them too keeps the kubelet's values; a restarted agent writes nothing.
//!
//! Needs root and a kernel with `cpu.idle` and `cpu.cfs_burst_us` in the v1 `cpu` hierarchy (the
//! batch test: a v1 `memory` hierarchy); skipped (with a message) otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, http_get, metric_sum};
use fumarole_e2e::colocation::{self, CgroupTree, config_map, log, read, running_pod};
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "colo-1";
const BE_ID: &str = "aaaa0001";
const BURST_ID: &str = "bbbb0002";
const PLAIN_ID: &str = "cccc0003";
const BATCH_ID: &str = "dddd0004";
const MIXED_ID: &str = "eeee0005";

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
        colocation::agent(NODE, &config, dir.path())
            .unwrap()
            .process(name)
            .flag("--qos-interval", "1s")
            .spawn_in(&cluster)
            .unwrap()
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

/// Waits for the agent's first pod round after a start, then a few more rounds.
async fn settled(agent: &fumarole_e2e::process::Proc) {
    eventually(
        "the agent's first pod round",
        Duration::from_secs(30),
        move || async move {
            Ok(log(agent)
                .contains("co-location: pods synced")
                .then_some(()))
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn batch_resources_become_cgroup_limits_on_the_real_kernel() {
    let Some(tree) = CgroupTree::create(
        "batch",
        &["cpu", "memory"],
        &[
            ("cpu", "cpu.cfs_quota_us"),
            ("memory", "memory.limit_in_bytes"),
        ],
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
                .label("volcano.sh/oversubscription", "true"),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let batch = json!({
        "requests": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "1Gi"},
        "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "1Gi"},
    });
    let batch_uid = running_pod(
        &pods,
        NODE,
        "batch-job",
        json!({"volcano.sh/qos-level": "BE"}),
        json!({ "resources": batch }),
        BATCH_ID,
    )
    .await
    .unwrap();
    let mut mixed = batch.clone();
    mixed["requests"]["cpu"] = json!("500m");
    let mixed_uid = running_pod(
        &pods,
        NODE,
        "mixed",
        json!({}),
        json!({ "resources": mixed }),
        MIXED_ID,
    )
    .await
    .unwrap();
    let qos = |p: Pod| p.status.unwrap().qos_class.unwrap();
    // The API server counts only cpu and memory for the class.
    assert_eq!(qos(pods.get("batch-job").await.unwrap()), "BestEffort");
    assert_eq!(qos(pods.get("mixed").await.unwrap()), "Burstable");

    // The kubelet's side, in both hierarchies: a BestEffort pod has the minimal shares and no
    // limits; the Burstable one the shares of its 500m request.
    let batch_rel = format!("kubepods/besteffort/pod{batch_uid}");
    let mixed_rel = format!("kubepods/burstable/pod{mixed_uid}");
    let mut dirs = Vec::new();
    for rel in [
        batch_rel.clone(),
        format!("{batch_rel}/{BATCH_ID}"),
        mixed_rel.clone(),
        format!("{mixed_rel}/{MIXED_ID}"),
    ] {
        let cpu = tree.mkdir("cpu", &rel).unwrap();
        write(
            &cpu,
            "cpu.shares",
            if rel.contains("burstable") {
                "512"
            } else {
                "2"
            },
        );
        dirs.push((cpu, tree.dir("memory", &rel)));
    }
    let [
        (pod_cpu, pod_memory),
        (container_cpu, container_memory),
        (mixed_cpu, mixed_memory),
        _,
    ] = <[_; 4]>::try_from(dirs).unwrap();
    let unlimited = read(&pod_memory, "memory.limit_in_bytes");

    let dir = tempfile::tempdir().unwrap();
    let config = tree.kubelet_config(dir.path()).unwrap();
    let start = |name: &str| {
        let agent = colocation::agent(NODE, &config, dir.path())
            .unwrap()
            .process(name)
            .flag("--qos-interval", "1s");
        (
            agent.spawn_in(&cluster).unwrap(),
            agent.metrics_port().unwrap(),
        )
    };

    let (agent, metrics_port) = start("fumarole-agent-batch");
    // 1500m requested: 1536 shares; 2000m limit: 200 ms per 100 ms period; 1 GiB.
    for cpu in [&container_cpu, &pod_cpu] {
        file_becomes(cpu, "cpu.shares", "1536").await;
        file_becomes(cpu, "cpu.cfs_quota_us", "200000").await;
    }
    for memory in [&container_memory, &pod_memory] {
        file_becomes(memory, "memory.limit_in_bytes", "1073741824").await;
    }
    settled(&agent).await;
    // Native requests: the kubelet's values stay.
    assert_eq!(read(&mixed_cpu, "cpu.shares"), "512");
    assert_eq!(read(&mixed_cpu, "cpu.cfs_quota_us"), "-1");
    assert_eq!(read(&mixed_memory, "memory.limit_in_bytes"), unlimited);
    let metrics = http_get(metrics_port, "/metrics").await.unwrap();
    assert_eq!(
        metric_sum(&metrics, "fumarole_colocation_batch_limited_pods"),
        1.0,
        "{metrics}"
    );
    assert_eq!(metric_sum(&metrics, "fumarole_colocation_pod_errors"), 0.0);
    let text = log(&agent);
    assert!(!text.contains("not fully applied"), "{text}");
    drop(agent);

    // A restarted agent finds the limits in place and writes nothing.
    let (again, _) = start("fumarole-agent-batch-restarted");
    settled(&again).await;
    let text = log(&again);
    assert!(!text.contains("cgroup value changed"), "{text}");
    assert_eq!(read(&pod_cpu, "cpu.cfs_quota_us"), "200000");
    drop(again);
    drop(cluster);
    drop(tree);
}
