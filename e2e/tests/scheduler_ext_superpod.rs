//! Huawei's super-pod jobs through real Volcano (v1.10), each test two ways ([`Way`]):
//! fumarole-scheduler-ext as its extender, and vc-scheduler-fumarole (fumarole's plugin
//! compiled in) configured as Huawei's users write it ([`HUAWEI_VOLCANO_CONF`], the `init-params`
//! arguments fumarole does not implement each named once in its log). Ascend nodes (`huawei.com/Ascend910`, Atlas 800 topology) in two physical
//! super-pods, an `sp-block` job placed block by block, `--reserve-nodes` kept while another
//! super-pod can take a block, and a bad `sp-block` refused with our reason; `sp-block` given
//! on the Volcano Job only (Volcano copies it to the PodGroup), and the annotations the
//! training job reads (`hccl/rankIndex`, `super-pod-rank`, `super-pod-id`) on every pod.
//!
//! And through the real kube-scheduler (the extension as its filter, prioritize and bind
//! extender, no Volcano): the job annotations and `huawei.com/Ascend910` arrive in the
//! extension's `Binding`, the only write to the pod after its creation (the API server's audit
//! log); a PodGroup CRD installed after the extension started is watched without a restart; and
//! a PodGroup's status updates build no view in full.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::Way;
use fumarole_e2e::cluster::eventually;
use fumarole_e2e::fumarole::KUBE_PLUGIN;
use fumarole_e2e::{NodeSpec, TestCluster};
use fumarole_topology::crd::DeviceTopology;
use fumarole_topology::crd::device_topology::SuperNodeInfo;
use fumarole_topology::crd::testing::atlas_800_910;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;

const NPU: &str = "huawei.com/Ascend910";

/// Physical super-pod `sp-1` (n0..n3) and `sp-2` (m0..m3): 8 idle Atlas 800 nodes.
fn super_pods() -> Vec<DeviceTopology> {
    super_pods_with_ids(["sp-1", "sp-2"])
}

/// Two physical super-pods of 4 idle Atlas 800 nodes, n0..n3 in the first, m0..m3 in the
/// second, with these super-node ids.
fn super_pods_with_ids(ids: [&str; 2]) -> Vec<DeviceTopology> {
    let mut out = Vec::new();
    for (sp, prefix) in [(ids[0], "n"), (ids[1], "m")] {
        for i in 0..4 {
            let mut t = atlas_800_910(&format!("{prefix}{i}"), &[]);
            t.spec.super_node = Some(SuperNodeInfo {
                id: sp.into(),
                source: "config".into(),
            });
            out.push(t);
        }
    }
    out
}

fn super_pod_of(node: &str) -> &'static str {
    match node.chars().next() {
        Some('n') => "sp-1",
        Some('m') => "sp-2",
        _ => "?",
    }
}

/// The super-pod id (`SuperPodID`) of a node of [`super_pods_with_ids`]`(["1", "2"])`.
fn numeric_super_pod_of(node: &str) -> &'static str {
    match super_pod_of(node) {
        "sp-1" => "1",
        "sp-2" => "2",
        other => panic!("{node} is in no super-pod ({other})"),
    }
}

/// Asserts that `pod` on `node` (a node of [`super_pods_with_ids`]`(["1", "2"])`) carries
/// `hccl/rankIndex` = `hccl_rank`, `super-pod-rank` = `block` and `super-pod-id` = its node's
/// super-pod id.
fn assert_job_annotations(
    pod: &str,
    node: &str,
    a: &BTreeMap<String, String>,
    hccl_rank: &str,
    block: u32,
) {
    assert_eq!(
        a.get("hccl/rankIndex").map(String::as_str),
        Some(hccl_rank),
        "{pod}: {a:?}"
    );
    assert_eq!(
        a.get("super-pod-rank"),
        Some(&block.to_string()),
        "{pod}: {a:?}"
    );
    assert_eq!(
        a.get("super-pod-id").map(String::as_str),
        Some(numeric_super_pod_of(node)),
        "{pod} on {node}: {a:?}"
    );
}

