//! Shipping fumarole's kube-scheduler plugin: `deploy/kube-plugin` and the chart's
//! `kubePlugin.enabled` against the real API server.
//!
//! The manifests pass a server-side dry run and the chart renders the same objects; the
//! plugin's own ClusterRole is no broader than the extender's. Then `kube-scheduler-fumarole`
//! runs with the shipped configuration as the shipped ServiceAccount, with only the shipped
//! rights, leader election on, and deploy/daemonset's device-choice policy in force: it binds a
//! pod that names it with its devices in the Binding.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use fumarole_e2e::cluster::{Identity, eventually};
use fumarole_e2e::deploy::{apply, deploy_dir, grants, kustomization, must, pick, render_chart};
use fumarole_topology::crd::DeviceTopology;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "fumarole-system";
const ACCOUNT: &str = "fumarole-kube-scheduler";
const CONFIG_MAP: &str = "fumarole-kube-scheduler-config";

fn plugin_dir() -> std::path::PathBuf {
    deploy_dir().join("kube-plugin")
}

/// The KubeSchedulerConfiguration a ConfigMap of the plugin's carries.
fn configuration(config_map: &Value) -> Value {
    serde_norway::from_str(config_map["data"]["config.yaml"].as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_plugin_manifests_and_chart_option_agree_and_apply() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    cluster.create_namespace(NAMESPACE).await.unwrap();

    let objects = kustomization(&plugin_dir()).unwrap();
    for entry in std::fs::read_dir(plugin_dir()).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().to_string();
        if file != "kustomization.yaml" {
            assert!(
                objects
                    .iter()
                    .any(|(name, _)| name.starts_with(&format!("{file}:"))),
                "{file} is not listed in deploy/kube-plugin/kustomization.yaml"
            );
        }
    }
    for (name, object) in &objects {
        if let Err(e) = apply(&client, object, true).await {
            panic!("{name}: server-side dry-run apply failed: {e}");
        }
    }

    // One profile, fumarole-scheduler, binding through Fumarole before DefaultBinder.
    let config = configuration(must(&objects, "ConfigMap", CONFIG_MAP));
    let profile = &config["profiles"][0];
    assert_eq!(profile["schedulerName"], "fumarole-scheduler");
    assert_eq!(
        profile["plugins"]["multiPoint"]["enabled"][0]["name"],
        "Fumarole"
    );
    assert_eq!(
        profile["plugins"]["bind"]["enabled"],
        json!([{"name": "Fumarole"}, {"name": "DefaultBinder"}])
    );
    assert_eq!(config["leaderElection"]["resourceNamespace"], NAMESPACE);
    let deployment = must(&objects, "Deployment", ACCOUNT);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], ACCOUNT);
    assert_eq!(pod["volumes"][0]["configMap"]["name"], CONFIG_MAP);

    // The plugin's own rights are the extender's reads and the pod patch (the job
    // annotations before a Binding); binding is kube-scheduler's own right.
    let role = must(&objects, "ClusterRole", "fumarole-kube-plugin");
    let daemonset = kustomization(&deploy_dir().join("daemonset")).unwrap();
    let extender = grants(must(&daemonset, "ClusterRole", "fumarole-scheduler-ext"));
    let beyond: Vec<_> = grants(role).difference(&extender).cloned().collect();
    assert!(
        beyond.is_empty(),
        "beyond the extender's rights: {beyond:?}"
    );

    // deploy/daemonset's device-choice policy admits the plugin's ServiceAccount.
    let policy = must(
        &daemonset,
        "ValidatingAdmissionPolicy",
        "fumarole-device-choice-writers",
    );
    let admits = |policy: &Value| {
        policy["spec"]["matchConditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| {
                c["expression"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("'system:serviceaccount:{NAMESPACE}:{ACCOUNT}'"))
            })
    };
    assert!(admits(policy));

    // The chart: nothing by default; with kubePlugin.enabled the same objects (labels aside),
    // also with the extender off, and they apply.
    let chart = render_chart(&[]).unwrap();
    assert!(pick(&chart, "Deployment", ACCOUNT).is_none());
    for values in [
        &["kubePlugin.enabled=true"][..],
        &["kubePlugin.enabled=true", "schedulerExt.enabled=false"][..],
    ] {
        let rendered = render_chart(values).unwrap();
        for (kind, name) in [
            ("ClusterRole", "fumarole-kube-plugin"),
            ("ClusterRoleBinding", "fumarole-kube-plugin"),
            (
                "ClusterRoleBinding",
                "fumarole-kube-scheduler-as-kube-scheduler",
            ),
            ("Role", "fumarole-kube-scheduler-leader"),
        ] {
            let (ours, theirs) = (must(&objects, kind, name), must(&rendered, kind, name));
            for field in ["rules", "roleRef", "subjects"] {
                assert_eq!(
                    ours[field], theirs[field],
                    "{values:?} {kind} {name} {field}"
                );
            }
        }
        assert_eq!(
            configuration(must(&rendered, "ConfigMap", CONFIG_MAP)),
            config,
            "{values:?}"
        );
        assert_eq!(
            must(&rendered, "Deployment", ACCOUNT)["spec"]["template"]["spec"]["containers"],
            pod["containers"],
            "{values:?}"
        );
        assert!(admits(must(
            &rendered,
            "ValidatingAdmissionPolicy",
            "fumarole-device-choice-writers"
        )));
        for (name, object) in &rendered {
            if let Err(e) = apply(&client, object, true).await {
                panic!("{values:?} {name}: server-side dry-run apply failed: {e}");
            }
        }
    }
}

