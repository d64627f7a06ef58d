//! The control plane itself: version, RBAC through impersonation, Node objects.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn apiserver_version_rbac_and_nodes() {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client();

    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.37.2");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "37")
    );

    let node = cluster
        .create_node(
            &NodeSpec::new("n1")
                .capacity("cpu", "8")
                .capacity("memory", "32Gi")
                .capacity("example.com/gpu", "4")
                .label("topology.kubernetes.io/zone", "z1"),
        )
        .await
        .unwrap();
    let status = node.status.unwrap();
    let alloc = status.allocatable.unwrap();
    assert_eq!(alloc["cpu"].0, "8");
    assert_eq!(alloc["example.com/gpu"].0, "4");
    assert_eq!(alloc["pods"].0, "110");
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels["topology.kubernetes.io/zone"], "z1");
    assert_eq!(labels["kubernetes.io/hostname"], "n1");
    // TaintNodesByCondition is off: no not-ready taint.
    assert!(node.spec.unwrap().taints.unwrap_or_default().is_empty());

    // A ServiceAccount may not list nodes until RBAC says so.
    let sa = cluster
        .service_account_client("default", "reader")
        .await
        .unwrap();
    let sa_nodes: Api<Node> = Api::all(sa);
    match sa_nodes.list(&Default::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("expected 403, got {other:?}"),
    }
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "node-lister"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "reader-lists-nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-lister"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &crb)
        .await
        .unwrap();
    let names = fumarole_e2e::cluster::eventually("RBAC to allow", Duration::from_secs(10), || {
        let sa_nodes = sa_nodes.clone();
        async move {
            Ok(sa_nodes.list(&Default::default()).await.ok().map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|n| n.metadata.name)
                    .collect::<Vec<_>>()
            }))
        }
    })
    .await
    .unwrap();
    assert_eq!(names, vec!["n1".to_string()]);

    // The binding is for that ServiceAccount only: another one, and a plain
    // user, still get 403.
    for client in [
        cluster
            .service_account_client("default", "other")
            .await
            .unwrap(),
        cluster.client_as("nobody", &["some-group"]).await.unwrap(),
    ] {
        match Api::<Node>::all(client).get("n1").await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
            other => panic!("expected 403, got {other:?}"),
        }
    }
}
