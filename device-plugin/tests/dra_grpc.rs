#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The DRA kubelet plugin over its unix sockets, driven by our own tonic clients the way the
//! kubelet drives it: find the registration socket, `GetInfo`, dial the endpoint it names,
//! `NotifyRegistrationStatus`, then prepare and unprepare claims. Then a second server over
//! the same directories (a restart) with the API server unreachable. This is not the kubelet:
//! the e2e with the kubelet's DRA manager comes with the Go harness.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fumarole_device_plugin::config::Config;
use fumarole_device_plugin::dra::api::dra_plugin_client::DraPluginClient;
use fumarole_device_plugin::dra::api::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use fumarole_device_plugin::dra::claims::{ClaimFuture, ClaimReader};
use fumarole_device_plugin::dra::node::DraNode;
use fumarole_device_plugin::dra::registration_api::registration_client::RegistrationClient;
use fumarole_device_plugin::dra::registration_api::{InfoRequest, RegistrationStatus};
use fumarole_device_plugin::dra::serve::{self, DraDirs};
use fumarole_device_plugin::resources::{resources_with, split};
use fumarole_topology::dra::{GPU_DRIVER, NPU_DRIVER};
use fumarole_topology::{
    CpuSet, Device, DeviceKind, Health, LinkClass, LinkMatrix, NodeTopology, PciId, Vendor,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use tonic::transport::{Channel, Endpoint};

const NODE: &str = "node-a";

/// Two NVIDIA GPUs (DRA) and one Ascend NPU (device plugin only), nodes under a temp root.
fn dra_node() -> (DraNode, tempfile::TempDir) {
    let gpu = |index: u32| Device {
        id: format!("GPU-{index}"),
        index,
        vendor: Vendor::Nvidia,
        kind: DeviceKind::Gpu,
        model: "H100".into(),
        pci_bus_id: format!("0000:{:02x}:00.0", index + 0x10),
        pci_path: Vec::new(),
        pci_id: PciId {
            vendor: 0x10de,
            device: 0x2330,
            class: 0x0302,
        },
        numa_node: Some(0),
        local_cpus: CpuSet::default(),
        dev_nodes: vec![format!("/dev/nvidia{index}")],
        health: Health::Healthy,
        uuid: Some(format!("GPU-{index}")),
        serial: None,
        memory_bytes: None,
        mig: Vec::new(),
    };
    let mut npu = gpu(0);
    npu.id = "Ascend910-0".into();
    npu.vendor = Vendor::Huawei;
    npu.kind = DeviceKind::Npu;
    npu.pci_id.vendor = 0x19e5;
    npu.dev_nodes = vec!["/dev/davinci0".into()];
    npu.uuid = None;
    let devices = vec![gpu(0), gpu(1), npu];
    let t = NodeTopology {
        hostname: NODE.into(),
        packages: Vec::new(),
        processing_units: Vec::new(),
        allowed_cpus: CpuSet::default(),
        numa_nodes: Vec::new(),
        links: LinkMatrix::filled(devices.len(), LinkClass::CrossNuma),
        devices,
        super_node: None,
    };
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("dev")).unwrap();
    for f in ["nvidia0", "nvidia1", "nvidiactl", "davinci0"] {
        std::fs::write(root.path().join("dev").join(f), "").unwrap();
    }
    let config = Config::parse(
        "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n",
        None,
    )
    .unwrap();
    let (_, dra) = split(resources_with(&t, root.path(), false, &config).unwrap());
    (DraNode::new(NODE, t, dra), root)
}

/// Claims by namespace and name; `None`: the API server is down.
struct Claims(Option<Mutex<BTreeMap<(String, String), ResourceClaim>>>);

impl ClaimReader for Claims {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> ClaimFuture<'a> {
        let found = self.0.as_ref().map(|m| {
            m.lock()
                .unwrap()
                .get(&(namespace.to_string(), name.to_string()))
                .cloned()
        });
        Box::pin(async move { found.ok_or_else(|| "connection refused".to_string()) })
    }
}

fn claim(name: &str, uid: &str, devices: &[&str]) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ns".into());
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(uid.into());
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    devices
                        .iter()
                        .map(|d| DeviceRequestAllocationResult {
                            driver: GPU_DRIVER.into(),
                            pool: NODE.into(),
                            device: d.to_string(),
                            request: "gpu".into(),
                            ..Default::default()
                        })
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

