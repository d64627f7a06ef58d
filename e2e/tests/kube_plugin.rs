//! Real kube-scheduler with fumarole's framework plugin compiled in (`kube-scheduler-fumarole`,
//! built by kube-plugin/build.sh against the k8s.io/kubernetes the control plane runs), no
//! extender: the plugin's engine watches the API server itself. The nodes advertise all their
//! GPUs, so only fumarole knows which are free.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fumarole_e2e::cluster::{TestCluster, eventually};
use fumarole_e2e::fumarole::{KUBE_PLUGIN, start_kube_plugin};
use fumarole_topology::crd::DeviceTopology;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const SCHEDULER: &str = KUBE_PLUGIN;

/// A cluster with `topologies` published and kube-scheduler-fumarole running with `args`.
async fn cluster_with_plugin(topologies: &[DeviceTopology], args: &str) -> TestCluster {
    let cluster = common::cluster().await;
    common::publish(&cluster, topologies).await;
    start_plugin(&cluster, args).await;
    cluster
}

/// Starts kube-scheduler-fumarole with `args` on `cluster`; answers its HTTPS port.
async fn start_plugin(cluster: &TestCluster, args: &str) -> u16 {
    start_kube_plugin(cluster, args).await.unwrap()
}

async fn bound_node(pods: &Api<Pod>, name: &str) -> String {
    eventually(
        &format!("{name} to be bound"),
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            let name = name.to_string();
            async move { Ok(pods.get(&name).await?.spec.and_then(|s| s.node_name)) }
        },
    )
    .await
    .unwrap()
}

/// The messages of the pod's FailedScheduling Events, once there is one containing `part`.
async fn failed_scheduling(cluster: &TestCluster, name: &str, part: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let fields = format!("involvedObject.name={name}");
    eventually(
        &format!("a FailedScheduling Event on {name} saying {part:?}"),
        Duration::from_secs(60),
        || {
            let events = events.clone();
            let fields = fields.clone();
            async move {
                let messages: Vec<String> = events
                    .list(&ListParams::default().fields(&fields))
                    .await?
                    .items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
                    .filter_map(|e| e.message)
                    .collect();
                Ok(messages
                    .iter()
                    .any(|m| m.contains(part))
                    .then_some(messages))
            }
        },
    )
    .await
    .unwrap()
}

/// dgx-a has 4 free GPUs, dgx-b 6, pcie-a 3: a 4-GPU pod goes to dgx-a, where it fits exactly,
/// and the first version of it that names its node already carries dgx-a's 4 free GPUs (the
/// Binding brought both); a 7-GPU pod stays pending with fumarole's reason in its Event; a pod
/// asking for no GPU is left to kube-scheduler's own plugins and default binder.
#[tokio::test]
async fn plugin_binds_a_four_gpu_pod_where_it_fits_exactly_with_its_devices() {
    let cluster = cluster_with_plugin(&common::two_dgx(), "{}").await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let watch = pods
        .watch(&WatchParams::default().fields("metadata.name=four"), "0")
        .await
        .unwrap()
        .boxed();
    let pp = PostParams::default();
    for p in [
        common::gpu_pod("four", 4, json!({})),
        common::gpu_pod("seven", 7, json!({})),
        common::gpu_pod("cpu-only", 0, json!({})),
    ] {
        pods.create(&pp, &p).await.unwrap();
    }

    // The first event in which "four" has a node.
    let first_bound = tokio::time::timeout(
        Duration::from_secs(60),
        watch
            .try_filter_map(|e| async move {
                Ok(match e {
                    WatchEvent::Added(p) | WatchEvent::Modified(p)
                        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() =>
                    {
                        Some(p)
                    }
                    _ => None,
                })
            })
            .boxed()
            .try_next(),
    )
    .await
    .expect("four bound within 60 s")
    .unwrap()
    .unwrap();
    assert_eq!(
        first_bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some("dgx-a")
    );
    assert_eq!(
        common::devices_of(&first_bound),
        Some(
            ["dgx-a-gpu4", "dgx-a-gpu5", "dgx-a-gpu6", "dgx-a-gpu7"]
                .map(String::from)
                .to_vec()
        ),
        "the pod's first bound version must carry its devices"
    );

    failed_scheduling(&cluster, "seven", "needs 7 nvidia.com/gpu, 6 free").await;

    bound_node(&pods, "cpu-only").await;
    let cpu_only = pods.get("cpu-only").await.unwrap();
    assert_eq!(common::devices_of(&cpu_only), None);
}

