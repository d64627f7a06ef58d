//! Harness nodes with the kubelet's own DRA manager and plugin manager, proven with
//! `dra-standin` (e2e/upstream/k8s/cmd/dra-standin, the upstream `kubeletplugin` helper) in
//! place of fumarole's plugin: the stand-in registers through the node's plugins_registry;
//! a pod whose ResourceClaim the test allocated and reserved (no scheduler) is bound to the
//! node, prepared (`NodePrepareResources`) and admitted with the stand-in's CDI device on its
//! container; deleting it unprepares the claim (`NodeUnprepareResources`) before the pod is
//! gone. A failed prepare leaves the pod Pending until retried; a kubelet restart re-registers
//! the plugin and unprepares from the DRA manager's checkpoint.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use fumarole_e2e::cluster::eventually;
use fumarole_e2e::{HarnessNode, NodeSpec, TestCluster, Upstream};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const DRIVER: &str = "standin.example.com";
const NODE: &str = "node-a";
/// Generous: the machine is small and shared.
const T: Duration = Duration::from_secs(90);

/// The stand-in DRA plugin serving on `node`; returns its calls file and fail-prepare file.
fn start_standin(cluster: &TestCluster, node: &HarnessNode) -> (PathBuf, PathBuf) {
    let calls = cluster.root().join("dra-standin-calls.jsonl");
    let fail = cluster.root().join("dra-standin-fail-prepare");
    let args = vec![
        format!("--driver={DRIVER}"),
        format!("--node-name={}", node.node_name()),
        format!(
            "--registry-dir={}",
            node.plugins_registry_dir().unwrap().display()
        ),
        format!(
            "--plugin-data-dir={}",
            node.dra_plugin_dir(DRIVER).unwrap().display()
        ),
        format!("--calls-file={}", calls.display()),
        format!("--fail-prepare-file={}", fail.display()),
    ];
    cluster
        .start_program(
            "dra-standin",
            &Upstream::get().unwrap().bin("dra-standin"),
            &args,
            &[],
        )
        .unwrap();
    (calls, fail)
}

/// The stand-in's calls so far (one JSON object per line).
fn calls(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits until the stand-in recorded `method` for the claim of uid `claim_uid`; returns
/// that call's claim entry.
async fn wait_call(path: &Path, method: &str, claim_uid: &str) -> Value {
    eventually(&format!("dra-standin {method} {claim_uid}"), T, || async {
        Ok(calls(path)
            .into_iter()
            .filter(|c| c["method"] == method)
            .flat_map(|c| c["claims"].as_array().cloned().unwrap_or_default())
            .find(|c| c["uid"] == claim_uid))
    })
    .await
    .unwrap()
}

/// A ResourceClaim asking one device of class `standin` (request `dev`).
fn claim(name: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{
            "name": "dev",
            "exactly": {"deviceClassName": "standin", "allocationMode": "ExactCount", "count": 1}
        }]}}
    }))
    .unwrap()
}

/// A pod, not yet bound, whose container `main` uses ResourceClaim `claim` by name.
fn pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
            "containers": [{
                "name": "main", "image": "example.invalid/none",
                "resources": {"claims": [{"name": "dev"}]}
            }]
        }
    }))
    .unwrap()
}

/// What a scheduler would do: allocate `device` of the stand-in's pool `NODE` to the claim,
/// reserve it for `pod`, then bind `pod` to `NODE`.
async fn allocate_reserve_bind(cluster: &TestCluster, claim: &str, device: &str, pod: &Pod) {
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), "default");
    let pod_name = pod.metadata.name.clone().unwrap();
    let pod_uid = pod.metadata.uid.clone().unwrap();
    claims
        .patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "allocation": {
                    "devices": {"results": [
                        {"request": "dev", "driver": DRIVER, "pool": NODE, "device": device}
                    ]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [NODE]}
                    ]}]}
                },
                "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]
            }})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod_name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}
    });
    let _: Value = pods
        .create_subresource("binding", &pod_name, &PostParams::default(), &binding)
        .await
        .unwrap();
}

async fn phase(pods: &Api<Pod>, name: &str) -> Option<String> {
    pods.get(name).await.unwrap().status.and_then(|s| s.phase)
}

async fn wait_phase(pods: &Api<Pod>, name: &str, want: &str) {
    eventually(&format!("{name} {want}"), T, || async {
        Ok((phase(pods, name).await.as_deref() == Some(want)).then_some(()))
    })
    .await
    .unwrap()
}

