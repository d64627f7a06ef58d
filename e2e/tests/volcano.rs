//! Volcano (scheduler + controller-manager) binds a plain pod with
//! `schedulerName: volcano`; its controller makes the PodGroup.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use fumarole_e2e::cluster::{eventually, volcano_conf};
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

#[tokio::test]
async fn volcano_binds_plain_pod_via_podgroup() {
    let cluster = TestCluster::start().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new("tiny")
                .capacity("cpu", "1")
                .capacity("memory", "4Gi"),
        )
        .await
        .unwrap();
    cluster
        .create_node(
            &NodeSpec::new("roomy")
                .capacity("cpu", "16")
                .capacity("memory", "64Gi"),
        )
        .await
        .unwrap();
    cluster
        .start_volcano(&volcano_conf("  - name: binpack\n"))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "vc-pod"},
        "spec": {
            "schedulerName": "volcano",
            "containers": [{
                "name": "c", "image": "example.invalid/none",
                "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}
            }]
        }
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let uid = created.metadata.uid.unwrap();

    // The pg-controller makes a PodGroup owned by the pod.
    let gvk = GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup");
    let pgs: Api<DynamicObject> = Api::namespaced_with(
        cluster.client(),
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, "podgroups"),
    );
    let pg = eventually("a PodGroup for vc-pod", Duration::from_secs(60), || {
        let pgs = pgs.clone();
        let uid = uid.clone();
        async move {
            Ok(pgs
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .find(|pg| {
                    pg.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == uid && o.kind == "Pod")
                }))
        }
    })
    .await
    .unwrap();
    assert_eq!(pg.data["spec"]["minMember"], 1);

    let node = eventually("vc-pod to be bound", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move { Ok(pods.get("vc-pod").await?.spec.and_then(|s| s.node_name)) }
    })
    .await
    .unwrap();
    assert_eq!(node, "roomy");

    // The default queue exists (created by vc-scheduler) and the group ran.
    let phase = eventually("PodGroup to be Running", Duration::from_secs(60), || {
        let pgs = pgs.clone();
        let name = pg.metadata.name.clone().unwrap();
        async move {
            let pg = pgs.get(&name).await?;
            Ok(pg.data["status"]["phase"]
                .as_str()
                .filter(|p| *p == "Running")
                .map(str::to_string))
        }
    })
    .await;
    assert_eq!(phase.unwrap(), "Running");
}
