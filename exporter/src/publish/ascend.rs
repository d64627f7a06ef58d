//! What Huawei's Ascend scheduler plugin (`ascend-for-volcano`, with
//! `useClusterInfoManager: "false"`) reads of a node, rendered from the node's topology and
//! health: the per-node device-info ConfigMap and the Ascend node labels. Pure functions; the
//! publisher writes them when `--ascend-device-info` is on (the labels also with
//! `--compat-labels`). The format is in `shared/reference/ascend-contract.md`; the contract test
//! `exporter/tests/ascend_contract.rs` parses what this module renders with types of its own.
//!
//! Start at [`device_info`] (what the ConfigMap should list) and [`body`] (the object).

use std::collections::BTreeMap;

use fumarole_topology::{FaultKind, NodeHealth, NodeTopology, SuperNodeSource, Vendor};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::device_health::dcmi::answers::{ChipInfo, SuperPod};

use super::objects::label_value;

/// Namespace of the device-info ConfigMaps.
pub const NAMESPACE: &str = "kube-system";
/// The ConfigMap of node `n` is `mindx-dl-deviceinfo-<n>`.
pub const NAME_PREFIX: &str = "mindx-dl-deviceinfo-";
/// The label the scheduler plugin selects the ConfigMaps by (value `"true"`).
pub const CONSUMER_LABEL: &str = "mx-consumer-cim";
/// The data key holding the JSON.
pub const DATA_KEY: &str = "DeviceInfoCfg";
/// `SuperPodID`, `ServerIndex`, `RackID` where they do not apply.
pub const NOT_APPLICABLE: i64 = -1;
/// The label of the server model as Huawei's device plugin writes it (`Ascend910B-20`).
pub const SERVER_TYPE_LABEL: &str = "servertype";
/// The label of the chip's name as DCMI gives it (`910B3`).
pub const CHIP_NAME_LABEL: &str = "node.kubernetes.io/npu.chip.name";
/// Suffixes of the per-state device lists, after the resource name.
pub const SUFFIXES: [&str; 4] = ["", "-Unhealthy", "-NetworkUnhealthy", "-Recovering"];

/// The ConfigMap name of node `node`.
pub fn configmap_name(node: &str) -> String {
    format!("{NAME_PREFIX}{node}")
}

/// What the node's ConfigMap says, apart from its `UpdateTime`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Resource key (`huawei.com/Ascend910`, `huawei.com/Ascend910-Unhealthy`, ...) to the
    /// comma-separated device ids.
    pub lists: BTreeMap<String, String>,
    pub super_pod_id: i64,
    pub server_index: i64,
    pub rack_id: i64,
}

/// The device lists of node `t` with health `health`, and its super-pod place; `None` when the
/// node has no Ascend device. Healthy: no fault that takes the device out. Unhealthy: a
/// disabling fault other than the RoCE network's. NetworkUnhealthy: a RoCE network fault
/// (`dcmi-network`). Recovering: always empty (fumarole has no such state). A device with
/// both kinds of fault is in both lists. `SuperPodID` is the node's super-node id when it is
/// a number (any source), `ServerIndex` the hardware's when the hardware's super-pod is that
/// one; `RackID` is always -1: Huawei's device plugin fills it (from the super-pod info's
/// `chassis_id`) only on Ascend 950 (A5) super-pods of type 1D/2D, never on A3 hardware.
pub fn device_info(
    t: &NodeTopology,
    health: &NodeHealth,
    hardware: Option<&SuperPod>,
) -> Option<DeviceInfo> {
    let mut npus: Vec<_> = t
        .devices
        .iter()
        .filter(|d| d.vendor == Vendor::Huawei && d.id.starts_with("Ascend"))
        .collect();
    if npus.is_empty() {
        return None;
    }
    npus.sort_by_key(|d| (d.default_resource_name(), d.index));
    let mut lists: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for d in &npus {
        let resource = d.default_resource_name();
        for suffix in SUFFIXES {
            lists.entry(format!("{resource}{suffix}")).or_default();
        }
        let faults = health.faults(&d.id);
        let mut put = |suffix: &str| {
            lists
                .entry(format!("{resource}{suffix}"))
                .or_default()
                .push(&d.id);
        };
        if health.is_healthy(&d.id) {
            put("");
        }
        if faults
            .iter()
            .any(|f| f.kind.disables() && f.kind != FaultKind::DcmiNetwork)
        {
            put("-Unhealthy");
        }
        if faults.iter().any(|f| f.kind == FaultKind::DcmiNetwork) {
            put("-NetworkUnhealthy");
        }
    }
    let super_pod_id = t
        .super_node
        .as_ref()
        .and_then(|s| s.id.parse::<i64>().ok())
        .filter(|id| *id >= 0)
        .unwrap_or(NOT_APPLICABLE);
    let server_index = hardware
        .and_then(|h| h.member)
        .filter(|(id, _)| i64::from(*id) == super_pod_id)
        .map_or(NOT_APPLICABLE, |(_, index)| i64::from(index));
    Some(DeviceInfo {
        lists: lists.into_iter().map(|(k, v)| (k, v.join(","))).collect(),
        super_pod_id,
        server_index,
        rack_id: NOT_APPLICABLE,
    })
}

