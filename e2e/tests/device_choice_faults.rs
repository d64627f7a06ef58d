//! Bad input at admission, through the kubelet's real device manager (a harness node) and the
//! agent's device plugin in cluster mode: pods deleted between their bind and their
//! admission, and a plugin killed while the kubelet waits on it. Each time the node says why
//! (the kubelet's refusal on the pod, the agent's log and metric), the kubelet's allocation
//! stays consistent, and no device is given to two live pods.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port, http_get};
use fumarole_e2e::harness_node::PodRecord;
use fumarole_e2e::process::Proc;
use fumarole_e2e::{AgentBuilder, HarnessNode, HarnessOptions, NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const GPU: &str = "nvidia.com/gpu";
const NODE: &str = "dgx-0";
const T: Duration = Duration::from_secs(60);

/// A cluster with one harness node for `NODE` (kubelet-node `extra` flags).
async fn start(extra: &[&str]) -> (TestCluster, HarnessNode) {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(&NodeSpec::new(NODE).capacity("cpu", "224"))
        .await
        .unwrap();
    let options = HarnessOptions {
        extra_args: extra.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let node = cluster
        .start_harness_node_with(NODE, &options)
        .await
        .unwrap();
    (cluster, node)
}

/// The agent in cluster mode on the dgx-h100 fixture, waiting up to a minute for a Volcano
/// pod's choice (long enough that a wait would show), serving metrics on `metrics`.
fn agent(cluster: &TestCluster, node: &HarnessNode, metrics: u16) -> Proc {
    AgentBuilder::fixture("dgx-h100")
        .node(NODE)
        .device_plugin_dir(node.plugin_dir())
        .flag("--await-device-choice-from", "volcano")
        .flag("--await-device-choice-timeout", "60s")
        .metrics_on_port(metrics)
        .without_host_kubelet(cluster.root())
        .env("RUST_LOG", "info")
        .spawn_in(cluster)
        .unwrap()
}

/// The node's GPU ids, sorted.
async fn gpus(node: &HarnessNode) -> Vec<String> {
    node.wait_allocatable(GPU, 8, T).await.unwrap();
    let d = node.devices().await.unwrap();
    let mut ids: Vec<String> = d["healthy"][GPU]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["ID"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// A pod bound to `NODE` asking for `n` GPUs, of `scheduler`, with `choice` as its
/// `fumarole.dev/devices` when given.
fn pod(name: &str, scheduler: &str, n: usize, choice: Option<&[String]>) -> Pod {
    let annotations = match choice {
        Some(ids) => json!({"fumarole.dev/devices": json!({GPU: ids}).to_string()}),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": NODE, "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "example.invalid/none",
                "resources": {"limits": {GPU: n.to_string()}}}]}
    }))
    .unwrap()
}

/// The pod's GPUs by the kubelet's device manager, after checking that the agent's `Allocate`
/// answer (`NVIDIA_VISIBLE_DEVICES`) names the same ones.
fn allocated(record: &PodRecord) -> Vec<String> {
    assert!(record.admitted, "{record:?}");
    let devices = record.devices(GPU);
    let c = record.container("main").unwrap();
    let visible: BTreeSet<&str> = c
        .options
        .as_ref()
        .and_then(|o| o.envs.get("NVIDIA_VISIBLE_DEVICES"))
        .map(|v| v.split(',').collect())
        .unwrap_or_default();
    let kubelet: BTreeSet<&str> = devices.iter().map(String::as_str).collect();
    assert_eq!(
        visible, kubelet,
        "{}: env and allocation differ",
        record.name
    );
    devices
}

/// `fumarole_device_choice_total{resource="nvidia.com/gpu", outcome}` from the agent.
async fn choices(metrics: u16, outcome: &str) -> u64 {
    let text = http_get(metrics, "/metrics").await.unwrap();
    let series =
        format!("fumarole_device_choice_total{{resource=\"{GPU}\",outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// No device of the node is held by two live pods (the kubelet's own account).
async fn no_device_twice(node: &HarnessNode) {
    let mut seen = BTreeSet::new();
    for r in node.pods().await.unwrap() {
        if r.admitted && !r.deleted && r.state == "admitted" {
            for id in r.devices(GPU) {
                assert!(seen.insert(id.clone()), "{id} given twice");
            }
        }
    }
}

/// Pods deleted after their bind and before the kubelet admitted them (one force-deleted, gone
/// from the API server; one gracefully, terminating): the kubelet still admits both, first,
/// and the plugin knows they are the pods being admitted. Neither waits for a choice no
/// scheduler will write (a log line and `outcome="pod-deleting"`); their devices go back; the
/// pod bound after them gets exactly its scheduler's choice.
#[tokio::test(flavor = "multi_thread")]
async fn pods_deleted_before_admission_do_not_take_the_next_pods_choice() {
    // The kubelet's sync latency: the deletions reach the agent before the kubelet admits.
    let (cluster, node) = start(&["--admit-delay=3s"]).await;
    let metrics = free_port().unwrap();
    let _agent = agent(&cluster, &node, metrics);
    let ids = gpus(&node).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let create = |p: Pod| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &p).await.unwrap() }
    };

    let forced = create(pod("forced", "volcano", 2, None)).await;
    pods.delete("forced", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let graceful = create(pod("graceful", "volcano", 2, None)).await;
    pods.delete("graceful", &DeleteParams::default())
        .await
        .unwrap();
    let choice = vec![ids[6].clone(), ids[7].clone()];
    let next = create(pod("next", "default-scheduler", 2, Some(&choice))).await;

    let record = node.wait_decided(&next, T).await.unwrap();
    assert!(record.admitted, "{record:?}");
    assert_eq!(allocated(&record), choice);
    for p in [&forced, &graceful] {
        let r = node
            .wait_pod_until("default", &p.metadata.name.clone().unwrap(), T, |r| {
                r.deleted || r.state == "released"
            })
            .await
            .unwrap();
        assert!(r.admitted, "the kubelet admits a pod it was told of: {r:?}");
        let got = allocated(&r);
        assert!(
            got.iter().all(|id| !choice.contains(id)),
            "{} took the next pod's choice: {got:?}",
            r.name
        );
    }
    no_device_twice(&node).await;
    assert_eq!(choices(metrics, "pod-deleting").await, 2);
    assert_eq!(choices(metrics, "honoured").await, 1);
    assert_eq!(choices(metrics, "no-choice-in-time").await, 0);
    let log = std::fs::read_to_string(cluster.root().join("logs/fumarole-agent.log")).unwrap();
    assert!(
        log.contains("being deleted before its admission"),
        "no log line for the deleted pods"
    );
}