/// The shipped scheduler, as shipped: its configuration, ServiceAccount and rights, leader
/// election on, deploy/daemonset's policy in force. A 4-GPU pod naming fumarole-scheduler goes
/// where it fits exactly, bound with its devices.
#[tokio::test(flavor = "multi_thread")]
async fn kube_plugin_binds_a_pod_as_its_service_account_with_the_shipped_rights() {
    let cluster = common::cluster().await;
    common::publish(&cluster, &common::two_dgx()).await;
    let admin = cluster.client();
    cluster.install_deploy_daemonset().await.unwrap();
    let identity = Identity::service_account(NAMESPACE, ACCOUNT);
    let topologies: Api<DeviceTopology> = Api::all(cluster.client_for(&identity).await.unwrap());
    // Before the manifests the account may not read fumarole's objects.
    match topologies.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("listing DeviceTopologies before deploy/kube-plugin: {other:?}"),
    }
    let objects = kustomization(&plugin_dir()).unwrap();
    for (name, object) in &objects {
        if object["kind"] != "Deployment" {
            apply(&admin, object, false)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    // RBAC follows new bindings within moments.
    eventually(
        "the ServiceAccount may list DeviceTopologies",
        Duration::from_secs(30),
        || {
            let topologies = topologies.clone();
            async move { Ok(topologies.list(&ListParams::default()).await.ok().map(drop)) }
        },
    )
    .await
    .unwrap();
    let kubeconfig = cluster
        .kubeconfig_for("fumarole-kube-scheduler.kubeconfig", &identity)
        .unwrap();
    let config = must(&objects, "ConfigMap", CONFIG_MAP)["data"]["config.yaml"]
        .as_str()
        .unwrap();
    cluster
        .start_scheduler_program_as(
            ACCOUNT,
            &fumarole_e2e::fumarole::kube_plugin_bin().unwrap(),
            config,
            Some(&kubeconfig),
            &[],
        )
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "four"},
        "spec": {"schedulerName": "fumarole-scheduler", "containers": [{
            "name": "c", "image": "example.invalid/none",
            "resources": {"limits": {"nvidia.com/gpu": "4"}}
        }]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let placed = common::placed(&pods, "four").await.unwrap_or_else(|e| {
        panic!(
            "{e}\n{ACCOUNT}:\n{}",
            cluster.log_tail(ACCOUNT, 80).unwrap_or_default()
        )
    });
    assert_eq!(placed.1.0, "dgx-a");
    assert_eq!(
        placed.1.1,
        ["dgx-a-gpu4", "dgx-a-gpu5", "dgx-a-gpu6", "dgx-a-gpu7"]
    );
    let log = cluster.log_tail(ACCOUNT, 4000).unwrap();
    assert!(!log.contains("forbidden"), "{log}");
}
