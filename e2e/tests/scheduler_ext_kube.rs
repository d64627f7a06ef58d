//! Real kube-scheduler with fumarole-scheduler-ext (serving the live cluster: reflectors over
//! the API server) as its filter, prioritize and bind extender. The nodes advertise all their
//! GPUs, so only the extender knows which are free.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use fumarole_e2e::cluster::eventually;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;

/// The message of the pod's `PodScheduled=False` condition, once it has one.
async fn unschedulable_message(pods: &Api<Pod>, name: &str) -> String {
    eventually(
        &format!("{name} to be marked unschedulable"),
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            let name = name.to_string();
            async move {
                let p = pods.get(&name).await?;
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
    .unwrap()
}

/// dgx-a has 4 free GPUs, dgx-b 6, pcie-a 3: a 4-GPU pod goes to dgx-a, where it fits exactly,
/// with dgx-a's 4 free GPUs written on it; a 7-GPU pod stays pending with our reason.
#[tokio::test]
async fn four_gpu_pod_goes_where_it_fits_exactly() {
    let (cluster, port) = common::cluster_with_extender(&common::two_dgx(), &[]).await;
    cluster
        .start_kube_scheduler(&common::kube_scheduler_config(port))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    pods.create(&pp, &common::gpu_pod("four", 4, json!({})))
        .await
        .unwrap();
    pods.create(&pp, &common::gpu_pod("seven", 7, json!({})))
        .await
        .unwrap();

    let node = eventually("four to be bound", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { Ok(pods.get("four").await?.spec.and_then(|s| s.node_name)) }
    })
    .await
    .unwrap();
    assert_eq!(node, "dgx-a");
    let four = pods.get("four").await.unwrap();
    assert_eq!(
        common::devices_of(&four).unwrap(),
        ["dgx-a-gpu4", "dgx-a-gpu5", "dgx-a-gpu6", "dgx-a-gpu7"]
    );

    let message = unschedulable_message(&pods, "seven").await;
    assert!(
        message.contains("needs 7 nvidia.com/gpu, 6 free"),
        "{message}"
    );
}

/// 16 pods of 2 GPUs in units of 16 GPUs (8 pods) over three super-nodes with 16, 16 and 12
/// free GPUs: each unit lands whole in one super-node (so rack-c, too small, gets none), over
/// 8 nodes, with no device given twice; a pod whose atomic unit (32 GPUs) fits no super-node
/// stays pending with our reason in its events. The service publishes a Volcano HyperNode per
/// super-node and deletes the one whose nodes are gone.
#[tokio::test]
async fn group_job_lands_unit_by_unit_in_single_super_nodes() {
    let (cluster, port) =
        common::cluster_with_extender(&common::racks(), &["--publish-hypernodes"]).await;
    cluster
        .start_kube_scheduler(&common::kube_scheduler_config(port))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    common::place_a_group_job_over_the_racks(&pods).await;

    let message = unschedulable_message(&pods, "huge-0").await;
    let ours = "unit 0 of job default/huge (atomic part 0): needs 32 nvidia.com/gpu (16 pods of 2) in one super-node";
    assert!(message.contains(ours), "{message}");
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let listed = events
        .list(&ListParams::default().fields("involvedObject.name=huge-0"))
        .await
        .unwrap();
    assert!(
        listed
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("FailedScheduling")
                && e.message.as_deref().is_some_and(|m| m.contains(ours))),
        "{:?}",
        listed.items.iter().map(|e| &e.message).collect::<Vec<_>>()
    );

    // HyperNodes: one per rack, members by exact node name.
    let hypernodes: Api<DynamicObject> = Api::all_with(
        cluster.client(),
        &scheduler_ext::controllers::hypernode::resource(),
    );
    let members = |o: &DynamicObject| -> Vec<String> {
        o.data["spec"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m["selector"]["exactMatch"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let rack_c = hypernodes.get("fumarole-rack-c").await.unwrap();
    assert_eq!(members(&rack_c), ["c0", "c1", "c2"]);
    assert_eq!(rack_c.data["spec"]["tier"], 1);
    assert_eq!(
        members(&hypernodes.get("fumarole-rack-a").await.unwrap()),
        ["a0", "a1", "a2", "a3"]
    );
    let topologies: Api<DynamicObject> =
        fumarole_e2e::fumarole::device_topologies(cluster.client());
    for n in ["c0", "c1", "c2"] {
        topologies.delete(n, &Default::default()).await.unwrap();
    }
    let left = eventually(
        "fumarole-rack-c to be deleted",
        Duration::from_secs(30),
        || {
            let hypernodes = hypernodes.clone();
            async move {
                let names: BTreeSet<String> = hypernodes
                    .list(&Default::default())
                    .await?
                    .items
                    .into_iter()
                    .filter_map(|o| o.metadata.name)
                    .collect();
                Ok((!names.contains("fumarole-rack-c")).then_some(names))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        left,
        BTreeSet::from(["fumarole-rack-a".to_string(), "fumarole-rack-b".to_string()])
    );
}

/// The `/ui` defragmentation section of a live `serve`, from its pod watch: over the racks
/// (every node 4 of 8 GPUs free), `web` (a ReplicaSet's pod, 1 GPU on a0) and a bare pod
/// (1 GPU on b0) keep rack-a and rack-b from a waiting unit of 4 pods x 4 GPUs that must share
/// a super-node (rack-c has 3 nodes). The page names web's move, out of rack-a to the fullest
/// node that takes it (b0), never the bare pod. No scheduler runs: the pods are bound by hand.
#[tokio::test]
async fn ui_shows_the_defrag_advice_for_a_waiting_unit() {
    let ui = fumarole_e2e::cluster::free_port().unwrap();
    let ui_listen = format!("--ui-listen=127.0.0.1:{ui}");
    let (cluster, _port) = common::cluster_with_extender(&common::racks(), &[&ui_listen]).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let bound = |name: &str, node: &str, gpu: &str| -> Pod {
        let mut p = common::gpu_pod(
            name,
            1,
            json!({"fumarole.dev/devices": json!({"nvidia.com/gpu": [gpu]}).to_string()}),
        );
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        p
    };
    let mut web = bound("web", "a0", "a0-gpu4");
    web.metadata.owner_references =
        Some(vec![fumarole_e2e::fumarole::replica_set_owner("web-5c6b")]);
    pods.create(&pp, &web).await.unwrap();
    pods.create(&pp, &bound("notebook", "b0", "b0-gpu4"))
        .await
        .unwrap();
    for i in 0..4 {
        let mut p = common::gpu_pod(
            &format!("train-{i}"),
            4,
            json!({"metax-tech.com/gpu-group-size": "16"}),
        );
        // Nobody schedules it: it stays pending.
        p.spec.as_mut().unwrap().scheduler_name = Some("nobody".into());
        pods.create(&pp, &p).await.unwrap();
    }
    let page = eventually(
        "/ui to advise moving web",
        Duration::from_secs(60),
        || async move {
            let page = fumarole_e2e::cluster::http_get(ui, "/ui").await?;
            Ok(page.contains("data-pod=\"default/web\"").then_some(page))
        },
    )
    .await
    .unwrap();
    let section = page.split("<h2 id=\"defragmentation\">").nth(1).unwrap();
    assert!(
        section.contains(
            "unit 0 of job default/train (atomic part 0) (4 pods of 4 nvidia.com/gpu) becomes placeable in rack-a"
        ),
        "{section}"
    );
    let row = section
        .split("<tr class=\"move\" data-pod=\"default/web\">")
        .nth(1)
        .unwrap();
    assert!(
        row.starts_with("<td>default/web</td><td>default/ReplicaSet/web-5c6b</td><td>a0</td><td>a0-gpu4</td><td>b0</td>"),
        "{row}"
    );
    assert!(!section.contains("default/notebook"), "{section}");
}

/// A pod bound by a scheduler that does not tell its choice (Volcano before `allocateFunc`) gets
/// its devices written after the fact; when the API server refuses that write for a while (here
/// an admission policy, as when fumarole's own policy is not yet in force), the service tries
/// again until it lands instead of giving up after the first refusal.
#[tokio::test]
async fn a_bound_pods_refused_choice_is_written_once_the_refusal_passes() {
    let (cluster, _) = common::cluster_with_extender(&common::two_dgx(), &[]).await;
    let admin = cluster.client();
    let hold = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "hold-device-choices"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["pods"]}]},
            "validations": [{
                "expression": "!has(object.metadata.annotations) || !('fumarole.dev/devices' in object.metadata.annotations)",
                "message": "device choices are held"}]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "hold-device-choices"},
        "spec": {"policyName": "hold-device-choices", "validationActions": ["Deny"]}
    });
    let admission = |kind: &str| -> Api<DynamicObject> {
        Api::all_with(
            admin.clone(),
            &kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                kind,
            )),
        )
    };
    let policies = admission("ValidatingAdmissionPolicy");
    let bindings = admission("ValidatingAdmissionPolicyBinding");
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(hold).unwrap(),
        )
        .await
        .unwrap();
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).unwrap(),
        )
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut pod = common::gpu_pod("late", 2, json!({}));
    pod.spec.as_mut().unwrap().scheduler_name = Some("volcano".into());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // The hold is in force (policies reach the API server's admission a moment after they
    // are created): a dry-run write of a choice is refused.
    let dry_choice = json!({"metadata": {"annotations": {"fumarole.dev/devices": "probe"}}});
    eventually("the hold in force", Duration::from_secs(30), || {
        let pods = pods.clone();
        let patch = kube::api::Patch::Merge(dry_choice.clone());
        async move {
            let params = kube::api::PatchParams {
                dry_run: true,
                ..Default::default()
            };
            Ok(pods
                .patch("late", &params, &patch)
                .await
                .is_err()
                .then_some(()))
        }
    })
    .await
    .unwrap();

    // Bound by hand to dgx-a, as Volcano binds: the service's write is refused.
    let bind = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "late"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "dgx-a"}
    });
    let _: serde_json::Value = pods
        .create_subresource("binding", "late", &PostParams::default(), &bind)
        .await
        .unwrap();
    eventually("a refused write", Duration::from_secs(30), || {
        let log = cluster
            .log_tail("fumarole-scheduler-ext", 400)
            .unwrap_or_default();
        async move {
            Ok(log
                .contains("cannot give devices to a bound pod yet")
                .then_some(()))
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nfumarole-scheduler-ext:\n{}",
            cluster
                .log_tail("fumarole-scheduler-ext", 60)
                .unwrap_or_default()
        )
    });
    // Several rounds of the view pass (a round every 5 s at the least) while held.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        common::devices_of(&pods.get("late").await.unwrap()),
        None,
        "the hold let a choice through"
    );

    // The refusal passes: the choice lands, on dgx-a's free GPUs.
    bindings
        .delete("hold-device-choices", &Default::default())
        .await
        .unwrap();
    let devices = eventually("late annotated", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { Ok(common::devices_of(&pods.get("late").await.unwrap())) }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nfumarole-scheduler-ext:\n{}",
            cluster
                .log_tail("fumarole-scheduler-ext", 60)
                .unwrap_or_default()
        )
    });
    assert_eq!(devices.len(), 2, "{devices:?}");
    for d in &devices {
        assert!(
            ["dgx-a-gpu4", "dgx-a-gpu5", "dgx-a-gpu6", "dgx-a-gpu7"].contains(&d.as_str()),
            "{d} is not free on dgx-a"
        );
    }
}

