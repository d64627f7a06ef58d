//! Contract test: what `publish::ascend` renders, parsed with types written here from the
//! documented format (`shared/reference/ascend-contract.md`: Huawei's device-info ConfigMap
//! and node labels), not with the writer's types. Unknown fields are refused, so a renamed or
//! extra key fails here. The node labels are parsed the same way: a map with exactly the
//! reference's keys (`accelerator`, `accelerator-type`, `servertype`,
//! `node.kubernetes.io/npu.chip.name`), `servertype` split as `<chip kind>-<AI cores>`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use fumarole_exporter::device_health::dcmi::answers::{ChipInfo, SuperPod};
use fumarole_exporter::fixtures::{
    ATLAS_800_910_CHIP, ATLAS_800T_A2_CHIP, ATLAS_A3_CHIP, ChipAnswer,
};
use fumarole_exporter::publish::ascend;
use fumarole_topology::model::{Device, DeviceKind, PciId};
use fumarole_topology::{
    CpuSet, Fault, FaultKind, Health, LinkClass, LinkMatrix, NodeHealth, NodeTopology, SuperNode,
    SuperNodeSource, Vendor,
};
use serde::Deserialize;

/// `DeviceInfoCfg` as the scheduler plugin reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceInfoCfg {
    #[serde(rename = "DeviceInfo")]
    device_info: DeviceInfo,
    #[serde(rename = "CheckCode")]
    check_code: String,
    #[serde(rename = "SuperPodID")]
    super_pod_id: i64,
    #[serde(rename = "ServerIndex")]
    server_index: i64,
    #[serde(rename = "RackID")]
    rack_id: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceInfo {
    #[serde(rename = "DeviceList")]
    device_list: BTreeMap<String, String>,
    #[serde(rename = "UpdateTime")]
    update_time: i64,
}

/// The ConfigMap part we write: labels and data.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigMapPart {
    metadata: Metadata,
    data: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    labels: BTreeMap<String, String>,
}

/// The Ascend node labels as the scheduler plugin reads them; no other key may appear.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeLabels {
    accelerator: String,
    #[serde(rename = "accelerator-type")]
    accelerator_type: Option<String>,
    #[serde(rename = "servertype")]
    server_type: Option<String>,
    #[serde(rename = "node.kubernetes.io/npu.chip.name")]
    chip_name: Option<String>,
}

fn parse_labels(labels: &BTreeMap<String, String>) -> NodeLabels {
    serde_json::from_value(serde_json::to_value(labels).unwrap()).unwrap()
}

/// `servertype` as `<chip kind>-<AI cores>` (`Ascend910B-20`: the reference's example).
fn server_type_parts(value: &str) -> (&str, u32) {
    let (kind, cores) = value.rsplit_once('-').unwrap();
    assert!(kind.starts_with("Ascend"), "{value}");
    (kind, cores.parse().unwrap())
}

fn chip(answer: ChipAnswer) -> ChipInfo {
    ChipInfo {
        chip_type: answer.chip_type.into(),
        name: answer.name.into(),
        version: answer.version.into(),
        ai_cores: answer.ai_cores,
    }
}