/// A Node advertising its 8 NPUs (so only the extender tells free from used) and its
/// DeviceTopology with status, as the agent publishes them.
async fn publish(cluster: &TestCluster, topologies: &[DeviceTopology]) {
    let api: Api<DeviceTopology> = Api::all(cluster.client());
    for t in topologies {
        let name = t.metadata.name.clone().unwrap();
        cluster
            .create_node(
                &NodeSpec::new(&name)
                    .capacity("cpu", "64")
                    .capacity("memory", "512Gi")
                    .capacity(NPU, "8")
                    .label("accelerator", "huawei-Ascend910")
                    .label("accelerator-type", "module"),
            )
            .await
            .unwrap();
        let mut spec_only = t.clone();
        spec_only.status = None;
        api.create(&PostParams::default(), &spec_only)
            .await
            .unwrap();
        let status = json!({"status": t.status});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
}

/// A Volcano Job with the pytorch plugin: master 1 + `workers`, 8 NPUs each, `sp-block` on the
/// master's template only (the extension takes it for the whole job, as for gpu-group-size).
fn sp_job(name: &str, workers: u32, sp_block: &str) -> DynamicObject {
    let mut job = plain_job(name, workers);
    job.data["spec"]["tasks"][0]["template"]["metadata"]["annotations"] =
        json!({"sp-block": sp_block});
    job
}

/// The Volcano Job of [`sp_job`] without `sp-block` anywhere.
fn plain_job(name: &str, workers: u32) -> DynamicObject {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "batch.volcano.sh",
        "v1alpha1",
        "Job",
    ));
    let container = json!({
        "name": "train", "image": "example.invalid/mindspore",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {NPU: "8"}}
    });
    let mut job = DynamicObject::new(name, &ar).within("default");
    let mut tasks = vec![json!({"name": "master", "replicas": 1, "template": {
        "metadata": {"labels": {"ring-controller.atlas": "ascend-910"}},
        "spec": {"restartPolicy": "OnFailure", "containers": [container.clone()]}}})];
    if workers > 0 {
        tasks.push(json!({"name": "worker", "replicas": workers, "template": {
            "metadata": {"labels": {"ring-controller.atlas": "ascend-910"}},
            "spec": {"restartPolicy": "OnFailure", "containers": [container]}}}));
    }
    job.data = json!({"spec": {
        "schedulerName": "volcano",
        "queue": "default",
        "minAvailable": workers + 1,
        "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
        "tasks": tasks
    }});
    job
}

fn pod_names(job: &str, workers: u32) -> Vec<String> {
    std::iter::once(format!("{job}-master-0"))
        .chain((0..workers).map(|i| format!("{job}-worker-{i}")))
        .collect()
}

/// Waits for every pod of `names` to be bound with our device annotation (Volcano binding).
async fn all_placed(
    cluster: &TestCluster,
    pods: &Api<Pod>,
    names: &[String],
) -> BTreeMap<String, (String, Vec<String>)> {
    all_placed_by(cluster, "vc-scheduler", pods, names).await
}

/// [`all_placed`] with `scheduler` (the process whose log a failure shows) binding.
async fn all_placed_by(
    cluster: &TestCluster,
    scheduler: &str,
    pods: &Api<Pod>,
    names: &[String],
) -> BTreeMap<String, (String, Vec<String>)> {
    let placed = common::all_placed(pods, names, Duration::from_secs(150)).await;
    match placed {
        Ok(p) => p,
        Err(e) => panic!(
            "{e}\npods: {:?}\nscheduler-ext:\n{}\n{scheduler}:\n{}",
            common::pod_states(pods).await,
            // The plugin way runs no extension process: say so instead of panicking here.
            cluster
                .log_tail("fumarole-scheduler-ext", 80)
                .unwrap_or_else(|e| e.to_string()),
            cluster
                .log_tail(scheduler, 80)
                .unwrap_or_else(|e| e.to_string())
        ),
    }
}

