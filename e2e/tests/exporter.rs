//! The exporter (`fumarole-agent run`) against the real API server and Volcano: its
//! Numatopology, NodeResourceTopology and DeviceTopology are accepted by the real CRDs, Volcano's
//! `numa-aware` plugin places pods by them, nothing is written in steady state, it recovers
//! from an API server outage by itself, and bad kubelet state keeps the last good object.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port, http_get, metric_sum, volcano_conf};
use fumarole_e2e::fumarole::{device_topologies, node_resource_topologies, numatopologies};
use fumarole_e2e::{AgentBuilder, NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const GOOD_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\nkubeReserved: {cpu: \"1\", memory: 1Gi}\n";
/// One agent on one node, with its own kubelet files.
struct Agent {
    name: String,
    dir: tempfile::TempDir,
    metrics_port: u16,
}

impl Agent {
    fn config(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("cpu_manager_state")
    }

    fn log_name(&self) -> String {
        format!("fumarole-agent-{}", self.name)
    }

    /// The raw HTTP/1.0 response to `GET path` on the agent's metrics port.
    async fn get(&self, path: &str) -> String {
        http_get(self.metrics_port, path).await.unwrap()
    }

    async fn metric(&self, name: &str) -> f64 {
        metric_sum(&self.get("/metrics").await, name)
    }
}

async fn start_agent(cluster: &TestCluster, node: &str, fixture: &str, cpus: u32) -> Agent {
    start_agent_with(cluster, NodeSpec::new(node), fixture, cpus, "1s", &[]).await
}

/// Creates the node from `spec` (plus capacity) and starts an agent for it with `extra` args.
async fn start_agent_with(
    cluster: &TestCluster,
    spec: NodeSpec,
    fixture: &str,
    cpus: u32,
    recheck: &str,
    extra: &[&str],
) -> Agent {
    let node = spec.name.clone();
    let node = node.as_str();
    cluster
        .create_node(
            &spec
                .capacity("cpu", &cpus.to_string())
                .capacity("memory", "512Gi"),
        )
        .await
        .unwrap();
    let agent = Agent {
        name: node.into(),
        dir: tempfile::tempdir().unwrap(),
        metrics_port: free_port().unwrap(),
    };
    std::fs::write(agent.config(), GOOD_CONFIG).unwrap();
    std::fs::write(
        agent.state(),
        r#"{"policyName":"static","defaultCpuSet":"","entries":{},"checksum":1}"#,
    )
    .unwrap();
    AgentBuilder::fixture(fixture)
        .process(&agent.log_name())
        .node(node)
        .kubelet_config(&agent.config())
        .cpu_manager_state(&agent.state())
        .pod_resources_socket(&agent.dir.path().join("absent.sock"))
        .flag("--recheck-interval", recheck)
        .metrics_on_port(agent.metrics_port)
        .args(extra)
        .env("FUMAROLE_LOG", "info")
        .start_in(cluster)
        .unwrap();
    agent
}
/// The object once `ready` holds for it.
async fn wait_for(
    what: &str,
    api: &Api<DynamicObject>,
    name: &str,
    ready: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    eventually(what, Duration::from_secs(60), || {
        let api = api.clone();
        let name = name.to_string();
        let ok = &ready;
        async move { Ok(api.get_opt(&name).await?.filter(|o| ok(o))) }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn publishes_objects_the_real_crds_accept() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client());
    let _agent = start_agent(&cluster, "dgx-1", "dgx-h100", 224).await;
    // A label owned by someone else, set before and after the agent's first write.
    nodes
        .patch(
            "dgx-1",
            &PatchParams::apply("ops"),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"labels": {"team": "ml"}}}),
            ),
        )
        .await
        .unwrap();

    let numa = wait_for(
        "Numatopology dgx-1",
        &numatopologies(cluster.client()),
        "dgx-1",
        |_| true,
    )
    .await;
    let spec = &numa.data["spec"];
    assert_eq!(spec["policies"]["CPUManagerPolicy"], "static");
    assert_eq!(
        spec["policies"]["TopologyManagerPolicy"],
        "single-numa-node"
    );
    assert_eq!(spec["numares"]["cpu"]["capacity"], 224);
    assert_eq!(spec["numares"]["cpu"]["allocatable"], "0-223");
    assert_eq!(spec["resReserved"]["cpu"], "1");
    assert_eq!(
        spec["cpuDetail"]["112"],
        json!({"numa": 0, "socket": 0, "core": 0})
    );

    let nrt = wait_for(
        "NodeResourceTopology dgx-1",
        &node_resource_topologies(cluster.client()),
        "dgx-1",
        |_| true,
    )
    .await;
    let zones = nrt.data["zones"].as_array().unwrap();
    assert_eq!(zones.len(), 2);
    let gpu = zones[1]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "nvidia.com/gpu")
        .unwrap();
    assert_eq!(
        (gpu["capacity"].as_str(), gpu["available"].as_str()),
        (Some("4"), Some("4"))
    );
    assert_eq!(zones[0]["costs"][1], json!({"name": "node-1", "value": 20}));
    assert_eq!(
        nrt.data["attributes"][0],
        json!({"name": "topologyManagerPolicy", "value": "single-numa-node"})
    );

    let dt = wait_for(
        "DeviceTopology dgx-1 with status",
        &device_topologies(cluster.client()),
        "dgx-1",
        |o| o.data["status"]["healthyCount"] == 8,
    )
    .await;
    assert_eq!(dt.data["spec"]["acceleratorCount"], 8);
    assert_eq!(dt.data["spec"]["model"], "NVIDIA H100 80GB HBM3");
    assert_eq!(dt.data["spec"]["links"].as_array().unwrap().len(), 28);
    assert_eq!(dt.data["spec"]["links"][0]["kind"], "nvlink");

    let node = eventually("fumarole labels on dgx-1", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            Ok(nodes.get("dgx-1").await.ok().filter(|n| {
                n.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("fumarole.dev/accelerator-count"))
            }))
        }
    })
    .await
    .unwrap();
    // Each object the agent publishes for the node is owned by the Node (the garbage
    // collector deletes them with it); one published before the agent saw the Node gains it.
    let node_uid = node.metadata.uid.clone().unwrap();
    let owned = |o: &DynamicObject| {
        o.metadata.owner_references.iter().flatten().any(|r| {
            r.kind == "Node" && r.name == "dgx-1" && r.uid == node_uid && r.api_version == "v1"
        })
    };
    for (what, api) in [
        ("Numatopology", numatopologies(cluster.client())),
        (
            "NodeResourceTopology",
            node_resource_topologies(cluster.client()),
        ),
        ("DeviceTopology", device_topologies(cluster.client())),
    ] {
        wait_for(
            &format!("{what} dgx-1 owned by its Node"),
            &api,
            "dgx-1",
            owned,
        )
        .await;
    }
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels["fumarole.dev/accelerator-count"], "8");
    assert_eq!(labels["fumarole.dev/accelerator-vendor"], "nvidia");
    assert_eq!(
        labels["fumarole.dev/accelerator-model"],
        "NVIDIA-H100-80GB-HBM3"
    );
    assert_eq!(
        labels["team"], "ml",
        "a label owned by someone else must stay"
    );

    // A deleted object comes back.
    device_topologies(cluster.client())
        .delete("dgx-1", &DeleteParams::default())
        .await
        .unwrap();
    let back = wait_for(
        "DeviceTopology dgx-1 re-created",
        &device_topologies(cluster.client()),
        "dgx-1",
        |o| o.metadata.uid != dt.metadata.uid,
    )
    .await;
    assert_eq!(back.data["spec"]["acceleratorCount"], 8);

    // A field we own, overwritten by someone else, is restored.
    numatopologies(cluster.client())
        .patch(
            "dgx-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"policies": {"CPUManagerPolicy": "none"}}})),
        )
        .await
        .unwrap();
    wait_for(
        "Numatopology dgx-1 restored",
        &numatopologies(cluster.client()),
        "dgx-1",
        |o| o.data["spec"]["policies"]["CPUManagerPolicy"] == "static",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn volcano_numa_aware_places_pods_by_the_published_numatopology() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    // "narrow": 8 NUMA nodes of 24 CPUs (192 in all); "wide": 2 NUMA nodes of 32 CPUs.
    let _narrow = start_agent(&cluster, "narrow", "atlas-800-910", 192).await;
    let _wide = start_agent(&cluster, "wide", "cpu-only", 64).await;
    for node in ["narrow", "wide"] {
        wait_for(
            "Numatopology",
            &numatopologies(cluster.client()),
            node,
            |_| true,
        )
        .await;
    }
    cluster
        .start_volcano(&volcano_conf("  - name: numa-aware\n"))
        .await
        .unwrap();

    // 28 exclusive CPUs on one NUMA node: only "wide" can, although "narrow" has more CPUs.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "numa-pod", "annotations": {"volcano.sh/numa-topology-policy": "single-numa-node"}},
        "spec": {
            "schedulerName": "volcano",
            "containers": [{
                "name": "c", "image": "example.invalid/none",
                "resources": {
                    "requests": {"cpu": "28", "memory": "1Gi"},
                    "limits": {"cpu": "28", "memory": "1Gi"}
                }
            }]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let node = eventually("numa-pod to be bound", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move { Ok(pods.get("numa-pod").await?.spec.and_then(|s| s.node_name)) }
    })
    .await
    .unwrap();
    assert_eq!(node, "wide");
}