fn wire(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

async fn channel(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix:{}", socket.display()))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("dialing {}: {e}", socket.display()))
}

fn dirs(base: &Path) -> DraDirs {
    DraDirs {
        registry: base.join("plugins_registry"),
        plugins: base.join("plugins"),
        cdi: base.join("cdi"),
    }
}

#[tokio::test]
async fn the_kubelet_way_register_prepare_unprepare_restart() {
    let base = tempfile::tempdir().unwrap();
    let dirs = dirs(base.path());
    let (node, _root) = dra_node();
    let claims = Claims(Some(Mutex::new(
        [
            claim("two", "uid-two", &["nvidia-0", "nvidia-1"]),
            claim("bad", "uid-bad", &["nvidia-7"]),
        ]
        .into_iter()
        .map(|c| {
            (
                (
                    c.metadata.namespace.clone().unwrap(),
                    c.metadata.name.clone().unwrap(),
                ),
                c,
            )
        })
        .collect(),
    )));
    let server = serve::start(&dirs, node.clone(), Arc::new(claims)).unwrap();
    assert_eq!(server.drivers(), [GPU_DRIVER]);
    // Only drivers with DRA devices register: the NPU is the device plugin's.
    let registered: Vec<PathBuf> = std::fs::read_dir(&dirs.registry)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        registered,
        [dirs.registry.join("gpu.fumarole.dev-reg.sock")]
    );
    assert!(!dirs.registration_socket(NPU_DRIVER).exists());

    // Registration, as the plugin watcher does it.
    let mut reg = RegistrationClient::new(channel(&registered[0]).await);
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, GPU_DRIVER);
    assert_eq!(
        PathBuf::from(&info.endpoint),
        dirs.plugins.join("gpu.fumarole.dev/dra.sock")
    );
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    let mut status = server.registration_status(GPU_DRIVER).unwrap();
    assert_eq!(*status.borrow(), None);
    reg.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    status.changed().await.unwrap();
    assert_eq!(*status.borrow(), Some(Ok(())));

    // The DRA service at the endpoint GetInfo named.
    let mut dra = DraPluginClient::new(channel(Path::new(&info.endpoint)).await);
    let prepared = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![wire("two", "uid-two"), wire("bad", "uid-bad")],
        })
        .await
        .unwrap()
        .into_inner()
        .claims;
    assert_eq!(prepared.len(), 2);
    let two = &prepared["uid-two"];
    assert_eq!(two.error, "");
    let ids: Vec<&str> = two
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter().map(String::as_str))
        .collect();
    assert_eq!(
        ids,
        [
            "gpu.fumarole.dev/claim=uid-two-nvidia-0",
            "gpu.fumarole.dev/claim=uid-two-nvidia-1"
        ]
    );
    assert!(
        two.devices
            .iter()
            .all(|d| d.pool_name == NODE && d.request_names == ["gpu"] && d.share_id.is_none())
    );
    assert!(
        prepared["uid-bad"]
            .error
            .contains("\"nvidia-7\" of driver gpu.fumarole.dev is not a device of node node-a"),
        "{}",
        prepared["uid-bad"].error
    );
    assert!(prepared["uid-bad"].devices.is_empty());
    let spec = dirs.cdi.join("gpu.fumarole.dev-claim_uid-two.json");
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(
        text.contains("NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-1"),
        "{text}"
    );

    // Restart: the old server goes, a new one serves the same directories with the API
    // server down. It answers the prepared claim from its file and unprepares it.
    drop((reg, dra));
    server.shutdown().await;
    assert!(!dirs.registration_socket(GPU_DRIVER).exists());
    let server = serve::start(&dirs, node, Arc::new(Claims(None))).unwrap();
    let mut dra = DraPluginClient::new(channel(&dirs.service_socket(GPU_DRIVER)).await);
    let again = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![wire("two", "uid-two")],
        })
        .await
        .unwrap()
        .into_inner()
        .claims;
    assert_eq!(&again["uid-two"], two);
    let unprepared = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![wire("two", "uid-two"), wire("bad", "uid-bad")],
        })
        .await
        .unwrap()
        .into_inner()
        .claims;
    assert_eq!(unprepared.len(), 2);
    assert!(unprepared.values().all(|u| u.error.is_empty()));
    assert!(!spec.exists());
    assert_eq!(std::fs::read_dir(&dirs.cdi).unwrap().count(), 0);
    drop(server);
}