/// The pytorch plugin's RANK env of a pod.
async fn rank(pods: &Api<Pod>, name: &str) -> u32 {
    let p = pods.get(name).await.unwrap();
    p.spec.unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "RANK")
        .and_then(|e| e.value.clone())
        .unwrap()
        .parse()
        .unwrap()
}

/// Each pod has 8 distinct NPUs of its node; returns block -> super-pods of its pods.
async fn blocks(
    pods: &Api<Pod>,
    placed: &BTreeMap<String, (String, Vec<String>)>,
    pods_per_block: u32,
) -> BTreeMap<u32, BTreeSet<&'static str>> {
    let mut out: BTreeMap<u32, BTreeSet<&'static str>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (pod, (node, devices)) in placed {
        assert_eq!(devices.len(), 8, "{pod}: {devices:?}");
        for d in devices {
            assert!(d.starts_with("Ascend910-"), "{pod}: {d}");
            assert!(
                seen.insert((node.clone(), d.clone())),
                "{d} on {node} twice"
            );
        }
        out.entry(rank(pods, pod).await / pods_per_block)
            .or_default()
            .insert(super_pod_of(node));
    }
    out
}

/// Volcano reports our reason for a pod it cannot place.
async fn reported(cluster: &TestCluster, pods: &Api<Pod>, pod: &str, ours: &str) -> String {
    eventually("our reason to be reported", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let p = pods.get(pod).await?;
            assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.clone()), None);
            let condition = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.message)
                .find(|m| m.contains(ours));
            let events: Api<k8s_openapi::api::core::v1::Event> =
                Api::namespaced(cluster.client(), "default");
            let event = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|e| e.message)
                .find(|m| m.contains(ours));
            Ok(condition.or(event))
        }
    })
    .await
    .unwrap()
}

/// Volcano's configuration as Huawei's users write it: the NPU plugin under its versioned name
/// in the first tier after `conformance`, and the top-level `init-params` with its values as
/// strings, exactly as Huawei's documents show them (../shared/reference/
/// volcano-scheduler-configs.md): `super-pod-size` 48 (it only refuses jobs needing more nodes,
/// so the 4-node super-pods here need no other value) and `reserve-nodes` 2.
const HUAWEI_VOLCANO_CONF: &str = r#"actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
  - name: volcano-npu_v7.3.0_linux-x86_64
- plugins:
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
configurations:
  - name: init-params
    arguments: {"grace-over-time":"900","presetVirtualDevice":"true","nslb-version":"1.0","shared-tor-num":"2","useClusterInfoManager":"false","super-pod-size":"48","reserve-nodes":"2"}
"#;

/// The `init-params` arguments of [`HUAWEI_VOLCANO_CONF`] fumarole does not implement.
const NOT_IMPLEMENTED: [&str; 5] = [
    "grace-over-time",
    "presetVirtualDevice",
    "nslb-version",
    "shared-tor-num",
    "useClusterInfoManager",
];

/// A cluster of `topologies` with Volcano deciding with fumarole the `way` given: the extension
/// with `args` as its extender, or fumarole's plugin with [`HUAWEI_VOLCANO_CONF`] (its
/// `init-params` hold what `args` says, and `reserve-nodes` 2); the Volcano Job and Pod APIs of
/// namespace `default`.
async fn volcano_with_extension(
    topologies: &[DeviceTopology],
    way: Way,
    args: &[&str],
) -> (TestCluster, Api<DynamicObject>, Api<Pod>) {
    let cluster = common::cluster().await;
    publish(&cluster, topologies).await;
    common::start_volcano(&cluster, way, args, HUAWEI_VOLCANO_CONF).await;
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "batch.volcano.sh",
        "v1alpha1",
        "Job",
    ));
    let jobs = Api::namespaced_with(cluster.client(), "default", &ar);
    let pods = Api::namespaced(cluster.client(), "default");
    (cluster, jobs, pods)
}

