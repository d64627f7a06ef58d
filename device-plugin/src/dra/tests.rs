#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Unit tests of the DRA kubelet plugin: CDI spec content per vendor, claim -> devices,
//! per-claim errors, idempotence and restarts over the same directories. The gRPC sockets are
//! tested in `tests/dra_grpc.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fumarole_topology::dra::{GPU_DRIVER, NPU_DRIVER};
use fumarole_topology::{
    CpuSet, Device, DeviceKind, Health, LinkClass, LinkMatrix, NodeTopology, PciId, Vendor,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use tonic::Request;

use super::allocation::{Allocated, our_devices};
use super::api;
use super::api::dra_plugin_server::DraPlugin;
use super::cdi;
use super::claims::{ClaimFuture, ClaimReader};
use super::claims::{ClaimRef, PrepareError};
use super::node::{DraNode, LookupError};
use super::prepare::DriverPlugin;
use super::service::DraService;
use crate::config::Config;
use crate::resources::{Resource, resources_with, split};

const NODE: &str = "node-a";

fn device(vendor: Vendor, pci_vendor: u16, index: u32, id: &str, nodes: &[&str]) -> Device {
    Device {
        id: id.into(),
        index,
        vendor,
        kind: if vendor == Vendor::Huawei {
            DeviceKind::Npu
        } else {
            DeviceKind::Gpu
        },
        model: "model".into(),
        pci_bus_id: format!("0000:{:02x}:00.0", index + 0x10),
        pci_path: Vec::new(),
        pci_id: PciId {
            vendor: pci_vendor,
            device: 0x1,
            class: 0x0302,
        },
        numa_node: Some(0),
        local_cpus: CpuSet::default(),
        dev_nodes: nodes.iter().map(|n| n.to_string()).collect(),
        health: Health::Healthy,
        uuid: (vendor == Vendor::Nvidia).then(|| format!("GPU-uuid-{index}")),
        serial: None,
        memory_bytes: None,
        mig: Vec::new(),
    }
}

/// Two NVIDIA GPUs, two Ascend NPUs and a MetaX GPU, their device nodes under a temp root.
fn node() -> (NodeTopology, tempfile::TempDir) {
    let devices = vec![
        device(Vendor::Nvidia, 0x10de, 0, "GPU-uuid-0", &["/dev/nvidia0"]),
        Device {
            model: "NVIDIA H100 80GB HBM3".into(),
            ..device(Vendor::Nvidia, 0x10de, 1, "GPU-uuid-1", &["/dev/nvidia1"])
        },
        device(Vendor::Huawei, 0x19e5, 0, "Ascend910-0", &["/dev/davinci0"]),
        Device {
            model: "Ascend910".into(),
            ..device(Vendor::Huawei, 0x19e5, 1, "Ascend910-1", &["/dev/davinci1"])
        },
        device(
            Vendor::Metax,
            0x9999,
            0,
            "0000:10:00.0",
            &["/dev/dri/card1", "/dev/dri/renderD129"],
        ),
    ];
    let n = devices.len();
    let t = NodeTopology {
        hostname: NODE.into(),
        packages: Vec::new(),
        processing_units: Vec::new(),
        allowed_cpus: CpuSet::default(),
        numa_nodes: Vec::new(),
        devices,
        links: LinkMatrix::filled(n, LinkClass::CrossNuma),
        super_node: None,
    };
    let root = tempfile::tempdir().unwrap();
    let dev = root.path().join("dev");
    std::fs::create_dir_all(dev.join("dri")).unwrap();
    for f in [
        "nvidia0",
        "nvidia1",
        "nvidiactl",
        "nvidia-uvm",
        "davinci0",
        "davinci1",
        "davinci_manager",
        "hisi_hdc",
        "mxcd",
        "dri/card1",
        "dri/renderD129",
    ] {
        std::fs::write(dev.join(f), "").unwrap();
    }
    (t, root)
}

/// Everything served through DRA, unless `config` says otherwise.
const ALL_DRA: &str = "resources:\n  - match: {kind: gpu}\n    servedBy: dra\n  - match: {kind: npu}\n    servedBy: dra\n";

fn config(text: &str) -> Config {
    Config::parse(text, Some(Path::new("dp.yaml"))).unwrap()
}

fn dra_node(text: &str) -> (DraNode, Vec<Resource>, tempfile::TempDir) {
    let (t, root) = node();
    let all = resources_with(&t, root.path(), false, &config(text)).unwrap();
    let (_, dra) = split(all.clone());
    (DraNode::new(NODE, t, dra), all, root)
}

/// Claims by namespace and name, counting reads; `down` makes every read fail.
#[derive(Default)]
struct FakeClaims {
    claims: Mutex<BTreeMap<(String, String), ResourceClaim>>,
    reads: AtomicUsize,
    down: bool,
}

impl FakeClaims {
    fn with(claims: &[ResourceClaim]) -> Arc<Self> {
        let f = Self::default();
        for c in claims {
            f.put(c.clone());
        }
        Arc::new(f)
    }

    fn put(&self, c: ResourceClaim) {
        let key = (
            c.metadata.namespace.clone().unwrap(),
            c.metadata.name.clone().unwrap(),
        );
        self.claims.lock().unwrap().insert(key, c);
    }

    fn down() -> Arc<Self> {
        Arc::new(Self {
            down: true,
            ..Self::default()
        })
    }
}

impl ClaimReader for FakeClaims {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> ClaimFuture<'a> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let found = self
            .claims
            .lock()
            .unwrap()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned();
        let down = self.down;
        Box::pin(async move {
            if down {
                Err("connection refused".to_string())
            } else {
                Ok(found)
            }
        })
    }
}

