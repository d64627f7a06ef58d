//! One GPU shared among containers through the device plugin (issue 39), against the kubelet's
//! own device-plugin client (`kubelet-dm`): the agent, standalone on the dgx-h100 fixture with
//! the NVML stand-in (health through the real FFI), its GPUs shared as NVIDIA's `sharing`
//! configuration says.
//!
//! - Time-slicing: every GPU advertised as its replicas (`<uuid>::<n>`), `GetPreferredAllocation`
//!   packing them (`replicaAllocation: packed`), a container of replicas seeing each GPU once,
//!   and a fault on one GPU taking all its replicas out (and back).
//! - MPS: the client's env and mounts point at NVIDIA's control daemon with its part of the
//!   GPU's memory and SMs; `failRequestsGreaterThanOne` refuses a second replica; the
//!   replicas renamed `nvidia.com/gpu.shared`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use fumarole_e2e::process::Proc;
use fumarole_e2e::standin::{StandIn, nvidia_root};
use fumarole_e2e::{AgentBuilder, KubeletDm};
use serde_json::{Value, json};

const GPU: &str = "nvidia.com/gpu";

/// What [`start`] started. Bind every field: the agent stops and the directory goes when
/// theirs are dropped.
struct Node {
    kdm: KubeletDm,
    agent: Proc,
    nvml: StandIn,
    _dir: tempfile::TempDir,
}

/// The agent, standalone on the dgx-h100 fixture with the NVML stand-in (its state as `edit`
/// leaves it), its device plugins configured by `config`, serving `kubelet-dm`.
async fn start(config: &str, edit: impl FnOnce(&mut Value)) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let (root, lib, mut nvml) = nvidia_root(dir.path()).unwrap();
    nvml.edit(edit);
    let config_file = dir.path().join("device-plugins.yaml");
    std::fs::write(&config_file, config).unwrap();
    let plugins = dir.path().join("device-plugins");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&plugins).unwrap();
    let kdm = KubeletDm::start(&plugins, &logs).await.unwrap();
    let agent = AgentBuilder::root(&root)
        .standalone()
        .device_plugin_dir(&plugins)
        .path_flag("--device-plugin-config", &config_file)
        .nvml_standin(&lib, &nvml.path)
        .flag("--health-quiet-period", "1s")
        .flag("--health-poll-interval", "300ms")
        .spawn(&logs)
        .unwrap();
    Node {
        kdm,
        agent,
        nvml,
        _dir: dir,
    }
}

fn ids(devices: &[Value]) -> Vec<String> {
    devices
        .iter()
        .map(|d| d["ID"].as_str().unwrap().to_string())
        .collect()
}