/// No failed extender call, no plugin failure; under the plugin, each `init-params` argument
/// fumarole does not implement named once in the scheduler's log.
fn check_scheduler_log(cluster: &TestCluster, way: Way) {
    common::assert_no_failed_calls(cluster);
    if let Way::Plugin = way {
        let log = cluster.log_tail("vc-scheduler", 100_000).unwrap();
        for key in NOT_IMPLEMENTED {
            let named = log
                .lines()
                .filter(|l| {
                    l.contains(&format!("{key:?}")) && l.contains("is not implemented by fumarole")
                })
                .count();
            assert_eq!(
                named, 1,
                "{key} named {named} times in vc-scheduler log:\n{log}"
            );
        }
    }
}

/// With `--reserve-nodes 2`: a job of 4 pods x 8 NPUs in `sp-block: 16` lands block by block,
/// each block whole in one super-pod. The first block takes sp-1 (equal room, first by name)
/// outside its reserve (n2, n3); sp-1 then has room for one more block only in its reserve, so
/// the second block goes to sp-2 (without the reserve best fit would put it on n2, n3). Then a
/// third job's block fits nowhere outside a reserve and takes one super-pod's two reserve
/// nodes, whole. A job with `sp-block: 12` (not a multiple of its pods' 8 NPUs) stays pending
/// with our reason.
#[tokio::test]
async fn extender_sp_block_job_lands_block_by_block_and_keeps_the_reserve() {
    sp_block_job_lands_block_by_block_and_keeps_the_reserve(Way::Extender).await;
}

#[tokio::test]
async fn plugin_sp_block_job_lands_block_by_block_and_keeps_the_reserve() {
    sp_block_job_lands_block_by_block_and_keeps_the_reserve(Way::Plugin).await;
}

async fn sp_block_job_lands_block_by_block_and_keeps_the_reserve(way: Way) {
    let (cluster, jobs, pods) = volcano_with_extension(
        &super_pods(),
        way,
        &["--reserve-nodes=2", "--super-pod-size=4"],
    )
    .await;
    let pp = PostParams::default();

    jobs.create(&pp, &sp_job("odd", 0, "12")).await.unwrap();
    let reason = reported(
        &cluster,
        &pods,
        "odd-master-0",
        "sp-block = 12 is not a multiple of the pod's 8 GPUs",
    )
    .await;
    assert!(reason.contains("default/odd-master-0"), "{reason}");

    jobs.create(&pp, &sp_job("train", 3, "16")).await.unwrap();
    let names = pod_names("train", 3);
    let placed = all_placed(&cluster, &pods, &names).await;
    assert_eq!(rank(&pods, "train-master-0").await, 0);
    let by_block = blocks(&pods, &placed, 2).await;
    assert_eq!(by_block.len(), 2, "{placed:?}");
    for (block, sps) in &by_block {
        assert_eq!(sps.len(), 1, "block {block} spans {sps:?}: {placed:?}");
    }
    let used: BTreeSet<&str> = by_block.values().flatten().copied().collect();
    assert_eq!(used, BTreeSet::from(["sp-1", "sp-2"]), "{placed:?}");
    let nodes: BTreeSet<&str> = placed.values().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        nodes,
        BTreeSet::from(["m0", "m1", "n0", "n1"]),
        "the reserve nodes (n2, n3, m2, m3) stay free: {placed:?}"
    );

    // Only reserves are left: the next block takes one super-pod's reserve, whole.
    jobs.create(&pp, &sp_job("late", 1, "16")).await.unwrap();
    let late = all_placed(&cluster, &pods, &pod_names("late", 1)).await;
    let late_blocks = blocks(&pods, &late, 2).await;
    assert_eq!(late_blocks.len(), 1, "{late:?}");
    assert_eq!(late_blocks[&0].len(), 1, "{late:?}");
    let late_nodes: BTreeSet<&str> = late.values().map(|(n, _)| n.as_str()).collect();
    assert!(
        late_nodes == BTreeSet::from(["n2", "n3"]) || late_nodes == BTreeSet::from(["m2", "m3"]),
        "{late:?}"
    );
    check_scheduler_log(&cluster, way);
}

