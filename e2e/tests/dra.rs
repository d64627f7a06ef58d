//! Dynamic Resource Allocation against the real API server (v1.37, `resource.k8s.io/v1`) and
//! the real kube-scheduler's DRA allocator: two Ascend nodes (fixture `atlas-800-910`, HCCS
//! groups 0-3 and 4-7) whose agents serve their NPUs through DRA (`servedBy: dra`).
//!
//! - Each agent publishes one ResourceSlice with its eight devices and their attributes, and
//!   writes nothing more while nothing changes (the API server's audit log).
//! - A device whose `/dev/davinciN` disappears gets a NoSchedule taint in the slice; the
//!   scheduler gives it to no claim, and the taint goes when the device is back.
//! - A claim for two NPUs with `matchAttribute: fumarole.dev/fabricGroup` lands on the only
//!   two untainted NPUs of one HCCS group, on the node where they are, while the other node
//!   has two untainted NPUs split across its groups.
//! - A claim whose `firstAvailable` first choice (four NPUs) fits nowhere gets its second.
//!
//! A second test puts fumarole's DRA kubelet plugin under the kubelet's own DRA manager and
//! plugin manager (a harness node): registration, prepare of a claim the real scheduler
//! allocated, CDI devices naming exactly the allocated NPUs, a plugin restart, unprepare.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use fumarole_e2e::cluster::eventually;
use fumarole_e2e::dra::{DraAgent, DraKubelet};
use fumarole_e2e::harness_node::HarnessNode;
use fumarole_e2e::standin::{ascend_chips, dcmi_standin, nvidia_root};
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const DRIVER: &str = "npu.fumarole.dev";
const GPU_DRIVER: &str = "gpu.fumarole.dev";

/// A fixture node whose devices of `vendor` the agent serves through DRA.
#[derive(Clone, Copy)]
struct Shape {
    fixture: &'static str,
    vendor: &'static str,
}

const ATLAS: Shape = Shape {
    fixture: "atlas-800-910",
    vendor: "huawei",
};

const METAX: Shape = Shape {
    fixture: "metax-c500-8",
    vendor: "metax",
};

/// Takes `/dev/davinciN` of `node` away (the device turns unhealthy) or puts it back.
fn set_present(node: &DraAgent, index: u32, present: bool) {
    let path = node.root.join(format!("dev/davinci{index}"));
    if present {
        std::fs::write(&path, "").unwrap();
    } else {
        std::fs::remove_file(&path).unwrap();
    }
}

async fn start_node(cluster: &TestCluster, name: &str) -> DraAgent {
    cluster
        .create_node(&NodeSpec::new(name).capacity("cpu", "192"))
        .await
        .unwrap();
    start_agent(cluster, ATLAS, name, None, "fumarole-agent")
}

/// An agent for node `name` of `shape`, its devices served through DRA with its plugin in
/// `kubelet`'s directories (else its own); started as process `process`.
fn start_agent(
    cluster: &TestCluster,
    shape: Shape,
    name: &str,
    kubelet: Option<&DraKubelet>,
    process: &str,
) -> DraAgent {
    cluster
        .start_dra_agent(shape.fixture, shape.vendor, name, kubelet, process)
        .unwrap()
}

/// The slice once `ready` holds for it.
async fn slice_when(
    slices: &Api<ResourceSlice>,
    name: &str,
    what: &str,
    ready: impl Fn(&ResourceSlice) -> bool,
) -> ResourceSlice {
    eventually(what, Duration::from_secs(60), || {
        let slices = slices.clone();
        let name = name.to_string();
        let ok = &ready;
        async move { Ok(slices.get_opt(&name).await?.filter(|s| ok(s))) }
    })
    .await
    .unwrap()
}

/// Names of the devices of `s` that carry a taint.
fn tainted(s: &ResourceSlice) -> Vec<String> {
    s.spec
        .devices
        .iter()
        .flatten()
        .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
        .map(|d| d.name.clone())
        .collect()
}

/// Writes to ResourceSlices in the audit log so far.
fn slice_writes(cluster: &TestCluster) -> usize {
    cluster
        .audited_writes()
        .unwrap()
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "resourceslices")
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .count()
}

/// A claim and a pod using it; returns the claim once allocated, and the pod's node.
async fn claim_and_pod(cluster: &TestCluster, name: &str, claim_spec: Value) -> (Value, String) {
    claim_and_pod_on(cluster, name, None, claim_spec).await
}

/// [`claim_and_pod`], the pod kept to node `on` when given (by its hostname label).
async fn claim_and_pod_on(
    cluster: &TestCluster,
    name: &str,
    on: Option<&str>,
    claim_spec: Value,
) -> (Value, String) {
    let client = cluster.client();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": claim_spec,
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let selector = on.map(|n| json!({"kubernetes.io/hostname": n}));
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector,
            "resourceClaims": [{"name": "npus", "resourceClaimName": name}],
            "containers": [{
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "npus"}]},
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let node = eventually(
        &format!("pod {name} bound"),
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                Ok(pods
                    .get(name)
                    .await?
                    .spec
                    .and_then(|s| s.node_name)
                    .filter(|n| !n.is_empty()))
            }
        },
    )
    .await
    .unwrap();
    let claim = serde_json::to_value(claims.get(name).await.unwrap()).unwrap();
    (claim, node)
}

