//! fumarole placing pods whose NPUs come from ResourceClaims, against the real API server and
//! the real kube-scheduler (v1.37, `resource.k8s.io/v1`, its own DRA allocator), two ways:
//! fumarole-scheduler-ext as its filter and prioritize extender, and `kube-scheduler-fumarole`
//! (the framework plugin compiled in). Neither binds: the scheduler's DRA allocator picks the
//! devices on the node.
//!
//! Two Ascend nodes (fixture `atlas-800-910`: HCCS groups 0-3 and 4-7) whose agents serve their
//! NPUs through DRA (`servedBy: dra`) and publish their ResourceSlices and DeviceTopology. A
//! "holder" pod, kept on npu-a by node affinity, takes three NPUs of one HCCS group through a
//! claim (`matchAttribute: fumarole.dev/fabricGroup`) and 64 of npu-a's 192 CPUs. Then a pod
//! with a one-NPU claim and no constraint:
//!
//! - with the extension (or the plugin), it goes to npu-a: the held NPUs (an allocated claim
//!   fumarole counts as used) leave one NPU alone in its HCCS group there, which the pod can
//!   take breaking no whole group, where on npu-b it would break one (gpu-aware scoring, the
//!   same as for `huawei.com/Ascend910` pods: 10 against 8, times weight 5 and kube-scheduler's
//!   scale); the pod gets no `fumarole.dev/devices` annotation.
//! - without it (the control test), kube-scheduler alone sends it to npu-b, the less loaded
//!   node (its resource scoring knows nothing of HCCS groups).
//!
//! Checked by hand: the first test fails (npu-b) with the extender taken out of the
//! configuration, and with an extension that does not count the devices allocated claims hold
//! (both nodes then look untouched and score the same).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use fumarole_e2e::NodeSpec;
use fumarole_e2e::TestCluster;
use fumarole_e2e::cluster::eventually;
use fumarole_e2e::dra::DraAgent;
use fumarole_e2e::fumarole::{device_topologies, start_kube_plugin};
use fumarole_topology::annotation::DEVICES_ANNOTATION;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};
use scheduler_ext::protocol::kube_scheduler::KUBE_PREFIX;
use serde_json::{Value, json};

const DRIVER: &str = "npu.fumarole.dev";

/// Starts a Node of 192 CPUs and its agent on a fresh atlas-800-910 root, NPUs served through
/// DRA. The agent's directories live as long as the returned handle.
async fn start_node(cluster: &TestCluster, name: &str) -> DraAgent {
    cluster
        .create_node(&NodeSpec::new(name).capacity("cpu", "192"))
        .await
        .unwrap();
    cluster
        .start_dra_agent("atlas-800-910", "huawei", name, None, "fumarole-agent")
        .unwrap()
}

/// kube-scheduler with fumarole-scheduler-ext as filter and prioritize extender for every pod
/// (no `managedResources`: a claim pod names no extended resource).
fn extender_config(port: u16) -> String {
    format!(
        "extenders:\n\
         - urlPrefix: http://127.0.0.1:{port}{KUBE_PREFIX}\n\
         \x20 filterVerb: filter\n\
         \x20 prioritizeVerb: prioritize\n\
         \x20 nodeCacheCapable: true\n\
         \x20 weight: 5\n"
    )
}

/// What besides kube-scheduler's own plugins scores the nodes.
#[derive(Clone, Copy)]
enum Fumarole {
    /// Nothing: upstream's kube-scheduler alone (the control).
    Absent,
    /// fumarole-scheduler-ext as filter and prioritize extender.
    Extender,
    /// `kube-scheduler-fumarole`: the framework plugin compiled in (shipped weight 5).
    Plugin,
}

/// Two Ascend nodes with their slices and DeviceTopology published, the DeviceClasses, and
/// kube-scheduler with `fumarole` deciding beside it.
async fn setup(fumarole: Fumarole) -> (TestCluster, Vec<DraAgent>) {
    let cluster = common::cluster().await;
    cluster.install_dra_device_classes().await.unwrap();
    let dirs = vec![
        start_node(&cluster, "npu-a").await,
        start_node(&cluster, "npu-b").await,
    ];
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    let topologies = device_topologies(cluster.client());
    for node in ["npu-a", "npu-b"] {
        eventually(
            &format!("{node}'s slice and DeviceTopology with 8 NPUs"),
            Duration::from_secs(60),
            || {
                let (slices, topologies) = (slices.clone(), topologies.clone());
                async move {
                    let slice = slices.get_opt(&format!("{node}-{DRIVER}")).await?;
                    let dt = topologies.get_opt(node).await?;
                    let eight = slice
                        .and_then(|s| s.spec.devices)
                        .is_some_and(|d| d.len() == 8)
                        && dt.is_some_and(|t| {
                            t.data["spec"]["devices"].as_array().map(Vec::len) == Some(8)
                        });
                    Ok(eight.then_some(()))
                }
            },
        )
        .await
        .unwrap();
    }
    match fumarole {
        Fumarole::Absent => {
            cluster.start_kube_scheduler("").await.unwrap();
        }
        Fumarole::Extender => {
            let port = cluster.start_scheduler_ext(&[]).await.unwrap();
            cluster
                .start_kube_scheduler(&extender_config(port))
                .await
                .unwrap();
        }
        Fumarole::Plugin => {
            start_kube_plugin(&cluster, "{}").await.unwrap();
        }
    }
    (cluster, dirs)
}