/// `sp-block: "16"` and `sp-fit: idlest` given on the Volcano Job only (Volcano copies them to
/// the PodGroup, not to the pods): the job of 4 pods x 8 NPUs lands block by block, each block
/// in one super-pod, and `sp-fit: idlest` sends the second block to the other, idle super-pod
/// (best fit would keep it beside the first). Every pod carries `hccl/rankIndex` (its RANK),
/// `super-pod-rank` (its block) and `super-pod-id` (its node's super-node id); the master's
/// template presets a garbled `hccl/rankIndex`, which stays.
#[tokio::test]
async fn extender_sp_block_on_the_volcano_job_and_the_job_annotations() {
    sp_block_on_the_volcano_job_and_the_job_annotations(Way::Extender).await;
}

#[tokio::test]
async fn plugin_sp_block_on_the_volcano_job_and_the_job_annotations() {
    sp_block_on_the_volcano_job_and_the_job_annotations(Way::Plugin).await;
}

async fn sp_block_on_the_volcano_job_and_the_job_annotations(way: Way) {
    let (cluster, jobs, pods) = volcano_with_extension(
        &super_pods_with_ids(["1", "2"]),
        way,
        &["--super-pod-size=4"],
    )
    .await;
    let mut job = plain_job("train", 3);
    job.metadata.annotations = Some(BTreeMap::from([
        ("sp-block".to_string(), "16".to_string()),
        ("sp-fit".to_string(), "idlest".to_string()),
    ]));
    job.data["spec"]["tasks"][0]["template"]["metadata"]["annotations"] =
        json!({"hccl/rankIndex": "garbled"});
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let names = pod_names("train", 3);
    let placed = all_placed(&cluster, &pods, &names).await;
    let mut blocks: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
    for (pod, (node, _)) in &placed {
        let p = pods.get(pod).await.unwrap();
        assert!(
            !p.annotations().contains_key("sp-block"),
            "{pod}: sp-block came from the pod, not the Job"
        );
        let rank = rank(&pods, pod).await;
        let a = p.annotations();
        let expected_rank = if pod == "train-master-0" {
            "garbled".to_string()
        } else {
            rank.to_string()
        };
        assert_job_annotations(pod, node, a, &expected_rank, rank / 2);
        blocks
            .entry(rank / 2)
            .or_default()
            .insert(numeric_super_pod_of(node));
    }
    assert_eq!(
        blocks,
        BTreeMap::from([(0, BTreeSet::from(["1"])), (1, BTreeSet::from(["2"]))]),
        "each block whole in one super-pod, the second in the idlest: {placed:?}"
    );
    check_scheduler_log(&cluster, way);
}

/// With `--whole-job-super-pod`, a Volcano Job of 4 pods x 8 NPUs without `sp-block` anywhere
/// is one logical super-pod (Huawei's default): all its pods land in one super-pod and carry
/// `super-pod-rank: "0"` and that super-pod's id (without the flag they would carry neither:
/// no group, no super-pod keys).
#[tokio::test]
async fn extender_whole_job_super_pod_places_an_unannotated_job_in_one_super_pod() {
    whole_job_super_pod_places_an_unannotated_job_in_one_super_pod(Way::Extender).await;
}

#[tokio::test]
async fn plugin_whole_job_super_pod_places_an_unannotated_job_in_one_super_pod() {
    whole_job_super_pod_places_an_unannotated_job_in_one_super_pod(Way::Plugin).await;
}

async fn whole_job_super_pod_places_an_unannotated_job_in_one_super_pod(way: Way) {
    let (cluster, jobs, pods) = volcano_with_extension(
        &super_pods_with_ids(["1", "2"]),
        way,
        &["--super-pod-size=4", "--whole-job-super-pod"],
    )
    .await;
    jobs.create(&PostParams::default(), &plain_job("whole", 3))
        .await
        .unwrap();
    let names = pod_names("whole", 3);
    let placed = all_placed(&cluster, &pods, &names).await;
    let mut ids = BTreeSet::new();
    for (pod, (node, _)) in &placed {
        let a = pods.get(pod).await.unwrap().annotations().clone();
        let rank = rank(&pods, pod).await;
        assert_job_annotations(pod, node, &a, &rank.to_string(), 0);
        ids.insert(numeric_super_pod_of(node));
    }
    assert_eq!(ids.len(), 1, "the whole job in one super-pod: {placed:?}");
    check_scheduler_log(&cluster, way);
}