/// `(request, device)` of each result of the claim's allocation (all of `DRIVER`).
fn allocated(claim: &Value) -> Vec<(String, String)> {
    allocated_of(claim, DRIVER)
}

/// `(request, device)` of each result of the claim's allocation, all of `driver`.
fn allocated_of(claim: &Value, driver: &str) -> Vec<(String, String)> {
    let results = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for r in &results {
        assert_eq!(r["driver"], driver, "{r}");
    }
    results
        .iter()
        .map(|r| {
            (
                r["request"].as_str().unwrap().to_string(),
                r["device"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A harness node `name` (the kubelet's own DRA and plugin managers), a CDI directory, and
/// the directories an agent's DRA plugin must use to be found by it.
async fn harness_node(
    cluster: &TestCluster,
    name: &str,
) -> (HarnessNode, tempfile::TempDir, DraKubelet) {
    let harness = cluster.start_harness_node(name).await.unwrap();
    let cdi_dir = tempfile::tempdir().unwrap();
    let dirs = DraKubelet {
        registry: harness.plugins_registry_dir().unwrap().to_path_buf(),
        plugins: harness
            .dra_plugin_dir(DRIVER)
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf(),
        cdi: cdi_dir.path().to_path_buf(),
    };
    (harness, cdi_dir, dirs)
}

async fn install_device_classes(cluster: &TestCluster) {
    cluster.install_dra_device_classes().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn slices_taints_and_the_real_scheduler_keep_claims_on_one_hccs_group() {
    let cluster = TestCluster::start().await.unwrap();
    install_device_classes(&cluster).await;
    cluster.start_kube_scheduler("").await.unwrap();
    let a = start_node(&cluster, "npu-a").await;
    let b = start_node(&cluster, "npu-b").await;
    let slices: Api<ResourceSlice> = Api::all(cluster.client());

    // Eight devices each, with the attributes placement needs.
    for node in [&a, &b] {
        let s = slice_when(&slices, &node.slice(), "slice with 8 NPUs", |s| {
            s.spec.devices.as_ref().is_some_and(|d| d.len() == 8)
        })
        .await;
        assert_eq!(s.spec.driver, DRIVER);
        assert_eq!(s.spec.node_name.as_deref(), Some(node.node.as_str()));
        assert_eq!(s.spec.pool.name, node.node);
        let devices = s.spec.devices.as_ref().unwrap();
        let attr = |i: usize, name: &str| devices[i].attributes.as_ref().unwrap()[name].clone();
        assert_eq!(devices[5].name, "huawei-5");
        assert_eq!(attr(5, "fumarole.dev/fabricGroup").int, Some(4));
        assert_eq!(attr(1, "fumarole.dev/fabricGroup").int, Some(0));
        assert_eq!(
            attr(5, "fumarole.dev/fabric").string.as_deref(),
            Some("hccs")
        );
        assert!(attr(5, "resource.kubernetes.io/pcieRoot").string.is_some());
        assert!(tainted(&s).is_empty());
        let owner = s.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owner[0].kind, "Node");
    }

    // Nothing changes, nothing is written (a re-check every second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = slice_writes(&cluster);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(slice_writes(&cluster), before, "writes in steady state");

    // npu-a keeps NPUs 0 and 4 (one per group); npu-b keeps 3 (group 0) and 6, 7 (group 4).
    for i in [1, 2, 3, 5, 6, 7] {
        set_present(&a, i, false);
    }
    for i in [0, 1, 2, 4, 5] {
        set_present(&b, i, false);
    }
    let want = |v: &[u32]| -> Vec<String> { v.iter().map(|i| format!("huawei-{i}")).collect() };
    slice_when(&slices, &a.slice(), "npu-a's six taints", |s| {
        tainted(s) == want(&[1, 2, 3, 5, 6, 7])
    })
    .await;
    // Discovery sees a missing node before the health stream names the fault: wait for both.
    let s = slice_when(
        &slices,
        &b.slice(),
        "npu-b's five taints, with their reason",
        |s| {
            tainted(s) == want(&[0, 1, 2, 4, 5])
                && s.spec
                    .devices
                    .iter()
                    .flatten()
                    .flat_map(|d| d.taints.iter().flatten())
                    .all(|t| t.value.as_deref() == Some("dev-node-missing"))
        },
    )
    .await;
    let taint = &s.spec.devices.as_ref().unwrap()[0].taints.as_ref().unwrap()[0];
    assert_eq!(
        (taint.key.as_str(), taint.effect.as_str()),
        ("fumarole.dev/unhealthy", "NoSchedule")
    );
    assert_eq!(taint.value.as_deref(), Some("dev-node-missing"));

    // Two NPUs of one HCCS group: only 6 and 7 on npu-b qualify.
    let (claim, node) = claim_and_pod(
        &cluster,
        "pair",
        json!({
            "devices": {
                "requests": [{"name": "npus", "exactly": {"deviceClassName": DRIVER, "count": 2}}],
                "constraints": [{"requests": ["npus"], "matchAttribute": "fumarole.dev/fabricGroup"}],
            }
        }),
    )
    .await;
    assert_eq!(node, "npu-b");
    let mut got = allocated(&claim);
    got.sort();
    assert_eq!(
        got,
        [
            ("npus".to_string(), "huawei-6".to_string()),
            ("npus".to_string(), "huawei-7".to_string())
        ]
    );

    // Four NPUs fit nowhere now (npu-a has 2 untainted, npu-b 1 free): the second choice.
    let (claim, _) = claim_and_pod(
        &cluster,
        "fallback",
        json!({
            "devices": {
                "requests": [{"name": "npus", "firstAvailable": [
                    {"name": "four", "deviceClassName": DRIVER, "count": 4},
                    {"name": "one", "deviceClassName": DRIVER, "count": 1},
                ]}],
            }
        }),
    )
    .await;
    let got = allocated(&claim);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "npus/one");
    assert!(
        ["huawei-0", "huawei-4", "huawei-3"].contains(&got[0].1.as_str()),
        "a tainted device was allocated: {got:?}"
    );

    // npu-a's devices come back: the taints go.
    for i in [1, 2, 3, 5, 6, 7] {
        set_present(&a, i, true);
    }
    slice_when(&slices, &a.slice(), "npu-a untainted", |s| {
        tainted(s).is_empty()
    })
    .await;
}

/// fumarole's DRA kubelet plugin under the kubelet's own DRA manager and plugin manager (a
/// harness node): it registers through the node's plugins_registry; a claim the real
/// kube-scheduler allocated is prepared with CDI devices naming exactly the allocated NPUs,
/// whose spec file holds their device nodes; the agent restarts between prepare and unprepare
/// and the new one unprepares the claim from its files.
///
/// The kubelet's registration dial sends the percent-encoded socket path as `:authority`,
/// which tonic's h2 refuses; the plugin's registration socket rewrites it
/// (`fumarole_device_plugin::dra::authority`), and this test is what shows the kubelet's own
/// plugin manager getting through.
#[tokio::test(flavor = "multi_thread")]
async fn the_kubelets_dra_manager_prepares_exactly_the_allocated_devices_across_a_restart() {
    let cluster = TestCluster::start().await.unwrap();
    install_device_classes(&cluster).await;
    cluster.start_kube_scheduler("").await.unwrap();
    let name = "npu-h";
    cluster
        .create_node(&NodeSpec::new(name).capacity("cpu", "192"))
        .await
        .unwrap();
    let (harness, cdi_dir, dirs) = harness_node(&cluster, name).await;
    let node = start_agent(&cluster, ATLAS, name, Some(&dirs), "agent-1");
    let plugin = harness
        .wait_dra_plugin(DRIVER, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        plugin.services.iter().any(|s| s == "v1.DRAPlugin"),
        "{plugin:?}"
    );
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    slice_when(&slices, &node.slice(), "slice with 8 NPUs", |s| {
        s.spec.devices.as_ref().is_some_and(|d| d.len() == 8)
    })
    .await;

    let (claim, bound) = claim_and_pod(
        &cluster,
        "pair",
        json!({
            "devices": {
                "requests": [{"name": "npus", "exactly": {"deviceClassName": DRIVER, "count": 2}}],
                "constraints": [{"requests": ["npus"], "matchAttribute": "fumarole.dev/fabricGroup"}],
            }
        }),
    )
    .await;
    assert_eq!(bound, name);
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    let devices: Vec<String> = allocated(&claim).into_iter().map(|(_, d)| d).collect();
    assert_eq!(devices.len(), 2);
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod = pods.get("pair").await.unwrap();
    let record = harness
        .wait_record(&pod, Duration::from_secs(60), |r| r.state == "admitted")
        .await
        .unwrap();
    let dra = record.dra.as_ref().unwrap();
    assert!(dra.prepared, "{record:?}");
    let container = record.container("main").unwrap();
    let mut want: Vec<String> = devices
        .iter()
        .map(|d| format!("{DRIVER}/claim={uid}-{d}"))
        .collect();
    want.sort();
    let mut got = container.cdi_devices.clone();
    got.sort();
    assert_eq!(got, want, "{container:?}");
    // The CDI spec the runtime would read: the allocated NPUs' device nodes, and no other.
    let spec_file = cdi_dir.path().join(format!("{DRIVER}-claim_{uid}.json"));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_file).unwrap()).unwrap();
    let nodes: Vec<String> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| {
            d["containerEdits"]["deviceNodes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect();
    let mut want_nodes: Vec<String> = devices
        .iter()
        .map(|d| format!("/dev/davinci{}", d.trim_start_matches("huawei-")))
        .collect();
    want_nodes.sort();
    let mut nodes = nodes;
    nodes.sort();
    assert_eq!(nodes, want_nodes, "{spec}");

    // The plugin restarts between prepare and unprepare.
    cluster.stop(&format!("agent-1-{name}")).unwrap();
    let _node = start_agent(&cluster, ATLAS, name, Some(&dirs), "agent-2");
    registered_again(&harness).await;
    pods.delete("pair", &Default::default()).await.unwrap();
    harness
        .wait_record(&pod, Duration::from_secs(60), |r| {
            r.dra.as_ref().is_some_and(|d| d.unprepared)
        })
        .await
        .unwrap();
    assert!(!spec_file.exists(), "the claim's CDI spec is still there");
}

/// GPUs the same way: two `metax-c500-8` nodes (MetaXLink zones 0-3 and 4-7, super-node
/// `metax-sn-a`) with their GPUs served through `gpu.fumarole.dev`. Claims already holding
/// GPUs (allocated by the scheduler, picked by index with a CEL selector) leave one node with
/// GPUs 0 and 4 free (one per zone) and the other with 3, 6 and 7: a claim for two GPUs with
/// `matchAttribute: fumarole.dev/fabricGroup` gets 6 and 7.
#[tokio::test(flavor = "multi_thread")]
async fn gpu_claims_keep_to_one_metaxlink_zone() {
    let cluster = TestCluster::start().await.unwrap();
    install_device_classes(&cluster).await;
    cluster.start_kube_scheduler("").await.unwrap();
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    let mut nodes = Vec::new();
    for name in ["gpu-a", "gpu-b"] {
        cluster
            .create_node(
                &NodeSpec::new(name)
                    .capacity("cpu", "128")
                    .label("kubernetes.io/hostname", name),
            )
            .await
            .unwrap();
        let node = start_agent(&cluster, METAX, name, None, "fumarole-agent");
        let s = slice_when(&slices, &node.slice(), "slice with 8 GPUs", |s| {
            s.spec.devices.as_ref().is_some_and(|d| d.len() == 8)
        })
        .await;
        let devices = s.spec.devices.as_ref().unwrap();
        let attr = |i: usize, name: &str| devices[i].attributes.as_ref().unwrap()[name].clone();
        assert_eq!(devices[6].name, "metax-6");
        assert_eq!(attr(6, "fumarole.dev/fabricGroup").int, Some(4));
        assert_eq!(attr(2, "fumarole.dev/fabricGroup").int, Some(0));
        assert_eq!(
            attr(6, "fumarole.dev/fabric").string.as_deref(),
            Some("metaxLink")
        );
        assert_eq!(
            attr(6, "fumarole.dev/superNode").string.as_deref(),
            Some("metax-sn-a")
        );
        nodes.push(node);
    }
    // Holders, each pinned to its node, taking GPUs by index.
    for (node, taken) in [
        ("gpu-a", "[1, 2, 3, 5, 6, 7]"),
        ("gpu-b", "[0, 1, 2, 4, 5]"),
    ] {
        let count = taken.split(',').count();
        let (claim, bound) = claim_and_pod_on(
            &cluster,
            &format!("holder-{node}"),
            Some(node),
            json!({
                "devices": {"requests": [{"name": "npus", "exactly": {
                    "deviceClassName": "gpu.fumarole.dev",
                    "count": count,
                    "selectors": [{"cel": {"expression": format!("device.attributes[\"fumarole.dev\"].index in {taken}")}}],
                }}]}
            }),
        )
        .await;
        assert_eq!(bound, node);
        assert_eq!(allocated_of(&claim, "gpu.fumarole.dev").len(), count);
    }
    let (claim, bound) = claim_and_pod_on(
        &cluster,
        "pair",
        None,
        json!({
            "devices": {
                "requests": [{"name": "npus", "exactly": {"deviceClassName": "gpu.fumarole.dev", "count": 2}}],
                "constraints": [{"requests": ["npus"], "matchAttribute": "fumarole.dev/fabricGroup"}],
            }
        }),
    )
    .await;
    assert_eq!(bound, "gpu-b");
    let mut got: Vec<String> = allocated_of(&claim, "gpu.fumarole.dev")
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    got.sort();
    assert_eq!(got, ["metax-6", "metax-7"]);
}

/// A device several claims may hold (`draShares: 2`): the agent publishes it with
/// `allowMultipleAllocations` and a `shares` capacity of 2, and the real kube-scheduler's DRA
/// allocator puts two claims that a selector keeps to NPU 0 on it, each with its own share,
/// while a third waits.
#[tokio::test(flavor = "multi_thread")]
async fn two_claims_share_one_npu_and_a_third_waits() {
    let cluster = TestCluster::start().await.unwrap();
    install_device_classes(&cluster).await;
    cluster.start_kube_scheduler("").await.unwrap();
    cluster
        .create_node(&NodeSpec::new("npu-s").capacity("cpu", "192"))
        .await
        .unwrap();
    let agent = cluster
        .start_dra_agent_with(
            ATLAS.fixture,
            ATLAS.vendor,
            "npu-s",
            None,
            "fumarole-agent",
            "draShares: 2",
        )
        .unwrap();
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    let s = slice_when(&slices, &agent.slice(), "slice with 8 shared NPUs", |s| {
        s.spec.devices.as_ref().is_some_and(|d| {
            d.len() == 8 && d.iter().all(|d| d.allow_multiple_allocations == Some(true))
        })
    })
    .await;
    let npu0 = &s.spec.devices.as_ref().unwrap()[0];
    assert_eq!(npu0.name, "huawei-0");
    assert_eq!(npu0.capacity.as_ref().unwrap()["shares"].value.0, "2");

    let on_npu0 = || {
        json!({
            "devices": {"requests": [{"name": "npus", "exactly": {
                "deviceClassName": DRIVER,
                "selectors": [{"cel": {"expression": "device.attributes[\"fumarole.dev\"].index == 0"}}],
            }}]}
        })
    };
    let mut shares = Vec::new();
    for name in ["share-a", "share-b"] {
        let (claim, node) = claim_and_pod(&cluster, name, on_npu0()).await;
        assert_eq!(node, "npu-s");
        assert_eq!(
            allocated(&claim),
            [("npus".to_string(), "huawei-0".to_string())]
        );
        let result = &claim["status"]["allocation"]["devices"]["results"][0];
        assert_eq!(result["consumedCapacity"]["shares"], "1", "{result}");
        shares.push(result["shareID"].as_str().unwrap().to_string());
    }
    assert_ne!(
        shares[0], shares[1],
        "each claim has its own share of the device"
    );

    // A third claim for NPU 0 finds both shares taken and waits (this cluster runs no
    // kube-controller-manager, which would release a deleted pod's share).
    let third = tokio::time::timeout(
        Duration::from_secs(15),
        claim_and_pod(&cluster, "share-c", on_npu0()),
    )
    .await;
    assert!(
        third.is_err(),
        "a third claim got NPU 0 while two held both its shares"
    );
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), "default");
    let c = claims.get("share-c").await.unwrap();
    assert!(
        c.status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_none(),
        "{:?}",
        c.status
    );
}

/// The kubelet's own DRA manager (a harness node) prepares one shared NPU for two claims: each
/// pod is admitted with its own claim's CDI device for `huawei-0`, each spec gives
/// `/dev/davinci0`, and one pod's end unprepares only its claim.
#[tokio::test(flavor = "multi_thread")]
async fn the_kubelets_dra_manager_prepares_one_shared_npu_for_two_claims() {
    let cluster = TestCluster::start().await.unwrap();
    install_device_classes(&cluster).await;
    cluster.start_kube_scheduler("").await.unwrap();
    let name = "npu-hs";
    cluster
        .create_node(&NodeSpec::new(name).capacity("cpu", "192"))
        .await
        .unwrap();
    let (harness, cdi_dir, dirs) = harness_node(&cluster, name).await;
    let node = cluster
        .start_dra_agent_with(
            ATLAS.fixture,
            ATLAS.vendor,
            name,
            Some(&dirs),
            "agent",
            "draShares: 2",
        )
        .unwrap();
    harness
        .wait_dra_plugin(DRIVER, Duration::from_secs(60))
        .await
        .unwrap();
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    slice_when(&slices, &node.slice(), "slice with 8 shared NPUs", |s| {
        s.spec.devices.as_ref().is_some_and(|d| {
            d.len() == 8 && d.iter().all(|d| d.allow_multiple_allocations == Some(true))
        })
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let mut specs = Vec::new();
    for claim_name in ["share-a", "share-b"] {
        let (claim, bound) = claim_and_pod(
            &cluster,
            claim_name,
            json!({
                "devices": {"requests": [{"name": "npus", "exactly": {
                    "deviceClassName": DRIVER,
                    "selectors": [{"cel": {"expression": "device.attributes[\"fumarole.dev\"].index == 0"}}],
                }}]}
            }),
        )
        .await;
        assert_eq!(bound, name);
        assert_eq!(
            allocated(&claim),
            [("npus".to_string(), "huawei-0".to_string())]
        );
        let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
        let pod = pods.get(claim_name).await.unwrap();
        let record = harness
            .wait_record(&pod, Duration::from_secs(60), |r| r.state == "admitted")
            .await
            .unwrap();
        assert!(record.dra.as_ref().unwrap().prepared, "{record:?}");
        let container = record.container("main").unwrap();
        assert_eq!(
            container.cdi_devices,
            [format!("{DRIVER}/claim={uid}-huawei-0")],
            "{container:?}"
        );
        let spec_file = cdi_dir.path().join(format!("{DRIVER}-claim_{uid}.json"));
        let spec: Value =
            serde_json::from_str(&std::fs::read_to_string(&spec_file).unwrap()).unwrap();
        let nodes: Vec<&str> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|d| d["containerEdits"]["deviceNodes"].as_array().unwrap())
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert_eq!(nodes, ["/dev/davinci0"], "{spec}");
        specs.push((pod, spec_file));
    }

    // One pod ends: its claim is unprepared, the other's spec stays.
    let (pod_a, spec_a) = &specs[0];
    pods.delete("share-a", &Default::default()).await.unwrap();
    harness
        .wait_record(pod_a, Duration::from_secs(60), |r| {
            r.dra.as_ref().is_some_and(|d| d.unprepared)
        })
        .await
        .unwrap();
    assert!(!spec_a.exists(), "share-a's CDI spec is still there");
    assert!(
        specs[1].1.exists(),
        "share-b's CDI spec went with share-a's"
    );
}

/// Until the harness kubelet has seen a DRA plugin register a second time (a restarted agent).
async fn registered_again(harness: &HarnessNode) {
    eventually(
        "the plugin registered again",
        Duration::from_secs(60),
        || async {
            Ok(harness
                .events(0, Duration::ZERO)
                .await?
                .iter()
                .filter(|e| e.kind == "dra_plugin_registered")
                .nth(1)
                .map(|_| ()))
        },
    )
    .await
    .unwrap();
}

/// The slices of `node`'s pool of `driver`.
async fn pool_of(
    slices: &Api<ResourceSlice>,
    node: &str,
    driver: &str,
) -> kube::Result<Vec<ResourceSlice>> {
    Ok(slices
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.pool.name == node && s.spec.driver == driver)
        .collect())
}

/// MIG partitions through DRA (`draPartitions`) on a DGX H100, allocated by the real
/// kube-scheduler's DRA allocator from the counters fumarole publishes: two MIG instances
/// that fit share one GPU, at placements that do not overlap; a third that does not fit
/// waits, and so does the whole GPU; a whole GPU taken leaves no partition of it.
#[tokio::test(flavor = "multi_thread")]
async fn mig_partitions_that_fit_share_a_gpu_and_overlapping_ones_wait() {
    let cluster = TestCluster::start().await.unwrap();
    install_device_classes(&cluster).await;
    cluster.start_kube_scheduler("").await.unwrap();
    let node = "dgx-mig";
    cluster
        .create_node(&NodeSpec::new(node).capacity("cpu", "224"))
        .await
        .unwrap();
    let agent = cluster
        .start_dra_agent_with(
            "dgx-h100",
            "nvidia",
            node,
            None,
            "fumarole-agent",
            "draPartitions: true",
        )
        .unwrap();
    // 8 GPUs x (the whole GPU + 25 MIG placements) in 4 slices, their counter sets in a fifth,
    // all of one generation.
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    let pool = eventually("the pool's five slices", Duration::from_secs(60), || {
        let slices = slices.clone();
        async move {
            let pool = pool_of(&slices, node, GPU_DRIVER).await?;
            let complete = pool.len() == 5
                && pool.iter().all(|s| {
                    s.spec.pool.resource_slice_count == 5
                        && s.spec.pool.generation == pool[0].spec.pool.generation
                });
            Ok(complete.then_some(pool))
        }
    })
    .await
    .unwrap();
    let devices = pool
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .count();
    assert_eq!(devices, 8 * 26);
    let sets: Vec<&str> = pool
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(sets.len(), 8, "{sets:?}");

    let claim_on = |class: &str, gpu: u32, profile: Option<&str>| {
        let mut cel = format!("device.attributes[\"fumarole.dev\"].index == {gpu}");
        if let Some(p) = profile {
            cel.push_str(&format!(
                " && device.attributes[\"fumarole.dev\"].profile == \"{p}\""
            ));
        }
        json!({
            "devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": class,
                "selectors": [{"cel": {"expression": cel}}],
            }}]}
        })
    };
    let mig = |gpu, profile| claim_on("gpu-partition.fumarole.dev", gpu, Some(profile));
    let whole = |gpu| claim_on("gpu.fumarole.dev", gpu, None);
    let device_of = |claim: &Value| {
        let got = allocated_of(claim, GPU_DRIVER);
        assert_eq!(got.len(), 1, "{got:?}");
        got[0].1.clone()
    };

    // 4g.40gb takes memory slices 0-3 of GPU 0; 3g.40gb fits only at 4-7.
    let (a, bound) = claim_and_pod(&cluster, "mig-4g", mig(0, "4g.40gb")).await;
    assert_eq!(bound, node);
    assert_eq!(device_of(&a), "nvidia-0-4g-40gb-0");
    let (b, _) = claim_and_pod(&cluster, "mig-3g", mig(0, "3g.40gb")).await;
    assert_eq!(device_of(&b), "nvidia-0-3g-40gb-4");
    // GPU 1 taken whole: the whole-device class gives the GPU itself.
    let (w, _) = claim_and_pod(&cluster, "whole-1", whole(1)).await;
    assert_eq!(device_of(&w), "nvidia-1");

    // Nothing left on GPU 0 for a 1g.10gb or the whole GPU, nor on GPU 1 for a partition:
    // each waits, unallocated (this cluster runs no kube-controller-manager to release them).
    let waits = |name: &'static str, spec: Value| {
        let cluster = &cluster;
        async move {
            tokio::time::timeout(Duration::from_secs(15), claim_and_pod(cluster, name, spec))
                .await
                .is_err()
        }
    };
    let writes = slice_writes(&cluster);
    let (small, whole0, part1) = tokio::join!(
        waits("mig-1g", mig(0, "1g.10gb")),
        waits("whole-0", whole(0)),
        waits("mig-on-whole", mig(1, "1g.10gb")),
    );
    assert!(
        small,
        "a 1g.10gb got GPU 0 while 4g.40gb and 3g.40gb held all its slices"
    );
    assert!(
        whole0,
        "GPU 0 was given whole while two of its MIG instances were held"
    );
    assert!(
        part1,
        "a MIG instance of GPU 1 was given while GPU 1 was held whole"
    );
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), "default");
    for name in ["mig-1g", "whole-0", "mig-on-whole"] {
        let c = claims.get(name).await.unwrap();
        assert!(
            c.status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .is_none(),
            "{name}: {:?}",
            c.status
        );
    }
    assert_eq!(
        slice_writes(&cluster),
        writes,
        "the pool, unchanged, is not written again (re-checked every second)"
    );
    // Elsewhere the same ask fits at once: GPU 2's first slice.
    let (c, _) = claim_and_pod(&cluster, "mig-1g-2", mig(2, "1g.10gb")).await;
    assert_eq!(device_of(&c), "nvidia-2-1g-10gb-0");

    // GPU 3 goes (its device node disappears): the whole pool is written again under the next
    // generation, and GPU 3 and every one of its partitions carry the taint.
    let generation = pool[0].spec.pool.generation;
    std::fs::remove_file(agent.root.join("dev/nvidia3")).unwrap();
    eventually(
        "the pool's next generation",
        Duration::from_secs(60),
        || {
            let slices = slices.clone();
            async move {
                let pool = pool_of(&slices, node, GPU_DRIVER).await?;
                let next = pool.len() == 5
                    && pool
                        .iter()
                        .all(|s| s.spec.pool.generation == generation + 1);
                let gpu3: Vec<bool> = pool
                    .iter()
                    .flat_map(|s| s.spec.devices.iter().flatten())
                    .filter(|d| d.name == "nvidia-3" || d.name.starts_with("nvidia-3-"))
                    .map(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
                    .collect();
                Ok((next && gpu3.len() == 26 && gpu3.iter().all(|t| *t)).then_some(()))
            }
        },
    )
    .await
    .unwrap();
}