/// Creates claim `name` (`count` NPUs of one HCCS group) and a pod using it with `cpu` CPUs,
/// on `node` only if given
/// (node affinity: the scheduler still places it and allocates its claim); returns the pod's
/// node and the claim's allocated devices once it is bound.
async fn claim_pod(
    cluster: &TestCluster,
    name: &str,
    count: u32,
    cpu: &str,
    node: Option<&str>,
) -> (String, Vec<String>, Pod) {
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"devices": {
            "requests": [{"name": "npu", "exactly": {"deviceClassName": DRIVER, "count": count}}],
            "constraints": [{"requests": ["npu"], "matchAttribute": "fumarole.dev/fabricGroup"}],
        }},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    // The extension judges a pod by its claim: let its watch see the claim first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let affinity = node.map(|n| {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [n]}]}]}}})
    });
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "affinity": affinity,
            "resourceClaims": [{"name": "npu", "resourceClaimName": name}],
            "containers": [{
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": cpu}, "claims": [{"name": "npu"}]},
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let bound = eventually(
        &format!("pod {name} bound"),
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get(name).await?;
                let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
                Ok(bound.filter(|n| !n.is_empty()).map(|n| (n, p)))
            }
        },
    )
    .await
    .unwrap();
    let allocated = eventually(
        &format!("claim {name} allocated"),
        Duration::from_secs(30),
        || {
            let claims = claims.clone();
            async move {
                let c = serde_json::to_value(claims.get(name).await?).unwrap();
                let results = c["status"]["allocation"]["devices"]["results"].clone();
                Ok(results.as_array().map(|r| {
                    r.iter()
                        .map(|r: &Value| {
                            assert_eq!(r["driver"], DRIVER, "{r}");
                            format!(
                                "{}/{}",
                                r["pool"].as_str().unwrap(),
                                r["device"].as_str().unwrap()
                            )
                        })
                        .collect::<Vec<_>>()
                }))
            }
        },
    )
    .await
    .unwrap();
    (bound.0, allocated, bound.1)
}

/// With the extension: the one-NPU claim pod goes where it breaks no whole HCCS group.
#[tokio::test(flavor = "multi_thread")]
async fn the_extension_steers_a_claim_pod_to_the_node_whose_hccs_group_is_already_broken() {
    steers_a_claim_pod_to_the_node_whose_hccs_group_is_already_broken(Fumarole::Extender).await;
}

/// The same with the framework plugin: its Score, and the default binder (the plugin binds
/// no claim pod; the scheduler's DRA allocator chooses the devices).
#[tokio::test(flavor = "multi_thread")]
async fn the_plugin_steers_a_claim_pod_to_the_node_whose_hccs_group_is_already_broken() {
    steers_a_claim_pod_to_the_node_whose_hccs_group_is_already_broken(Fumarole::Plugin).await;
}

async fn steers_a_claim_pod_to_the_node_whose_hccs_group_is_already_broken(fumarole: Fumarole) {
    let (cluster, _dirs) = setup(fumarole).await;
    let (node, held, _) = claim_pod(&cluster, "holder", 3, "64", Some("npu-a")).await;
    assert_eq!(node, "npu-a");
    assert_eq!(held.len(), 3, "{held:?}");
    let (node, got, pod) = claim_pod(&cluster, "single", 1, "1", None).await;
    assert_eq!(
        node, "npu-a",
        "fumarole prefers the node with a broken HCCS group (holder has {held:?})"
    );
    assert!(got[0].starts_with("npu-a/"), "{got:?}");
    let annotations = pod.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(DEVICES_ANNOTATION),
        "no device choice of ours on a claim pod: {annotations:?}"
    );
}

/// The control: kube-scheduler alone sends the same pod to the other, less loaded, node.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_extension_the_scheduler_sends_it_to_the_untouched_node() {
    let (cluster, _dirs) = setup(Fumarole::Absent).await;
    let (node, _, _) = claim_pod(&cluster, "holder", 3, "64", Some("npu-a")).await;
    assert_eq!(node, "npu-a");
    let (node, _, _) = claim_pod(&cluster, "single", 1, "1", None).await;
    assert_eq!(node, "npu-b");
}
