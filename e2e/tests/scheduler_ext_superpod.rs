//! Huawei's super-pod jobs through real Volcano (v1.10, with fumarole-scheduler-ext as its
//! extender): Ascend nodes (`huawei.com/Ascend910`, Atlas 800 topology) in two physical
//! super-pods, an `sp-block` job placed block by block, `--reserve-nodes` kept while another
//! super-pod can take a block, and a bad `sp-block` refused with our reason; `sp-block` given
//! on the Volcano Job only (Volcano copies it to the PodGroup), and the annotations the
//! training job reads (`hccl/rankIndex`, `super-pod-rank`, `super-pod-id`) on every pod.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fumarole_e2e::cluster::eventually;
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

/// Waits for every pod of `names` to be bound with our device annotation.
async fn all_placed(
    cluster: &TestCluster,
    pods: &Api<Pod>,
    names: &[String],
) -> BTreeMap<String, (String, Vec<String>)> {
    let placed = eventually(
        "all pods bound and annotated",
        Duration::from_secs(150),
        || {
            let pods = pods.clone();
            let names = names.to_vec();
            async move {
                let placed = common::placements(&pods, &names).await;
                Ok((placed.len() == names.len()).then_some(placed))
            }
        },
    )
    .await;
    match placed {
        Ok(p) => p,
        Err(e) => panic!(
            "{e}\npods: {:?}\nscheduler-ext:\n{}\nvc-scheduler:\n{}",
            common::pod_states(pods).await,
            cluster.log_tail("fumarole-scheduler-ext", 80).unwrap(),
            cluster.log_tail("vc-scheduler", 80).unwrap()
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

/// A cluster of `topologies` with the extension (`args`) as Volcano's extender; the Volcano Job
/// and Pod APIs of namespace `default`.
async fn volcano_with_extension(
    topologies: &[DeviceTopology],
    args: &[&str],
) -> (TestCluster, Api<DynamicObject>, Api<Pod>) {
    let cluster = common::cluster().await;
    publish(&cluster, topologies).await;
    let port = cluster.start_scheduler_ext(args).await.unwrap();
    cluster
        .start_volcano(&fumarole_e2e::fumarole::volcano_conf_with_extender(port))
        .await
        .unwrap();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "batch.volcano.sh",
        "v1alpha1",
        "Job",
    ));
    let jobs = Api::namespaced_with(cluster.client(), "default", &ar);
    let pods = Api::namespaced(cluster.client(), "default");
    (cluster, jobs, pods)
}

/// With `--reserve-nodes 2`: a job of 4 pods x 8 NPUs in `sp-block: 16` lands block by block,
/// each block whole in one super-pod. The first block takes sp-1 (equal room, first by name)
/// outside its reserve (n2, n3); sp-1 then has room for one more block only in its reserve, so
/// the second block goes to sp-2 (without the reserve best fit would put it on n2, n3). Then a
/// third job's block fits nowhere outside a reserve and takes one super-pod's two reserve
/// nodes, whole. A job with `sp-block: 12` (not a multiple of its pods' 8 NPUs) stays pending
/// with our reason.
#[tokio::test]
async fn sp_block_job_lands_block_by_block_and_keeps_the_reserve() {
    let (cluster, jobs, pods) =
        volcano_with_extension(&super_pods(), &["--reserve-nodes=2", "--super-pod-size=4"]).await;
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
    let log = cluster.log_tail("vc-scheduler", 4000).unwrap();
    for failure in ["Predicate failed", "Prioritize failed"] {
        assert!(
            !log.contains(failure),
            "{failure} in vc-scheduler log:\n{log}"
        );
    }
}

/// `sp-block: "16"` and `sp-fit: idlest` given on the Volcano Job only (Volcano copies them to
/// the PodGroup, not to the pods): the job of 4 pods x 8 NPUs lands block by block, each block
/// in one super-pod, and `sp-fit: idlest` sends the second block to the other, idle super-pod
/// (best fit would keep it beside the first). Every pod carries `hccl/rankIndex` (its RANK),
/// `super-pod-rank` (its block) and `super-pod-id` (its node's super-node id); the master's
/// template presets a garbled `hccl/rankIndex`, which stays.
#[tokio::test]
async fn sp_block_on_the_volcano_job_and_the_job_annotations() {
    let (cluster, jobs, pods) =
        volcano_with_extension(&super_pods_with_ids(["1", "2"]), &["--super-pod-size=4"]).await;
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
    let id_of = |node: &str| match super_pod_of(node) {
        "sp-1" => "1",
        "sp-2" => "2",
        other => panic!("{node} is in no super-pod ({other})"),
    };
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
        assert_eq!(
            a.get("hccl/rankIndex"),
            Some(&expected_rank),
            "{pod}: {a:?}"
        );
        assert_eq!(
            a.get("super-pod-rank"),
            Some(&(rank / 2).to_string()),
            "{pod}: {a:?}"
        );
        assert_eq!(
            a.get("super-pod-id").map(String::as_str),
            Some(id_of(node)),
            "{pod} on {node}: {a:?}"
        );
        blocks.entry(rank / 2).or_default().insert(id_of(node));
    }
    assert_eq!(
        blocks,
        BTreeMap::from([(0, BTreeSet::from(["1"])), (1, BTreeSet::from(["2"]))]),
        "each block whole in one super-pod, the second in the idlest: {placed:?}"
    );
}

/// With `--whole-job-super-pod`, a Volcano Job of 4 pods x 8 NPUs without `sp-block` anywhere
/// is one logical super-pod (Huawei's default): all its pods land in one super-pod and carry
/// `super-pod-rank: "0"` and that super-pod's id (without the flag they would carry neither:
/// no group, no super-pod keys).
#[tokio::test]
async fn whole_job_super_pod_places_an_unannotated_job_in_one_super_pod() {
    let (cluster, jobs, pods) = volcano_with_extension(
        &super_pods_with_ids(["1", "2"]),
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
        assert_eq!(
            a.get("hccl/rankIndex"),
            Some(&rank.to_string()),
            "{pod}: {a:?}"
        );
        assert_eq!(
            a.get("super-pod-rank").map(String::as_str),
            Some("0"),
            "{pod}: {a:?}"
        );
        let id = a.get("super-pod-id").cloned().unwrap_or_default();
        let expected = if super_pod_of(node) == "sp-1" {
            "1"
        } else {
            "2"
        };
        assert_eq!(id, expected, "{pod} on {node}: {a:?}");
        ids.insert(id);
    }
    assert_eq!(ids.len(), 1, "the whole job in one super-pod: {placed:?}");
}
