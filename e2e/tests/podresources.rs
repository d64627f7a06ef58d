//! The exporter (`fumarole-agent run`) reading the kubelet's real PodResources v1 server:
//! `kubelet-dm --pod-resources-socket` serves `k8s.io/kubernetes/pkg/kubelet/apis/podresources`
//! (the kubelet's own `List`, gRPC registration and rate limiter), with pods set over its JSON
//! API. The Numatopology, DeviceTopology and NodeResourceTopology follow what it reports, and
//! when it dies the agent falls back to the CPU manager checkpoint. A GPU's replicas held by
//! pods are listed, holder by holder, under the GPU in `DeviceTopology`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port};
use fumarole_e2e::fumarole::{device_topologies, node_resource_topologies, numatopologies};
use fumarole_e2e::{AgentBuilder, KubeletDm, NodeSpec, TestCluster};
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};

const CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\nkubeReserved: {cpu: \"1\", memory: 1Gi}\n";

/// The CPU manager checkpoint: one pod that PodResources does not know, so it is visible
/// which of the two the agent read.
const CHECKPOINT: &str = r#"{"policyName":"static","defaultCpuSet":"0-9,12-223","entries":{"ckpt-uid":{"side":"10-11"}},"checksum":1}"#;

const NODE: &str = "dgx-1";
const GPU: &str = "nvidia.com/gpu";

/// The `dgx-h100` fixture's GPU uuids are deterministic; GPUs 0-3 are on NUMA node 0.
fn gpu(i: u32) -> String {
    format!("GPU-f55b88b0-0000-4000-8000-00000000000{i}")
}
/// `NODE`'s object once `ready` holds for it.
async fn wait_for(
    what: &str,
    api: &Api<DynamicObject>,
    ready: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    let last = std::sync::Mutex::new(None::<Value>);
    let r = eventually(what, Duration::from_secs(60), || {
        let api = api.clone();
        let ok = &ready;
        let last = &last;
        async move {
            let o = api.get_opt(NODE).await?;
            *last.lock().unwrap() = o.as_ref().map(|o| o.data.clone());
            Ok(o.filter(|o| ok(o)))
        }
    })
    .await;
    match r {
        Ok(o) => o,
        Err(e) => panic!(
            "{e:#}\nlast seen: {:#}",
            last.lock().unwrap().clone().unwrap_or_default()
        ),
    }
}

/// `nvidia.com/gpu` `available` in NodeResourceTopology zone `zone`.
fn gpus_available(nrt: &DynamicObject, zone: &str) -> Option<String> {
    let zone = nrt.data["zones"]
        .as_array()?
        .iter()
        .find(|z| z["name"] == zone)?;
    let r = zone["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == GPU)?;
    r["available"].as_str().map(str::to_string)
}

fn allocation(dt: &DynamicObject, id: &str) -> Value {
    dt.data["status"]["devices"][id]["allocation"].clone()
}

fn train_pod(devices: Value) -> Value {
    json!([{
        "name": "train-0",
        "namespace": "ml",
        "uid": "6f1c8e2a-0000-4000-8000-00000000a001",
        "containers": [{"name": "main", "cpu_ids": [4, 5, 6, 7], "devices": devices}]
    }])
}

/// A cluster with the fumarole CRDs and Node `NODE`, and `kubelet-dm` serving PodResources
/// (its files in the returned directory).
async fn start() -> (TestCluster, KubeletDm, tempfile::TempDir) {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(NODE)
                .capacity("cpu", "224")
                .capacity("memory", "512Gi"),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kdm = cluster
        .start_kubelet_dm_with_pod_resources(
            &dir.path().join("device-plugins"),
            &dir.path().join("pod-resources/kubelet.sock"),
        )
        .await
        .unwrap();
    (cluster, kdm, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn exporter_follows_the_kubelets_podresources_server() {
    let (cluster, kdm, dir) = start().await;
    let socket = kdm.pod_resources_socket().unwrap().to_path_buf();
    assert!(socket.exists(), "{} not served", socket.display());

    // The kubelet's own List answers what was set.
    let two_gpus = json!([{"resource_name": GPU, "device_ids": [gpu(0), gpu(1)]}]);
    let set = kdm
        .set_pod_resources(train_pod(two_gpus.clone()))
        .await
        .unwrap();
    assert_eq!(
        set["list"]["pod_resources"],
        json!([{"name": "train-0", "namespace": "ml", "containers": [
            {"name": "main", "cpu_ids": [4, 5, 6, 7], "devices": [{"resource_name": GPU, "device_ids": [gpu(0), gpu(1)]}]}
        ]}]),
        "{set:#}"
    );

    let config = dir.path().join("config.yaml");
    let state = dir.path().join("cpu_manager_state");
    std::fs::write(&config, CONFIG).unwrap();
    std::fs::write(&state, CHECKPOINT).unwrap();
    AgentBuilder::fixture("dgx-h100")
        .node(NODE)
        .kubelet_config(&config)
        .cpu_manager_state(&state)
        .pod_resources_socket(&socket)
        .flag("--recheck-interval", "1s")
        .metrics_on_port(free_port().unwrap())
        .env("FUMAROLE_LOG", "info")
        .start_in(&cluster)
        .unwrap();

    // 1. train-0 holds CPUs 4-7 and GPUs 0 and 1 (NUMA node 0).
    let numa = wait_for(
        "Numatopology with train-0",
        &numatopologies(cluster.client()),
        |o| o.data["spec"]["numares"]["cpu"]["allocatable"] == "0-3,8-223",
    )
    .await;
    let pods = numa.data["spec"]["podAllocations"].as_array().unwrap();
    assert_eq!(pods.len(), 1, "{pods:#?}");
    assert_eq!(pods[0]["name"], "train-0");
    assert_eq!(pods[0]["namespace"], "ml");
    assert_eq!(
        pods[0]["containerAllocations"],
        json!([{"name": "main", "allocations": {"cpu": "4-7", GPU: "2"}}])
    );
    let held = json!({"namespace": "ml", "pod": "train-0", "container": "main"});
    let dt = wait_for(
        "DeviceTopology with GPUs 0, 1 held",
        &device_topologies(cluster.client()),
        |o| allocation(o, &gpu(0)) == held && allocation(o, &gpu(1)) == held,
    )
    .await;
    for i in 2..8 {
        assert_eq!(allocation(&dt, &gpu(i)), Value::Null, "GPU {i}");
    }
    assert_eq!(dt.data["status"]["healthyCount"], 8);
    let nrt = wait_for(
        "NodeResourceTopology with 2 GPUs held",
        &node_resource_topologies(cluster.client()),
        |o| gpus_available(o, "node-0").as_deref() == Some("2"),
    )
    .await;
    assert_eq!(gpus_available(&nrt, "node-1").as_deref(), Some("4"));
    let cpu0 = nrt.data["zones"][0]["resources"][0].clone();
    assert_eq!(
        (cpu0["name"].as_str(), cpu0["available"].as_str()),
        (Some("cpu"), Some("108")),
        "{cpu0}"
    );

    // 2. The GPUs are released, the CPUs kept.
    kdm.set_pod_resources(train_pod(json!([]))).await.unwrap();
    wait_for(
        "DeviceTopology with no GPU held",
        &device_topologies(cluster.client()),
        |o| (0..8).all(|i| allocation(o, &gpu(i)).is_null()),
    )
    .await;
    wait_for(
        "NodeResourceTopology with every GPU free",
        &node_resource_topologies(cluster.client()),
        |o| gpus_available(o, "node-0").as_deref() == Some("4"),
    )
    .await;
    let numa = wait_for(
        "Numatopology without the GPUs",
        &numatopologies(cluster.client()),
        |o| {
            o.data["spec"]["podAllocations"][0]["containerAllocations"][0]["allocations"]
                == json!({"cpu": "4-7"})
        },
    )
    .await;
    assert_eq!(
        numa.data["spec"]["numares"]["cpu"]["allocatable"],
        "0-3,8-223"
    );

    // 3. No pods at all.
    kdm.set_pod_resources(json!([])).await.unwrap();
    let numa = wait_for(
        "Numatopology with nothing held",
        &numatopologies(cluster.client()),
        |o| o.data["spec"]["numares"]["cpu"]["allocatable"] == "0-223",
    )
    .await;
    assert!(
        numa.data["spec"]["podAllocations"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{:#}",
        numa.data["spec"]
    );

    // 4. The PodResources server dies (its socket stays, refusing connections): the agent
    //    falls back to the CPU manager checkpoint, which knows CPUs but no devices.
    kdm.set_pod_resources(train_pod(two_gpus)).await.unwrap();
    wait_for(
        "DeviceTopology with GPUs held again",
        &device_topologies(cluster.client()),
        |o| allocation(o, &gpu(0)) == held,
    )
    .await;
    kdm.stop_pod_resources().await.unwrap();
    assert!(socket.exists());
    let numa = wait_for(
        "Numatopology from the checkpoint",
        &numatopologies(cluster.client()),
        |o| o.data["spec"]["numares"]["cpu"]["allocatable"] == "0-9,12-223",
    )
    .await;
    assert_eq!(numa.data["spec"]["podAllocations"][0]["uid"], "ckpt-uid");
    assert_eq!(
        numa.data["spec"]["podAllocations"][0]["containerAllocations"],
        json!([{"name": "side", "allocations": {"cpu": "10-11"}}])
    );
    // Devices are not freed while the kubelet is away: the last PodResources answer's GPUs
    // stay held (the checkpoint knows none), the CPUs are the checkpoint's.
    let nrt = wait_for(
        "NodeResourceTopology from the checkpoint",
        &node_resource_topologies(cluster.client()),
        |o| o.data["zones"][0]["resources"][0]["available"] == "110",
    )
    .await;
    assert_eq!(gpus_available(&nrt, "node-0").as_deref(), Some("2"));
    let dt = device_topologies(cluster.client()).get(NODE).await.unwrap();
    assert_eq!(allocation(&dt, &gpu(0)), held);
    assert_eq!(allocation(&dt, &gpu(1)), held);
    // Still down a few seconds later (the agent reads allocations every second): logged once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = cluster.log_tail("fumarole-agent", 400).unwrap();
    assert_eq!(log.matches("PodResources failed").count(), 1, "{log}");

    // 5. While it is down, train-0 gives GPUs 0 and 1 back and takes GPU 2; served again,
    //    PodResources wins over the checkpoint and the kept devices again.
    kdm.set_pod_resources(train_pod(
        json!([{"resource_name": GPU, "device_ids": [gpu(2)]}]),
    ))
    .await
    .unwrap();
    kdm.start_pod_resources().await.unwrap();
    let dt = wait_for(
        "DeviceTopology from PodResources again",
        &device_topologies(cluster.client()),
        |o| allocation(o, &gpu(2)) == held,
    )
    .await;
    assert_eq!(allocation(&dt, &gpu(0)), Value::Null);
    assert_eq!(allocation(&dt, &gpu(1)), Value::Null);
    wait_for(
        "Numatopology from PodResources again",
        &numatopologies(cluster.client()),
        |o| o.data["spec"]["numares"]["cpu"]["allocatable"] == "0-3,8-223",
    )
    .await;
    wait_for(
        "NodeResourceTopology from PodResources again",
        &node_resource_topologies(cluster.client()),
        |o| gpus_available(o, "node-0").as_deref() == Some("3"),
    )
    .await;
    let log = cluster.log_tail("fumarole-agent", 400).unwrap();
    assert_eq!(
        log.matches("PodResources answering again").count(),
        1,
        "{log}"
    );
    cluster.check_processes().unwrap();
}

/// Shares of a GPU held through the kubelet (replicas `<uuid>::<n>`, as a device plugin with
/// time-slicing or MPS allocates them) are listed under their GPU in `DeviceTopology`, holder by
/// holder, and counted in `fumarole_device_shares_allocated`; the GPU has no whole-device
/// holder.
#[tokio::test(flavor = "multi_thread")]
async fn device_topology_lists_the_holders_of_a_gpus_replicas() {
    let (cluster, kdm, _dir) = start().await;
    let socket = kdm.pod_resources_socket().unwrap().to_path_buf();
    let pod = |name: &str, replica: u32| {
        json!({
            "name": name, "namespace": "serve", "uid": format!("uid-{name}"),
            "containers": [{"name": "main", "cpu_ids": [], "devices": [
                {"resource_name": GPU, "device_ids": [format!("{}::{replica}", gpu(0))]}
            ]}]
        })
    };
    kdm.set_pod_resources(json!([pod("infer-a", 0), pod("infer-b", 3)]))
        .await
        .unwrap();
    let port = free_port().unwrap();
    AgentBuilder::fixture("dgx-h100")
        .node(NODE)
        .pod_resources_socket(&socket)
        .flag("--recheck-interval", "1s")
        .metrics_on_port(port)
        .start_in(&cluster)
        .unwrap();
    let dt = wait_for(
        "DeviceTopology with GPU 0's two replicas held",
        &device_topologies(cluster.client()),
        |o| {
            o.data["status"]["devices"][gpu(0)]["shares"]
                .as_array()
                .is_some_and(|s| s.len() == 2)
        },
    )
    .await;
    assert_eq!(
        dt.data["status"]["devices"][gpu(0)]["shares"],
        json!([
            {"share": format!("{}::0", gpu(0)), "namespace": "serve", "pod": "infer-a", "container": "main"},
            {"share": format!("{}::3", gpu(0)), "namespace": "serve", "pod": "infer-b", "container": "main"},
        ])
    );
    assert_eq!(allocation(&dt, &gpu(0)), Value::Null);
    assert!(dt.data["status"]["devices"][gpu(1)]["shares"].is_null());
    eventually("the shares metric", Duration::from_secs(30), || async {
        let text = fumarole_e2e::cluster::http_get(port, "/metrics").await?;
        Ok(text
            .lines()
            .any(|l| l == "fumarole_device_shares_allocated 2")
            .then_some(()))
    })
    .await
    .unwrap();
}
