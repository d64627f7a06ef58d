//! Harness nodes: the kubelet's own device manager and topology manager (`kubelet-node`)
//! admit the pods bound to a Node, with the fumarole agent's device plugins registered with
//! them. The Node's capacity follows the device manager; each admitted container's devices
//! and `Allocate` answer are the agent's; pods get disjoint devices, a deleted pod's devices
//! come back, an oversized pod is refused with the kubelet's reason; the topology manager's
//! `single-numa-node` policy decides; the checkpoint carries allocations over a kubelet
//! restart; two harness nodes share one cluster; time-sliced replicas let two pods share a GPU.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port};
use fumarole_e2e::harness_node::PodRecord;
use fumarole_e2e::{AgentBuilder, HarnessNode, HarnessOptions, NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const GPU: &str = "nvidia.com/gpu";
const NPU: &str = "huawei.com/Ascend910";
/// Generous: the machine is small and shared.
const T: Duration = Duration::from_secs(90);

/// `fumarole-agent run --standalone --fixture <fixture>` serving its device plugins in the
/// harness node's directory, stopped with the cluster.
fn start_agent(cluster: &TestCluster, node: &HarnessNode, fixture: &str, extra: &[&str]) {
    AgentBuilder::fixture(fixture)
        .process(&format!("fumarole-agent-{}", node.node_name()))
        .standalone()
        .device_plugin_dir(node.plugin_dir())
        .args(extra)
        .start_in(cluster)
        .unwrap();
}

/// A pod bound to `node` (no scheduler) whose one container `main` asks `n` of `resource`.
fn pod(name: &str, node: &str, resource: &str, n: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{
            "name": "main", "image": "example.invalid/none",
            "resources": {"limits": {resource: n.to_string()}}
        }]}
    }))
    .unwrap()
}

/// Waits until the API server shows pod `name` in `phase`; returns it.
async fn wait_phase(pods: &Api<Pod>, name: &str, phase: &str) -> Pod {
    eventually(&format!("{name} {phase}"), T, || async {
        let p = pods.get(name).await?;
        let now = p.status.as_ref().and_then(|s| s.phase.clone());
        Ok((now.as_deref() == Some(phase)).then_some(p))
    })
    .await
    .unwrap()
}

