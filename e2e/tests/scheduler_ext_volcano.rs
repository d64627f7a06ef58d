//! Real Volcano (vc-scheduler with its `extender` plugin) and fumarole-scheduler-ext, the
//! cluster view from the committed snapshot `scheduler-ext/tests/snapshots/two-dgx` (dgx-a: 4
//! free GPUs, dgx-b: 6 free, pcie-a: 3 free). The API server's nodes all advertise enough
//! `nvidia.com/gpu`, so only the extender tells them apart: a 4-GPU pod goes to dgx-a.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use fumarole_e2e::cluster::{eventually, volcano_conf};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use scheduler_ext::volcano::VOLCANO_PREFIX;
use serde_json::json;

#[tokio::test]
async fn volcano_puts_four_gpu_pod_where_it_fits_exactly() {
    let (cluster, port) = common::two_dgx_with_extender().await;

    cluster
        .start_volcano(&volcano_conf(&format!(
            "  - name: extender\n    arguments:\n      extender.urlPrefix: http://127.0.0.1:{port}{VOLCANO_PREFIX}\n      extender.httpTimeout: 1s\n      extender.predicateVerb: predicate\n      extender.prioritizeVerb: prioritize\n"
        )))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "four"},
        "spec": {
            "schedulerName": "volcano",
            "containers": [{
                "name": "c", "image": "example.invalid/none",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": "4"}}
            }]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let node = eventually("four to be bound", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move { Ok(pods.get("four").await?.spec.and_then(|s| s.node_name)) }
    })
    .await
    .unwrap();
    assert_eq!(node, "dgx-a");
    // Every extender call succeeded (Volcano logs failed ones and carries on).
    let log = cluster.log_tail("vc-scheduler", 2000).unwrap();
    for failure in ["Predicate failed", "Prioritize failed"] {
        assert!(
            !log.contains(failure),
            "{failure} in vc-scheduler log:\n{log}"
        );
    }
}