/// Go's `json.Marshal` of `DeviceInfo{DeviceList map[string]string; UpdateTime int64}`:
/// compact, fields in declaration order, map keys sorted.
fn go_json(info: &DeviceInfo) -> String {
    let list: Vec<String> = info
        .device_list
        .iter()
        .map(|(k, v)| {
            format!(
                "{}:{}",
                serde_json::to_string(k).unwrap(),
                serde_json::to_string(v).unwrap()
            )
        })
        .collect();
    format!(
        "{{\"DeviceList\":{{{}}},\"UpdateTime\":{}}}",
        list.join(","),
        info.update_time
    )
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `n` Ascend NPUs of `model` (ids `Ascend910-N`), as discovery names them.
fn npus(model: &str, n: u32) -> NodeTopology {
    let devices: Vec<Device> = (0..n)
        .map(|i| Device {
            id: format!("Ascend910-{i}"),
            index: i,
            vendor: Vendor::Huawei,
            kind: DeviceKind::Other,
            model: model.into(),
            pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
            pci_path: vec![],
            pci_id: PciId {
                vendor: 0x19e5,
                device: 0xd802,
                class: 0x1200,
            },
            numa_node: None,
            local_cpus: CpuSet::default(),
            dev_nodes: vec![],
            health: Health::Healthy,
            uuid: None,
            serial: None,
            memory_bytes: None,
            mig: Vec::new(),
        })
        .collect();
    NodeTopology {
        hostname: "n".into(),
        packages: vec![],
        processing_units: vec![],
        allowed_cpus: CpuSet::default(),
        numa_nodes: vec![],
        links: LinkMatrix::filled(devices.len(), LinkClass::Hccs),
        devices,
        super_node: None,
    }
}

fn parse(topology: &NodeTopology, health: &NodeHealth, hw: Option<&SuperPod>) -> DeviceInfoCfg {
    let info = ascend::device_info(topology, health, hw).unwrap();
    let body = ascend::body(&info, 1_764_000_000);
    let part: ConfigMapPart = serde_json::from_value(body).unwrap();
    assert_eq!(
        part.metadata.labels,
        BTreeMap::from([("mx-consumer-cim".to_string(), "true".to_string())])
    );
    assert_eq!(part.data.keys().collect::<Vec<_>>(), ["DeviceInfoCfg"]);
    let cfg: DeviceInfoCfg = serde_json::from_str(&part.data["DeviceInfoCfg"]).unwrap();
    assert_eq!(
        cfg.check_code,
        sha256_hex(go_json(&cfg.device_info).as_bytes())
    );
    assert_eq!(cfg.device_info.update_time, 1_764_000_000);
    cfg
}

#[test]
fn configmap_name_namespace_and_shape() {
    assert_eq!(
        ascend::configmap_name("node-7"),
        "mindx-dl-deviceinfo-node-7"
    );
    assert_eq!(ascend::NAMESPACE, "kube-system");
    let t = npus("Ascend910", 8);
    let mut h = NodeHealth::default();
    h.add(
        "Ascend910-3",
        Fault::new(FaultKind::DcmiChip, "chip health 3"),
    );
    h.add("Ascend910-6", Fault::new(FaultKind::DcmiNetwork, "RoCE"));
    let cfg = parse(&t, &h, None);
    let want: BTreeMap<String, String> = [
        (
            "huawei.com/Ascend910",
            "Ascend910-0,Ascend910-1,Ascend910-2,Ascend910-4,Ascend910-5,Ascend910-7",
        ),
        ("huawei.com/Ascend910-Unhealthy", "Ascend910-3"),
        ("huawei.com/Ascend910-NetworkUnhealthy", "Ascend910-6"),
        ("huawei.com/Ascend910-Recovering", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(cfg.device_info.device_list, want);
    assert_eq!(
        (cfg.super_pod_id, cfg.server_index, cfg.rack_id),
        (-1, -1, -1)
    );
}

#[test]
fn a3_super_pod_from_the_hardware() {
    let mut t = npus("Ascend910B", 16);
    let hw = SuperPod {
        member: Some((7, 3)),
    };
    t.super_node = ascend::hardware_super_node(None, Some(&hw));
    assert_eq!(
        t.super_node,
        Some(SuperNode {
            id: "7".into(),
            source: SuperNodeSource::Hardware
        })
    );
    let cfg = parse(&t, &NodeHealth::default(), Some(&hw));
    assert_eq!(
        (cfg.super_pod_id, cfg.server_index, cfg.rack_id),
        (7, 3, -1)
    );
    assert_eq!(
        cfg.device_info.device_list["huawei.com/Ascend910"]
            .split(',')
            .count(),
        16
    );
    let labels = ascend::labels(&t, Some(&hw), None);
    assert_eq!(
        labels,
        BTreeMap::from([
            ("accelerator".to_string(), "huawei-Ascend910".to_string()),
            (
                "accelerator-type".to_string(),
                "module-a3-16-super-pod".to_string()
            ),
        ])
    );
}

#[test]
fn labels_per_server_shape() {
    let kind = |t: &NodeTopology, hw: Option<&SuperPod>| {
        ascend::labels(t, hw, None).get("accelerator-type").cloned()
    };
    assert_eq!(kind(&npus("Ascend910", 8), None).as_deref(), Some("module"));
    assert_eq!(
        kind(&npus("Ascend910B", 8), None).as_deref(),
        Some("module-910b-8")
    );
    assert_eq!(
        kind(&npus("Ascend910B", 16), Some(&SuperPod { member: None })).as_deref(),
        Some("module-a3-16")
    );
    // 16 x 910B without the hardware's answer: A2 or A3 cannot be told apart, left out.
    assert_eq!(kind(&npus("Ascend910B", 16), None), None);
}

#[test]
fn chip_labels_per_fixture_parse_as_the_reference_says() {
    let a3 = SuperPod {
        member: Some((7, 3)),
    };
    for (t, hw, answer, kind, server_type, chip_name) in [
        (
            npus("Ascend910", 8),
            None,
            ATLAS_800_910_CHIP,
            "module",
            ("Ascend910", 32),
            "910A",
        ),
        (
            npus("Ascend910B", 8),
            None,
            ATLAS_800T_A2_CHIP,
            "module-910b-8",
            ("Ascend910B", 20),
            "910B3",
        ),
        (
            npus("Ascend910B", 16),
            Some(&a3),
            ATLAS_A3_CHIP,
            "module-a3-16",
            ("Ascend910A3", 24),
            "Ascend910",
        ),
    ] {
        let rendered = ascend::labels(&t, hw, Some(&chip(answer)));
        let l = parse_labels(&rendered);
        assert_eq!(l.accelerator, "huawei-Ascend910");
        assert_eq!(l.accelerator_type.as_deref(), Some(kind));
        assert_eq!(
            server_type_parts(l.server_type.as_deref().unwrap()),
            server_type
        );
        assert_eq!(l.chip_name.as_deref(), Some(chip_name));
    }
    // The reference's example pair, literally.
    let l = parse_labels(&ascend::labels(
        &npus("Ascend910B", 8),
        None,
        Some(&chip(ATLAS_800T_A2_CHIP)),
    ));
    assert_eq!(
        (l.server_type.as_deref(), l.chip_name.as_deref()),
        (Some("Ascend910B-20"), Some("910B3"))
    );
    // Without chip info: neither key.
    let l = parse_labels(&ascend::labels(&npus("Ascend910B", 8), None, None));
    assert!(l.server_type.is_none() && l.chip_name.is_none());
}