/// Waits until pod `name` is gone from the API server.
async fn wait_gone(pods: &Api<Pod>, name: &str) {
    eventually(&format!("{name} deleted"), T, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .unwrap()
}

/// `status.<field>.<resource>` of Node `name`.
async fn node_quantity(
    nodes: &Api<Node>,
    name: &str,
    field: &str,
    resource: &str,
) -> Option<String> {
    let n = nodes.get(name).await.unwrap();
    let status = serde_json::to_value(n.status.unwrap()).unwrap();
    status[field][resource].as_str().map(str::to_string)
}

/// Waits until Node `name` shows `value` of `resource` in capacity and allocatable.
async fn wait_node_devices(nodes: &Api<Node>, name: &str, resource: &str, value: &str) {
    eventually(&format!("{name} to show {value} {resource}"), T, || async {
        let cap = node_quantity(nodes, name, "capacity", resource).await;
        let alloc = node_quantity(nodes, name, "allocatable", resource).await;
        Ok((cap.as_deref() == Some(value) && alloc.as_deref() == Some(value)).then_some(()))
    })
    .await
    .unwrap()
}

/// The one container's devices of `resource`, checked against its `Allocate` answer: the
/// agent's NVIDIA env names exactly those devices (uuids), and its device nodes hold one
/// `/dev/nvidiaN` per GPU plus the control nodes.
fn checked_gpus(rec: &PodRecord) -> Vec<String> {
    assert!(rec.admitted, "{rec:#?}");
    let c = rec.container("main").unwrap();
    let ids = c.devices.get(GPU).cloned().unwrap_or_default();
    let opts = c.options.as_ref().unwrap();
    let mut visible: Vec<String> = opts.envs["NVIDIA_VISIBLE_DEVICES"]
        .split(',')
        .map(str::to_string)
        .collect();
    visible.sort();
    assert_eq!(visible, ids, "NVIDIA_VISIBLE_DEVICES of {}", rec.name);
    let gpu_nodes = opts
        .devices
        .iter()
        .filter(|d| {
            d.host_path
                .strip_prefix("/dev/nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    assert_eq!(gpu_nodes, ids.len(), "{:?}", opts.devices);
    assert!(
        opts.devices.iter().any(|d| d.host_path == "/dev/nvidiactl"),
        "{:?}",
        opts.devices
    );
    ids
}

fn disjoint(a: &[String], b: &[String]) -> bool {
    let a: BTreeSet<&String> = a.iter().collect();
    b.iter().all(|x| !a.contains(x))
}

/// One harness node with the agent on dgx-h100: the Node's capacity shows 8 GPUs (cpu and
/// memory untouched); two 2-GPU pods run with disjoint GPUs named in their env and CDI
/// devices; an 8-GPU pod is refused by the device manager; after the two are deleted, the
/// next 8-GPU pod gets every GPU.
#[tokio::test(flavor = "multi_thread")]
async fn the_kubelets_device_manager_admits_pods_with_the_agents_devices() {
    let cluster = TestCluster::start().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new("node-a")
                .capacity("cpu", "224")
                .capacity("memory", "2Ti"),
        )
        .await
        .unwrap();
    let node = cluster.start_harness_node("node-a").await.unwrap();
    start_agent(&cluster, &node, "dgx-h100", &["--cdi"]);

    let nodes: Api<Node> = Api::all(cluster.client());
    wait_node_devices(&nodes, "node-a", GPU, "8").await;
    assert_eq!(
        node_quantity(&nodes, "node-a", "capacity", "cpu")
            .await
            .as_deref(),
        Some("224")
    );
    assert_eq!(
        node_quantity(&nodes, "node-a", "allocatable", "memory")
            .await
            .as_deref(),
        Some("2Ti")
    );
    let healthy: Vec<String> = node.devices().await.unwrap()["healthy"][GPU]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["ID"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(healthy.len(), 8);

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let created = pods
        .create(&pp, &pod("one", "node-a", GPU, 2))
        .await
        .unwrap();
    let one = node.wait_decided(&created, T).await.unwrap();
    let one_ids = checked_gpus(&one);
    // The device manager asked the agent's GetPreferredAllocation: on eight NV18-equal GPUs
    // select takes the two lowest (the manager alone would take any two).
    let mut healthy = healthy;
    healthy.sort();
    assert_eq!(one_ids, healthy[..2], "{healthy:?}");
    let cdi: BTreeSet<String> = one.containers[0]
        .options
        .as_ref()
        .unwrap()
        .cdi_devices
        .iter()
        .cloned()
        .collect();
    let want: BTreeSet<String> = one_ids.iter().map(|id| format!("{GPU}={id}")).collect();
    assert_eq!(cdi, want);
    let running = wait_phase(&pods, "one", "Running").await;
    let conditions = running.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{conditions:?}"
    );

    let created = pods
        .create(&pp, &pod("two", "node-a", GPU, 2))
        .await
        .unwrap();
    let two_ids = checked_gpus(&node.wait_decided(&created, T).await.unwrap());
    // Disjoint: the next two lowest.
    assert!(disjoint(&one_ids, &two_ids), "{one_ids:?} {two_ids:?}");
    assert_eq!(two_ids, healthy[2..4]);
    wait_phase(&pods, "two", "Running").await;

    // 8 asked, 4 free: the device manager refuses, and the pod fails as the kubelet fails it.
    let created = pods
        .create(&pp, &pod("big", "node-a", GPU, 8))
        .await
        .unwrap();
    let big = node.wait_decided(&created, T).await.unwrap();
    assert_eq!(big.state, "rejected");
    assert_eq!(big.reason, "UnexpectedAdmissionError");
    assert!(
        big.message
            .contains("requested number of devices unavailable for nvidia.com/gpu"),
        "{}",
        big.message
    );
    let failed = wait_phase(&pods, "big", "Failed").await.status.unwrap();
    assert_eq!(failed.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert!(
        failed
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("Pod was rejected: "),
        "{failed:?}"
    );
    let in_use = node.devices().await.unwrap()["in_use"][GPU].clone();
    assert_eq!(in_use.as_array().unwrap().len(), 4, "{in_use}");

    // Deleting the two returns their GPUs: the next 8-GPU pod gets them all.
    for name in ["one", "two", "big"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for name in ["one", "two", "big"] {
        wait_gone(&pods, name).await;
    }
    for name in ["one", "two"] {
        let rec = node
            .wait_pod_until("default", name, T, |r| r.deleted)
            .await
            .unwrap();
        assert_eq!(rec.state, "released");
    }
    let created = pods
        .create(&pp, &pod("big", "node-a", GPU, 8))
        .await
        .unwrap();
    let big2 = node.wait_decided(&created, T).await.unwrap();
    assert_eq!(checked_gpus(&big2), healthy);
    wait_phase(&pods, "big", "Running").await;
}

/// Two harness nodes in one cluster, each with its own agent: an NVIDIA node and an Ascend
/// node. Each Node shows only its own devices and each harness admits only its own pods.
#[tokio::test(flavor = "multi_thread")]
async fn two_harness_nodes_share_a_cluster() {
    let cluster = TestCluster::start().await.unwrap();
    for name in ["node-a", "node-b"] {
        cluster
            .create_node(&NodeSpec::new(name).capacity("cpu", "192"))
            .await
            .unwrap();
    }
    let a = cluster.start_harness_node("node-a").await.unwrap();
    let b = cluster.start_harness_node("node-b").await.unwrap();
    assert_ne!(a.plugin_dir(), b.plugin_dir());
    start_agent(&cluster, &a, "dgx-h100", &[]);
    start_agent(&cluster, &b, "atlas-800-910", &[]);
    let nodes: Api<Node> = Api::all(cluster.client());
    wait_node_devices(&nodes, "node-a", GPU, "8").await;
    wait_node_devices(&nodes, "node-b", NPU, "8").await;
    assert_eq!(node_quantity(&nodes, "node-a", "capacity", NPU).await, None);
    assert_eq!(node_quantity(&nodes, "node-b", "capacity", GPU).await, None);

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let train_a = pods
        .create(&pp, &pod("train-a", "node-a", GPU, 8))
        .await
        .unwrap();
    let train_b = pods
        .create(&pp, &pod("train-b", "node-b", NPU, 2))
        .await
        .unwrap();
    let ra = a.wait_decided(&train_a, T).await.unwrap();
    assert_eq!(checked_gpus(&ra).len(), 8);
    let rb = b.wait_decided(&train_b, T).await.unwrap();
    assert!(rb.admitted, "{rb:#?}");
    let npus = rb.devices(NPU);
    assert_eq!(npus.len(), 2);
    assert!(
        npus.iter().all(|id| id.starts_with("Ascend910-")),
        "{npus:?}"
    );
    // The Ascend answer names the NPUs by number.
    let mut numbers: Vec<String> = npus
        .iter()
        .map(|id| id.trim_start_matches("Ascend910-").to_string())
        .collect();
    numbers.sort();
    let env = &rb.containers[0].options.as_ref().unwrap().envs["ASCEND_VISIBLE_DEVICES"];
    let mut visible: Vec<String> = env.split(',').map(str::to_string).collect();
    visible.sort();
    assert_eq!(visible, numbers);
    wait_phase(&pods, "train-a", "Running").await;
    wait_phase(&pods, "train-b", "Running").await;

    // Each harness saw only its own node's pods.
    let names =
        |recs: Vec<PodRecord>| -> Vec<String> { recs.into_iter().map(|r| r.name).collect() };
    assert_eq!(names(a.pods().await.unwrap()), ["train-a"]);
    assert_eq!(names(b.pods().await.unwrap()), ["train-b"]);
}

/// The topology manager's `single-numa-node` policy on a 2-NUMA-node dgx-h100 (4 GPUs per
/// NUMA node): a 5-GPU pod cannot be aligned and is refused with `TopologyAffinityError`;
/// two 4-GPU pods each get the GPUs of one NUMA node, a different one each.
#[tokio::test(flavor = "multi_thread")]
async fn single_numa_node_policy_aligns_or_refuses() {
    let cluster = TestCluster::start().await.unwrap();
    cluster
        .create_node(&NodeSpec::new("node-a").capacity("cpu", "224"))
        .await
        .unwrap();
    let node = cluster
        .start_harness_node_with("node-a", &HarnessOptions::topology("single-numa-node", 2))
        .await
        .unwrap();
    start_agent(&cluster, &node, "dgx-h100", &[]);
    node.wait_allocatable(GPU, 8, T).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let created = pods
        .create(&pp, &pod("five", "node-a", GPU, 5))
        .await
        .unwrap();
    let five = node.wait_decided(&created, T).await.unwrap();
    assert_eq!(five.state, "rejected");
    assert_eq!(five.reason, "TopologyAffinityError");
    let failed = wait_phase(&pods, "five", "Failed").await.status.unwrap();
    assert_eq!(failed.reason.as_deref(), Some("TopologyAffinityError"));

    let mut numa = Vec::new();
    for name in ["left", "right"] {
        let created = pods
            .create(&pp, &pod(name, "node-a", GPU, 4))
            .await
            .unwrap();
        let rec = node.wait_decided(&created, T).await.unwrap();
        assert_eq!(checked_gpus(&rec).len(), 4);
        let c = rec.container("main").unwrap();
        let nodes = c.numa_nodes[GPU].clone();
        assert_eq!(nodes.len(), 1, "{name}: GPUs on NUMA nodes {nodes:?}");
        let hint = c.affinity.clone().unwrap();
        assert_eq!(hint.numa_nodes, nodes);
        assert!(hint.preferred);
        numa.push(nodes[0]);
    }
    assert_ne!(numa[0], numa[1]);
}

/// A kubelet restart (new managers over the same directory): the agent registers again, the
/// checkpoint keeps the first pod's GPUs allocated, so a 6-GPU pod gets the other six and a
/// further 1-GPU pod is refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_checkpoint_carries_allocations_over_a_kubelet_restart() {
    let cluster = TestCluster::start().await.unwrap();
    cluster
        .create_node(&NodeSpec::new("node-a").capacity("cpu", "224"))
        .await
        .unwrap();
    let node = cluster.start_harness_node("node-a").await.unwrap();
    start_agent(&cluster, &node, "dgx-h100", &[]);
    node.wait_allocatable(GPU, 8, T).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let created = pods
        .create(&pp, &pod("first", "node-a", GPU, 2))
        .await
        .unwrap();
    let first = node.wait_decided(&created, T).await.unwrap();
    let first_ids = checked_gpus(&first);
    let checkpoint =
        std::fs::read_to_string(node.plugin_dir().join("kubelet_internal_checkpoint")).unwrap();
    assert!(checkpoint.contains(&first.uid), "{checkpoint}");

    let since = node
        .events(0, Duration::ZERO)
        .await
        .unwrap()
        .last()
        .map_or(0, |e| e.seq);
    assert_eq!(node.restart().await.unwrap(), 2);
    node.wait_event(since, T, |e| {
        e.kind == "capacity"
            && e.generation == 2
            && e.resource.as_deref() == Some(GPU)
            && e.allocatable == Some(8)
    })
    .await
    .unwrap();

    let created = pods
        .create(&pp, &pod("second", "node-a", GPU, 6))
        .await
        .unwrap();
    let second = node.wait_decided(&created, T).await.unwrap();
    assert_eq!(second.generation, 2);
    let second_ids = checked_gpus(&second);
    assert_eq!(second_ids.len(), 6);
    assert!(
        disjoint(&first_ids, &second_ids),
        "{first_ids:?} {second_ids:?}"
    );

    let created = pods
        .create(&pp, &pod("third", "node-a", GPU, 1))
        .await
        .unwrap();
    let third = node.wait_decided(&created, T).await.unwrap();
    assert_eq!(third.state, "rejected");
    assert_eq!(third.reason, "UnexpectedAdmissionError");
}

/// The agent in cluster mode on a harness node that admits pods as soon as it sees them (the
/// agent's own pod watch may lag: the plugin waits for the pod, bounded): the scheduler's
/// `fumarole.dev/devices` choice goes through the kubelet's `GetPreferredAllocation` call and
/// is what the container gets; a choice of devices already taken falls back to `select`, and
/// the pod gets a Warning Event saying why.
#[tokio::test(flavor = "multi_thread")]
async fn the_schedulers_device_choice_is_what_the_kubelet_allocates() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(&NodeSpec::new("dgx-1").capacity("cpu", "224"))
        .await
        .unwrap();
    let node = cluster.start_harness_node("dgx-1").await.unwrap();
    AgentBuilder::fixture("dgx-h100")
        .node("dgx-1")
        .device_plugin_dir(node.plugin_dir())
        .metrics_on_port(free_port().unwrap())
        .without_host_kubelet(cluster.root())
        .start_in(&cluster)
        .unwrap();
    node.wait_allocatable(GPU, 8, T).await.unwrap();
    let mut healthy: Vec<String> = node.devices().await.unwrap()["healthy"][GPU]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["ID"].as_str().unwrap().to_string())
        .collect();
    healthy.sort();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let chosen = vec![healthy[5].clone(), healthy[6].clone()];
    let annotated = |name: &str| {
        let mut p = pod(name, "dgx-1", GPU, 2);
        p.metadata.annotations = Some(
            [(
                "fumarole.dev/devices".to_string(),
                json!({GPU: chosen}).to_string(),
            )]
            .into(),
        );
        p
    };
    let created = pods.create(&pp, &annotated("chosen")).await.unwrap();
    let rec = node.wait_decided(&created, T).await.unwrap();
    assert_eq!(checked_gpus(&rec), chosen);
    let log = cluster.log_tail("fumarole-agent", 300).unwrap();
    assert!(log.contains("preferring the scheduler's devices"), "{log}");

    // The same choice again: those two are taken, so select decides and says why.
    let created = pods.create(&pp, &annotated("late")).await.unwrap();
    let late = checked_gpus(&node.wait_decided(&created, T).await.unwrap());
    assert!(disjoint(&late, &chosen), "{late:?}");
    let log = cluster.log_tail("fumarole-agent", 300).unwrap();
    assert!(
        log.contains("cannot give the scheduler's devices") && log.contains("is not available"),
        "{log}"
    );
}

/// NVIDIA time-slicing through the kubelet's own device manager: with 2 replicas per GPU
/// (`replicaAllocation: packed`) the Node offers 16 `nvidia.com/gpu`; three one-replica pods
/// bound to it are admitted, the first two on one GPU (each seeing it in
/// `NVIDIA_VISIBLE_DEVICES`), the third on the next.
#[tokio::test(flavor = "multi_thread")]
async fn time_sliced_replicas_let_two_pods_share_one_gpu() {
    let cluster = TestCluster::start().await.unwrap();
    cluster
        .create_node(&NodeSpec::new("node-s").capacity("cpu", "224"))
        .await
        .unwrap();
    let node = cluster.start_harness_node("node-s").await.unwrap();
    let config = cluster.root().join("sharing.yaml");
    std::fs::write(
        &config,
        "resources:\n  - match: {vendor: nvidia}\n    replicaAllocation: packed\n    sharing:\n      timeSlicing:\n        resources:\n          - {name: nvidia.com/gpu, replicas: 2}\n",
    )
    .unwrap();
    start_agent(
        &cluster,
        &node,
        "dgx-h100",
        &["--device-plugin-config", config.to_str().unwrap()],
    );
    let nodes: Api<Node> = Api::all(cluster.client());
    wait_node_devices(&nodes, "node-s", GPU, "16").await;

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let mut seen = Vec::new();
    for name in ["s1", "s2", "s3"] {
        let created = pods
            .create(&PostParams::default(), &pod(name, "node-s", GPU, 1))
            .await
            .unwrap();
        let rec = node.wait_decided(&created, T).await.unwrap();
        assert!(rec.admitted, "{rec:#?}");
        let c = rec.container("main").unwrap();
        let replica = c.devices[GPU].clone();
        assert_eq!(replica.len(), 1, "{replica:?}");
        let gpu = replica[0].split("::").next().unwrap().to_string();
        let visible = &c.options.as_ref().unwrap().envs["NVIDIA_VISIBLE_DEVICES"];
        assert_eq!(*visible, gpu, "{name} sees its replica's GPU");
        seen.push((replica[0].clone(), gpu));
    }
    assert_ne!(seen[0].0, seen[1].0, "two pods, two replicas");
    assert_eq!(seen[0].1, seen[1].1, "packed: the first two share one GPU");
    assert_ne!(seen[2].1, seen[0].1, "the third starts the next GPU");
}