/// `DeviceInfo` of the JSON, field names as the plugin reads them.
#[derive(Serialize, Deserialize)]
struct InfoJson {
    #[serde(rename = "DeviceList")]
    device_list: BTreeMap<String, String>,
    #[serde(rename = "UpdateTime")]
    update_time: i64,
}

#[derive(Serialize)]
struct CfgJson<'a> {
    #[serde(rename = "DeviceInfo")]
    device_info: &'a InfoJson,
    #[serde(rename = "CheckCode")]
    check_code: String,
    #[serde(rename = "SuperPodID")]
    super_pod_id: i64,
    #[serde(rename = "ServerIndex")]
    server_index: i64,
    #[serde(rename = "RackID")]
    rack_id: i64,
}

#[derive(Deserialize)]
struct LiveCfg {
    #[serde(rename = "DeviceInfo")]
    device_info: InfoJson,
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `DeviceInfoCfg` string: `DeviceInfo` (lists, `update_time`), its `CheckCode` (SHA-256 of
/// `DeviceInfo`'s compact JSON, map keys in order, as Go's `json.Marshal` writes it), and the
/// super-pod fields.
pub fn device_info_cfg(d: &DeviceInfo, update_time: i64) -> String {
    let info = InfoJson {
        device_list: d.lists.clone(),
        update_time,
    };
    // Serialising strings and integers cannot fail; an empty code would only fail the check.
    let check_code = serde_json::to_vec(&info)
        .map(|b| sha256_hex(&b))
        .unwrap_or_default();
    serde_json::to_string(&CfgJson {
        device_info: &info,
        check_code,
        super_pod_id: d.super_pod_id,
        server_index: d.server_index,
        rack_id: d.rack_id,
    })
    .unwrap_or_default()
}

/// The part of the ConfigMap we write (server-side apply body without name and kind).
pub fn body(d: &DeviceInfo, update_time: i64) -> Value {
    json!({
        "metadata": { "labels": { CONSUMER_LABEL: "true" } },
        "data": { DATA_KEY: device_info_cfg(d, update_time) },
    })
}

/// The device lists and `UpdateTime` of a live ConfigMap's `DeviceInfoCfg`; `None` when it
/// does not parse.
pub fn parse_live(cfg: &str) -> Option<(BTreeMap<String, String>, i64)> {
    let live: LiveCfg = serde_json::from_str(cfg).ok()?;
    Some((live.device_info.device_list, live.device_info.update_time))
}

/// `UpdateTime` for `lists`: kept while the lists stay what we last published (`last`) or
/// what the live object already says (`live`, e.g. after an agent restart), else `now`. So the
/// time, and with it the ConfigMap, changes only when the lists do.
pub fn update_time(
    lists: &BTreeMap<String, String>,
    last: Option<(&BTreeMap<String, String>, i64)>,
    live: Option<(&BTreeMap<String, String>, i64)>,
    now: i64,
) -> i64 {
    [last, live]
        .into_iter()
        .flatten()
        .find(|(l, _)| *l == lists)
        .map_or(now, |(_, t)| t)
}

/// The Ascend node labels Huawei's scheduler plugin selects nodes by, where fumarole knows
/// the value (docs/labels.md has the table): `accelerator` (`huawei-<family>` of the first
/// Ascend device's id) and `accelerator-type` from the NPUs' model and count and the
/// hardware's super-pod answer: 8 x Ascend910 -> `module`; 8 x Ascend910B on a server whose
/// chips do not answer the super-pod query -> `module-910b-8`; 16 NPUs whose chips answer it
/// (A3) -> `module-a3-16`, or `module-a3-16-super-pod` when the node is in a super-node. Any
/// other shape (16 x 910B without the answer: A2 `module-910b-16` or A3?) is left out.
/// `servertype` and `node.kubernetes.io/npu.chip.name` come from the chips' DCMI chip info
/// `chip` ([`chip_labels`]); without it they are not written.
pub fn labels(
    t: &NodeTopology,
    hardware: Option<&SuperPod>,
    chip: Option<&ChipInfo>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let npus: Vec<_> = t
        .devices
        .iter()
        .filter(|d| d.vendor == Vendor::Huawei)
        .filter(|d| {
            d.id.rsplit_once('-')
                .is_some_and(|(f, _)| f.starts_with("Ascend"))
        })
        .collect();
    let Some(first) = npus.first() else {
        return out;
    };
    let family = first.id.rsplit_once('-').map_or("", |(f, _)| f);
    out.insert("accelerator".into(), format!("huawei-{family}"));
    if let Some(chip) = chip {
        // Huawei tells A3 servers by board id; we by the chips answering the super-pod query.
        let a3 = family == "Ascend910" && hardware.is_some();
        out.extend(chip_labels(chip, a3));
    }
    // The server shapes below are all Ascend 910-family training servers.
    if family != "Ascend910" {
        return out;
    }
    let models: Vec<&str> = npus.iter().map(|d| d.model.as_str()).collect();
    let all = |m: &str| models.iter().all(|x| *x == m);
    let kind = match (npus.len(), hardware) {
        (8, None) if all("Ascend910") => Some("module".to_string()),
        (8, None) if all("Ascend910B") => Some("module-910b-8".to_string()),
        (16, Some(_)) if models.iter().all(|m| m.starts_with("Ascend910")) => {
            Some(if t.super_node.is_some() {
                "module-a3-16-super-pod".to_string()
            } else {
                "module-a3-16".to_string()
            })
        }
        _ => None,
    };
    if let Some(kind) = kind {
        out.insert("accelerator-type".into(), kind);
    }
    out
}

/// `servertype` and `node.kubernetes.io/npu.chip.name` from a chip's DCMI chip info, as
/// Huawei's device plugin derives them (MindCluster `ascend-device-plugin`, `getNewNodeLabel`
/// and `updateChipNameToNode`): the chip name as DCMI gives it (`910B3`), and
/// `<device type>-<AI cores>` (`Ascend910B-20`), the device type being `Ascend910A3` on A3
/// servers (`a3`), else from the chip name: `910B<digit>` or `A2G<digit>` -> `Ascend910B`,
/// any other `910...` -> `Ascend910`. Other chips (310P: Huawei adds a card-mode suffix we
/// cannot know) get no `servertype`; a name that is not a label value, or 0 AI cores, no
/// label of its own.
pub fn chip_labels(chip: &ChipInfo, a3: bool) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if label_value(&chip.name) == chip.name {
        out.insert(CHIP_NAME_LABEL.to_string(), chip.name.clone());
    }
    let digit_after = |prefix: &str| {
        chip.name
            .strip_prefix(prefix)
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| c.is_ascii_digit())
    };
    let device_type = if a3 {
        Some("Ascend910A3")
    } else if digit_after("910B") || digit_after("A2G") {
        Some("Ascend910B")
    } else if chip.name.starts_with("910") {
        Some("Ascend910")
    } else {
        None
    };
    if let Some(device_type) = device_type.filter(|_| chip.ai_cores > 0) {
        out.insert(
            SERVER_TYPE_LABEL.to_string(),
            format!("{device_type}-{}", chip.ai_cores),
        );
    }
    out
}