/// A claim `ns/name` with `uid`, allocated `(driver, pool, device, request)` (none: not
/// allocated).
fn claim(name: &str, uid: &str, results: Option<&[(&str, &str, &str, &str)]>) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ns".into());
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(uid.into());
    c.status = results.map(|results| ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    results
                        .iter()
                        .map(
                            |(driver, pool, device, request)| DeviceRequestAllocationResult {
                                driver: driver.to_string(),
                                pool: pool.to_string(),
                                device: device.to_string(),
                                request: request.to_string(),
                                ..Default::default()
                            },
                        )
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

fn reference(name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

fn plugin(
    driver: &'static str,
    node: &DraNode,
    cdi_dir: &Path,
    claims: Arc<dyn ClaimReader>,
) -> DriverPlugin {
    DriverPlugin::new(
        driver,
        Arc::new(node.clone()),
        cdi_dir.to_path_buf(),
        claims,
    )
}

fn spec_of(dir: &Path, driver: &str, uid: &str) -> cdi::Spec {
    cdi::read(dir, &cdi::file_name(driver, uid))
        .unwrap()
        .unwrap_or_else(|| panic!("no spec for {uid} in {}", dir.display()))
}

fn node_paths(edits: &cdi::ContainerEdits) -> Vec<&str> {
    edits.device_nodes.iter().map(|n| n.path.as_str()).collect()
}

#[tokio::test]
async fn nvidia_spec_lists_uuids_and_nodes_as_the_device_plugin_does() {
    let (node, all, _root) = dra_node(ALL_DRA);
    let cdi_dir = tempfile::tempdir().unwrap();
    let claims = FakeClaims::with(&[claim(
        "train",
        "uid-1",
        Some(&[
            (GPU_DRIVER, NODE, "nvidia-1", "gpus"),
            (GPU_DRIVER, NODE, "nvidia-0", "gpus"),
        ]),
    )]);
    let p = plugin(GPU_DRIVER, &node, cdi_dir.path(), claims);
    let answer = p.prepare(&reference("train", "uid-1")).await.unwrap();
    assert_eq!(
        answer,
        vec![
            api::Device {
                request_names: vec!["gpus".into()],
                pool_name: NODE.into(),
                device_name: "nvidia-1".into(),
                cdi_device_ids: vec!["gpu.fumarole.dev/claim=uid-1-nvidia-1".into()],
                share_id: None,
            },
            api::Device {
                request_names: vec!["gpus".into()],
                pool_name: NODE.into(),
                device_name: "nvidia-0".into(),
                cdi_device_ids: vec!["gpu.fumarole.dev/claim=uid-1-nvidia-0".into()],
                share_id: None,
            },
        ]
    );
    // The file, as a container runtime reads it.
    let file = cdi_dir.path().join("gpu.fumarole.dev-claim_uid-1.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let node = |p: &str| serde_json::json!({"path": p, "hostPath": p, "permissions": "rw"});
    assert_eq!(
        json,
        serde_json::json!({
            "cdiVersion": "0.6.0",
            "kind": "gpu.fumarole.dev/claim",
            "annotations": {"fumarole.dev/claim": "ns/train"},
            "devices": [
                {
                    "name": "uid-1-nvidia-1",
                    "annotations": {
                        "fumarole.dev/device": "nvidia-1",
                        "fumarole.dev/pool": NODE,
                        "fumarole.dev/requests": "gpus",
                    },
                    "containerEdits": {"deviceNodes": [node("/dev/nvidia1")]},
                },
                {
                    "name": "uid-1-nvidia-0",
                    "annotations": {
                        "fumarole.dev/device": "nvidia-0",
                        "fumarole.dev/pool": NODE,
                        "fumarole.dev/requests": "gpus",
                    },
                    "containerEdits": {"deviceNodes": [node("/dev/nvidia0")]},
                },
            ],
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=GPU-uuid-1,GPU-uuid-0"],
                "deviceNodes": [node("/dev/nvidiactl"), node("/dev/nvidia-uvm")],
            },
        })
    );
    // The same variables and nodes as the device plugin's Allocate for those devices.
    let gpu = all.iter().find(|r| r.name == "nvidia.com/gpu").unwrap();
    let allocate = gpu
        .allocate(&["GPU-uuid-1".into(), "GPU-uuid-0".into()])
        .unwrap();
    let spec = spec_of(cdi_dir.path(), GPU_DRIVER, "uid-1");
    let env: Vec<String> = allocate
        .envs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    assert_eq!(spec.container_edits.env, env);
    let mut dra_nodes: Vec<&str> = spec
        .devices
        .iter()
        .flat_map(|d| node_paths(&d.container_edits))
        .chain(node_paths(&spec.container_edits))
        .collect();
    let mut dp_nodes: Vec<&str> = allocate
        .devices
        .iter()
        .map(|d| d.host_path.as_str())
        .collect();
    dra_nodes.sort_unstable();
    dp_nodes.sort_unstable();
    assert_eq!(dra_nodes, dp_nodes);
    // Nothing half-written is left beside it.
    let names: Vec<String> = std::fs::read_dir(cdi_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["gpu.fumarole.dev-claim_uid-1.json"]);
}

#[tokio::test]
async fn ascend_metax_and_configured_env_values() {
    // Ascend: davinci numbers and the manager nodes, under the npu driver.
    let (node, _, _root) = dra_node(ALL_DRA);
    let cdi_dir = tempfile::tempdir().unwrap();
    let claims = FakeClaims::with(&[
        claim(
            "npu",
            "uid-n",
            Some(&[(NPU_DRIVER, NODE, "huawei-1", "npu")]),
        ),
        claim(
            "mixed",
            "uid-m",
            Some(&[
                (GPU_DRIVER, NODE, "metax-0", "mx"),
                (GPU_DRIVER, NODE, "nvidia-0", "nv"),
            ]),
        ),
    ]);
    let npu = plugin(NPU_DRIVER, &node, cdi_dir.path(), claims.clone());
    npu.prepare(&reference("npu", "uid-n")).await.unwrap();
    let spec = spec_of(cdi_dir.path(), NPU_DRIVER, "uid-n");
    assert_eq!(spec.kind, "npu.fumarole.dev/claim");
    assert_eq!(spec.container_edits.env, ["ASCEND_VISIBLE_DEVICES=1"]);
    assert_eq!(
        node_paths(&spec.container_edits),
        ["/dev/davinci_manager", "/dev/hisi_hdc"]
    );
    assert_eq!(
        node_paths(&spec.devices[0].container_edits),
        ["/dev/davinci1"]
    );
    // A claim of two GPU vendors: each vendor's variable, its nodes, its shared nodes.
    let gpu = plugin(GPU_DRIVER, &node, cdi_dir.path(), claims.clone());
    gpu.prepare(&reference("mixed", "uid-m")).await.unwrap();
    let spec = spec_of(cdi_dir.path(), GPU_DRIVER, "uid-m");
    assert_eq!(
        spec.container_edits.env,
        [
            "FUMAROLE_VISIBLE_DEVICES=0000:10:00.0",
            "NVIDIA_VISIBLE_DEVICES=GPU-uuid-0"
        ]
    );
    assert_eq!(
        node_paths(&spec.devices[0].container_edits),
        ["/dev/dri/card1", "/dev/dri/renderD129"]
    );
    assert_eq!(
        node_paths(&spec.container_edits),
        ["/dev/mxcd", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    );

    // The config's env and envValue apply to DRA as to the device plugin: indices, not uuids.
    let (node, _, _root) = dra_node(
        "resources:\n  - match: {vendor: nvidia}\n    servedBy: both\n    envValue: index\n  - match: {vendor: metax}\n    servedBy: dra\n    env: METAX_VISIBLE_DEVICES\n    envValue: index\n",
    );
    let cdi_dir = tempfile::tempdir().unwrap();
    let gpu = plugin(GPU_DRIVER, &node, cdi_dir.path(), claims);
    gpu.prepare(&reference("mixed", "uid-m")).await.unwrap();
    assert_eq!(
        spec_of(cdi_dir.path(), GPU_DRIVER, "uid-m")
            .container_edits
            .env,
        ["METAX_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=0"]
    );
}

#[test]
fn a_claim_gives_us_only_our_driver_in_our_pool() {
    let c = claim(
        "c",
        "uid-1",
        Some(&[
            (GPU_DRIVER, NODE, "nvidia-1", "a"),
            ("other.example.com", NODE, "nvidia-0", "a"),
            (GPU_DRIVER, "node-b", "nvidia-0", "a"),
            (NPU_DRIVER, NODE, "huawei-0", "b"),
            (GPU_DRIVER, NODE, "nvidia-1", "b"),
        ]),
    );
    let want = reference("c", "uid-1");
    assert_eq!(
        our_devices(&c, &want, GPU_DRIVER, NODE).unwrap(),
        vec![Allocated {
            device: "nvidia-1".into(),
            requests: vec!["a".into(), "b".into()],
        }]
    );
    assert_eq!(
        our_devices(&c, &want, NPU_DRIVER, NODE).unwrap(),
        vec![Allocated {
            device: "huawei-0".into(),
            requests: vec!["b".into()],
        }]
    );
    assert!(
        our_devices(&c, &want, GPU_DRIVER, "node-c")
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        our_devices(&c, &reference("c", "uid-2"), GPU_DRIVER, NODE).unwrap_err(),
        PrepareError::UidMismatch {
            claim: "ns/c (uid-2)".into(),
            found: "uid-1".into()
        }
    );
    assert_eq!(
        our_devices(&claim("c", "uid-1", None), &want, GPU_DRIVER, NODE).unwrap_err(),
        PrepareError::NotAllocated("ns/c (uid-1)".into())
    );
}

#[tokio::test]
async fn each_claim_gets_its_own_answer_and_error() {
    let (node, _, _root) = dra_node(
        "resources:\n  - match: {vendor: nvidia, pciDevice: \"0x1\", pciVendor: \"0x10de\"}\n    servedBy: both\n  - match: {vendor: metax}\n    servedBy: devicePlugin\n",
    );
    let cdi_dir = tempfile::tempdir().unwrap();
    let claims = FakeClaims::with(&[
        claim(
            "good",
            "uid-good",
            Some(&[(GPU_DRIVER, NODE, "nvidia-0", "r")]),
        ),
        claim(
            "unknown",
            "uid-unknown",
            Some(&[(GPU_DRIVER, NODE, "nvidia-9", "r")]),
        ),
        claim(
            "moved",
            "uid-new",
            Some(&[(GPU_DRIVER, NODE, "nvidia-1", "r")]),
        ),
        claim("pending", "uid-pending", None),
        claim(
            "dp-only",
            "uid-dp",
            Some(&[(GPU_DRIVER, NODE, "metax-0", "r")]),
        ),
        claim(
            "elsewhere",
            "uid-else",
            Some(&[(GPU_DRIVER, "node-b", "nvidia-0", "r")]),
        ),
    ]);
    let service = DraService::new(Arc::new(plugin(GPU_DRIVER, &node, cdi_dir.path(), claims)));
    let wire = |name: &str, uid: &str| api::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    };
    let answer = service
        .node_prepare_resources(Request::new(api::NodePrepareResourcesRequest {
            claims: vec![
                wire("good", "uid-good"),
                wire("unknown", "uid-unknown"),
                wire("moved", "uid-old"),
                wire("pending", "uid-pending"),
                wire("gone", "uid-gone"),
                wire("dp-only", "uid-dp"),
                wire("elsewhere", "uid-else"),
                wire("evil", "../../etc/passwd"),
            ],
        }))
        .await
        .unwrap()
        .into_inner()
        .claims;
    let error = |uid: &str| answer[uid].error.clone();
    assert_eq!(error("uid-good"), "");
    assert_eq!(answer["uid-good"].devices.len(), 1);
    assert_eq!(
        error("uid-unknown"),
        "ResourceClaim ns/unknown (uid-unknown): device \"nvidia-9\" of driver gpu.fumarole.dev is not a device of node node-a"
    );
    assert_eq!(
        error("uid-old"),
        "ResourceClaim ns/moved (uid-old) has uid \"uid-new\" now: the claim the kubelet names is gone"
    );
    assert_eq!(
        error("uid-pending"),
        "ResourceClaim ns/pending (uid-pending) is not allocated"
    );
    assert_eq!(
        error("uid-gone"),
        "ResourceClaim ns/gone (uid-gone) not found"
    );
    assert!(
        error("uid-dp")
            .contains("\"metax-0\" (0000:10:00.0) of node node-a is not served through DRA"),
        "{}",
        error("uid-dp")
    );
    // Another node's devices: nothing to do here, no error, no file.
    assert_eq!(error("uid-else"), "");
    assert!(answer["uid-else"].devices.is_empty());
    assert!(error("../../etc/passwd").contains("the uid must be letters, digits and '-'"));
    for (uid, written) in [
        ("uid-good", true),
        ("uid-unknown", false),
        ("uid-else", false),
    ] {
        let file = cdi_dir.path().join(cdi::file_name(GPU_DRIVER, uid));
        assert_eq!(file.exists(), written, "{uid}");
    }
    assert_eq!(
        node.lookup(GPU_DRIVER, "huawei-0").unwrap_err(),
        LookupError::Unknown {
            driver: GPU_DRIVER.into(),
            device: "huawei-0".into(),
            node: NODE.into()
        },
        "an NPU is not the GPU driver's"
    );
}

#[tokio::test]
async fn prepare_and_unprepare_are_idempotent() {
    let (node, _, _root) = dra_node(ALL_DRA);
    let cdi_dir = tempfile::tempdir().unwrap();
    let claims = FakeClaims::with(&[claim(
        "c",
        "uid-1",
        Some(&[(GPU_DRIVER, NODE, "nvidia-0", "r")]),
    )]);
    let p = plugin(GPU_DRIVER, &node, cdi_dir.path(), claims.clone());
    let c = reference("c", "uid-1");
    let first = p.prepare(&c).await.unwrap();
    // Again, even with the claim changed or gone on the API server: the file's answer.
    claims.claims.lock().unwrap().clear();
    assert_eq!(p.prepare(&c).await.unwrap(), first);
    assert_eq!(claims.reads.load(Ordering::SeqCst), 1);
    let file = cdi_dir.path().join(cdi::file_name(GPU_DRIVER, "uid-1"));
    p.unprepare(&c).await.unwrap();
    assert!(!file.exists());
    p.unprepare(&c).await.unwrap();
    p.unprepare(&reference("never", "uid-never")).await.unwrap();
    // Once unprepared, preparing reads the claim again (and fails: it is gone now).
    assert_eq!(
        p.prepare(&c).await.unwrap_err(),
        PrepareError::NotFound("ns/c (uid-1)".into())
    );
}

#[tokio::test]
async fn a_new_instance_carries_on_from_the_files_without_the_api_server() {
    let (node, _, _root) = dra_node(ALL_DRA);
    let cdi_dir = tempfile::tempdir().unwrap();
    let claims = FakeClaims::with(&[
        claim("a", "uid-a", Some(&[(GPU_DRIVER, NODE, "nvidia-0", "r")])),
        claim("b", "uid-b", Some(&[(GPU_DRIVER, NODE, "nvidia-1", "r")])),
    ]);
    let old = plugin(GPU_DRIVER, &node, cdi_dir.path(), claims);
    let a = old.prepare(&reference("a", "uid-a")).await.unwrap();
    old.prepare(&reference("b", "uid-b")).await.unwrap();
    drop(old);
    // After a restart, with the API server unreachable.
    let down = FakeClaims::down();
    let new = plugin(GPU_DRIVER, &node, cdi_dir.path(), down.clone());
    assert_eq!(new.prepare(&reference("a", "uid-a")).await.unwrap(), a);
    new.unprepare(&reference("b", "uid-b")).await.unwrap();
    assert_eq!(down.reads.load(Ordering::SeqCst), 0);
    let left: Vec<PathBuf> = std::fs::read_dir(cdi_dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        left,
        [cdi_dir.path().join("gpu.fumarole.dev-claim_uid-a.json")]
    );
    // A claim it never saw needs the API server, and says so.
    let e = new.prepare(&reference("c", "uid-c")).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "reading ResourceClaim ns/c (uid-c): connection refused"
    );
    // A file that is not our record is prepared again rather than trusted.
    std::fs::write(
        cdi_dir.path().join(cdi::file_name(GPU_DRIVER, "uid-a")),
        "{not json",
    )
    .unwrap();
    assert!(new.prepare(&reference("a", "uid-a")).await.is_err());
}

#[test]
fn the_plugin_serves_the_drivers_with_devices_and_only_those() {
    let (node, _, _root) = dra_node("resources:\n  - match: {vendor: huawei}\n    servedBy: dra\n");
    assert_eq!(node.drivers(), [NPU_DRIVER]);
    let (node, _, _root) = dra_node(ALL_DRA);
    assert_eq!(node.drivers(), [GPU_DRIVER, NPU_DRIVER]);
}

#[tokio::test]
async fn without_a_partitioner_a_partition_is_not_prepared_and_says_why() {
    let (node, _, _root) = dra_node(ALL_DRA);
    assert_eq!(
        node.lookup(GPU_DRIVER, "nvidia-1-3g-40gb-4").unwrap_err(),
        LookupError::PartitionNotCreated {
            device: "nvidia-1-3g-40gb-4".into(),
            profile: "3g.40gb".into(),
            id: "GPU-uuid-1".into(),
            node: NODE.into()
        }
    );
    // No such placement, and GPU 0's model has no MIG table: not a device at all.
    for name in ["nvidia-1-3g-40gb-2", "nvidia-0-3g-40gb-4"] {
        assert!(matches!(
            node.lookup(GPU_DRIVER, name),
            Err(LookupError::Unknown { .. })
        ));
    }
    let cdi_dir = tempfile::tempdir().unwrap();
    let claims = FakeClaims::with(&[claim(
        "mig",
        "uid-mig",
        Some(&[(GPU_DRIVER, NODE, "nvidia-1-1g-10gb-0", "r")]),
    )]);
    let p = plugin(GPU_DRIVER, &node, cdi_dir.path(), claims);
    let e = p.prepare(&reference("mig", "uid-mig")).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("is a 1g.10gb partition of GPU-uuid-1 on node node-a")
            && e.to_string()
                .contains("MIG instances need the NVML library"),
        "{e}"
    );
    assert!(
        !cdi_dir
            .path()
            .join(cdi::file_name(GPU_DRIVER, "uid-mig"))
            .exists()
    );
}

