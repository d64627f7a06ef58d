//! Shipping fumarole's Volcano plugin: `deploy/volcano-plugin` and the chart's
//! `volcanoPlugin.enabled` against the real API server and Volcano v1.10.0's own installer
//! (`installer/volcano-development.yaml` of the Go module the e2e builds Volcano from).
//!
//! The manifests pass a server-side dry run, the chart renders the same RBAC, no broader than
//! the extender's, the example ConfigMap is the seeds' configuration byte for byte, and the
//! image patch switches the image of Volcano's own scheduler Deployment and nothing else. Then
//! `vc-scheduler-fumarole` places a pod acting as Volcano's scheduler ServiceAccount with only
//! Volcano's ClusterRole and ours: Volcano's alone cannot read fumarole's objects.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use fumarole_e2e::cluster::{Identity, eventually};
use fumarole_e2e::deploy::{
    apply, deploy_dir, documents, grants, kustomization, must, pick, render_chart,
    volcano_installer_file,
};
use fumarole_topology::crd::DeviceTopology;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const VOLCANO_NAMESPACE: &str = "volcano-system";
/// Volcano's scheduler ServiceAccount, Deployment and container, as its installer names them.
const VOLCANO_SCHEDULER: &str = "volcano-scheduler";

fn plugin_dir() -> std::path::PathBuf {
    deploy_dir().join("volcano-plugin")
}