/// The node's super-node from the hardware (an A3 chip's super-pod id), for a node whose
/// super-node nobody set: the flag, the label and the override file win over it.
pub fn hardware_super_node(
    current: Option<&fumarole_topology::SuperNode>,
    hardware: Option<&SuperPod>,
) -> Option<fumarole_topology::SuperNode> {
    if let Some(s) = current {
        return Some(s.clone());
    }
    let (id, _) = hardware?.member?;
    Some(fumarole_topology::SuperNode {
        id: id.to_string(),
        source: SuperNodeSource::Hardware,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use fumarole_topology::model::{Device, DeviceKind, PciId};
    use fumarole_topology::{CpuSet, Fault, Health, LinkClass, LinkMatrix, SuperNode};

    /// The fixtures' shapes: `n` NPUs of `model` (ids `Ascend910-N`), or 4 NVIDIA GPUs.
    fn node(name: &str) -> NodeTopology {
        let (vendor, model, n) = match name {
            "atlas-800-910" => (Vendor::Huawei, "Ascend910", 8),
            "atlas-800t-a2" => (Vendor::Huawei, "Ascend910B", 8),
            "atlas-a3-16" => (Vendor::Huawei, "Ascend910B", 16),
            _ => (Vendor::Nvidia, "NVIDIA L40S", 4),
        };
        let devices: Vec<Device> = (0..n)
            .map(|i| Device {
                id: if vendor == Vendor::Huawei {
                    format!("Ascend910-{i}")
                } else {
                    format!("GPU-{i}")
                },
                index: i,
                vendor,
                kind: DeviceKind::Gpu,
                model: model.into(),
                pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
                pci_path: vec![],
                pci_id: PciId {
                    vendor: 0x19e5,
                    device: 0xd801,
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
            hostname: name.into(),
            packages: vec![],
            processing_units: vec![],
            allowed_cpus: CpuSet::default(),
            numa_nodes: vec![],
            links: LinkMatrix::filled(devices.len(), LinkClass::CrossNuma),
            devices,
            super_node: None,
        }
    }

    #[test]
    fn lists_follow_health() {
        let t = node("atlas-800-910");
        let mut h = NodeHealth::default();
        h.add("Ascend910-2", Fault::new(FaultKind::DcmiChip, "chip"));
        h.add("Ascend910-5", Fault::new(FaultKind::DcmiNetwork, "roce"));
        h.add("Ascend910-1", Fault::new(FaultKind::HccsDown, "link only"));
        let d = device_info(&t, &h, None).unwrap();
        assert_eq!(
            d.lists["huawei.com/Ascend910"],
            "Ascend910-0,Ascend910-1,Ascend910-3,Ascend910-4,Ascend910-6,Ascend910-7"
        );
        assert_eq!(d.lists["huawei.com/Ascend910-Unhealthy"], "Ascend910-2");
        assert_eq!(
            d.lists["huawei.com/Ascend910-NetworkUnhealthy"],
            "Ascend910-5"
        );
        assert_eq!(d.lists["huawei.com/Ascend910-Recovering"], "");
        assert_eq!(d.lists.len(), 4);
        assert_eq!((d.super_pod_id, d.server_index, d.rack_id), (-1, -1, -1));
        // No Ascend device: no ConfigMap.
        assert_eq!(device_info(&node("pcie-4gpu"), &h, None), None);
    }

    #[test]
    fn ten_devices_sort_by_index_not_text() {
        let t = node("atlas-a3-16");
        let d = device_info(&t, &NodeHealth::default(), None).unwrap();
        assert!(
            d.lists["huawei.com/Ascend910"].starts_with("Ascend910-0,Ascend910-1,Ascend910-2,"),
            "{}",
            d.lists["huawei.com/Ascend910"]
        );
        assert!(d.lists["huawei.com/Ascend910"].ends_with("Ascend910-9,Ascend910-10,Ascend910-11,Ascend910-12,Ascend910-13,Ascend910-14,Ascend910-15"));
    }

    #[test]
    fn super_pod_fields() {
        let mut t = node("atlas-a3-16");
        let hw = SuperPod {
            member: Some((7, 3)),
        };
        t.super_node = hardware_super_node(t.super_node.as_ref(), Some(&hw));
        assert_eq!(
            t.super_node,
            Some(SuperNode {
                id: "7".into(),
                source: SuperNodeSource::Hardware
            })
        );
        let d = device_info(&t, &NodeHealth::default(), Some(&hw)).unwrap();
        assert_eq!((d.super_pod_id, d.server_index), (7, 3));
        // An operator's id wins; a non-numeric one is no SuperPodID, and the hardware's index
        // belongs to the hardware's super-pod only.
        let given = SuperNode {
            id: "rack-2".into(),
            source: SuperNodeSource::NodeLabel,
        };
        t.super_node = hardware_super_node(Some(&given), Some(&hw));
        assert_eq!(t.super_node.as_ref(), Some(&given));
        let d = device_info(&t, &NodeHealth::default(), Some(&hw)).unwrap();
        assert_eq!((d.super_pod_id, d.server_index), (-1, -1));
        // Chips in no super-pod: none.
        let none = SuperPod { member: None };
        assert_eq!(hardware_super_node(None, Some(&none)), None);
    }

    #[test]
    fn update_time_moves_only_with_the_lists() {
        let a: BTreeMap<String, String> = [("k".to_string(), "x".to_string())].into();
        let b: BTreeMap<String, String> = [("k".to_string(), "y".to_string())].into();
        assert_eq!(update_time(&a, None, None, 100), 100);
        assert_eq!(update_time(&a, Some((&a, 50)), None, 100), 50);
        assert_eq!(update_time(&a, Some((&b, 50)), None, 100), 100);
        // After a restart, the live object's time when it lists the same.
        assert_eq!(update_time(&a, None, Some((&a, 40)), 100), 40);
        assert_eq!(update_time(&a, None, Some((&b, 40)), 100), 100);
    }

    #[test]
    fn cfg_round_trips_and_checks() {
        let t = node("atlas-800t-a2");
        let d = device_info(&t, &NodeHealth::default(), None).unwrap();
        let cfg = device_info_cfg(&d, 1_700_000_000);
        let (lists, time) = parse_live(&cfg).unwrap();
        assert_eq!((lists, time), (d.lists.clone(), 1_700_000_000));
        assert!(cfg.contains("\"CheckCode\":\""), "{cfg}");
        assert_eq!(parse_live("not json"), None);
        // Known SHA-256 (of "abc").
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn labels_per_fixture() {
        let labels = |name: &str, hw: Option<SuperPod>, sn: Option<&str>| {
            let mut t = node(name);
            t.super_node = sn.map(|id| SuperNode {
                id: id.into(),
                source: SuperNodeSource::Hardware,
            });
            super::labels(&t, hw.as_ref(), None)
        };
        let kind = |l: BTreeMap<String, String>| l.get("accelerator-type").cloned();
        let a3 = Some(SuperPod {
            member: Some((1, 0)),
        });
        assert_eq!(
            labels("atlas-800-910", None, None)["accelerator"],
            "huawei-Ascend910"
        );
        assert_eq!(kind(labels("atlas-800-910", None, None)).unwrap(), "module");
        assert_eq!(
            kind(labels("atlas-800t-a2", None, None)).unwrap(),
            "module-910b-8"
        );
        assert_eq!(kind(labels("atlas-a3-16", None, None)), None);
        assert_eq!(
            kind(labels("atlas-a3-16", Some(SuperPod { member: None }), None)).unwrap(),
            "module-a3-16"
        );
        assert_eq!(
            kind(labels("atlas-a3-16", a3, Some("1"))).unwrap(),
            "module-a3-16-super-pod"
        );
        let l = labels("atlas-a3-16", a3, Some("1"));
        assert!(
            !l.contains_key("servertype") && !l.contains_key("node.kubernetes.io/npu.chip.name")
        );
        assert!(labels("pcie-4gpu", None, None).is_empty());
    }

    fn chip(name: &str, ai_cores: u32) -> ChipInfo {
        ChipInfo {
            chip_type: "Ascend".into(),
            name: name.into(),
            version: "V1".into(),
            ai_cores,
        }
    }

    #[test]
    fn chip_labels_as_huawei_derives_them() {
        let get = |c: ChipInfo, a3: bool| {
            let l = chip_labels(&c, a3);
            (
                l.get(SERVER_TYPE_LABEL).cloned(),
                l.get(CHIP_NAME_LABEL).cloned(),
            )
        };
        let some = |a: &str, b: &str| (Some(a.to_string()), Some(b.to_string()));
        // The reference's example pair: an Atlas 800T A2 chip.
        assert_eq!(
            get(chip("910B3", 20), false),
            some("Ascend910B-20", "910B3")
        );
        assert_eq!(
            get(chip("910B4", 20), false),
            some("Ascend910B-20", "910B4")
        );
        assert_eq!(get(chip("A2G1", 24), false), some("Ascend910B-24", "A2G1"));
        // Ascend 910 (Atlas 800 training server): the older names.
        assert_eq!(get(chip("910A", 32), false), some("Ascend910-32", "910A"));
        assert_eq!(
            get(chip("910ProB", 30), false),
            some("Ascend910-30", "910ProB")
        );
        // A plain "910B" is the older 910 (no digit), not a 910B-generation chip.
        assert_eq!(get(chip("910B", 32), false), some("Ascend910-32", "910B"));
        // A3: the server decides the type, the name stays as DCMI gives it.
        assert_eq!(
            get(chip("Ascend910", 24), true),
            some("Ascend910A3-24", "Ascend910")
        );
        // Without A3 hardware, "Ascend910" names no type we know: the name only.
        assert_eq!(
            get(chip("Ascend910", 24), false),
            (None, Some("Ascend910".into()))
        );
        // 310P: Huawei's servertype has a card-mode suffix we do not know.
        assert_eq!(get(chip("310P3", 8), false), (None, Some("310P3".into())));
        // No AI cores: no servertype. A name that is no label value: no name label.
        assert_eq!(get(chip("910B3", 0), false), (None, Some("910B3".into())));
        assert_eq!(
            get(chip("910B3!", 20), false),
            (Some("Ascend910B-20".into()), None)
        );
        assert_eq!(get(chip(&"9".repeat(64), 20), false).1, None);
    }

    #[test]
    fn chip_labels_join_the_ascend_labels() {
        let t = node("atlas-800t-a2");
        let l = labels(&t, None, Some(&chip("910B3", 20)));
        assert_eq!(l["servertype"], "Ascend910B-20");
        assert_eq!(l["node.kubernetes.io/npu.chip.name"], "910B3");
        assert_eq!(l["accelerator-type"], "module-910b-8");
        let a3 = SuperPod {
            member: Some((7, 3)),
        };
        let l = labels(
            &node("atlas-a3-16"),
            Some(&a3),
            Some(&chip("Ascend910", 24)),
        );
        assert_eq!(l["servertype"], "Ascend910A3-24");
        // No Ascend device: nothing, whatever the chip info.
        assert!(labels(&node("pcie-4gpu"), None, Some(&chip("910B3", 20))).is_empty());
    }
}