/// Makes partitions in memory: on a GPU uuids `MIG-<n>`, GPU instance `n`; on an NPU vNPU
/// `100 + n`; fails for the profiles in `refuse`.
#[derive(Default)]
struct FakePartitioner {
    made: Mutex<Vec<(String, fumarole_topology::dra::MadePartition)>>,
    /// GPU instances, or vNPU ids, destroyed.
    destroyed: Mutex<Vec<u32>>,
    refuse: Vec<&'static str>,
}

impl crate::dra::node::Partitioner for FakePartitioner {
    fn makes(&self, _: Vendor) -> bool {
        true
    }

    fn create(
        &self,
        parent: &Device,
        p: &fumarole_topology::dra::Partition,
    ) -> Result<fumarole_topology::dra::MadePartition, String> {
        if self.refuse.contains(&p.profile.name) {
            return Err(format!("{} refused", p.profile.name));
        }
        let mut made = self.made.lock().unwrap();
        let n = u32::try_from(made.len()).unwrap() + 1;
        let m = if parent.vendor == Vendor::Huawei {
            fumarole_topology::dra::MadePartition::Vnpu { vdev_id: 100 + n }
        } else {
            fumarole_topology::dra::MadePartition::Mig {
                uuid: format!("MIG-{n}"),
                gpu_instance: n,
                compute_instance: 0,
            }
        };
        made.push((parent.id.clone(), m.clone()));
        Ok(m)
    }

