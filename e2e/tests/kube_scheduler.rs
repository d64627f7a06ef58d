//! kube-scheduler (upstream, unmodified) binds to the only node that fits.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use fumarole_e2e::cluster::eventually;
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn kube_scheduler_binds_pod_to_only_node_that_fits() {
    let cluster = TestCluster::start().await.unwrap();
    for (name, cpu, gpus) in [
        ("small-1", "2", "0"),
        ("big", "16", "4"),
        ("small-2", "2", "8"),
    ] {
        cluster
            .create_node(
                &NodeSpec::new(name)
                    .capacity("cpu", cpu)
                    .capacity("memory", "64Gi")
                    .capacity("example.com/gpu", gpus),
            )
            .await
            .unwrap();
    }
    cluster
        .start_kube_scheduler(
            "apiVersion: kubescheduler.config.k8s.io/v1\n\
             kind: KubeSchedulerConfiguration\n\
             profiles:\n- schedulerName: default-scheduler\n",
        )
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "needs-big"},
        "spec": {"containers": [{
            "name": "c", "image": "example.invalid/none",
            "resources": {"requests": {"cpu": "4", "example.com/gpu": "2"},
                          "limits": {"example.com/gpu": "2"}}
        }]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // A pod nothing can hold stays pending.
    let too_big: Pod = serde_json::from_value(json!({
        "metadata": {"name": "too-big"},
        "spec": {"containers": [{
            "name": "c", "image": "example.invalid/none",
            "resources": {"requests": {"cpu": "32"}}
        }]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &too_big).await.unwrap();

    let node = eventually("needs-big to be bound", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { Ok(pods.get("needs-big").await?.spec.and_then(|s| s.node_name)) }
    })
    .await
    .unwrap();
    assert_eq!(node, "big");

    let unschedulable = eventually(
        "too-big to be marked unschedulable",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("too-big").await?;
                assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.clone()), None);
                let cond = p
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False");
                Ok(cond.and_then(|c| c.reason))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(unschedulable, "Unschedulable");
}