async fn wait_gone(pods: &Api<Pod>, name: &str) {
    eventually(&format!("{name} deleted"), T, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .unwrap()
}

/// A cluster serving resource.k8s.io/v1 with Node `NODE`, its harness node, and the stand-in
/// registered with it.
async fn setup() -> (TestCluster, HarnessNode, PathBuf, PathBuf) {
    let cluster = TestCluster::start().await.unwrap();
    // resource.k8s.io/v1 is served by default in 1.37: no --runtime-config needed.
    let req = http::Request::get("/apis/resource.k8s.io/v1")
        .body(Vec::new())
        .unwrap();
    let group = cluster.client().request_text(req).await.unwrap();
    assert!(group.contains("\"resourceclaims\""), "{group}");
    cluster
        .create_node(&NodeSpec::new(NODE).capacity("cpu", "8"))
        .await
        .unwrap();
    let node = cluster.start_harness_node(NODE).await.unwrap();
    let (calls, fail) = start_standin(&cluster, &node);
    (cluster, node, calls, fail)
}

/// The stand-in registers through the harness node's plugins_registry exactly as with a
/// kubelet; a pod with an allocated, reserved ResourceClaim is prepared and admitted with the
/// stand-in's CDI device on its container; deleting the pod unprepares the claim first.
#[tokio::test(flavor = "multi_thread")]
async fn the_kubelets_dra_manager_prepares_and_unprepares_a_claim_with_a_kubeletplugin() {
    let (cluster, node, calls_file, _) = setup().await;

    let plugin = node.wait_dra_plugin(DRIVER, T).await.unwrap();
    let endpoint = node.dra_plugin_dir(DRIVER).unwrap().join("dra.sock");
    assert_eq!(Path::new(&plugin.endpoint), endpoint, "{plugin:?}");
    assert!(
        plugin.services.iter().any(|s| s == "v1.DRAPlugin"),
        "{plugin:?}"
    );
    let registered = node
        .wait_event(0, T, |e| e.kind == "dra_plugin_registered")
        .await
        .unwrap();
    assert_eq!(registered.driver.as_deref(), Some(DRIVER));
    assert_eq!(registered.generation, 1);
    // The stand-in got the kubelet's NotifyRegistrationStatus(registered).
    eventually("dra-standin Registered", T, || async {
        Ok(calls(&calls_file)
            .iter()
            .any(|c| c["method"] == "Registered")
            .then_some(()))
    })
    .await
    .unwrap();

    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), "default");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let claim_uid = claims
        .create(&pp, &claim("claim-a"))
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let created = pods.create(&pp, &pod("dra-pod", "claim-a")).await.unwrap();
    allocate_reserve_bind(&cluster, "claim-a", "dev-0", &created).await;

    let rec = node.wait_decided(&created, T).await.unwrap();
    assert_eq!(rec.state, "admitted", "{rec:#?}");
    let dra = rec.dra.clone().unwrap();
    assert!(dra.prepared, "{rec:#?}");
    assert_eq!(dra.claims, vec!["claim-a".to_string()]);
    assert_eq!(dra.prepare_attempts, 1);
    let main = rec.container("main").unwrap();
    let cdi = format!("{DRIVER}/dev=dev-0");
    assert_eq!(main.cdi_devices, vec![cdi.clone()], "{main:#?}");
    assert_eq!(main.claims.len(), 1, "{main:#?}");
    let dev = &main.claims[0];
    assert_eq!(
        (
            dev.claim.as_str(),
            dev.driver.as_str(),
            dev.pool.as_str(),
            dev.device.as_str()
        ),
        ("claim-a", DRIVER, NODE, "dev-0")
    );
    assert_eq!(dev.cdi_device_ids, vec![cdi.clone()]);
    assert_eq!(dev.requests, vec!["dev".to_string()]);
    wait_phase(&pods, "dra-pod", "Running").await;
    let prepared = wait_call(&calls_file, "NodePrepareResources", &claim_uid).await;
    assert_eq!(prepared["name"], "claim-a");
    assert_eq!(prepared["devices"][0]["device"], "dev-0");
    assert_eq!(prepared["devices"][0]["pool"], NODE);
    node.wait_event(0, T, |e| {
        e.kind == "prepared"
            && e.claims == ["claim-a"]
            && e.uid.as_deref() == Some(rec.uid.as_str())
    })
    .await
    .unwrap();

    // Deleting the pod (grace period default): the harness unprepares the claim as the
    // kubelet's SyncTerminatingPod does, and only then deletes the pod for good.
    pods.delete("dra-pod", &DeleteParams::default())
        .await
        .unwrap();
    let unprepared = wait_call(&calls_file, "NodeUnprepareResources", &claim_uid).await;
    assert_eq!(unprepared["name"], "claim-a");
    wait_gone(&pods, "dra-pod").await;
    let gone = node
        .wait_record(&created, T, |r| r.state == "released")
        .await
        .unwrap();
    let dra = gone.dra.unwrap();
    assert!(dra.unprepared && dra.unprepare_error.is_none(), "{dra:?}");
    let ev = node
        .wait_event(0, T, |e| e.kind == "unprepared")
        .await
        .unwrap();
    assert_eq!(ev.claims, vec!["claim-a".to_string()]);
    // Prepared once, unprepared once.
    let methods: Vec<String> = calls(&calls_file)
        .iter()
        .filter(|c| c["method"] != "Registered")
        .map(|c| c["method"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        methods,
        vec!["NodePrepareResources", "NodeUnprepareResources"]
    );
}

