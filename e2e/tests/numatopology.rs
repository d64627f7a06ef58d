//! Volcano's Numatopology CRD schema is enforced by the apiserver.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fumarole_e2e::TestCluster;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

fn numatopology(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeinfo.volcano.sh/v1alpha1",
        "kind": "Numatopology",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn numatopology_schema_rejects_invalid_and_round_trips_valid() {
    let cluster = TestCluster::start().await.unwrap();
    let names = cluster.install_volcano_crds().await.unwrap();
    for crd in [
        "numatopologies.nodeinfo.volcano.sh",
        "podgroups.scheduling.volcano.sh",
        "queues.scheduling.volcano.sh",
        "hypernodes.topology.volcano.sh",
    ] {
        assert!(names.iter().any(|n| n == crd), "{crd} not in {names:?}");
    }
    let nrt = cluster.install_nrt_crd().await.unwrap();
    assert_eq!(
        nrt,
        vec!["noderesourcetopologies.topology.node.k8s.io".to_string()]
    );

    let gvk = GroupVersionKind::gvk("nodeinfo.volcano.sh", "v1alpha1", "Numatopology");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "numatopologies");
    let api: Api<DynamicObject> = Api::all_with(cluster.client(), &ar);

    // A negative NUMA id violates `minimum: 0`.
    let bad = numatopology(
        "bad-negative",
        json!({"cpuDetail": {"0": {"core": 0, "socket": 0, "numa": -1}}}),
    );
    match api.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("spec.cpuDetail.0.numa"), "{}", e.message);
        }
        other => panic!("negative numa id accepted: {other:?}"),
    }
    // capacity must be an integer.
    let bad = numatopology(
        "bad-type",
        json!({"numares": {"cpu": {"allocatable": "0-3", "capacity": "four"}}}),
    );
    match api.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(
                e.message.contains("spec.numares.cpu.capacity"),
                "{}",
                e.message
            );
        }
        other => panic!("string capacity accepted: {other:?}"),
    }

    let spec = json!({
        "policies": {"CPUManagerPolicy": "static", "TopologyManagerPolicy": "single-numa-node"},
        "resReserved": {"cpu": "1", "memory": "1Gi"},
        "numares": {
            "cpu": {"allocatable": "1-3,5-7", "capacity": 8},
            "nvidia.com/gpu": {"allocatable": "0-1", "capacity": 2}
        },
        "cpuDetail": {
            "0": {"core": 0, "socket": 0, "numa": 0},
            "4": {"core": 0, "socket": 1, "numa": 1}
        }
    });
    api.create(
        &PostParams::default(),
        &numatopology("node-a", spec.clone()),
    )
    .await
    .unwrap();
    let got = api.get("node-a").await.unwrap();
    assert_eq!(got.data["spec"], spec);
}