/// An Ascend pod of 8 NPUs for kube-scheduler (no Volcano), with `annotations` and its rank
/// stated in `RANK` (as the pytorch plugin and Kubeflow's training-operator do).
fn npu_pod(name: &str, rank: u32, annotations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations,
            "labels": {"ring-controller.atlas": "ascend-910"}},
        "spec": {"containers": [{
            "name": "train", "image": "example.invalid/mindspore",
            "env": [{"name": "RANK", "value": rank.to_string()}],
            "resources": {"requests": {"cpu": "1"}, "limits": {NPU: "8"}}
        }]}
    }))
    .unwrap()
}

/// Pods `{job}-0..3` (`RANK` = the name's ordinal, 8 NPUs each) of an `sp-block: 16` job, all
/// placed: each carries `hccl/rankIndex` = its rank, `super-pod-rank` = its block (rank / 2),
/// `super-pod-id` = its node's super-pod, and `huawei.com/Ascend910` naming the NPUs of
/// `fumarole.dev/devices`; each block lies whole in one super-pod. Returns block -> super-pods.
async fn check_job_annotations(
    pods: &Api<Pod>,
    placed: &BTreeMap<String, (String, Vec<String>)>,
) -> BTreeMap<u32, BTreeSet<&'static str>> {
    let mut blocks: BTreeMap<u32, BTreeSet<&'static str>> = BTreeMap::new();
    for (pod, (node, devices)) in placed {
        let rank: u32 = pod.rsplit('-').next().unwrap().parse().unwrap();
        let p = pods.get(pod).await.unwrap();
        let a = p.annotations();
        assert_job_annotations(pod, node, a, &rank.to_string(), rank / 2);
        let huawei: BTreeSet<&str> = a
            .get(NPU)
            .unwrap_or_else(|| panic!("{pod}: no {NPU}: {a:?}"))
            .split(',')
            .collect();
        let ours: BTreeSet<&str> = devices.iter().map(String::as_str).collect();
        assert_eq!(huawei, ours, "{pod}: {a:?}");
        blocks
            .entry(rank / 2)
            .or_default()
            .insert(numeric_super_pod_of(node));
    }
    for (block, sps) in &blocks {
        assert_eq!(sps.len(), 1, "block {block} spans {sps:?}: {placed:?}");
    }
    blocks
}

/// Creates pods `{job}-0..3` ([`npu_pod`], `annotations` on each), then starts kube-scheduler
/// with the extension (on `port`) as its extender for [`NPU`], waits until all are placed and
/// checks them as an `sp-block: 16` job in two blocks ([`check_job_annotations`]). Returns
/// the pod names.
/// How kube-scheduler reaches fumarole.
#[derive(Clone, Copy)]
enum KubeWay {
    /// Upstream's kube-scheduler with the extension on this port as its binding extender.
    Extender(u16),
    /// `kube-scheduler-fumarole` (the framework plugin) with `superPodSize: 4`.
    Plugin,
}

async fn kube_scheduler_job(
    cluster: &TestCluster,
    way: KubeWay,
    job: &str,
    annotations: serde_json::Value,
) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let names: Vec<String> = (0..4).map(|i| format!("{job}-{i}")).collect();
    for (rank, n) in (0..).zip(&names) {
        let pod = npu_pod(n, rank, annotations.clone());
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    // The extension learns a job's group from the pods its view holds (a PodGroup through the
    // pods naming it): kube-scheduler starts once the view has rebuilt with all four, at the
    // latest one tick later, as Volcano's gang wait would give it.
    tokio::time::sleep(scheduler_ext::live::TICK * 2).await;
    let scheduler = match way {
        KubeWay::Extender(port) => {
            cluster
                .start_kube_scheduler(&fumarole_e2e::fumarole::kube_scheduler_config(port, &[NPU]))
                .await
                .unwrap();
            "kube-scheduler"
        }
        KubeWay::Plugin => {
            fumarole_e2e::fumarole::start_kube_plugin(cluster, "{superPodSize: 4}")
                .await
                .unwrap();
            KUBE_PLUGIN
        }
    };
    let placed = all_placed_by(cluster, scheduler, &pods, &names).await;
    let blocks = check_job_annotations(&pods, &placed).await;
    assert_eq!(blocks.len(), 2, "{placed:?}");
    names
}