/// A failing NodePrepareResources leaves the admitted pod Pending with the kubelet's
/// FailedPrepareDynamicResources; the retry prepares it. A kubelet restart re-registers the
/// plugin, and the new DRA manager unprepares the claim from its checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_prepare_is_retried_and_a_restart_unprepares_from_the_checkpoint() {
    let (cluster, node, calls_file, fail_file) = setup().await;
    node.wait_dra_plugin(DRIVER, T).await.unwrap();

    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), "default");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    std::fs::write(&fail_file, b"").unwrap();
    let claim_uid = claims
        .create(&pp, &claim("claim-b"))
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let created = pods
        .create(&pp, &pod("dra-pod-b", "claim-b"))
        .await
        .unwrap();
    allocate_reserve_bind(&cluster, "claim-b", "dev-1", &created).await;

    let rec = node.wait_decided(&created, T).await.unwrap();
    assert_eq!(rec.state, "prepare_failed", "{rec:#?}");
    assert!(rec.admitted);
    assert_eq!(rec.reason, "FailedPrepareDynamicResources");
    let dra = rec.dra.clone().unwrap();
    assert!(!dra.prepared);
    assert!(
        dra.prepare_error
            .as_deref()
            .unwrap_or_default()
            .contains("failing on purpose"),
        "{dra:?}"
    );
    assert!(rec.containers.is_empty(), "{rec:#?}");
    wait_call(&calls_file, "NodePrepareResources", &claim_uid).await;
    assert_eq!(phase(&pods, "dra-pod-b").await.as_deref(), Some("Pending"));

    // Still failing: the retry records the new error.
    let again = node.retry_prepare(&rec.uid).await.unwrap();
    assert_eq!(again.state, "prepare_failed");
    assert_eq!(again.dra.as_ref().unwrap().prepare_attempts, 2);

    std::fs::remove_file(&fail_file).unwrap();
    let ok = node.retry_prepare(&rec.uid).await.unwrap();
    assert_eq!(ok.state, "admitted", "{ok:#?}");
    assert_eq!(ok.dra.as_ref().unwrap().prepare_attempts, 3);
    assert_eq!(
        ok.container("main").unwrap().cdi_devices,
        vec![format!("{DRIVER}/dev=dev-1")]
    );
    wait_phase(&pods, "dra-pod-b", "Running").await;
    // A second retry has nothing to do.
    let (status, _) = node
        .request("POST", &format!("/pods/prepare?uid={}", rec.uid), None)
        .await
        .unwrap();
    assert_eq!(status, 409);

    // A kubelet restart: the new plugin manager registers the stand-in again from its socket;
    // the new DRA manager knows the prepared claim from its checkpoint.
    let since = node.events(0, Duration::ZERO).await.unwrap().len() as u64;
    assert_eq!(node.restart().await.unwrap(), 2);
    node.wait_event(since, T, |e| {
        e.kind == "dra_plugin_registered" && e.generation == 2
    })
    .await
    .unwrap();
    assert!(
        node.dra_state_dir()
            .unwrap()
            .join("dra_manager_state")
            .is_file()
    );
    pods.delete("dra-pod-b", &DeleteParams::default())
        .await
        .unwrap();
    wait_call(&calls_file, "NodeUnprepareResources", &claim_uid).await;
    wait_gone(&pods, "dra-pod-b").await;
    let ev = node
        .wait_event(since, T, |e| e.kind == "unprepared")
        .await
        .unwrap();
    assert_eq!(ev.generation, 2);
}