/// The plugin is killed while the kubelet waits on its `GetPreferredAllocation` (a Volcano pod
/// whose choice has not come): the kubelet refuses that pod with its reason
/// (`UnexpectedAdmissionError`, on the pod's status), keeps the running pod's devices, and
/// after the agent is back and registered again, a pod whose choice names a device already in
/// use is told so on an Event and gets other devices; a valid choice is honoured again.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_killed_mid_admission_leaves_the_kubelet_consistent() {
    let (cluster, node) = start(&[]).await;
    let metrics = free_port().unwrap();
    let mut agent_proc = agent(&cluster, &node, metrics);
    let ids = gpus(&node).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let create = |p: Pod| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &p).await.unwrap() }
    };

    let running_choice = vec![ids[0].clone(), ids[1].clone()];
    let running = create(pod(
        "running",
        "default-scheduler",
        2,
        Some(&running_choice),
    ))
    .await;
    let r = node.wait_decided(&running, T).await.unwrap();
    assert_eq!(allocated(&r), running_choice);

    let waiting = create(pod("waiting", "volcano", 2, None)).await;
    eventually("the kubelet to be admitting the waiting pod", T, || async {
        let r = node.pod("default", "waiting").await?;
        Ok(r.filter(|r| r.state == "admitting").map(|_| ()))
    })
    .await
    .unwrap();
    // Let the plugin's wait begin, then crash it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    agent_proc.kill();

    let refused = node.wait_decided(&waiting, T).await.unwrap();
    assert!(!refused.admitted, "{refused:?}");
    assert_eq!(refused.reason, "UnexpectedAdmissionError", "{refused:?}");
    println!("refused: {}", refused.message);
    eventually("the refusal on the pod's status", T, || async {
        let p = pods.get("waiting").await?;
        let status = p.status.unwrap_or_default();
        Ok((status.phase.as_deref() == Some("Failed")
            && status.reason.as_deref() == Some("UnexpectedAdmissionError"))
        .then_some(()))
    })
    .await
    .unwrap();
    let d = node.devices().await.unwrap();
    let mut in_use: Vec<String> = serde_json::from_value(d["in_use"][GPU].clone()).unwrap();
    in_use.sort();
    assert_eq!(
        in_use, running_choice,
        "the kubelet holds the running pod's devices only"
    );

    // The kubelet saw the plugin go; it comes back and registers again.
    node.wait_allocatable(GPU, 0, T).await.unwrap();
    let _agent = agent(&cluster, &node, metrics);
    node.wait_allocatable(GPU, 8, T).await.unwrap();
    let stale = vec![ids[1].clone(), ids[2].clone()];
    let forged = create(pod("stale", "default-scheduler", 2, Some(&stale))).await;
    let r = node.wait_decided(&forged, T).await.unwrap();
    let got = allocated(&r);
    assert!(
        got.iter().all(|id| !running_choice.contains(id)),
        "{got:?} overlaps the running pod's devices"
    );
    eventually("the NotHonoured Event", T, || async {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(cluster.client(), "default");
        let list = events.list(&Default::default()).await?;
        Ok(list
            .items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("stale")
                    && e.reason.as_deref() == Some("DeviceChoiceNotHonoured")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains(&format!("{} is not available", ids[1])))
            })
            .then_some(()))
    })
    .await
    .unwrap();
    let free: Vec<String> = ids
        .iter()
        .filter(|id| !running_choice.contains(id) && !got.contains(id))
        .take(2)
        .cloned()
        .collect();
    let valid = create(pod("valid", "default-scheduler", 2, Some(&free))).await;
    let r = node.wait_decided(&valid, T).await.unwrap();
    assert_eq!(allocated(&r), free);
    no_device_twice(&node).await;
}