/// Sum of write requests (any verb but reads) the API server counted on our objects.
async fn writes(cluster: &TestCluster) -> u64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = cluster.client().request_text(req).await.unwrap();
    let resources = [
        "numatopologies",
        "noderesourcetopologies",
        "devicetopologies",
        "nodes",
    ];
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            ["APPLY", "PATCH", "POST", "PUT", "DELETE"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
        })
        .filter(|l| {
            resources
                .iter()
                .any(|r| l.contains(&format!("resource=\"{r}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn steady_state_writes_nothing() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let agent = start_agent(&cluster, "steady", "metax-c500-8", 128).await;
    wait_for(
        "DeviceTopology status",
        &device_topologies(cluster.client()),
        "steady",
        |o| o.data["status"]["healthyCount"] == 8,
    )
    .await;
    wait_for(
        "NodeResourceTopology",
        &node_resource_topologies(cluster.client()),
        "steady",
        |_| true,
    )
    .await;
    // Let the labels and the last writes of the first round land.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let before = writes(&cluster).await;
    let rounds_before = agent.metric("fumarole_discoveries_total").await;
    let publishes_before = agent.metric("fumarole_publishes_total").await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let after = writes(&cluster).await;
    let rounds = agent.metric("fumarole_discoveries_total").await - rounds_before;
    assert!(
        rounds >= 50.0,
        "the 1 s re-check ran only {rounds} times in 60 s"
    );
    assert_eq!(
        after,
        before,
        "API server saw {} writes in 60 s of steady state",
        after - before
    );
    assert_eq!(
        agent.metric("fumarole_publishes_total").await,
        publishes_before
    );
    println!(
        "steady state: {rounds} re-checks, {} writes in 60 s",
        after - before
    );
    let health = agent.get("/healthz").await;
    assert!(
        health.starts_with("HTTP/1.0 200") && health.ends_with("ok"),
        "{health}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn recovers_from_an_api_server_outage_without_restart() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let agent = start_agent(&cluster, "outage", "cpu-only", 64).await;
    wait_for(
        "Numatopology",
        &numatopologies(cluster.client()),
        "outage",
        |_| true,
    )
    .await;

    cluster.stop_apiserver().unwrap();
    // While the API server is away, the kubelet hands out CPUs 2-5 exclusively.
    std::fs::write(agent.state(), r#"{"policyName":"static","defaultCpuSet":"0-1,6-63","entries":{"pod-a":{"main":"2-5"}},"checksum":2}"#).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    cluster.start_apiserver().await.unwrap();

    let numa = wait_for(
        "Numatopology current after the outage",
        &numatopologies(cluster.client()),
        "outage",
        |o| o.data["spec"]["numares"]["cpu"]["allocatable"] == "0-1,6-63",
    )
    .await;
    assert_eq!(numa.data["spec"]["podAllocations"][0]["uid"], "pod-a");
    // Same agent process all along, and it counted the failures.
    cluster.check_processes().unwrap();
    assert!(agent.metric("fumarole_api_errors_total").await >= 1.0);
    // A round that publishes every object says so; the Numatopology may be current a round
    // before the rest (backoff after 30 s of failures is up to 10 s).
    eventually(
        "the agent to report the API server back",
        Duration::from_secs(60),
        || async {
            let log = cluster.log_tail(&agent.log_name(), 400)?;
            Ok(log.contains("API server reachable again").then_some(()))
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_kubelet_state_keeps_the_last_good_object() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let agent = start_agent(&cluster, "badstate", "cpu-only", 64).await;
    let good = wait_for(
        "Numatopology",
        &numatopologies(cluster.client()),
        "badstate",
        |_| true,
    )
    .await;

    let check_kept = |what: &'static str| {
        let cluster = &cluster;
        let good = good.clone();
        let agent = &agent;
        async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let now = numatopologies(cluster.client())
                .get("badstate")
                .await
                .unwrap();
            assert_eq!(
                now.metadata.resource_version, good.metadata.resource_version,
                "{what}: object changed"
            );
            assert_eq!(now.data["spec"], good.data["spec"]);
            cluster.log_tail(&agent.log_name(), 200).unwrap()
        }
    };

    std::fs::write(agent.config(), "cpuManagerPolicy: [static\n").unwrap();
    let log = check_kept("bad kubelet config").await;
    let config = agent.config().display().to_string();
    assert!(log.contains(&format!("kubelet config {config}")), "{log}");
    assert_eq!(
        log.matches(&format!("kubelet config {config}")).count(),
        1,
        "logged once, not every round: {log}"
    );

    std::fs::write(agent.config(), GOOD_CONFIG).unwrap();
    std::fs::write(
        agent.state(),
        "{\"policyName\": \"static\", \"entries\": {\"p\": {\"c\": \"9-2\"}}}",
    )
    .unwrap();
    let log = check_kept("corrupt cpu_manager_state").await;
    assert!(log.contains("is corrupt"), "{log}");

    // Fixed: the object follows again.
    std::fs::write(
        agent.state(),
        r#"{"policyName":"static","defaultCpuSet":"","entries":{"p":{"c":"8-9"}},"checksum":3}"#,
    )
    .unwrap();
    let fixed = wait_for(
        "Numatopology updated",
        &numatopologies(cluster.client()),
        "badstate",
        |o| o.data["spec"]["numares"]["cpu"]["allocatable"] == "0-7,10-63",
    )
    .await;
    let _: &Value = &fixed.data;
}

#[tokio::test(flavor = "multi_thread")]
async fn allocation_change_is_published_without_waiting_for_the_recheck() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let agent = start_agent_with(&cluster, NodeSpec::new("quick"), "cpu-only", 64, "1h", &[]).await;
    wait_for(
        "Numatopology",
        &numatopologies(cluster.client()),
        "quick",
        |_| true,
    )
    .await;
    std::fs::write(
        agent.state(),
        r#"{"policyName":"static","defaultCpuSet":"","entries":{"p":{"c":"10-11"}},"checksum":4}"#,
    )
    .unwrap();
    let started = std::time::Instant::now();
    wait_for(
        "Numatopology follows the new allocation",
        &numatopologies(cluster.client()),
        "quick",
        |o| o.data["spec"]["numares"]["cpu"]["allocatable"] == "0-9,12-63",
    )
    .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "took {took:?} with a 1 h re-check interval"
    );
    println!("allocation change published after {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn super_node_comes_from_a_node_label() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let spec = NodeSpec::new("racked").label("example.com/rack", "rack-7");
    let _agent = start_agent_with(
        &cluster,
        spec,
        "pcie-4gpu",
        64,
        "1s",
        &["--super-node-label", "example.com/rack"],
    )
    .await;
    let dt = wait_for(
        "DeviceTopology with a super-node",
        &device_topologies(cluster.client()),
        "racked",
        |o| !o.data["spec"]["superNode"].is_null(),
    )
    .await;
    assert_eq!(
        dt.data["spec"]["superNode"],
        json!({"id": "rack-7", "source": "nodeLabel"})
    );
    let nodes: Api<Node> = Api::all(cluster.client());
    let labels = eventually("the super-node label", Duration::from_secs(30), || {
        let nodes = nodes.clone();
        async move {
            let labels = nodes
                .get("racked")
                .await?
                .metadata
                .labels
                .unwrap_or_default();
            Ok(labels
                .contains_key("fumarole.dev/super-node")
                .then_some(labels))
        }
    })
    .await
    .unwrap();
    assert_eq!(labels["fumarole.dev/super-node"], "rack-7");
    assert_eq!(labels["example.com/rack"], "rack-7");
}

#[tokio::test(flavor = "multi_thread")]
async fn compat_labels_follow_the_switch() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let on_agent = start_agent_with(
        &cluster,
        NodeSpec::new("gfd-on"),
        "dgx-h100",
        224,
        "1s",
        &["--compat-labels"],
    )
    .await;
    let off_agent = start_agent(&cluster, "gfd-off", "dgx-h100", 224).await;
    let nodes: Api<Node> = Api::all(cluster.client());
    let labels_of = |node: &'static str, key: &'static str| {
        let nodes = nodes.clone();
        async move {
            eventually(&format!("{key} on {node}"), Duration::from_secs(60), || {
                let nodes = nodes.clone();
                async move {
                    let labels = nodes.get(node).await?.metadata.labels.unwrap_or_default();
                    Ok(labels.contains_key(key).then_some(labels))
                }
            })
            .await
            .unwrap()
        }
    };
    // GFD's keys and value formats, from the fixture's recorded NVML answers.
    let on = labels_of("gfd-on", "nvidia.com/gpu.product").await;
    let want = [
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.memory", "81559"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/gpu.compute.major", "9"),
        ("nvidia.com/gpu.compute.minor", "0"),
        ("nvidia.com/gpu.mode", "compute"),
        ("nvidia.com/mig.capable", "true"),
        ("nvidia.com/cuda.driver-version.full", "550.90.07"),
        ("nvidia.com/cuda.driver-version.major", "550"),
        ("nvidia.com/cuda.driver-version.minor", "90"),
        ("nvidia.com/cuda.driver-version.revision", "07"),
        ("nvidia.com/cuda.driver.major", "550"),
        ("nvidia.com/cuda.driver.minor", "90"),
        ("nvidia.com/cuda.driver.rev", "07"),
        ("nvidia.com/cuda.runtime-version.full", "12.4"),
        ("nvidia.com/cuda.runtime-version.major", "12"),
        ("nvidia.com/cuda.runtime-version.minor", "4"),
        ("nvidia.com/cuda.runtime.major", "12"),
        ("nvidia.com/cuda.runtime.minor", "4"),
    ];
    for (key, value) in want {
        assert_eq!(on.get(key).map(String::as_str), Some(value), "{key}");
    }
    assert!(
        !on.contains_key("accelerator"),
        "no Ascend label on an NVIDIA node"
    );
    assert_eq!(on["fumarole.dev/accelerator-count"], "8");

    // Switch off: fumarole's own labels only.
    let off = labels_of("gfd-off", "fumarole.dev/accelerator-count").await;
    let foreign: Vec<&String> = off
        .keys()
        .filter(|k| k.starts_with("nvidia.com/") || *k == "accelerator")
        .collect();
    assert!(foreign.is_empty(), "{foreign:?}");

    // A compatible label removed by someone else comes back; another nvidia.com/ label
    // (not one we publish) stays as its owner set it.
    nodes
        .patch(
            "gfd-on",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "nvidia.com/gpu.family": null,
                "nvidia.com/gpu.deploy.driver": "false"}}})),
        )
        .await
        .unwrap();
    let back = eventually(
        "nvidia.com/gpu.family restored",
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move {
                let labels = nodes
                    .get("gfd-on")
                    .await?
                    .metadata
                    .labels
                    .unwrap_or_default();
                Ok(
                    (labels.get("nvidia.com/gpu.family").map(String::as_str) == Some("hopper"))
                        .then_some(labels),
                )
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(back["nvidia.com/gpu.deploy.driver"], "false");
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Steady state: someone else's change to either Node makes no label write, on the
    // switched-off node not even with a GFD key there (not ours to compare).
    const LABEL_WRITES: &str = "fumarole_publishes_total{object=\"node-labels\"}";
    let on_before = on_agent.metric(LABEL_WRITES).await;
    let off_before = off_agent.metric(LABEL_WRITES).await;
    assert!(
        on_before >= 2.0 && off_before >= 1.0,
        "{on_before} {off_before}"
    );
    for (node, labels) in [
        ("gfd-on", json!({"team": "ml"})),
        (
            "gfd-off",
            json!({"team": "ml", "nvidia.com/gpu.product": "other"}),
        ),
    ] {
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(on_agent.metric(LABEL_WRITES).await, on_before);
    assert_eq!(off_agent.metric(LABEL_WRITES).await, off_before);
    let off = nodes.get("gfd-off").await.unwrap().metadata.labels.unwrap();
    assert_eq!(off["nvidia.com/gpu.product"], "other");
}

#[tokio::test(flavor = "multi_thread")]
async fn compat_labels_on_an_ascend_node() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let _agent = start_agent_with(
        &cluster,
        NodeSpec::new("atlas"),
        "atlas-800t-a2",
        192,
        "1s",
        &["--compat-labels"],
    )
    .await;
    let nodes: Api<Node> = Api::all(cluster.client());
    let labels = eventually("accelerator on atlas", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            let labels = nodes
                .get("atlas")
                .await?
                .metadata
                .labels
                .unwrap_or_default();
            Ok(labels.contains_key("accelerator").then_some(labels))
        }
    })
    .await
    .unwrap();
    // 910B NPUs are advertised as huawei.com/Ascend910, so their family label is Ascend910.
    assert_eq!(labels["accelerator"], "huawei-Ascend910");
    assert_eq!(labels["fumarole.dev/accelerator-vendor"], "huawei");
    // Atlas 800T A2: 8 x 910B, chips without super-pod info (no DCMI here): module-910b-8.
    assert_eq!(labels["accelerator-type"], "module-910b-8");
    // The chip-info labels come from DCMI with --ascend-device-info only (no DCMI here).
    assert!(!labels.contains_key("servertype"));
    assert!(!labels.contains_key("node.kubernetes.io/npu.chip.name"));
    let nvidia: Vec<&String> = labels
        .keys()
        .filter(|k| k.starts_with("nvidia.com/"))
        .collect();
    assert!(nvidia.is_empty(), "{nvidia:?}");
}