/// The kubelet's own DRA manager (a harness node) prepares claims on MIG partitions: the
/// agent makes each MIG instance through NVML (the stand-in library) at the placement the
/// scheduler allocated, two halves of one GPU side by side, each pod admitted with its MIG
/// device's uuid; after the agent restarts, a pod's end removes its instance and only its.
#[tokio::test(flavor = "multi_thread")]
async fn the_kubelets_dra_manager_gets_a_mig_instance_made_for_a_claim() {
    let cluster = TestCluster::start().await.unwrap();
    install_device_classes(&cluster).await;
    cluster.start_kube_scheduler("").await.unwrap();
    let name = "dgx-mig-hs";
    cluster
        .create_node(&NodeSpec::new(name).capacity("cpu", "224"))
        .await
        .unwrap();
    let (harness, cdi_dir, dirs) = harness_node(&cluster, name).await;
    let dir = tempfile::tempdir().unwrap();
    let (root, lib, mut nvml) = nvidia_root(dir.path()).unwrap();
    // MIG mode on every GPU, no MIG device yet.
    nvml.edit(|s| {
        for g in s["gpus"].as_array_mut().unwrap() {
            g["migCapable"] = json!(true);
            g["migEnabled"] = json!(true);
        }
    });
    let state = nvml.path.clone();
    let start = |process: &str| {
        cluster
            .start_nvidia_dra_agent(
                tempfile::tempdir().unwrap(),
                root.clone(),
                (&lib, &state),
                name,
                Some(&dirs),
                process,
                "draPartitions: true",
            )
            .unwrap()
    };
    let _agent = start("agent-1");
    harness
        .wait_dra_plugin(GPU_DRIVER, Duration::from_secs(60))
        .await
        .unwrap();
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    eventually("the pool's five slices", Duration::from_secs(60), || {
        let slices = slices.clone();
        async move { Ok((pool_of(&slices, name, GPU_DRIVER).await?.len() == 5).then_some(())) }
    })
    .await
    .unwrap();
    let mig_devices = |gpu: usize| -> Vec<Value> {
        let s: Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
        s["gpus"][gpu]["migDevices"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };

    let half_of_gpu2 = || {
        json!({
            "devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu-partition.fumarole.dev",
                "selectors": [{"cel": {"expression": "device.attributes[\"fumarole.dev\"].index == 2 && device.attributes[\"fumarole.dev\"].profile == \"3g.40gb\""}}],
            }}]}
        })
    };
    let (claim, bound) = claim_and_pod(&cluster, "mig-a", half_of_gpu2()).await;
    assert_eq!(bound, name);
    assert_eq!(
        allocated_of(&claim, GPU_DRIVER),
        [("gpu".to_string(), "nvidia-2-3g-40gb-0".to_string())]
    );
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod = pods.get("mig-a").await.unwrap();
    let record = harness
        .wait_record(&pod, Duration::from_secs(60), |r| r.state == "admitted")
        .await
        .unwrap();
    assert!(record.dra.as_ref().unwrap().prepared, "{record:?}");
    assert_eq!(
        record.container("main").unwrap().cdi_devices,
        [format!("{GPU_DRIVER}/claim={uid}-nvidia-2-3g-40gb-0")]
    );
    // NVML now lists one MIG device on GPU 2: a 3g.40gb GPU instance on memory slices 0-3
    // with its compute instance; the container is given its uuid.
    let made = mig_devices(2);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["placement"], json!([0, 4]));
    assert_eq!(made[0]["computeInstance"], json!(0));
    assert!(
        made[0]["name"].as_str().unwrap().ends_with("MIG 3g.40gb"),
        "{made:?}"
    );
    let uuid = made[0]["uuid"].as_str().unwrap().to_string();
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    assert!(mig_devices(0).is_empty() && mig_devices(1).is_empty());
    let spec_file = cdi_dir
        .path()
        .join(format!("{GPU_DRIVER}-claim_{uid}.json"));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_file).unwrap()).unwrap();
    let env: Vec<&str> = spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        env.contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid}").as_str()),
        "{spec}"
    );

    // A second 3g.40gb on GPU 2 gets the other half: its own instance on slices 4-7.
    let (claim_b, _) = claim_and_pod(&cluster, "mig-b", half_of_gpu2()).await;
    assert_eq!(
        allocated_of(&claim_b, GPU_DRIVER),
        [("gpu".to_string(), "nvidia-2-3g-40gb-4".to_string())]
    );
    let pod_b = pods.get("mig-b").await.unwrap();
    harness
        .wait_record(&pod_b, Duration::from_secs(60), |r| r.state == "admitted")
        .await
        .unwrap();
    let made = mig_devices(2);
    assert_eq!(made.len(), 2, "{made:?}");
    assert_eq!(made[1]["placement"], json!([4, 4]));
    assert_ne!(made[1]["uuid"], json!(uuid));

    // The agent starts again while both instances exist: GPU 2 is in MIG mode with MIG devices
    // that are DRA's own, served whole as before (no config error).
    cluster.stop(&format!("agent-1-{name}")).unwrap();
    let _again = start("agent-2");
    registered_again(&harness).await;

    // The first pod ends: the new agent unprepares its claim from the spec file, and its MIG
    // instance is gone; the other's stays.
    pods.delete("mig-a", &Default::default()).await.unwrap();
    harness
        .wait_record(&pod, Duration::from_secs(60), |r| {
            r.dra.as_ref().is_some_and(|d| d.unprepared)
        })
        .await
        .unwrap();
    assert!(!spec_file.exists());
    let left = mig_devices(2);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["placement"], json!([4, 4]));
}