/// The replica ids the kubelet sees for GPU `i` with `replicas` each, as NVIDIA names them.
fn replicas_of(nvml: &StandIn, i: usize, replicas: u32) -> Vec<String> {
    let uuid = nvml.state["gpus"][i]["uuid"].as_str().unwrap();
    (0..replicas).map(|n| format!("{uuid}::{n}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn time_sliced_replicas_reach_the_kubelet_pack_and_follow_their_gpus_health() {
    let Node {
        kdm,
        agent: _agent,
        mut nvml,
        _dir,
    } = start(
        "resources:\n  - match: {vendor: nvidia}\n    replicaAllocation: packed\n    sharing:\n      timeSlicing:\n        resources:\n          - name: nvidia.com/gpu\n            replicas: 4\n",
        |_| {},
    )
    .await;

    // 8 GPUs, 4 replicas each, under the GPUs' own uuids, all healthy.
    let devices = kdm
        .wait_devices(GPU, Duration::from_secs(60), |d| {
            d.len() == 32 && d.iter().all(|x| x["health"] == "Healthy")
        })
        .await
        .unwrap();
    let all = ids(&devices);
    let want: Vec<String> = (0..8).flat_map(|i| replicas_of(&nvml, i, 4)).collect();
    assert_eq!(all, want);
    // Every replica carries its GPU's NUMA node.
    let gpu5 = replicas_of(&nvml, 5, 4);
    let numa: Vec<&Value> = devices
        .iter()
        .filter(|d| gpu5.contains(&d["ID"].as_str().unwrap().to_string()))
        .map(|d| &d["topology"])
        .collect();
    assert_eq!(numa.len(), 4);
    assert!(numa.iter().all(|t| *t == numa[0]), "{numa:?}");

    // Packed: two replicas of one GPU; then the shared GPU again, not a fresh one.
    let gpu0 = replicas_of(&nvml, 0, 4);
    assert_eq!(kdm.preferred_ids(GPU, &all, 2).await.unwrap(), gpu0[..2]);
    let rest: Vec<String> = all
        .iter()
        .filter(|id| !gpu0[..2].contains(id))
        .cloned()
        .collect();
    assert_eq!(kdm.preferred_ids(GPU, &rest, 1).await.unwrap(), gpu0[2..3]);

    // A container of two replicas of GPU 0 sees GPU 0 once.
    let alloc = kdm
        .allocate(
            GPU,
            json!({"container_requests": [{"devices_ids": [gpu0[0], gpu0[1]]}]}),
        )
        .await
        .unwrap();
    let c = &alloc["container_responses"][0];
    let uuid0 = nvml.state["gpus"][0]["uuid"].as_str().unwrap();
    assert_eq!(c["envs"], json!({"NVIDIA_VISIBLE_DEVICES": uuid0}));
    let nodes: Vec<&str> = c["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["host_path"].as_str().unwrap())
        .filter(|p| p.starts_with("/dev/nvidia") && p[11..].parse::<u32>().is_ok())
        .collect();
    assert_eq!(nodes, ["/dev/nvidia0"]);
    // An id that is not a replica of this resource is refused by name.
    let bad = kdm
        .allocate(
            GPU,
            json!({"container_requests": [{"devices_ids": [uuid0]}]}),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("InvalidArgument") && bad.contains("unknown device id") && bad.contains(uuid0),
        "{bad}"
    );

    // XID 79 on GPU 3, which falls off the bus: all four of its replicas go, no other.
    let gpu3 = replicas_of(&nvml, 3, 4);
    let t = nvml.event(json!({"gpu": 3, "xid": 79}));
    nvml.edit(|s| s["gpus"][3]["lost"] = json!(true));
    let after = kdm
        .wait_devices(GPU, Duration::from_secs(20), |d| {
            d.iter().filter(|x| x["health"] == "Unhealthy").count() == 4
        })
        .await
        .unwrap();
    let unhealthy: Vec<String> = ids(&after)
        .into_iter()
        .zip(&after)
        .filter(|(_, d)| d["health"] == "Unhealthy")
        .map(|(id, _)| id)
        .collect();
    assert_eq!(unhealthy, gpu3);
    println!(
        "XID 79: GPU 3's 4 replicas unhealthy after {:?}",
        t.elapsed()
    );
    // Back on the bus: all 32 healthy again after the quiet period.
    let t = Instant::now();
    nvml.edit(|s| s["gpus"][3]["lost"] = json!(false));
    kdm.wait_devices(GPU, Duration::from_secs(30), |d| {
        d.len() == 32 && d.iter().all(|x| x["health"] == "Healthy")
    })
    .await
    .unwrap();
    println!(
        "recovered: GPU 3's replicas healthy after {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mps_clients_get_the_daemons_pipe_and_their_part_of_the_gpu() {
    const SHARED: &str = "nvidia.com/gpu.shared";
    let Node {
        kdm,
        agent: _agent,
        nvml,
        _dir,
    } = start(
        "resources:\n  - match: {vendor: nvidia}\n    mpsRoot: /run/example/mps\n    sharing:\n      mps:\n        renameByDefault: true\n        resources:\n          - {name: nvidia.com/gpu, replicas: 4}\n",
        |_| {},
    )
    .await;
    let all = ids(&kdm
        .wait_devices(SHARED, Duration::from_secs(60), |d| d.len() == 32)
        .await
        .unwrap());
    // Distributed (the default): two containers' single replicas land on two GPUs.
    let first = kdm.preferred_ids(SHARED, &all, 1).await.unwrap();
    let rest: Vec<String> = all.iter().filter(|id| **id != first[0]).cloned().collect();
    let second = kdm.preferred_ids(SHARED, &rest, 1).await.unwrap();
    assert_ne!(
        first[0].split("::").next(),
        second[0].split("::").next(),
        "{first:?} {second:?}"
    );

    let gpu6 = replicas_of(&nvml, 6, 4);
    let alloc = kdm
        .allocate(
            SHARED,
            json!({"container_requests": [{"devices_ids": [gpu6[2]]}]}),
        )
        .await
        .unwrap();
    let c = &alloc["container_responses"][0];
    // What the stand-in's nvmlDeviceGetMemoryInfo_v2 answers: 81,559 MiB, a quarter each.
    let memory_mib = nvml.state["gpus"][6]["memoryBytes"].as_u64().unwrap() >> 20;
    assert_eq!(memory_mib, 81_559);
    let limit = format!("0={}M", memory_mib / 4);
    assert_eq!(
        c["envs"],
        json!({
            "NVIDIA_VISIBLE_DEVICES": nvml.state["gpus"][6]["uuid"],
            "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu.shared/pipe",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": limit,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        })
    );
    let mounts: Vec<(&str, &str)> = c["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["host_path"].as_str().unwrap(),
                m["container_path"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            (
                "/run/example/mps/nvidia.com/gpu.shared/pipe",
                "/mps/nvidia.com/gpu.shared/pipe"
            ),
            ("/run/example/mps/shm", "/dev/shm"),
        ]
    );
    // MPS leaves failRequestsGreaterThanOne at true: a second replica is refused, in NVIDIA's
    // words, on both calls.
    for refused in [
        kdm.allocate(
            SHARED,
            json!({"container_requests": [{"devices_ids": [gpu6[0], gpu6[1]]}]}),
        )
        .await,
        kdm.preferred(
            SHARED,
            json!({"container_requests": [{"available_deviceIDs": all, "allocation_size": 2}]}),
        )
        .await,
    ] {
        let e = refused.unwrap_err().to_string();
        assert!(
            e.contains("maximum request size for shared resources is 1; found 2"),
            "{e}"
        );
    }
    // Every GPU went to the shared resource: nvidia.com/gpu is not served.
    let state = kdm.state().await.unwrap();
    assert!(state["devices"][GPU].is_null(), "{state}");
}

/// A MIG device as the stand-in NVML reports it.
fn mig(uuid: &str, profile: &str, gib: u64) -> Value {
    json!({"uuid": uuid, "name": format!("NVIDIA H100 80GB HBM3 MIG {profile}"),
           "memoryBytes": gib << 30})
}

#[tokio::test(flavor = "multi_thread")]
async fn mig_devices_from_nvml_are_served_by_profile_with_their_gpus_health() {
    // GPU 0 split as the configured layout; GPU 1 as one whole-GPU instance (not as configured).
    let Node {
        kdm,
        agent,
        mut nvml,
        _dir,
    } = start(
        "resources:\n  - match: {vendor: nvidia, model: \"NVIDIA H100*\"}\n    migLayout: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]\n",
        |s| {
            s["gpus"][0]["migDevices"] = json!([
                mig("MIG-0a", "3g.40gb", 40),
                mig("MIG-0b", "2g.20gb", 20),
                mig("MIG-0c", "1g.10gb", 10),
                mig("MIG-0d", "1g.10gb", 10),
            ]);
            s["gpus"][1]["migDevices"] = json!([mig("MIG-1a", "7g.80gb", 80)]);
        },
    )
    .await;

    // Each profile is a resource of its MIG devices; the 6 other GPUs stay nvidia.com/gpu.
    for (resource, want) in [
        ("nvidia.com/mig-3g.40gb", vec!["MIG-0a"]),
        ("nvidia.com/mig-2g.20gb", vec!["MIG-0b"]),
        ("nvidia.com/mig-1g.10gb", vec!["MIG-0c", "MIG-0d"]),
        ("nvidia.com/mig-7g.80gb", vec!["MIG-1a"]),
    ] {
        let devices = kdm
            .wait_devices(resource, Duration::from_secs(60), |d| {
                d.len() == want.len() && d.iter().all(|x| x["health"] == "Healthy")
            })
            .await
            .unwrap();
        assert_eq!(ids(&devices), want, "{resource}");
    }
    let whole = kdm
        .wait_devices(GPU, Duration::from_secs(10), |d| d.len() == 6)
        .await
        .unwrap();
    let gpu0 = nvml.state["gpus"][0]["uuid"].as_str().unwrap().to_string();
    assert!(!ids(&whole).contains(&gpu0));

    // A container of one 1g.10gb device sees that MIG device, on its GPU's node.
    let alloc = kdm
        .allocate(
            "nvidia.com/mig-1g.10gb",
            json!({"container_requests": [{"devices_ids": ["MIG-0d"]}]}),
        )
        .await
        .unwrap();
    let c = &alloc["container_responses"][0];
    assert_eq!(c["envs"], json!({"NVIDIA_VISIBLE_DEVICES": "MIG-0d"}));
    assert_eq!(c["devices"][0]["host_path"], "/dev/nvidia0");

    // The configured layout against what NVML reports: GPU 1 differs, said once in the log.
    let said = agent.log_tail(400);
    assert!(
        said.contains(
            "migLayout says [1g.10gb, 1g.10gb, 2g.20gb, 3g.40gb], NVML reports [7g.80gb]"
        ),
        "{said}"
    );
    assert!(
        !said.contains(&format!("GPU {gpu0}: migLayout says")),
        "{said}"
    );

    // GPU 0 lost: its four MIG devices go unhealthy, GPU 1's stays healthy.
    let t = nvml.event(json!({"gpu": 0, "xid": 79}));
    nvml.edit(|s| s["gpus"][0]["lost"] = json!(true));
    kdm.wait_devices("nvidia.com/mig-1g.10gb", Duration::from_secs(20), |d| {
        d.iter().all(|x| x["health"] == "Unhealthy")
    })
    .await
    .unwrap();
    for resource in ["nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb"] {
        kdm.wait_devices(resource, Duration::from_secs(5), |d| {
            d.iter().all(|x| x["health"] == "Unhealthy")
        })
        .await
        .unwrap();
    }
    let mig7 = kdm
        .wait_devices("nvidia.com/mig-7g.80gb", Duration::from_secs(5), |d| {
            d.len() == 1
        })
        .await
        .unwrap();
    assert_eq!(mig7[0]["health"], "Healthy");
    println!(
        "XID 79 on GPU 0: its 4 MIG devices unhealthy after {:?}",
        t.elapsed()
    );
}
