//! `fumarole-agent run --standalone` against the kubelet's own device-manager client
//! (`kubelet-dm`): registration, `ListAndWatch` contents, health both ways,
//! `GetPreferredAllocation` through `topology::select`, `Allocate` per vendor, bad requests,
//! re-registration after a kubelet restart (timed), and the scheduler's `fumarole.dev/devices`
//! choice honoured or reported (Events on the pod) in cluster mode.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fumarole_e2e::fumarole::fixture_root;
use fumarole_e2e::process::Proc;
use fumarole_e2e::{AgentBuilder, KubeletDm};
use serde_json::{Value, json};
/// A fixture node written out as a root, so the test can take device nodes away.
struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    kdm: KubeletDm,
    _agent: Proc,
}

async fn setup(fixture: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = fixture_root(fixture, dir.path()).unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let logs = dir.path().join("logs");
    let kdm = KubeletDm::start(&plugins, &logs).await.unwrap();
    let agent = AgentBuilder::root(&root)
        .standalone()
        .device_plugin_dir(&plugins)
        .spawn(&logs)
        .unwrap();
    Setup {
        _dir: dir,
        root,
        kdm,
        _agent: agent,
    }
}

fn ids(devices: &[Value]) -> Vec<String> {
    devices
        .iter()
        .map(|d| d["ID"].as_str().unwrap().to_string())
        .collect()
}

const GPU: &str = "nvidia.com/gpu";

#[tokio::test(flavor = "multi_thread")]
async fn nvidia_plugin_registers_allocates_and_survives_a_kubelet_restart() {
    let s = setup("dgx-h100").await;
    let reg = s
        .kdm
        .wait_event(0, Duration::from_secs(30), |e| {
            e.kind == "registered" && e.resource == GPU
        })
        .await
        .unwrap();
    assert_eq!(
        reg.endpoint
            .as_deref()
            .map(|p| p.ends_with("fumarole-nvidia.com_gpu.sock")),
        Some(true)
    );
    let options = reg.options.unwrap();
    assert_eq!(options["get_preferred_allocation_available"], true);
    // Go's JSON leaves out false fields.
    assert_ne!(options["pre_start_required"], true);

    let devices = s
        .kdm
        .wait_devices(GPU, Duration::from_secs(20), |d| d.len() == 8)
        .await
        .unwrap();
    assert!(devices.iter().all(|d| d["health"] == "Healthy"));
    assert_eq!(devices[0]["ID"], "GPU-f55b88b0-0000-4000-8000-000000000000");
    // The NUMA node of each device (Go's JSON leaves out an ID of 0).
    let numa = |d: &Value| {
        d["topology"]["nodes"][0]
            .as_object()
            .map(|n| n.get("ID").and_then(Value::as_i64).unwrap_or(0))
    };
    assert_eq!(numa(&devices[0]), Some(0));
    assert_eq!(numa(&devices[7]), Some(1));
    let all = ids(&devices);

    // Allocate: uuids in NVIDIA_VISIBLE_DEVICES, the GPUs' nodes and the control nodes.
    let alloc = s
        .kdm
        .allocate(
            GPU,
            json!({"container_requests": [{"devices_ids": [all[2], all[5]]}]}),
        )
        .await
        .unwrap();
    let c = &alloc["container_responses"][0];
    assert_eq!(
        c["envs"]["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", all[2], all[5])
    );
    let paths: Vec<&str> = c["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["host_path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/dev/nvidia2",
            "/dev/nvidia5",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ]
    );

    // Bad requests are InvalidArgument errors, and the plugin keeps serving.
    for bad in [
        json!({"container_requests": [{"devices_ids": ["GPU-nope"]}]}),
        json!({"container_requests": [{"devices_ids": []}]}),
        json!({"container_requests": [{"devices_ids": [all[0], all[0]]}]}),
    ] {
        let err = s
            .kdm
            .allocate(GPU, bad.clone())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("InvalidArgument") || err.contains("invalid"),
            "{bad}: {err}"
        );
    }
    let err = s
        .kdm
        .preferred(GPU, json!({"container_requests": [{"available_deviceIDs": [all[0]], "allocation_size": 2}]}))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("only 1 are free"), "{err}");

    // Health: a device node that disappears makes the GPU unhealthy; it comes back healthy.
    let node3 = s.root.join("dev/nvidia3");
    let since = s
        .kdm
        .events(0, Duration::ZERO)
        .await
        .unwrap()
        .last()
        .map_or(0, |e| e.seq);
    let t = Instant::now();
    std::fs::remove_file(&node3).unwrap();
    let down = s
        .kdm
        .wait_event(since, Duration::from_secs(10), |e| {
            e.kind == "list_and_watch"
                && e.devices
                    .as_ref()
                    .is_some_and(|d| d[3]["health"] == "Unhealthy")
        })
        .await
        .unwrap();
    let to_unhealthy = t.elapsed();
    std::fs::write(&node3, "").unwrap();
    let t = Instant::now();
    s.kdm
        .wait_event(down.seq, Duration::from_secs(10), |e| {
            e.kind == "list_and_watch"
                && e.devices
                    .as_ref()
                    .is_some_and(|d| d.iter().all(|x| x["health"] == "Healthy"))
        })
        .await
        .unwrap();
    let to_healthy = t.elapsed();
    println!(
        "health reached the kubelet: unhealthy after {to_unhealthy:?}, healthy again after {to_healthy:?}"
    );

    // A kubelet restart: serve and register again.
    let since = s
        .kdm
        .events(0, Duration::ZERO)
        .await
        .unwrap()
        .last()
        .map_or(0, |e| e.seq);
    let t = Instant::now();
    assert_eq!(s.kdm.restart().await.unwrap(), 2);
    let again = s
        .kdm
        .wait_event(since, Duration::from_secs(10), |e| {
            e.kind == "list_and_watch" && e.generation == 2
        })
        .await
        .unwrap();
    println!("re-registered after a kubelet restart in {:?}", t.elapsed());
    assert_eq!(again.devices.unwrap().len(), 8);
    let alloc = s
        .kdm
        .allocate(
            GPU,
            json!({"container_requests": [{"devices_ids": [all[0]]}]}),
        )
        .await
        .unwrap();
    assert_eq!(
        alloc["container_responses"][0]["envs"]["NVIDIA_VISIBLE_DEVICES"],
        all[0]
    );
}