/// 16 pods of 2 GPUs in units of 16 GPUs (8 pods) over three super-nodes with 16, 16 and 12
/// free GPUs: each unit lands whole in one super-node (rack-c, too small, gets none), over 8
/// nodes, no device given twice. PreFilter narrows each pod to its unit's super-node, so
/// kube-scheduler's sampling cannot miss it. A pod whose atomic unit (32 GPUs) fits no
/// super-node stays pending with fumarole's reason.
#[tokio::test]
async fn plugin_lands_a_group_job_unit_by_unit_in_single_super_nodes() {
    let cluster = cluster_with_plugin(&common::racks(), "{}").await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    common::place_a_group_job_over_the_racks(&pods).await;

    failed_scheduling(
        &cluster,
        "huge-0",
        "needs 32 nvidia.com/gpu (16 pods of 2) in one super-node",
    )
    .await;
}

/// Bad input: a pod whose annotation cannot be read gets a FailedScheduling Event saying why,
/// and the scheduler goes on placing the next pod; pluginConfig args with an argument fumarole
/// does not know stop kube-scheduler at start with an error naming it.
#[tokio::test]
async fn a_malformed_annotation_is_an_event_and_unknown_args_stop_the_start() {
    let cluster = cluster_with_plugin(&common::two_dgx(), "{lossWeight: 0.5}").await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    pods.create(
        &pp,
        &common::gpu_pod(
            "bad-0",
            2,
            json!({"metax-tech.com/gpu-group-size": "sixteen"}),
        ),
    )
    .await
    .unwrap();
    let messages = failed_scheduling(&cluster, "bad-0", "gpu-group-size").await;
    assert!(
        messages.iter().any(|m| m.contains("sixteen")),
        "{messages:?}"
    );
    pods.create(&pp, &common::gpu_pod("after", 2, json!({})))
        .await
        .unwrap();
    bound_node(&pods, "after").await;
    cluster.check_processes().unwrap();

    let other = common::cluster().await;
    let started = start_kube_plugin(&other, "{lossWieght: 0.5}").await;
    assert!(started.is_err(), "kube-scheduler must not start");
    let log = other.log_tail(SCHEDULER, 200).unwrap();
    assert!(log.contains("lossWieght"), "{log}");
}

/// An Ascend pod bound by the plugin carries Huawei's annotation beside fumarole's, naming the
/// same NPUs (what Huawei's device plugin reads), in the Binding's one write: atlas-a has NPUs
/// 0 and 1 in use, so a 2-NPU pod gets two of 2-7.
#[tokio::test]
async fn plugin_binds_an_ascend_pod_with_huaweis_annotation_naming_its_npus() {
    let cluster = cluster_with_plugin(
        &[fumarole_topology::crd::testing::atlas_800_910(
            "atlas-a",
            &[0, 1],
        )],
        "{}",
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let npu_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "npu"},
        "spec": {"containers": [{
            "name": "c", "image": "example.invalid/none",
            "resources": {"limits": {"huawei.com/Ascend910": "2"}}
        }]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &npu_pod).await.unwrap();
    assert_eq!(bound_node(&pods, "npu").await, "atlas-a");
    let bound = pods.get("npu").await.unwrap();
    let devices = common::devices_of(&bound).unwrap();
    assert_eq!(devices.len(), 2);
    assert!(
        devices
            .iter()
            .all(|d| d != "Ascend910-0" && d != "Ascend910-1"),
        "{devices:?}"
    );
    let huawei = bound
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("huawei.com/Ascend910"))
        .cloned()
        .unwrap_or_default();
    let named: BTreeSet<&str> = huawei.split(',').collect();
    let chosen: BTreeSet<&str> = devices.iter().map(String::as_str).collect();
    assert_eq!(named, chosen, "huawei.com/Ascend910 = {huawei:?}");
}

/// A pod fumarole refused for want of devices is retried when a DeviceTopology frees them,
/// which no kube-scheduler event says (no kubelet runs here, so no Node changes either): an
/// 8-GPU pod waits (dgx-b has 6 free), then dgx-b's two GPUs in use are released in its
/// status and the pod is bound there within seconds, not after kube-scheduler's 5-minute
/// flush of unschedulable pods.
#[tokio::test]
async fn a_refused_pod_is_retried_when_a_device_topology_frees_devices() {
    let cluster = cluster_with_plugin(&common::two_dgx(), "{}").await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.create(
        &PostParams::default(),
        &common::gpu_pod("eight", 8, json!({})),
    )
    .await
    .unwrap();
    failed_scheduling(&cluster, "eight", "needs 8 nvidia.com/gpu, 6 free").await;
    // The status's devices are a map: a merge patch frees a device by nulling its allocation.
    let topologies: Api<DeviceTopology> = Api::all(cluster.client());
    let free = json!({"allocation": null});
    topologies
        .patch_status(
            "dgx-b",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                &json!({"status": {"devices": {"dgx-b-gpu0": free, "dgx-b-gpu1": free}}}),
            ),
        )
        .await
        .unwrap();
    let node = eventually("eight to be bound", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move { Ok(pods.get("eight").await?.spec.and_then(|s| s.node_name)) }
    })
    .await
    .unwrap();
    assert_eq!(node, "dgx-b");
}