/// An Ascend vNPU made for a claim: the real kube-scheduler allocates a `vir04` partition of
/// NPU 2 (atlas-800-910, `draPartitions`), the kubelet's own DRA manager prepares it, the
/// agent makes the vNPU through the DCMI stand-in (the library it loads as the real one) and
/// the claim's CDI spec gives the container host `/dev/vdavinci<id>` as `/dev/davinci<id>`
/// with the id visible; the pod's end destroys the vNPU.
#[tokio::test(flavor = "multi_thread")]
async fn the_kubelets_dra_manager_gets_a_vnpu_made_for_a_claim() {
    let cluster = TestCluster::start().await.unwrap();
    install_device_classes(&cluster).await;
    cluster.start_kube_scheduler("").await.unwrap();
    let name = "atlas-vnpu-hs";
    cluster
        .create_node(&NodeSpec::new(name).capacity("cpu", "192"))
        .await
        .unwrap();
    let (harness, cdi_dir, dirs) = harness_node(&cluster, name).await;
    let dir = tempfile::tempdir().unwrap();
    // The 910's templates.
    let chips = ascend_chips(
        8,
        |_| json!({"vnpuTemplates": ["vir02", "vir04", "vir08", "vir16"]}),
    );
    let (lib, dcmi) = dcmi_standin(dir.path(), json!({"chips": chips})).unwrap();
    let _agent = cluster
        .start_ascend_dra_agent(
            "atlas-800-910",
            (&lib, &dcmi.path),
            name,
            Some(&dirs),
            "agent",
            "draPartitions: true",
        )
        .unwrap();
    harness
        .wait_dra_plugin(DRIVER, Duration::from_secs(60))
        .await
        .unwrap();
    let vdevices = || -> Vec<Value> {
        let s: Value = serde_json::from_str(&std::fs::read_to_string(&dcmi.path).unwrap()).unwrap();
        s["vdevices"].as_array().cloned().unwrap_or_default()
    };

    let (claim, bound) = claim_and_pod(
        &cluster,
        "vnpu-a",
        json!({
            "devices": {"requests": [{"name": "npu", "exactly": {
                "deviceClassName": "npu-partition.fumarole.dev",
                "selectors": [{"cel": {"expression": "device.attributes[\"fumarole.dev\"].index == 2 && device.attributes[\"fumarole.dev\"].profile == \"vir04\""}}],
            }}]}
        }),
    )
    .await;
    assert_eq!(bound, name);
    assert_eq!(
        allocated_of(&claim, DRIVER),
        [("npu".to_string(), "huawei-2-vir04-0".to_string())]
    );
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod = pods.get("vnpu-a").await.unwrap();
    let record = harness
        .wait_record(&pod, Duration::from_secs(60), |r| r.state == "admitted")
        .await
        .unwrap();
    assert!(record.dra.as_ref().unwrap().prepared, "{record:?}");
    assert_eq!(
        record.container("main").unwrap().cdi_devices,
        [format!("{DRIVER}/claim={uid}-huawei-2-vir04-0")]
    );
    // DCMI now holds one vNPU, vir04 on card 2, numbered from 100.
    assert_eq!(
        vdevices(),
        [json!({"card": 2, "device": 0, "vdevId": 100, "template": "vir04"})]
    );
    let spec_file = cdi_dir.path().join(format!("{DRIVER}-claim_{uid}.json"));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_file).unwrap()).unwrap();
    let env = &spec["containerEdits"]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!("ASCEND_VISIBLE_DEVICES=100")),
        "{spec}"
    );
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!("ASCEND_RUNTIME_OPTIONS=VIRTUAL")),
        "{spec}"
    );
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/davinci100", "hostPath": "/dev/vdavinci100", "permissions": "rw"}]),
        "{spec}"
    );

    // The pod ends: its claim is unprepared and the vNPU destroyed.
    pods.delete("vnpu-a", &Default::default()).await.unwrap();
    harness
        .wait_record(&pod, Duration::from_secs(60), |r| {
            r.dra.as_ref().is_some_and(|d| d.unprepared)
        })
        .await
        .unwrap();
    assert!(!spec_file.exists());
    assert_eq!(vdevices(), Vec::<Value>::new());
}