    fn destroy(
        &self,
        parent_uuid: &str,
        made: &fumarole_topology::dra::MadePartition,
    ) -> Result<(), String> {
        match *made {
            fumarole_topology::dra::MadePartition::Mig { gpu_instance, .. } => {
                assert_eq!(parent_uuid, "GPU-uuid-1");
                self.destroyed.lock().unwrap().push(gpu_instance);
            }
            fumarole_topology::dra::MadePartition::Vnpu { vdev_id } => {
                assert_eq!(parent_uuid, "Ascend910-1");
                self.destroyed.lock().unwrap().push(vdev_id);
            }
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_partition_is_made_on_prepare_and_removed_on_unprepare() {
    let (node, _, _root) = dra_node(ALL_DRA);
    let fake = Arc::new(FakePartitioner {
        refuse: vec!["7g.80gb"],
        ..FakePartitioner::default()
    });
    let node = node.with_partitioner(fake.clone());
    let cdi_dir = tempfile::tempdir().unwrap();
    let claims = FakeClaims::with(&[
        claim(
            "mig",
            "uid-mig",
            Some(&[
                (GPU_DRIVER, NODE, "nvidia-1-3g-40gb-0", "a"),
                (GPU_DRIVER, NODE, "nvidia-1-1g-10gb-5", "b"),
            ]),
        ),
        claim(
            "half",
            "uid-half",
            Some(&[
                (GPU_DRIVER, NODE, "nvidia-1-1g-10gb-4", "a"),
                (GPU_DRIVER, NODE, "nvidia-1-7g-80gb-0", "b"),
            ]),
        ),
    ]);
    let p = plugin(GPU_DRIVER, &node, cdi_dir.path(), claims);
    let answer = p.prepare(&reference("mig", "uid-mig")).await.unwrap();
    assert_eq!(answer.len(), 2);
    // The container sees the MIG devices, by uuid, with their GPU's device node.
    let spec = spec_of(cdi_dir.path(), GPU_DRIVER, "uid-mig");
    assert!(
        spec.container_edits
            .env
            .contains(&"NVIDIA_VISIBLE_DEVICES=MIG-1,MIG-2".to_string()),
        "{:?}",
        spec.container_edits.env
    );
    assert_eq!(
        node_paths(&spec.devices[0].container_edits),
        ["/dev/nvidia1"]
    );
    assert_eq!(
        spec.devices[1].annotations["fumarole.dev/gpu-instance"],
        "2"
    );
    assert_eq!(
        spec.devices[1].annotations["fumarole.dev/partition-of"],
        "GPU-uuid-1"
    );
    // Asked again: the file's answer, nothing made twice.
    assert_eq!(
        p.prepare(&reference("mig", "uid-mig")).await.unwrap(),
        answer
    );
    assert_eq!(fake.made.lock().unwrap().len(), 2);
    // A claim whose second partition cannot be made: the first is removed again, no file.
    let e = p.prepare(&reference("half", "uid-half")).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("partition nvidia-1-7g-80gb-0: 7g.80gb refused"),
        "{e}"
    );
    assert_eq!(*fake.destroyed.lock().unwrap(), [3]);
    assert!(
        !cdi_dir
            .path()
            .join(cdi::file_name(GPU_DRIVER, "uid-half"))
            .exists()
    );
    // Unprepare removes both instances, then the file; again is success.
    p.unprepare(&reference("mig", "uid-mig")).await.unwrap();
    assert_eq!(*fake.destroyed.lock().unwrap(), [3, 1, 2]);
    assert!(
        !cdi_dir
            .path()
            .join(cdi::file_name(GPU_DRIVER, "uid-mig"))
            .exists()
    );
    p.unprepare(&reference("mig", "uid-mig")).await.unwrap();
    assert_eq!(fake.destroyed.lock().unwrap().len(), 3);
}

/// An Ascend vNPU partition: made on prepare, the container given host `/dev/vdavinci<id>` as
/// `/dev/davinci<id>` with the id visible and the runtime told it is virtual; removed on
/// unprepare, from the spec file alone.
#[tokio::test]
async fn a_vnpu_is_made_on_prepare_and_removed_on_unprepare() {
    let (node, _, _root) = dra_node(ALL_DRA);
    let fake = Arc::new(FakePartitioner::default());
    let node = node.with_partitioner(fake.clone());
    let cdi_dir = tempfile::tempdir().unwrap();
    let claims = FakeClaims::with(&[claim(
        "vnpu",
        "uid-vnpu",
        Some(&[(NPU_DRIVER, NODE, "huawei-1-vir04-0", "a")]),
    )]);
    let p = plugin(NPU_DRIVER, &node, cdi_dir.path(), claims);
    let answer = p.prepare(&reference("vnpu", "uid-vnpu")).await.unwrap();
    assert_eq!(answer.len(), 1);
    let spec = spec_of(cdi_dir.path(), NPU_DRIVER, "uid-vnpu");
    let env = &spec.container_edits.env;
    assert!(
        env.contains(&"ASCEND_VISIBLE_DEVICES=101".to_string()),
        "{env:?}"
    );
    assert!(
        env.contains(&"ASCEND_RUNTIME_OPTIONS=VIRTUAL".to_string()),
        "{env:?}"
    );
    assert_eq!(
        spec.devices[0].container_edits.device_nodes,
        [cdi::DeviceNode {
            path: "/dev/davinci101".into(),
            host_path: Some("/dev/vdavinci101".into()),
            permissions: Some("rw".into()),
        }]
    );
    assert_eq!(spec.devices[0].annotations["fumarole.dev/vnpu-id"], "101");
    assert_eq!(
        fake.made.lock().unwrap()[0],
        (
            "Ascend910-1".to_string(),
            fumarole_topology::dra::MadePartition::Vnpu { vdev_id: 101 }
        )
    );
    p.unprepare(&reference("vnpu", "uid-vnpu")).await.unwrap();
    assert_eq!(*fake.destroyed.lock().unwrap(), [101]);
    assert!(
        !cdi_dir
            .path()
            .join(cdi::file_name(NPU_DRIVER, "uid-vnpu"))
            .exists()
    );
}