/// The real kube-scheduler with the extension as its binding extender, no Volcano: 4 pods of
/// 8 NPUs (`hccl-0`..`hccl-3`, `RANK` 0..3) with `sp-block: 16` land block by
/// block, each block in one super-pod, and each pod carries `huawei.com/Ascend910`,
/// `hccl/rankIndex`, `super-pod-rank` and `super-pod-id`. The API server's audit log holds,
/// per pod, its creation, the extension's patch of the job annotations and then its `Binding`
/// (201, not from kube-scheduler's own binder) and no other write: the job annotations are on
/// the pod before it is bound (a Binding may carry only the device choice: the API server
/// copies its annotations over the pod's), the device choice comes with the Binding.
#[tokio::test]
async fn kube_scheduler_binds_after_writing_the_job_annotations() {
    binds_after_writing_the_job_annotations(false).await;
}

/// The same through kube-scheduler-fumarole: the plugin's core patches the job annotations and
/// creates the Binding from inside the scheduler's process, with its own client (not
/// kube-scheduler's binder).
#[tokio::test]
async fn kube_plugin_binds_after_writing_the_job_annotations() {
    binds_after_writing_the_job_annotations(true).await;
}

async fn binds_after_writing_the_job_annotations(plugin: bool) {
    let cluster = common::cluster().await;
    publish(&cluster, &super_pods_with_ids(["1", "2"])).await;
    let way = if plugin {
        KubeWay::Plugin
    } else {
        let port = cluster
            .start_scheduler_ext(&["--super-pod-size=4"])
            .await
            .unwrap();
        KubeWay::Extender(port)
    };
    let names = kube_scheduler_job(&cluster, way, "hccl", json!({"sp-block": "16"})).await;

    let audit = cluster.audited_writes().unwrap();
    for n in &names {
        let writes: Vec<&serde_json::Value> = audit
            .iter()
            .filter(|e| {
                e["objectRef"]["resource"] == "pods"
                    && e["objectRef"]["namespace"] == "default"
                    && e["objectRef"]["name"] == n.as_str()
            })
            .collect();
        let kinds: Vec<(&str, &str)> = writes
            .iter()
            .map(|e| {
                (
                    e["verb"].as_str().unwrap_or(""),
                    e["objectRef"]["subresource"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [("create", ""), ("patch", ""), ("create", "binding")],
            "{n}: {writes:#?}"
        );
        let binding = writes[2];
        assert_eq!(binding["responseStatus"]["code"], 201, "{binding:#}");
        let agent = binding["userAgent"].as_str().unwrap_or("");
        assert!(
            !agent.starts_with("kube-scheduler"),
            "{n}: bound by kube-scheduler's own binder: {binding:#}"
        );
    }
}

/// The extension starts on an API server without Volcano's CRDs (it says PodGroups are not
/// served), then the PodGroup CRD is installed and a PodGroup `train` with `sp-block: 16`
/// created: the extension's probe finds it (within its first 30 s wait) and starts the watch,
/// without a restart (it logs when the watch has listed). Pods `train-0..3` naming the
/// PodGroup (`scheduling.k8s.io/group-name`), with no `sp-block` of their own, are then placed
/// by kube-scheduler as an `sp-block` job: blocks whole in one super-pod, `super-pod-rank` and
/// `super-pod-id` on every pod (without the PodGroup they would be in no group and carry
/// neither).
#[tokio::test]
async fn pod_group_crd_installed_after_start_is_watched() {
    let cluster = TestCluster::start().await.unwrap();
    cluster
        .install_crd_file(&fumarole_e2e::fumarole::device_topology_crd())
        .await
        .unwrap();
    publish(&cluster, &super_pods_with_ids(["1", "2"])).await;
    let port = cluster
        .start_scheduler_ext(&["--super-pod-size=4"])
        .await
        .unwrap();
    let log = cluster.log_tail("fumarole-scheduler-ext", 200).unwrap();
    assert!(
        log.contains("podgroups.scheduling.volcano.sh is not served"),
        "{log}"
    );

    let crd = fumarole_e2e::Upstream::get()
        .unwrap()
        .volcano_crds()
        .join("scheduling.volcano.sh_podgroups.yaml");
    cluster.install_crd_file(&crd).await.unwrap();
    create_pod_group(&cluster, "train", &[("sp-block", "16")]).await;
    let installed = std::time::Instant::now();
    eventually(
        "the extension to watch PodGroups",
        Duration::from_secs(90),
        || async {
            let log = cluster.log_tail("fumarole-scheduler-ext", 200)?;
            Ok(log.contains("PodGroups listed").then_some(()))
        },
    )
    .await
    .unwrap();
    eprintln!(
        "PodGroups listed by the extension {:?} after the CRD was installed",
        installed.elapsed()
    );

    let group = json!({"scheduling.k8s.io/group-name": "train"});
    kube_scheduler_job(&cluster, KubeWay::Extender(port), "train", group).await;
}

/// Creates PodGroup `name` in `default` (4 members, queue `default`) with `annotations`;
/// returns the PodGroups of `default`.
async fn create_pod_group(
    cluster: &TestCluster,
    name: &str,
    annotations: &[(&str, &str)],
) -> Api<DynamicObject> {
    let resource = scheduler_ext::live::pod_group_resource();
    let groups: Api<DynamicObject> = Api::namespaced_with(cluster.client(), "default", &resource);
    let mut group = DynamicObject::new(name, &resource).within("default");
    if !annotations.is_empty() {
        group.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    group.data = json!({"spec": {"minMember": 4, "queue": "default"}});
    groups.create(&PostParams::default(), &group).await.unwrap();
    groups
}

/// How many views the extension on `port` has built in full (its
/// `fumarole_scheduler_ext_view_builds_total{how="full"}`).
async fn full_builds(port: u16) -> u64 {
    let text = fumarole_e2e::cluster::http_get(port, "/metrics")
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("fumarole_scheduler_ext_view_builds_total{how=\"full\"} "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Volcano updates a PodGroup's status many times per job; only its `sp-block` / `sp-fit`
/// count for the view. Twenty status updates and an unrelated annotation build no view in
/// full (each used to: a full build costs a fifth of a second at 5,000 nodes); giving the
/// group an `sp-block` then does (the watch saw the events, the test does not pass by a dead
/// watch).
#[tokio::test]
async fn a_pod_groups_status_updates_build_no_view_in_full() {
    let cluster = common::cluster().await;
    publish(&cluster, &super_pods()).await;
    let port = cluster
        .start_scheduler_ext(&["--super-pod-size=4"])
        .await
        .unwrap();
    let groups = create_pod_group(&cluster, "steady", &[]).await;
    // The creation's own round is over once the count holds for a second (30 s at most).
    let mut before = full_builds(port).await;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = full_builds(port).await;
        if now == before {
            break;
        }
        before = now;
    }
    let patch = |body: serde_json::Value| {
        let groups = groups.clone();
        async move {
            groups
                .patch("steady", &PatchParams::default(), &Patch::Merge(body))
                .await
                .unwrap();
            // Apart, so the extension's 50 ms debounce cannot merge them into one round.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    for running in 0..20 {
        patch(json!({"status": {"phase": "Running", "running": running}})).await;
    }
    patch(json!({"metadata": {"annotations": {"note": "not ours"}}})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        full_builds(port).await,
        before,
        "a PodGroup's status and other annotations built the view in full"
    );
    patch(json!({"metadata": {"annotations": {"sp-block": "16"}}})).await;
    eventually(
        "a full build after sp-block was set",
        Duration::from_secs(30),
        || async { Ok((full_builds(port).await > before).then_some(())) },
    )
    .await
    .unwrap();
}
