//! A real NodeResourceTopology consumer reads what the agent publishes: kube-scheduler v1.34.7
//! with scheduler-plugins v0.34.7's `NodeResourceTopologyMatch` (filter and score), built from
//! Go modules as `nrt-scheduler`, against two `cpu-only` fixture nodes whose agents read the
//! kubelet's real PodResources server (`kubelet-dm`) and the memory manager's reservation
//! (`reservedMemory` in the kubelet configuration, or the agent's `--reserved-memory`). Node B's pods hold most of each NUMA zone's memory, so a
//! Guaranteed pod that fits one zone of node A lands there, not on B (which still fits at node
//! level); a pod no single zone can hold stays Pending with the plugin's reason; when B's pods
//! go, B's zones free up and a pod only B's zones can now hold lands on B. The
//! `nodeTopologyPodsFingerprint` the agents publish is the one podfingerprint (the Go library
//! the plugin and node-feature-discovery use) computes for the same pods.
//!
//! `overreserve_cache_resyncs_on_the_agents_fingerprint`: with the plugin's reserve cache
//! (`cacheResyncPeriodSeconds`), the scheduler takes a node's new NRT only when its fingerprint
//! matches the pods the scheduler sees running there; the agent's fingerprint is compared
//! (mismatch while PodResources lists a pod the API does not have) and then accepted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port};
use fumarole_e2e::fumarole::{fixture_root, node_resource_topologies};
use fumarole_e2e::{AgentBuilder, KubeletDm, NodeSpec, TestCluster, Upstream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

const GI: u64 = 1 << 30;
/// `cpu-only`: 2 NUMA nodes of 32 CPUs and 128 GiB each.
const ZONE_BYTES: u64 = 128 * GI;

/// The memory manager's static policy with 1 GiB kept on each NUMA node (and the node-level
/// reservation the kubelet requires it to add up to).
const KUBELET_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\nmemoryManagerPolicy: Static\ntopologyManagerPolicy: single-numa-node\ntopologyManagerScope: container\nkubeReserved: {cpu: \"1\", memory: 2Gi}\nreservedMemory:\n- numaNode: 0\n  limits: {memory: 1Gi}\n- numaNode: 1\n  limits: {memory: 1Gi}\n";

const SCHEDULER: &str = "fumarole-nrt";
/// The same profile with the reserve ("overreserve") cache, resynced every second by
/// fingerprint over all pods.
const SCHEDULER_CACHE_CONFIG: &str = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: fumarole-nrt\n  plugins:\n    filter:\n      enabled: [{name: NodeResourceTopologyMatch}]\n    reserve:\n      enabled: [{name: NodeResourceTopologyMatch}]\n    score:\n      enabled: [{name: NodeResourceTopologyMatch}]\n  pluginConfig:\n  - name: NodeResourceTopologyMatch\n    args:\n      cacheResyncPeriodSeconds: 1\n      cache: {resyncMethod: All, foreignPodsDetect: None, informerMode: Shared}\n";
const SCHEDULER_CONFIG: &str = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: fumarole-nrt\n  plugins:\n    filter:\n      enabled: [{name: NodeResourceTopologyMatch}]\n    score:\n      enabled: [{name: NodeResourceTopologyMatch}]\n";

/// One fixture node: its fixture root, the kubelet-dm serving its PodResources, its agent.
struct TopoNode {
    name: &'static str,
    kdm: KubeletDm,
    _dir: tempfile::TempDir,
}

/// A container holding `gib` GiB of memory pinned to NUMA node `numa`.
fn holder(namespace: &str, name: &str, uid: u32, numa: u32, gib: u64) -> Value {
    json!({
        "name": name, "namespace": namespace,
        "uid": format!("6f1c8e2a-0000-4000-8000-{uid:012}"),
        "containers": [{"name": "main", "memory": [
            {"memory_type": "memory", "size": gib * GI, "topology": {"nodes": [{"ID": numa}]}}
        ]}]
    })
}

/// Starts node `name` (Node object, fixture root with `hugepages_1gi` 1 GiB pages per NUMA
/// node, kubelet-dm with `pods`, the agent with `extra` flags).
async fn start_node(
    cluster: &TestCluster,
    name: &'static str,
    hugepages_1gi: u32,
    pods: Value,
    extra: &[&str],
) -> TopoNode {
    cluster
        .create_node(
            &NodeSpec::new(name)
                .capacity("cpu", "64")
                .capacity("memory", "256Gi"),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root("cpu-only", dir.path()).unwrap();
    for n in 0..2 {
        let node = root.join(format!("sys/devices/system/node/node{n}/hugepages"));
        for (size, count) in [
            ("hugepages-1048576kB", hugepages_1gi),
            ("hugepages-2048kB", 0),
        ] {
            std::fs::create_dir_all(node.join(size)).unwrap();
            std::fs::write(node.join(size).join("nr_hugepages"), format!("{count}\n")).unwrap();
        }
    }
    let kdm = cluster
        .start_kubelet_dm_with_pod_resources(
            &dir.path().join("device-plugins"),
            &dir.path().join("pod-resources/kubelet.sock"),
        )
        .await
        .unwrap();
    kdm.set_pod_resources(json!({ "pods": pods }))
        .await
        .unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, KUBELET_CONFIG).unwrap();
    let socket = kdm.pod_resources_socket().unwrap().to_path_buf();
    AgentBuilder::root(&root)
        .process(&format!("fumarole-agent-{name}"))
        .node(name)
        .kubelet_config(&config)
        .cpu_manager_state(&dir.path().join("cpu_manager_state"))
        .pod_resources_socket(&socket)
        .flag("--recheck-interval", "1s")
        .metrics_on_port(free_port().unwrap())
        .args(extra)
        .env("FUMAROLE_LOG", "info")
        .start_in(cluster)
        .unwrap();
    TopoNode {
        name,
        kdm,
        _dir: dir,
    }
}

/// (capacity, allocatable, available) of `resource` in zone `zone` of an NRT object.
fn amounts(nrt: &Value, zone: &str, resource: &str) -> Option<(u64, u64, u64)> {
    let z = nrt["zones"]
        .as_array()?
        .iter()
        .find(|z| z["name"] == zone)?;
    let r = z["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == resource)?;
    let q = |k: &str| r[k].as_str()?.parse::<u64>().ok();
    Some((q("capacity")?, q("allocatable")?, q("available")?))
}

fn attribute(nrt: &Value, name: &str) -> Option<String> {
    nrt["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == name)?["value"]
        .as_str()
        .map(str::to_string)
}

/// `node`'s NodeResourceTopology once `ready` holds for it.
async fn wait_nrt(
    cluster: &TestCluster,
    node: &str,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let api: Api<DynamicObject> = node_resource_topologies(cluster.client());
    let last = std::sync::Mutex::new(Value::Null);
    let r = eventually(what, Duration::from_secs(60), || {
        let api = api.clone();
        let ready = &ready;
        let last = &last;
        async move {
            let o = api.get_opt(node).await?;
            let data = o.map(|o| o.data).unwrap_or_default();
            *last.lock().unwrap() = data.clone();
            Ok(ready(&data).then_some(data))
        }
    })
    .await;
    match r {
        Ok(v) => v,
        Err(e) => panic!(
            "{e:#}\nlast seen: {:#}\nagent log:\n{}",
            last.lock().unwrap(),
            cluster
                .log_tail(&format!("fumarole-agent-{node}"), 30)
                .unwrap_or_default()
        ),
    }
}

/// podfingerprint's signature (the Go library, `bin/pod-fingerprint`) of `pods`.
fn go_fingerprint(pods: &[(&str, &str)]) -> String {
    let bin: PathBuf = Upstream::get().unwrap().bin("pod-fingerprint");
    let mut child = std::process::Command::new(&bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    {
        let mut stdin = child.stdin.take().unwrap();
        for (ns, name) in pods {
            writeln!(stdin, "{ns}/{name}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A Guaranteed pod for the NRT-aware profile asking for 4 CPUs and `gib` GiB.
fn guaranteed(name: &str, gib: u64) -> Pod {
    let res = json!({"cpu": "4", "memory": format!("{gib}Gi")});
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"schedulerName": SCHEDULER, "containers": [{
            "name": "c", "image": "example.invalid/none",
            "resources": {"requests": res, "limits": res}
        }]}
    }))
    .unwrap()
}

async fn bound_node(cluster: &TestCluster, pods: &Api<Pod>, name: &str) -> String {
    let r = eventually(
        &format!("{name} to be bound"),
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move { Ok(pods.get(name).await?.spec.and_then(|s| s.node_name)) }
        },
    )
    .await;
    r.unwrap_or_else(|e| {
        panic!(
            "{e:#}\nnrt-scheduler log:\n{}",
            cluster.log_tail("nrt-scheduler", 40).unwrap_or_default()
        )
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn node_resource_topology_match_places_by_the_agents_zones() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster.install_nrt_crd().await.unwrap();

    // Node A: a small database pod holds 4 GiB on NUMA node 0; 4 x 1 GiB huge pages per node.
    let a_pods = json!([holder("prod", "db-0", 1, 0, 4), {
        "name": "web", "namespace": "prod", "uid": "6f1c8e2a-0000-4000-8000-000000000002",
        "containers": [{"name": "main"}]
    }]);
    let a = start_node(&cluster, "node-a", 4, a_pods, &[]).await;
    // Node B: two pods hold 100 GiB of each NUMA node; no huge pages; its kubelet keeps 3 GiB
    // per NUMA node by flag (the agent's `--reserved-memory` replaces the file's 1 GiB).
    let b_pods = json!([
        holder("batch", "hog-0", 3, 0, 100),
        holder("batch", "hog-1", 4, 1, 100)
    ]);
    let b = start_node(
        &cluster,
        "node-b",
        0,
        b_pods,
        &[
            "--reserved-memory",
            "0:memory=3Gi",
            "--reserved-memory",
            "1:memory=3Gi",
        ],
    )
    .await;
    let list = b.kdm.pod_resources().await.unwrap();
    assert_eq!(
        list["list"]["pod_resources"][0]["containers"][0]["memory"][0]["size"],
        100 * GI,
        "the kubelet's List reports the memory blocks: {list:#}"
    );

    // What the agents publish: the memory manager's arithmetic per zone.
    let nrt_a = wait_nrt(&cluster, a.name, "node-a NRT with db-0's memory", |o| {
        amounts(o, "node-0", "memory").is_some_and(|m| m.2 < m.1)
    })
    .await;
    // MemTotal 128Gi; minus 4Gi of huge pages and 1Gi reservedMemory; db-0 holds 4Gi.
    assert_eq!(
        amounts(&nrt_a, "node-0", "memory"),
        Some((ZONE_BYTES, 123 * GI, 119 * GI)),
        "{nrt_a:#}"
    );
    assert_eq!(
        amounts(&nrt_a, "node-1", "memory"),
        Some((ZONE_BYTES, 123 * GI, 123 * GI))
    );
    assert_eq!(
        amounts(&nrt_a, "node-0", "hugepages-1Gi"),
        Some((4 * GI, 4 * GI, 4 * GI))
    );
    assert_eq!(amounts(&nrt_a, "node-1", "hugepages-2Mi"), Some((0, 0, 0)));
    assert_eq!(amounts(&nrt_a, "node-0", "cpu"), Some((32, 32, 32)));
    assert_eq!(
        attribute(&nrt_a, "topologyManagerPolicy").as_deref(),
        Some("single-numa-node")
    );
    assert_eq!(
        attribute(&nrt_a, "topologyManagerScope").as_deref(),
        Some("container")
    );
    // The fingerprint is podfingerprint's for the pods PodResources lists.
    assert_eq!(
        attribute(&nrt_a, "nodeTopologyPodsFingerprint"),
        Some(go_fingerprint(&[("prod", "db-0"), ("prod", "web")]))
    );
    let nrt_b = wait_nrt(&cluster, b.name, "node-b NRT with the hogs' memory", |o| {
        amounts(o, "node-1", "memory").is_some_and(|m| m.2 == 25 * GI)
    })
    .await;
    assert_eq!(
        amounts(&nrt_b, "node-0", "memory"),
        Some((ZONE_BYTES, 125 * GI, 25 * GI))
    );
    assert_eq!(amounts(&nrt_b, "node-0", "hugepages-1Gi"), Some((0, 0, 0)));
    assert_eq!(
        attribute(&nrt_b, "nodeTopologyPodsFingerprint"),
        Some(go_fingerprint(&[("batch", "hog-1"), ("batch", "hog-0")]))
    );

    cluster
        .start_scheduler_binary("nrt-scheduler", SCHEDULER_CONFIG, &[])
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");

    // 64 GiB fits node-0 or node-1 of A, no zone of B (25 GiB free each); B's node-level
    // allocatable (256 GiB, nothing bound) would take it, so only the NRT filter keeps it off B.
    pods.create(&PostParams::default(), &guaranteed("fits-a-zone", 64))
        .await
        .unwrap();
    assert_eq!(bound_node(&cluster, &pods, "fits-a-zone").await, "node-a");

    // 150 GiB fits both nodes' allocatable (A: 192 GiB left) but no single zone anywhere.
    pods.create(&PostParams::default(), &guaranteed("fits-no-zone", 150))
        .await
        .unwrap();
    let message = eventually(
        "fits-no-zone to be marked unschedulable",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("fits-no-zone").await?;
                assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.clone()), None);
                let cond = p
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False");
                Ok(cond.and_then(|c| {
                    (c.reason.as_deref() == Some("Unschedulable"))
                        .then(|| c.message.unwrap_or_default())
                }))
            }
        },
    )
    .await
    .unwrap();
    assert!(
        message.contains("2 cannot align container"),
        "the plugin rejected both nodes: {message}"
    );

    // B's pods go: its zones free up (125 GiB each), A's stay as its kubelet reports
    // (119 / 123 GiB). 125 GiB now fits a zone of B only.
    b.kdm.set_pod_resources(json!({"pods": []})).await.unwrap();
    let nrt_b = wait_nrt(&cluster, b.name, "node-b NRT with the hogs gone", |o| {
        amounts(o, "node-0", "memory").is_some_and(|m| m.2 == 125 * GI)
    })
    .await;
    assert_eq!(
        attribute(&nrt_b, "nodeTopologyPodsFingerprint"),
        None,
        "no pods, no fingerprint (as node-feature-discovery): {nrt_b:#}"
    );
    pods.create(&PostParams::default(), &guaranteed("fits-b-zone", 125))
        .await
        .unwrap();
    assert_eq!(bound_node(&cluster, &pods, "fits-b-zone").await, "node-b");
    // Still nowhere for 150 GiB.
    let p = pods.get("fits-no-zone").await.unwrap();
    assert_eq!(p.spec.and_then(|s| s.node_name), None);
}

/// Marks `name` Running, as its kubelet would (the cache's shared informer counts only
/// Running pods in a node's pod set).
async fn mark_running(pods: &Api<Pod>, name: &str) {
    pods.patch_status(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
}

/// Waits for a line of the scheduler's log containing every one of `parts`.
async fn scheduler_logged(cluster: &TestCluster, what: &str, parts: &[&str]) {
    let r = eventually(what, Duration::from_secs(60), || async move {
        let log = cluster.log_tail("nrt-scheduler", 100_000)?;
        Ok(log
            .lines()
            .any(|l| parts.iter().all(|p| l.contains(p)))
            .then_some(()))
    })
    .await;
    if let Err(e) = r {
        panic!(
            "{e:#}\nnrt-scheduler log:\n{}",
            cluster.log_tail("nrt-scheduler", 60).unwrap_or_default()
        );
    }
}

fn pod_resources(pods: &[(&str, Option<u32>)]) -> Value {
    let list: Vec<Value> = pods
        .iter()
        .enumerate()
        .map(|(i, (name, numa))| match numa {
            Some(n) => holder("default", name, 10 + i as u32, *n, 100),
            None => json!({
                "name": name, "namespace": "default",
                "uid": format!("6f1c8e2a-0000-4000-8000-{:012}", 10 + i),
                "containers": [{"name": "c"}]
            }),
        })
        .collect();
    json!({ "pods": list })
}

#[tokio::test(flavor = "multi_thread")]
async fn overreserve_cache_resyncs_on_the_agents_fingerprint() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster.install_nrt_crd().await.unwrap();
    let a = start_node(&cluster, "node-a", 0, json!([]), &[]).await;
    let nrt = wait_nrt(&cluster, a.name, "node-a NRT, nothing held", |o| {
        amounts(o, "node-1", "memory").is_some_and(|m| m.2 == 127 * GI)
    })
    .await;
    assert_eq!(attribute(&nrt, "nodeTopologyPodsFingerprint"), None);
    cluster
        .start_scheduler_binary("nrt-scheduler", SCHEDULER_CACHE_CONFIG, &["--v=4"])
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");

    // p1 (100 GiB) lands; the cache reserves it on every zone (it cannot know which one the
    // kubelet picks): 27 GiB left in each until a resync.
    pods.create(&PostParams::default(), &guaranteed("p1", 100))
        .await
        .unwrap();
    assert_eq!(bound_node(&cluster, &pods, "p1").await, "node-a");
    mark_running(&pods, "p1").await;

    // The node reports p1 on NUMA node 0 and a pod the scheduler does not know ("ghost"). The
    // NRT says 127 GiB free in node-1, but its fingerprint does not match the scheduler's pod
    // set {p1}: the cache keeps its reserved view and p2 (100 GiB) waits, where the
    // passthrough cache of the test above would place it at once.
    a.kdm
        .set_pod_resources(pod_resources(&[("p1", Some(0)), ("ghost", None)]))
        .await
        .unwrap();
    let nrt = wait_nrt(&cluster, a.name, "node-a NRT with p1 and ghost", |o| {
        amounts(o, "node-0", "memory").is_some_and(|m| m.2 == 27 * GI)
    })
    .await;
    assert_eq!(
        amounts(&nrt, "node-1", "memory").map(|m| m.2),
        Some(127 * GI)
    );
    assert_eq!(
        attribute(&nrt, "nodeTopologyPodsFingerprint"),
        Some(go_fingerprint(&[("default", "p1"), ("default", "ghost")]))
    );
    pods.create(&PostParams::default(), &guaranteed("p2", 100))
        .await
        .unwrap();
    scheduler_logged(
        &cluster,
        "the scheduler to compare the fingerprint and find a mismatch",
        &["NodeTopology podset fingerprint mismatch", "node-a"],
    )
    .await;
    let p2 = pods.get("p2").await.unwrap();
    assert_eq!(p2.spec.and_then(|s| s.node_name), None);

    // The node's pod list is the scheduler's, {p1}: the resync accepts the NRT.
    a.kdm
        .set_pod_resources(pod_resources(&[("p1", Some(0))]))
        .await
        .unwrap();
    scheduler_logged(
        &cluster,
        "the scheduler to take node-a's NRT after a fingerprint match",
        &["overriding cached info", "resynced", "node-a"],
    )
    .await;
    // p2 is retried on the next cluster event the plugin registers for (the NRT update comes
    // first and may race the resync); a Node allocatable update, as a kubelet writes, makes
    // sure it is retried after the flush.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client());
    nodes
        .patch_status(
            "node-a",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"allocatable": {"pods": "111"}}})),
        )
        .await
        .unwrap();
    assert_eq!(bound_node(&cluster, &pods, "p2").await, "node-a");
}
