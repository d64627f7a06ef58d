//! The node side of `fumarole-agent run --colocation` against the real API server and the real
//! kernel: the kubepods tree is a test cgroup in the v1 `cpu`, `cpuacct` and `memory`
//! hierarchies, and load is real (busy processes placed in an online pod's cgroup), so the
//! agent's usage readings, batch resources and pressure all come from the kernel's counters.
//!
//! One story, in order:
//! 1. batch resources appear on the Node status (idle node: about 60 % of 2 CPUs) and the
//!    state report lands in the `DeviceTopology` status;
//! 2. an invalid ConfigMap: a Warning Event names the bad key, the report carries the error,
//!    and the old configuration stays in force (the eviction below uses the old watermarks);
//! 3. load: batch-cpu falls; CPU usage above the high watermark taints the node and evicts the
//!    offline pods through the Eviction API, largest request first, one at a time, never the
//!    online pod nor the critical offline pod; each eviction gets an Event;
//! 4. load gone: the taint is removed and batch-cpu rises again;
//! 5. a restarted agent neither evicts again nor re-taints;
//! 6. oversubscription switched off (node label removed): batch-* leave the Node status and the
//!    offline pod that asked for batch resources is evicted.
//!
//! The agent runs as its ServiceAccount from `deploy/daemonset` (impersonated, with a token
//! bound to the node), so the story also proves that its RBAC and the node-scoped admission
//! policy allow its whole co-location job.
//!
//! Needs root and cgroup v1 `cpu`, `cpuacct` and `memory` hierarchies; skipped otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use fumarole_e2e::cluster::{Identity, http_get, metric_sum};
use fumarole_e2e::colocation::{
    self, CgroupTree, config_map, cpu_burner, event_seen, log, running_pod,
};
use fumarole_e2e::{NodeSpec, TestCluster};
use fumarole_topology::crd::DeviceTopology;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "colo-node";
/// Where deploy/daemonset installs the agent and its ConfigMap.
const NAMESPACE: &str = "fumarole-system";
const TAINT: &str = "volcano.sh/offline-job-evicting";
const WEB_ID: &str = "dddd0001";

fn config(cpu_high: serde_json::Value) -> ConfigMap {
    config_map(&json!({"globalConfig": {"evictingConfig": {
        "monitorInterval": 1,
        "highUsageCountLimit": 2,
        "evictingCPUHighWatermark": cpu_high,
        "evictingCPULowWatermark": 20,
        // The machine's own memory pressure is not under test: PSI off.
        "evictingMemoryPressureThreshold": 100,
    }}}))
}

/// `kubernetes.io/batch-cpu` on the Node status (capacity and allocatable must agree).
async fn batch_cpu(nodes: &Api<Node>) -> Option<u64> {
    let node = nodes.get(NODE).await.ok()?;
    let status = node.status?;
    let capacity = status.capacity?.get("kubernetes.io/batch-cpu")?.0.clone();
    let allocatable = status
        .allocatable?
        .get("kubernetes.io/batch-cpu")?
        .0
        .clone();
    assert_eq!(capacity, allocatable);
    capacity.parse().ok()
}

async fn tainted(nodes: &Api<Node>) -> bool {
    let node = nodes.get(NODE).await.unwrap();
    node.spec
        .and_then(|s| s.taints)
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT && t.effect == "NoSchedule"))
}

