//! Real kube-scheduler with fumarole-scheduler-ext as its extender, the cluster view from the
//! committed snapshot `scheduler-ext/tests/snapshots/two-dgx` (dgx-a: 4 free GPUs, dgx-b: 6
//! free, pcie-a: 3 free). The API server's nodes all advertise enough `nvidia.com/gpu`, so only
//! the extender tells them apart: a 4-GPU pod goes to dgx-a, where it fits exactly; a 7-GPU pod
//! stays pending with our reason in its condition.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use fumarole_e2e::cluster::eventually;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use scheduler_ext::extender::KUBE_PREFIX;
use serde_json::json;

fn gpu_pod(name: &str, gpus: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{
            "name": "c", "image": "example.invalid/none",
            "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": gpus}}
        }]}
    }))
    .unwrap()
}

#[tokio::test]
async fn four_gpu_pod_goes_where_it_fits_exactly() {
    let (cluster, port) = common::two_dgx_with_extender().await;

    cluster
        .start_kube_scheduler(&format!(
            "apiVersion: kubescheduler.config.k8s.io/v1\n\
             kind: KubeSchedulerConfiguration\n\
             extenders:\n\
             - urlPrefix: http://127.0.0.1:{port}{KUBE_PREFIX}\n\
             \x20 filterVerb: filter\n\
             \x20 prioritizeVerb: prioritize\n\
             \x20 nodeCacheCapable: true\n\
             \x20 weight: 5\n\
             \x20 managedResources:\n\
             \x20 - name: nvidia.com/gpu\n\
             \x20   ignoredByScheduler: false\n"
        ))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.create(&PostParams::default(), &gpu_pod("four", "4"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &gpu_pod("seven", "7"))
        .await
        .unwrap();

    let node = eventually("four to be bound", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { Ok(pods.get("four").await?.spec.and_then(|s| s.node_name)) }
    })
    .await
    .unwrap();
    assert_eq!(node, "dgx-a");

    let message = eventually(
        "seven to be marked unschedulable",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("seven").await?;
                assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.clone()), None);
                Ok(p.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                    .and_then(|c| c.message))
            }
        },
    )
    .await
    .unwrap();
    assert!(
        message.contains("needs 7 nvidia.com/gpu, 6 free"),
        "{message}"
    );
}