/// kube-scheduler's count of the plugin's queueing hints for scheduled pods' deletions that
/// answered `hint` (its `/metrics`, HTTPS on `port`).
fn hints_after_assigned_pod_deletes(port: u16, hint: &str) -> f64 {
    let out = std::process::Command::new("curl")
        .args(["-sSk", &format!("https://127.0.0.1:{port}/metrics")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.starts_with("scheduler_queueing_hint_execution_duration_seconds_count{"))
        .filter(|l| {
            l.contains(r#"event="AssignedPodDelete""#)
                && l.contains(&format!(r#"hint="{hint}""#))
                && l.contains(r#"plugin="Fumarole""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until kube-scheduler has counted a `hint` answer for a scheduled pod's deletion.
async fn hint_counted(port: u16, hint: &str) {
    eventually(
        &format!("a {hint} hint for a scheduled pod's deletion"),
        Duration::from_secs(30),
        || async { Ok((hints_after_assigned_pod_deletes(port, hint) >= 1.0).then_some(())) },
    )
    .await
    .unwrap();
}

/// The plugin's queueing hints, as kube-scheduler runs them for a pod fumarole refused: a
/// CPU pod's deletion leaves the refused pod where it is (`QueueSkip`), a GPU pod's deletion
/// retries it (`Queue`). An 8-GPU pod is refused (dgx-a's 4 free GPUs taken by a 4-GPU pod,
/// dgx-b has 6); a CPU pod is bound and deleted, then the 4-GPU pod.
#[tokio::test]
async fn a_cpu_pods_deletion_skips_a_refused_pod_and_a_gpu_pods_queues_it() {
    let cluster = common::cluster().await;
    common::publish(&cluster, &common::two_dgx()).await;
    let port = start_plugin(&cluster, "{}").await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let create = |pod: Pod| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
    };
    create(common::gpu_pod("hold", 4, json!({}))).await;
    assert_eq!(bound_node(&pods, "hold").await, "dgx-a");
    create(common::gpu_pod("eight", 8, json!({}))).await;
    failed_scheduling(&cluster, "eight", "needs 8 nvidia.com/gpu").await;
    create(common::gpu_pod("web", 0, json!({}))).await;
    bound_node(&pods, "web").await;
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete("web", &now).await.unwrap();
    hint_counted(port, "QueueSkip").await;
    assert_eq!(hints_after_assigned_pod_deletes(port, "Queue"), 0.0);
    pods.delete("hold", &now).await.unwrap();
    hint_counted(port, "Queue").await;
}

/// Two schedulers, each with fumarole's plugin and its own ledger, on one cluster: the
/// accelerators are split into node pools (`fumarole.dev/node-pool`), rack-a's nodes (16 free
/// GPUs) in pool `kube` for kube-scheduler (`nodePool: kube`), rack-b (16 free) and rack-c (12)
/// in no pool, Volcano's (the seeds' configuration unchanged). Both get their jobs at once:
/// kube-scheduler a 12-GPU unit of three 4-GPU pods and a lone 4-GPU pod, Volcano a 16-GPU unit
/// of four. Each lands in its own pool, each unit whole in one super-node (without pools the
/// 12-GPU unit would go to rack-c, its best fit, and Volcano's unit could go to rack-a), and
/// no device is given twice. Then one pod more for kube-scheduler stays pending, though rack-c
/// has room: the other pool's nodes refuse it with the pool reason.
#[tokio::test]
async fn kube_scheduler_and_volcano_share_a_cluster_in_node_pools() {
    use fumarole_e2e::fumarole::SEED_VOLCANO_CONF;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};

    let cluster = common::cluster().await;
    common::publish(&cluster, &common::racks()).await;
    let nodes: Api<Node> = Api::all(cluster.client());
    for node in ["a0", "a1", "a2", "a3"] {
        let pool = json!({"metadata": {"labels": {"fumarole.dev/node-pool": "kube"}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&pool))
            .await
            .unwrap();
    }
    start_plugin(&cluster, "{nodePool: kube}").await;
    common::start_volcano(&cluster, common::Way::Plugin, &[], SEED_VOLCANO_CONF).await;

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let group = |size: &str| json!({"metax-tech.com/gpu-group-size": size});
    let kube_unit: Vec<String> = (0..3).map(|i| format!("k-{i}")).collect();
    let volcano_unit: Vec<String> = (0..4).map(|i| format!("v-{i}")).collect();
    for (i, name) in volcano_unit.iter().enumerate() {
        let mut v = common::volcano_gpu_pod(name, 4);
        v.metadata.annotations = serde_json::from_value(group("16")).unwrap();
        pods.create(&pp, &v).await.unwrap();
        if let Some(k) = kube_unit.get(i) {
            pods.create(&pp, &common::gpu_pod(k, 4, group("12")))
                .await
                .unwrap();
        }
    }
    pods.create(&pp, &common::gpu_pod("lone", 4, json!({})))
        .await
        .unwrap();

    let all: Vec<String> = kube_unit
        .iter()
        .chain(&volcano_unit)
        .cloned()
        .chain(["lone".to_string()])
        .collect();
    let mut placed = common::all_placed(&pods, &all, Duration::from_secs(120))
        .await
        .unwrap();
    // No device twice, across both schedulers; each unit in one super-node of its pool.
    let mut devices = BTreeSet::new();
    for (pod, (_, held)) in &placed {
        for d in held {
            assert!(
                devices.insert(d.clone()),
                "{d} given twice ({pod}): {placed:?}"
            );
        }
    }
    let (lone_node, _) = placed.remove("lone").unwrap();
    assert_eq!(common::rack_of(&lone_node), "rack-a", "lone on {lone_node}");
    let rank = |pod: &str| pod[2..].parse::<u32>().unwrap();
    let (kube, volcano): (BTreeMap<_, _>, BTreeMap<_, _>) = placed
        .into_iter()
        .partition(|(pod, _)| pod.starts_with("k-"));
    let units = common::check_units(&kube, rank, 3);
    assert_eq!(units.values().collect::<Vec<_>>(), ["rack-a"], "{kube:?}");
    let units = common::check_units(&volcano, rank, 4);
    assert_eq!(
        units.values().collect::<Vec<_>>(),
        ["rack-b"],
        "{volcano:?}"
    );

    // rack-a is full; rack-c's 12 free GPUs are Volcano's.
    pods.create(&pp, &common::gpu_pod("extra", 4, json!({})))
        .await
        .unwrap();
    let refused = failed_scheduling(&cluster, "extra", "no node pool").await;
    assert!(
        refused.iter().any(|m| m.contains(
            "the node is in no node pool (fumarole.dev/node-pool); this scheduler places accelerator pods in node pool \"kube\""
        )),
        "{refused:?}"
    );
    assert!(
        pods.get("extra")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none(),
        "extra was bound outside its pool"
    );
}

/// A unit's planned super-node that kube-scheduler's other plugins refuse whole (every rack-a
/// node tainted NoSchedule, which fumarole does not judge) is given up from PostFilter: the
/// unit of 8 pods of 2 GPUs (16 GPUs; rack-a is its best fit by name, rack-b as good) lands
/// whole on rack-b within seconds, where the plan renewed on every try would have held it on
/// rack-a for good; the scheduler's log names the super-node given up.
#[tokio::test]
async fn a_unit_whose_super_node_other_plugins_refuse_is_planned_elsewhere() {
    let cluster = cluster_with_plugin(&common::racks(), "{}").await;
    let nodes: Api<Node> = Api::all(cluster.client());
    let taint = json!({"spec": {"taints": [
        {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    ]}});
    for node in ["a0", "a1", "a2", "a3"] {
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&taint))
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let names: Vec<String> = (0..8).map(|i| format!("train-{i}")).collect();
    for n in &names {
        let group = json!({"metax-tech.com/gpu-group-size": "16"});
        pods.create(&PostParams::default(), &common::gpu_pod(n, 2, group))
            .await
            .unwrap();
    }
    let placed = match common::all_placed(&pods, &names, Duration::from_secs(60)).await {
        Ok(p) => p,
        Err(e) => panic!(
            "{e}\npods: {:?}\n{SCHEDULER}:\n{}",
            common::pod_states(&pods).await,
            cluster.log_tail(SCHEDULER, 80).unwrap_or_default()
        ),
    };
    let racks: BTreeSet<&str> = placed
        .values()
        .map(|(node, _)| common::rack_of(node))
        .collect();
    assert_eq!(racks, BTreeSet::from(["rack-b"]), "{placed:?}");
    let log = cluster.log_tail(SCHEDULER, 4000).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("planning it elsewhere") && l.contains("rack-a")),
        "{log}"
    );
}

/// [`common::place_shares`] through kube-scheduler-fumarole.
#[tokio::test]
async fn plugin_packs_shares_onto_shared_gpus() {
    let cluster = cluster_with_plugin(&common::share_nodes(), "{}").await;
    common::place_shares(
        &Api::namespaced(cluster.client(), "default"),
        "default-scheduler",
        None,
    )
    .await;
}