async fn evicted(pods: &Api<Pod>, name: &str) -> bool {
    pods.get_opt(name)
        .await
        .unwrap()
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

async fn until(what: &str, secs: u64, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn batch_resources_follow_load_pressure_taints_and_evicts_offline_pods() {
    let Some(tree) = CgroupTree::create(
        "node",
        &["cpu", "cpuacct", "memory"],
        &[("cpuacct", "cpuacct.usage"), ("memory", "memory.stat")],
    ) else {
        return;
    };
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(NODE)
                .capacity("cpu", "2")
                .capacity("memory", "4Gi")
                .label("volcano.sh/colocation", "true")
                .label("volcano.sh/oversubscription", "true"),
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(cluster.client());
    // Installed as users install it; the agent runs as its ServiceAccount with a token bound
    // to the node, so every write below also proves its RBAC and the node-scoped policy.
    cluster.install_deploy_daemonset().await.unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), NAMESPACE);
    configmaps
        .replace(
            "volcano-agent-configuration",
            &PostParams::default(),
            &config(json!(40)),
        )
        .await
        .unwrap();
    let agent_id = Identity::service_account(NAMESPACE, "fumarole-agent").on_node(NODE);
    let kubeconfig = cluster
        .kubeconfig_for("agent.kubeconfig", &agent_id)
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let system: Api<Pod> = Api::namespaced(cluster.client(), "kube-system");
    let be = json!({"volcano.sh/qos-level": "BE"});
    let web_uid = running_pod(
        &pods,
        NODE,
        "web",
        json!({}),
        json!({"resources": {"requests": {"cpu": "1500m"}}}),
        WEB_ID,
    )
    .await
    .unwrap();
    for (name, cpu, batch) in [("batch-small", "100m", 300), ("batch-large", "100m", 900)] {
        let resources =
            json!({"requests": {"cpu": cpu, "kubernetes.io/batch-cpu": batch.to_string()}});
        running_pod(
            &pods,
            NODE,
            name,
            be.clone(),
            json!({"resources": resources}),
            name,
        )
        .await
        .unwrap();
    }
    // The largest request of all, but critical: never evicted.
    running_pod(
        &system,
        NODE,
        "critical-offline",
        be.clone(),
        json!({"priorityClassName": "system-node-critical", "resources": {"requests": {"cpu": "1"}}}),
        "critical",
    )
    .await
    .unwrap();

    let web = format!("kubepods/burstable/pod{web_uid}/{WEB_ID}");
    tree.mkdir("cpu", &web).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubelet = tree.kubelet_config(dir.path()).unwrap();
    let run = |name| {
        colocation::agent(NODE, &kubelet, dir.path())
            .unwrap()
            .process(name)
            .kubeconfig(&kubeconfig)
            .flag("--colocation-config-namespace", NAMESPACE)
    };
    let first = run("fumarole-agent-node");
    let metrics_port = first.metrics_port().unwrap();
    let mut agent = first.spawn_in(&cluster).unwrap();
    let metric =
        async |prefix: &str| metric_sum(&http_get(metrics_port, "/metrics").await.unwrap(), prefix);

    // 1. Idle: 60 % of about 2000m.
    until("batch-cpu published for an idle node", 60, async || {
        batch_cpu(&nodes).await.is_some_and(|v| v >= 1000)
    })
    .await;
    let topologies: Api<DeviceTopology> = Api::all(cluster.client());
    until(
        "the state report in DeviceTopology status",
        60,
        async || {
            topologies
                .get_opt(NODE)
                .await
                .ok()
                .flatten()
                .is_some_and(|t| {
                    t.status.and_then(|s| s.colocation).is_some_and(|c| {
                        c.enabled && c.batch_resources.is_some_and(|b| b.cpu_millis >= 1000)
                    })
                })
        },
    )
    .await;

    // The report lives in the DeviceTopology now, not (also) on the Node.
    until("no report annotation left on the Node", 30, async || {
        let node = nodes.get(NODE).await.unwrap();
        let annotations = node.metadata.annotations.unwrap_or_default();
        !annotations.contains_key("fumarole.dev/colocation-status")
    })
    .await;

    // 2. An invalid change: Event on the ConfigMap, the report says why, the old config stays.
    configmaps
        .replace(
            "volcano-agent-configuration",
            &PostParams::default(),
            &config(json!("eighty")),
        )
        .await
        .unwrap();
    let config_events: Api<Event> = Api::namespaced(cluster.client(), NAMESPACE);
    until("the InvalidColocationConfig Event", 30, async || {
        event_seen(&config_events, |e| {
            e.reason.as_deref() == Some("InvalidColocationConfig")
                && e.involved_object.kind.as_deref() == Some("ConfigMap")
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("evictingCPUHighWatermark"))
        })
        .await
        .unwrap()
    })
    .await;
    until("the config error in the state report", 30, async || {
        topologies
            .get_opt(NODE)
            .await
            .ok()
            .flatten()
            .is_some_and(|t| {
                t.status
                    .and_then(|s| s.colocation)
                    .and_then(|c| c.config_error)
                    .is_some_and(|e| e.contains("evictingCPUHighWatermark"))
            })
    })
    .await;

    assert_eq!(metric("fumarole_colocation_config_valid").await, 0.0);

    // 3. Two busy processes in the online pod: usage over the (old, 40 %) high watermark.
    let idle_batch = batch_cpu(&nodes).await.unwrap();
    let burners: Vec<_> = (0..2)
        .map(|i| {
            let burner = cpu_burner(&cluster, &format!("burner-{i}")).unwrap();
            tree.enter(&web, burner.pid()).unwrap();
            burner
        })
        .collect();
    until("the taint under CPU pressure", 60, async || {
        tainted(&nodes).await
    })
    .await;
    until("batch-large evicted first", 60, async || {
        evicted(&pods, "batch-large").await
    })
    .await;
    assert!(
        !evicted(&pods, "batch-small").await,
        "one eviction per round, and the next waits for the first pod to go"
    );
    until("then batch-small", 60, async || {
        evicted(&pods, "batch-small").await
    })
    .await;
    until("batch-cpu follows the load down", 60, async || {
        batch_cpu(&nodes)
            .await
            .is_some_and(|v| v < idle_batch * 7 / 10)
    })
    .await;
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    for event in ["batch-large", "batch-small"] {
        until("an Evicted Event on the pod", 30, async || {
            event_seen(&events, |e| {
                e.reason.as_deref() == Some("Evicted")
                    && e.involved_object.name.as_deref() == Some(event)
            })
            .await
            .unwrap()
        })
        .await;
    }
    // Pressure stays, but the online pod and the critical offline pod are never evicted.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!evicted(&pods, "web").await);
    assert!(!evicted(&system, "critical-offline").await);
    // The status, like the gauges below, says what the last round measured: the burners share
    // the CPUs with whatever else runs on the machine, so one round may fall under the
    // watermark (read once, `pressure` was empty in 2 of 3 runs under two busy loops).
    let report = async || {
        topologies
            .get(NODE)
            .await
            .unwrap()
            .status
            .unwrap()
            .colocation
            .unwrap()
    };
    until(
        "the status reporting CPU pressure while evicting",
        30,
        async || {
            let report = report().await;
            report.evicting && report.pressure.contains_key("cpu")
        },
    )
    .await;
    let report = report().await;
    assert!(report.last_eviction.is_some(), "{report:?}");
    assert_eq!(
        metric("fumarole_colocation_evictions_total{reason=\"pressure\"}").await,
        2.0
    );
    // The gauges are of the last round too.
    until(
        "the evicting and CPU pressure gauges at 1",
        30,
        async || {
            metric("fumarole_colocation_evicting").await == 1.0
                && metric("fumarole_colocation_pressure{resource=\"cpu\"}").await == 1.0
        },
    )
    .await;
    assert!(metric("fumarole_colocation_batch_cpu_millicores").await > 0.0);
    // The two dashboard metrics that need a measured node (deployment.rs checks the rest).
    assert!(metric("fumarole_colocation_usage_percent{resource=\"cpu\"}").await > 0.0);
    assert_eq!(
        metric("fumarole_colocation_pods{level=\"none\"}").await,
        1.0
    );

    // 4. Load gone: the taint goes at the low watermark, batch-cpu rises again.
    drop(burners);
    until("the taint removed", 60, async || !tainted(&nodes).await).await;
    until("batch-cpu follows the load up", 60, async || {
        batch_cpu(&nodes)
            .await
            .is_some_and(|v| v >= idle_batch * 8 / 10)
    })
    .await;
    let text = log(&agent);
    assert_eq!(text.matches("offline pod evicted").count(), 2, "{text}");
    // Everything above was done with the ServiceAccount's rights alone.
    assert!(!text.to_lowercase().contains("forbidden"), "{text}");
    agent.stop();

    // 5. Restart: nothing evicted twice, no taint flapping, an unchanged value not rewritten.
    let taint_changes = |t: &str| t.matches("node taint changed").count();
    let restarted = run("fumarole-agent-node-2").spawn_in(&cluster).unwrap();
    until("the restarted agent's config", 30, async || {
        log(&restarted).contains("co-location config in force")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let text = log(&restarted);
    assert!(!text.contains("offline pod evicted"), "{text}");
    assert_eq!(taint_changes(&text), 0, "{text}");

    // 6. Oversubscription off: batch-* leave the Node, the pod admitted on them is evicted.
    let resources = json!({"requests": {"cpu": "100m", "kubernetes.io/batch-cpu": "200"}});
    running_pod(
        &pods,
        NODE,
        "batch-late",
        be.clone(),
        json!({"resources": resources}),
        "late",
    )
    .await
    .unwrap();
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"volcano.sh/oversubscription": null}}})),
        )
        .await
        .unwrap();
    until("batch-* removed from the Node status", 30, async || {
        batch_cpu(&nodes).await.is_none()
    })
    .await;
    until("batch-late evicted", 30, async || {
        evicted(&pods, "batch-late").await
    })
    .await;
    assert!(!evicted(&pods, "web").await);
    drop(restarted);
    drop(cluster);
    drop(tree);
}