/// Volcano v1.10.0's own install (its development manifest, rendered from its chart).
fn volcano_install() -> Vec<(String, Value)> {
    documents(&volcano_installer_file("volcano-development.yaml").unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_manifests_and_chart_option_grant_the_same_rights_and_match_volcanos_install() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    // Namespaced objects need their namespaces for a dry run (the chart's own: Helm creates it).
    cluster.create_namespace(VOLCANO_NAMESPACE).await.unwrap();
    cluster.create_namespace("fumarole-system").await.unwrap();

    // Everything in deploy/volcano-plugin is in its kustomization, but the patch of Volcano's
    // own Deployment.
    let objects = kustomization(&plugin_dir()).unwrap();
    for entry in std::fs::read_dir(plugin_dir()).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().to_string();
        if file != "kustomization.yaml" && file != "scheduler-image-patch.yaml" {
            assert!(
                objects
                    .iter()
                    .any(|(name, _)| name.starts_with(&format!("{file}:"))),
                "{file} is not listed in deploy/volcano-plugin/kustomization.yaml"
            );
        }
    }
    assert_eq!(objects.len(), 5, "{:?}", objects.iter().map(|(n, _)| n));
    for (name, object) in &objects {
        if let Err(e) = apply(&client, object, true).await {
            panic!("{name}: server-side dry-run apply failed: {e}");
        }
    }

    // The example ConfigMap is the seeds' configuration as written, under the name and key
    // Volcano's installer mounts as --scheduler-conf.
    let install = volcano_install();
    let deployment = must(&install, "Deployment", VOLCANO_SCHEDULER);
    assert_eq!(deployment["metadata"]["namespace"], VOLCANO_NAMESPACE);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccount"], VOLCANO_SCHEDULER);
    let container = &pod["containers"][0];
    assert_eq!(container["name"], VOLCANO_SCHEDULER);
    let conf_arg = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--scheduler-conf="))
        .next()
        .unwrap();
    let (dir, key) = conf_arg.rsplit_once('/').unwrap();
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap();
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let config_map = volume["configMap"]["name"].as_str().unwrap();
    let ours = must(&objects, "ConfigMap", config_map);
    assert_eq!(ours["metadata"]["namespace"], VOLCANO_NAMESPACE);
    assert_eq!(
        ours["data"][key].as_str(),
        Some(fumarole_e2e::fumarole::SEED_VOLCANO_CONF)
    );

    // The binding names the ServiceAccount Volcano's installer creates.
    let binding = must(&objects, "ClusterRoleBinding", "fumarole-volcano-plugin");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": VOLCANO_SCHEDULER, "namespace": VOLCANO_NAMESPACE}])
    );
    let account = must(&install, "ServiceAccount", VOLCANO_SCHEDULER);
    assert_eq!(account["metadata"]["namespace"], VOLCANO_NAMESPACE);

    // The plugin's rights are the extender's reads and the pod patch it writes the device
    // choice with: no binding, no Node writes, no Events.
    let role = must(&objects, "ClusterRole", "fumarole-volcano-plugin");
    let plugin_grants = grants(role);
    let daemonset = kustomization(&deploy_dir().join("daemonset")).unwrap();
    let extender_grants = grants(must(&daemonset, "ClusterRole", "fumarole-scheduler-ext"));
    let beyond: Vec<_> = plugin_grants.difference(&extender_grants).collect();
    assert!(
        beyond.is_empty(),
        "beyond the extender's rights: {beyond:?}"
    );
    for absent in [
        " pods/binding create",
        " nodes patch",
        " nodes/status patch",
        "events.k8s.io events create",
    ] {
        assert!(!plugin_grants.contains(absent), "{absent} granted");
    }
    assert!(plugin_grants.contains(" pods patch"), "{plugin_grants:?}");
    assert!(
        plugin_grants.contains("topology.fumarole.dev devicetopologies watch"),
        "{plugin_grants:?}"
    );

    // The device-choice policy replacing deploy/daemonset's is the same policy admitting one
    // more writer, Volcano's scheduler ServiceAccount.
    const CHOICE_POLICY: &str = "fumarole-device-choice-writers";
    let replacement = &must(&objects, "ValidatingAdmissionPolicy", CHOICE_POLICY)["spec"];
    let original = &must(&daemonset, "ValidatingAdmissionPolicy", CHOICE_POLICY)["spec"];
    let condition_names = |spec: &Value| -> Vec<String> {
        spec["matchConditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    let mut admitted = replacement["matchConditions"].as_array().unwrap().clone();
    let added = admitted.remove(2);
    assert_eq!(
        added,
        json!({"name": "not-the-volcano-plugin",
               "expression": "request.userInfo.username != 'system:serviceaccount:volcano-system:volcano-scheduler'"})
    );
    assert_eq!(json!(admitted), original["matchConditions"]);
    let without_message = |spec: &Value| {
        let mut spec = spec.clone();
        spec.as_object_mut().unwrap().remove("matchConditions");
        spec["validations"][0]
            .as_object_mut()
            .unwrap()
            .remove("message");
        spec
    };
    assert_eq!(without_message(replacement), without_message(original));
    assert_eq!(
        must(&objects, "ValidatingAdmissionPolicyBinding", CHOICE_POLICY)["spec"],
        must(
            &daemonset,
            "ValidatingAdmissionPolicyBinding",
            CHOICE_POLICY
        )["spec"]
    );

    // The chart: nothing by default; with volcanoPlugin.enabled the same ClusterRole and
    // binding and device-choice policy, also with the extender off, and they apply.
    let chart = render_chart(&[]).unwrap();
    assert!(pick(&chart, "ClusterRole", "fumarole-volcano-plugin").is_none());
    assert!(pick(&chart, "ClusterRoleBinding", "fumarole-volcano-plugin").is_none());
    assert!(
        !condition_names(&must(&chart, "ValidatingAdmissionPolicy", CHOICE_POLICY)["spec"])
            .contains(&"not-the-volcano-plugin".to_string())
    );
    for values in [
        &["volcanoPlugin.enabled=true"][..],
        &["volcanoPlugin.enabled=true", "schedulerExt.enabled=false"][..],
    ] {
        let rendered = render_chart(values).unwrap();
        assert_eq!(
            must(&rendered, "ClusterRole", "fumarole-volcano-plugin")["rules"],
            role["rules"],
            "{values:?}"
        );
        let chart_binding = must(&rendered, "ClusterRoleBinding", "fumarole-volcano-plugin");
        for field in ["roleRef", "subjects"] {
            assert_eq!(chart_binding[field], binding[field], "{values:?} {field}");
        }
        for (name, object) in &rendered {
            if let Err(e) = apply(&client, object, true).await {
                panic!("{values:?} {name}: server-side dry-run apply failed: {e}");
            }
        }
        let extender = pick(&rendered, "Deployment", "fumarole-scheduler-ext").is_some();
        assert_eq!(extender, !values.contains(&"schedulerExt.enabled=false"));
        let policy = &must(&rendered, "ValidatingAdmissionPolicy", CHOICE_POLICY)["spec"];
        if extender {
            assert_eq!(policy, replacement, "{values:?}");
        } else {
            assert_eq!(
                condition_names(policy),
                ["not-the-volcano-plugin", "not-a-cluster-admin"],
                "{values:?}"
            );
        }
        assert!(pick(&rendered, "ValidatingAdmissionPolicyBinding", CHOICE_POLICY).is_some());
    }
    // The ServiceAccount and namespace are values.
    let elsewhere = render_chart(&[
        "volcanoPlugin.enabled=true",
        "volcanoPlugin.schedulerServiceAccount=vc-sched",
        "volcanoPlugin.volcanoNamespace=batch-system",
    ])
    .unwrap();
    assert_eq!(
        must(&elsewhere, "ClusterRoleBinding", "fumarole-volcano-plugin")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "vc-sched", "namespace": "batch-system"}])
    );
    assert_eq!(
        must(&elsewhere, "ValidatingAdmissionPolicy", CHOICE_POLICY)["spec"]["matchConditions"][2]
            ["expression"],
        "request.userInfo.username != 'system:serviceaccount:batch-system:vc-sched'"
    );

    // The image patch, applied as `kubectl patch` does (strategic merge) to Volcano's own
    // scheduler Deployment, changes its image and keeps its arguments and configuration.
    apply(&client, deployment, false).await.unwrap();
    let patch = documents(&plugin_dir().join("scheduler-image-patch.yaml")).unwrap();
    assert_eq!(patch.len(), 1);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), VOLCANO_NAMESPACE);
    let before = serde_json::to_value(deployments.get(VOLCANO_SCHEDULER).await.unwrap()).unwrap();
    let after = deployments
        .patch(
            VOLCANO_SCHEDULER,
            &PatchParams::default(),
            &Patch::Strategic(&patch[0].1),
        )
        .await
        .unwrap();
    let after = serde_json::to_value(after).unwrap();
    let containers = |d: &Value| d["spec"]["template"]["spec"]["containers"].clone();
    assert_eq!(containers(&after).as_array().unwrap().len(), 1);
    let image = containers(&after)[0]["image"].as_str().unwrap().to_string();
    assert!(
        image.starts_with("ghcr.io/fumarole-dev/vc-scheduler-fumarole:"),
        "{image}"
    );
    let mut expected = containers(&before);
    expected[0]["image"] = json!(image);
    assert_eq!(containers(&after), expected);
    assert_eq!(
        after["spec"]["template"]["spec"]["volumes"],
        before["spec"]["template"]["spec"]["volumes"]
    );

    // The configuration (and the extender's token) from a Secret: the same volume, now a
    // Secret's, mounted where the scheduler reads its file; nothing else changes.
    let from_secret =
        documents(&deploy_dir().join("daemonset/examples/volcano-scheduler-conf-from-secret.yaml"))
            .unwrap();
    let secret_sourced = deployments
        .patch(
            VOLCANO_SCHEDULER,
            &PatchParams::default(),
            &Patch::Strategic(&from_secret[0].1),
        )
        .await
        .unwrap();
    let secret_sourced = serde_json::to_value(secret_sourced).unwrap();
    let volumes = secret_sourced["spec"]["template"]["spec"]["volumes"].clone();
    let config = volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "scheduler-config")
        .unwrap();
    assert_eq!(
        config["secret"]["secretName"], "volcano-scheduler-conf",
        "{volumes}"
    );
    assert!(config.get("configMap").is_none(), "{volumes}");
    assert_eq!(containers(&secret_sourced), containers(&after));
    let args = containers(&secret_sourced)[0]["args"].to_string();
    assert!(
        args.contains("--scheduler-conf=/volcano.scheduler/volcano-scheduler.conf"),
        "{args}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_places_a_pod_as_volcanos_scheduler_service_account_with_our_clusterrole() {
    let cluster = common::cluster().await;
    common::publish(&cluster, &common::two_dgx()).await;
    let admin = cluster.client();
    cluster.create_namespace(VOLCANO_NAMESPACE).await.unwrap();
    // fumarole as installed before switching: deploy/daemonset, with its device-choice policy
    // (nothing runs its pods: there is no controller manager for them).
    cluster.install_deploy_daemonset().await.unwrap();

    // Volcano's own scheduler ServiceAccount and rights, as its installer creates them.
    let install = volcano_install();
    for (kind, name) in [
        ("ServiceAccount", VOLCANO_SCHEDULER),
        ("ClusterRole", VOLCANO_SCHEDULER),
        ("ClusterRoleBinding", "volcano-scheduler-role"),
    ] {
        apply(&admin, must(&install, kind, name), false)
            .await
            .unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
    }
    let identity = Identity::service_account(VOLCANO_NAMESPACE, VOLCANO_SCHEDULER);
    let as_scheduler = cluster.client_for(&identity).await.unwrap();
    // Volcano's rights alone do not reach fumarole's objects.
    let topologies: Api<DeviceTopology> = Api::all(as_scheduler.clone());
    match topologies.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("listing DeviceTopologies with Volcano's rights: {other:?}"),
    }

    // Ours (after deploy/daemonset: its device-choice policy replaced), then fumarole's
    // scheduler with the ConfigMap's configuration, as that account.
    let objects = kustomization(&plugin_dir()).unwrap();
    for (name, object) in &objects {
        apply(&admin, object, false)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
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
    // A user who may patch pods: the policy holds for her before and after the replacement.
    let alice = Identity::user("alice", &["system:authenticated"]);
    for object in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "pod-editor", "namespace": "default"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "pod-editor", "namespace": "default"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-editor"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}),
    ] {
        apply(&admin, &object, false).await.unwrap();
    }
    let alice_pods: Api<Pod> =
        Api::namespaced(cluster.client_for(&alice).await.unwrap(), "default");
    // The replaced device-choice policy is in force (policies reach the API server's admission
    // a moment after they change): a dry-run choice on a pod passes for the account and is
    // refused to alice with the new policy's words (a pass alone could also be a moment with
    // no policy in force).
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "example.invalid/none"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &probe).await.unwrap();
    let pods_as_scheduler: Api<Pod> = Api::namespaced(as_scheduler.clone(), "default");
    eventually(
        "the replaced device-choice policy in force",
        Duration::from_secs(30),
        || {
            let pods = pods_as_scheduler.clone();
            let alice_pods = alice_pods.clone();
            async move {
                let choice =
                    json!({"metadata": {"annotations": {"fumarole.dev/devices": "probe"}}});
                let params = PatchParams {
                    dry_run: true,
                    ..Default::default()
                };
                let patched = pods.patch("probe", &params, &Patch::Merge(&choice)).await;
                let hers = alice_pods
                    .patch("probe", &params, &Patch::Merge(&choice))
                    .await;
                let refused = matches!(&hers, Err(kube::Error::Api(e))
                    if e.code == 403 && e.message.contains("only fumarole's schedulers"));
                Ok((patched.is_ok() && refused).then_some(()))
            }
        },
    )
    .await
    .unwrap();
    pods.delete("probe", &Default::default()).await.unwrap();
    let conf = must(&objects, "ConfigMap", "volcano-scheduler-configmap")["data"]
        ["volcano-scheduler.conf"]
        .as_str()
        .unwrap();
    let kubeconfig = cluster
        .kubeconfig_for("volcano-scheduler.kubeconfig", &identity)
        .unwrap();
    let scheduler = fumarole_e2e::fumarole::volcano_plugin_bin().unwrap();
    cluster
        .start_volcano_as(&scheduler, conf, &kubeconfig)
        .await
        .unwrap();

    // Its whole job: a 4-GPU pod placed on the node where it fits exactly, with its devices
    // written on the pod.
    let pod = common::volcano_gpu_pod("four", 4);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let placed = common::placed(&pods, "four").await.unwrap_or_else(|e| {
        panic!(
            "{e}\nvc-scheduler:\n{}",
            cluster.log_tail("vc-scheduler", 80).unwrap_or_default()
        )
    });
    assert_eq!(placed.1.0, "dgx-a");
    assert_eq!(
        placed.1.1,
        ["dgx-a-gpu4", "dgx-a-gpu5", "dgx-a-gpu6", "dgx-a-gpu7"]
    );
    let log = cluster.log_tail("vc-scheduler", 4000).unwrap();
    for refusal in ["forbidden", "fumarole is not ready", "fumarole panicked"] {
        assert!(
            !log.to_lowercase().contains(refusal),
            "{refusal} in vc-scheduler log:\n{log}"
        );
    }

    // The policy still holds for everyone else: alice may not change the device choice the
    // plugin wrote.
    eventually("alice may patch pods", Duration::from_secs(10), || async {
        let label = json!({"metadata": {"labels": {"team": "ml"}}});
        Ok(alice_pods
            .patch("four", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .ok()
            .map(drop))
    })
    .await
    .unwrap();
    let choice = json!({"metadata": {"annotations": {"fumarole.dev/devices": "dgx-a-gpu0"}}});
    match alice_pods
        .patch("four", &PatchParams::default(), &Patch::Merge(&choice))
        .await
    {
        Err(kube::Error::Api(s))
            if s.code == 403 && s.message.contains("only fumarole's schedulers") => {}
        other => panic!("a user changing the plugin's device choice: {other:?}"),
    }
}