/// `GetPreferredAllocation` through the kubelet's client, for one container.
async fn pick(kdm: &KubeletDm, available: &[String], must: &[String], size: i32) -> Vec<String> {
    let r = kdm
        .preferred(
            GPU,
            json!({"container_requests": [{"available_deviceIDs": available, "must_include_deviceIDs": must, "allocation_size": size}]}),
        )
        .await
        .unwrap();
    ids_of(&r["container_responses"][0]["deviceIDs"])
}

fn ids_of(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn preferred_allocation_keeps_fast_pairs_whole() {
    // pcie-4gpu: GPU pairs {0,1} and {2,3} share a switch (PIX); across, PHB.
    let s = setup("pcie-4gpu").await;
    let devices = s
        .kdm
        .wait_devices(GPU, Duration::from_secs(30), |d| d.len() == 4)
        .await
        .unwrap();
    let all = ids(&devices);
    // GPU0 is busy: a 1-GPU pod takes GPU1 (whose partner is busy), not one of the idle pair.
    assert_eq!(pick(&s.kdm, &all[1..], &[], 1).await, vec![all[1].clone()]);
    // A 2-GPU pod on the empty node takes a switch pair.
    assert_eq!(
        pick(&s.kdm, &all, &[], 2).await,
        vec![all[0].clone(), all[1].clone()]
    );
    // must_include is honoured: with GPU3 required, its partner GPU2 joins it.
    assert_eq!(
        pick(&s.kdm, &all, &all[3..], 2).await,
        vec![all[2].clone(), all[3].clone()]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ascend_plugin_hands_out_davinci_numbers_and_manager_nodes() {
    let s = setup("atlas-800-910").await;
    let npu = "huawei.com/Ascend910";
    let devices = s
        .kdm
        .wait_devices(npu, Duration::from_secs(30), |d| d.len() == 8)
        .await
        .unwrap();
    assert_eq!(ids(&devices)[5], "Ascend910-5");
    // NPU 0 is busy: a 2-NPU pod takes from its broken group {1,2,3} and keeps {4-7} whole.
    let r = s
        .kdm
        .preferred(npu, json!({"container_requests": [{"available_deviceIDs": ids(&devices)[1..].to_vec(), "allocation_size": 2}]}))
        .await
        .unwrap();
    assert_eq!(
        r["container_responses"][0]["deviceIDs"],
        json!(["Ascend910-1", "Ascend910-2"])
    );
    let alloc = s
        .kdm
        .allocate(
            npu,
            json!({"container_requests": [{"devices_ids": ["Ascend910-4", "Ascend910-6"]}]}),
        )
        .await
        .unwrap();
    let c = &alloc["container_responses"][0];
    assert_eq!(c["envs"]["ASCEND_VISIBLE_DEVICES"], "4,6");
    let paths: Vec<&str> = c["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["host_path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/dev/davinci4",
            "/dev/davinci6",
            "/dev/davinci_manager",
            "/dev/devmm_svm",
            "/dev/hisi_hdc"
        ]
    );
}

/// Warning Events the agent recorded on `pod`, as `reason: note`.
async fn pod_events(cluster: &fumarole_e2e::TestCluster, pod: &str) -> Vec<String> {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{Api, ListParams};
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

/// The device plugin in cluster mode: the pod being admitted is the oldest one bound to the
/// node that asks for GPUs and has not got them; its `fumarole.dev/devices` choice is
/// preferred, and every way it is not (devices taken, a garbled value, a kubelet that
/// allocates others) is a Warning Event on the pod, never a silent difference.
#[tokio::test(flavor = "multi_thread")]
async fn scheduler_device_choice_is_honoured_or_reported() {
    use fumarole_e2e::cluster::{eventually, free_port};
    use fumarole_e2e::{NodeSpec, TestCluster};
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, PostParams};

    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new("dgx-1")
                .capacity("cpu", "224")
                .capacity("nvidia.com/gpu", "8"),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let kdm = KubeletDm::start(&plugins, &dir.path().join("logs"))
        .await
        .unwrap();
    AgentBuilder::fixture("dgx-h100")
        .node("dgx-1")
        .device_plugin_dir(&plugins)
        .flag("--await-device-choice-timeout", "1s")
        .without_host_kubelet(dir.path())
        .metrics_on_port(free_port().unwrap())
        .start_in(&cluster)
        .unwrap();
    let all = ids(&kdm
        .wait_devices(GPU, Duration::from_secs(30), |d| d.len() == 8)
        .await
        .unwrap());
    // No pod waits for GPUs: after the bounded wait, select takes the two lowest of eight
    // NV18-equal GPUs.
    assert_eq!(
        pick(&kdm, &all, &[], 2).await,
        vec![all[0].clone(), all[1].clone()]
    );

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod = |name: &str, annotation: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {"fumarole.dev/devices": annotation}},
            "spec": {"nodeName": "dgx-1", "containers": [{"name": "c", "image": "example.invalid/none",
                "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
        }))
        .unwrap()
    };
    let choice = json!({GPU: [all[5], all[6]]}).to_string();
    pods.create(&PostParams::default(), &pod("chosen", &choice))
        .await
        .unwrap();
    let want = vec![all[5].clone(), all[6].clone()];
    eventually(
        "the plugin to prefer the scheduler's choice",
        Duration::from_secs(30),
        || {
            let (kdm, all, want) = (&kdm, &all, &want);
            async move { Ok((pick(kdm, all, &[], 2).await == *want).then_some(())) }
        },
    )
    .await
    .unwrap();

    // The chosen devices are not all available: select decides, and the pod hears why.
    assert_eq!(
        pick(&kdm, &all[..6], &[], 2).await,
        vec![all[0].clone(), all[1].clone()]
    );
    let taken = format!("{} is not available", all[6]);
    eventually("the NotHonoured Event", Duration::from_secs(30), || {
        let (cluster, taken) = (&cluster, &taken);
        async move {
            let events = pod_events(cluster, "chosen").await;
            Ok(events
                .iter()
                .any(|e| e.starts_with("DeviceChoiceNotHonoured") && e.contains(taken.as_str()))
                .then_some(()))
        }
    })
    .await
    .unwrap();

    // The kubelet allocates other devices than the preferred ones: reported on the pod.
    assert_eq!(pick(&kdm, &all, &[], 2).await, want);
    kdm.allocate(
        GPU,
        json!({"container_requests": [{"devices_ids": [all[5], all[7]]}]}),
    )
    .await
    .unwrap();
    eventually("the Differs Event", Duration::from_secs(30), || {
        let cluster = &cluster;
        async move {
            let events = pod_events(cluster, "chosen").await;
            Ok(events
                .iter()
                .any(|e| e.starts_with("DeviceChoiceDiffers"))
                .then_some(()))
        }
    })
    .await
    .unwrap();

    // A malformed annotation is ignored with the reason, never a failed admission.
    pods.delete("chosen", &DeleteParams::default())
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("garbled", "GPU-1,GPU-2"))
        .await
        .unwrap();
    eventually(
        "the garbled annotation to be reported",
        Duration::from_secs(30),
        || {
            let (kdm, all, cluster) = (&kdm, &all, &cluster);
            async move {
                let got = pick(kdm, all, &[], 2).await;
                assert_eq!(got, vec![all[0].clone(), all[1].clone()]);
                let events = pod_events(cluster, "garbled").await;
                Ok(events
                    .iter()
                    .any(|e| {
                        e.starts_with("DeviceChoiceIgnored") && e.contains("not a JSON object")
                    })
                    .then_some(()))
            }
        },
    )
    .await
    .unwrap();
}