/// Volcano's `allocateFunc` and `deallocateFunc` come before a bind. Called for a bound pod
/// (by anyone who holds Volcano's token) they would free the devices a running pod holds, so
/// the next pod is given them, or move its choice to another node: both are refused, and the
/// pod keeps its devices.
#[tokio::test]
async fn volcanos_allocate_and_deallocate_refuse_a_bound_pod() {
    let (cluster, port) = common::cluster_with_extender(&common::two_dgx(), &[]).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let mut pod = common::gpu_pod("running", 2, json!({}));
    pod.spec.as_mut().unwrap().scheduler_name = Some("volcano".into());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let bind = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "running"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "dgx-a"}
    });
    let _: serde_json::Value = pods
        .create_subresource("binding", "running", &PostParams::default(), &bind)
        .await
        .unwrap();
    let devices = eventually("running annotated", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { Ok(common::devices_of(&pods.get("running").await?)) }
    })
    .await
    .unwrap();

    let live = serde_json::to_value(pods.get("running").await.unwrap()).unwrap();
    for (verb, node) in [("deallocateFunc", ""), ("allocateFunc", "dgx-b")] {
        let answer = fumarole_e2e::cluster::http_post_json(
            port,
            &format!("/volcano/{verb}"),
            &json!({"task": {"Pod": live, "NodeName": node}}),
        )
        .await
        .unwrap();
        assert!(
            answer.contains("is already bound to node dgx-a"),
            "{verb}: {answer}"
        );
        assert_eq!(
            common::devices_of(&pods.get("running").await.unwrap()),
            Some(devices.clone()),
            "{verb} changed the running pod's devices"
        );
    }
}

/// [`common::place_shares`] through the real kube-scheduler and the extender.
#[tokio::test]
async fn shares_pack_onto_shared_gpus_and_count_what_is_committed() {
    let (cluster, port) = common::cluster_with_extender(&common::share_nodes(), &[]).await;
    let managed = [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-3g.40gb",
    ];
    cluster
        .start_kube_scheduler(&fumarole_e2e::fumarole::kube_scheduler_config(
            port, &managed,
        ))
        .await
        .unwrap();
    common::place_shares(
        &Api::namespaced(cluster.client(), "default"),
        "default-scheduler",
        None,
    )
    .await;
}
