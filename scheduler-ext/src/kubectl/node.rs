//! `kubectl fumarole node NODE`: the node's `DeviceTopology` for people: the link class
//! between every pair of devices (as `nvidia-smi topo -m` writes them: `NV18`, `HCCS`, `PIX`,
//! `SYS`, ...) with each device's NUMA node and CPUs, then each device's health, the reason
//! when it is unhealthy and the pod that uses it: the container the node reports it allocated
//! to, else the pod bound to the node whose `fumarole.dev/devices` choice names it (the
//! scheduler extension counts those as taken before the kubelet allocates them).

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use fumarole_topology::LinkClass;
use fumarole_topology::annotation::{self, DEVICES_ANNOTATION, DEVICES_NODE_ANNOTATION};
use fumarole_topology::crd::{DeviceTopology, device_topology};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use serde::Serialize;

use super::config::Connection;
use crate::text_table as table;

/// One node's devices, links and health.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub node: String,
    pub model: String,
    pub super_node: Option<String>,
    /// Where the super-node comes from (`nvlinkClique`, `overrideFile`, `nodeLabel`, `config`).
    pub super_node_source: Option<String>,
    pub healthy: usize,
    pub devices: Vec<DeviceRow>,
    /// `matrix[a][b]`: the short name of the link class between devices `a` and `b` (`X` on
    /// the diagonal, `-` where no link is published).
    pub matrix: Vec<Vec<String>>,
}

/// One device.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRow {
    /// `GPU0`, `NPU3`, `ACC1`: kind and position, as the matrix names it.
    pub label: String,
    pub id: String,
    pub model: String,
    pub pci_bus_id: String,
    pub numa_node: Option<u32>,
    pub local_cpus: String,
    pub uuid: Option<String>,
    /// `Healthy`, `Unhealthy`, or `Unknown` before the agent reported status.
    pub health: String,
    pub reason: Option<String>,
    /// `namespace/pod/container` the device is allocated to, as the node reports it.
    pub used_by: Option<String>,
    /// The device's shares in use (replicas, MIG devices): `<share> namespace/pod/container`
    /// each, as the node reports them.
    pub shares: Vec<String>,
    /// `namespace/pod` of the bound pod whose `fumarole.dev/devices` names the device.
    pub chosen_for: Option<String>,
}

/// Reads the node's `DeviceTopology`.
pub async fn read(conn: &Connection, node: &str) -> Result<NodeReport> {
    let api: Api<DeviceTopology> = Api::all(conn.client.clone());
    if let Some(dt) = api
        .get_opt(node)
        .await
        .with_context(|| format!("reading DeviceTopology {node}"))?
    {
        // Pods bound here and not finished: their device choices.
        let pods: Api<Pod> = Api::all(conn.client.clone());
        let fields = format!("spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed");
        let pods = pods
            .list(&ListParams::default().fields(&fields))
            .await
            .with_context(|| format!("listing the pods on {node}"))?;
        return Ok(NodeReport::of(&dt, &chosen(node, &pods.items)));
    }
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(conn.client.clone());
    match nodes
        .get_metadata_opt(node)
        .await
        .with_context(|| format!("reading node {node}"))?
    {
        Some(_) => bail!(
            "node {node} publishes no DeviceTopology: is fumarole-agent running on it, and does it have accelerators?"
        ),
        None => bail!("node {node} not found"),
    }
}

/// Device id -> `namespace/pod` for the `fumarole.dev/devices` choices of `pods`, bound to
/// `node`. As in the extension's view, an unusable annotation names nothing, and neither does
/// a choice made for another node (`fumarole.dev/devices-node`).
pub fn chosen(node: &str, pods: &[Pod]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for p in pods {
        let Some(annotations) = p.metadata.annotations.as_ref() else {
            continue;
        };
        if annotations
            .get(DEVICES_NODE_ANNOTATION)
            .is_some_and(|n| n != node)
        {
            continue;
        }
        let Some(value) = annotations.get(DEVICES_ANNOTATION) else {
            continue;
        };
        let Ok(choice) = annotation::parse(value) else {
            continue;
        };
        let key = fumarole_topology::pod::key(p);
        for id in choice.into_values().flatten() {
            out.insert(id, key.clone());
        }
    }
    out
}

impl NodeReport {
    /// The report of `dt`, with `chosen` (device id -> pod, [`chosen`]).
    pub fn of(dt: &DeviceTopology, chosen: &BTreeMap<String, String>) -> Self {
        let spec = &dt.spec;
        let status = dt.status.as_ref();
        let n = spec.devices.len();
        let mut matrix = vec![vec!["-".to_string(); n]; n];
        for (i, row) in matrix.iter_mut().enumerate() {
            if let Some(cell) = row.get_mut(i) {
                *cell = "X".into();
            }
        }
        for l in &spec.links {
            let (a, b) = (l.a as usize, l.b as usize);
            if a == b || a >= n || b >= n {
                continue;
            }
            // A kind this version does not know is shown as the agent wrote it.
            let cell = l
                .class()
                .map_or_else(|| l.kind.clone(), LinkClass::short_name);
            matrix[a][b] = cell.clone();
            matrix[b][a] = cell;
        }
        let devices: Vec<DeviceRow> = spec
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let s = status.and_then(|s| s.devices.get(&d.id));
                DeviceRow {
                    label: format!(
                        "{}{i}",
                        match d.kind.as_str() {
                            "gpu" => "GPU",
                            "npu" => "NPU",
                            _ => "ACC",
                        }
                    ),
                    id: d.id.clone(),
                    model: d.model.clone(),
                    pci_bus_id: d.pci_bus_id.clone(),
                    numa_node: d.numa_node,
                    local_cpus: d.local_cpus.clone(),
                    uuid: d.uuid.clone(),
                    health: s.map_or_else(|| "Unknown".into(), |s| s.health.clone()),
                    reason: s.and_then(|s| s.reason.clone()),
                    chosen_for: chosen.get(&d.id).cloned(),
                    used_by: s
                        .and_then(|s| s.allocation.as_ref())
                        .map(|a| format!("{}/{}/{}", a.namespace, a.pod, a.container)),
                    shares: s
                        .map(|s| &s.shares[..])
                        .unwrap_or_default()
                        .iter()
                        .map(|h| format!("{} {}", h.share, h.holder()))
                        .collect(),
                }
            })
            .collect();
        NodeReport {
            node: dt.metadata.name.clone().unwrap_or_default(),
            model: spec.model.clone(),
            super_node: spec.super_node.as_ref().map(|s| s.id.clone()),
            super_node_source: spec.super_node.as_ref().map(|s| s.source.clone()),
            healthy: devices.iter().filter(|d| d.health == "Healthy").count(),
            devices,
            matrix,
        }
    }
}

/// The header, the matrix with its legend, and the device table (`wide`: also model, PCI bus
/// id and UUID).
pub fn table(r: &NodeReport, wide: bool) -> String {
    let mut out = format!("Node {}: {} devices", r.node, r.devices.len());
    if !r.model.is_empty() {
        out.push_str(&format!(" ({})", r.model));
    }
    match (&r.super_node, &r.super_node_source) {
        (Some(id), Some(source)) => out.push_str(&format!(", super-node {id} (from {source})")),
        (Some(id), None) => out.push_str(&format!(", super-node {id}")),
        (None, _) => out.push_str(", no super-node"),
    }
    out.push_str(&format!(", {}/{} healthy\n", r.healthy, r.devices.len()));
    if r.devices.is_empty() {
        return out;
    }
    let mut rows = vec![
        std::iter::once(String::new())
            .chain(r.devices.iter().map(|d| d.label.clone()))
            .chain(["NUMA".into(), "CPU AFFINITY".into()])
            .collect::<Vec<_>>(),
    ];
    for (d, cells) in r.devices.iter().zip(&r.matrix) {
        rows.push(
            std::iter::once(d.label.clone())
                .chain(cells.iter().cloned())
                .chain([
                    d.numa_node.map_or_else(|| "-".into(), |n| n.to_string()),
                    d.local_cpus.clone(),
                ])
                .collect(),
        );
    }
    out.push('\n');
    out.push_str(&table::render(&rows));
    out.push('\n');
    out.push_str(&legend(&r.matrix));

    let mut header = vec!["DEVICE", "ID", "HEALTH", "USED BY"];
    if wide {
        header.extend(["MODEL", "PCI", "UUID"]);
    }
    header.push("REASON");
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for d in &r.devices {
        let mut row = vec![
            d.label.clone(),
            d.id.clone(),
            d.health.clone(),
            match (&d.used_by, &d.chosen_for) {
                (Some(u), _) => u.clone(),
                (None, Some(p)) => format!("{p} (chosen)"),
                (None, None) if !d.shares.is_empty() => shares_in_use(&d.shares),
                (None, None) => "-".into(),
            },
        ];
        if wide {
            row.extend([
                d.model.clone(),
                d.pci_bus_id.clone(),
                d.uuid.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        row.push(d.reason.clone().unwrap_or_default());
        rows.push(row);
    }
    out.push('\n');
    out.push_str(&table::render(&rows));
    out
}

/// A shared device's `USED BY`: how many shares, and their holders (`<share> ns/pod/container`
/// each, the share's own id dropped to keep the line short).
fn shares_in_use(shares: &[String]) -> String {
    let holders: Vec<&str> = shares
        .iter()
        .map(|s| s.split_once(' ').map_or(s.as_str(), |(_, holder)| holder))
        .collect();
    device_topology::shares_in_use(&holders)
}

/// The legend lines of the classes the matrix shows, strongest first.
fn legend(matrix: &[Vec<String>]) -> String {
    let shown: std::collections::BTreeSet<&str> =
        matrix.iter().flatten().map(String::as_str).collect();
    let mut out = String::from("Legend:\n  X    = self\n");
    for (name, meaning) in LinkClass::legend() {
        let present = match name.strip_suffix('#') {
            // `NV#`: any NVLink count.
            Some(prefix) => shown.iter().any(|s| {
                s.strip_prefix(prefix)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            }),
            None => shown.contains(name),
        };
        if present {
            out.push_str(&format!("  {name:<4} = {meaning}\n"));
        }
    }
    if shown.contains("-") {
        out.push_str("  -    = no link published\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fumarole_topology::crd::device_topology::{LinkInfo, SuperNodeInfo};
    use fumarole_topology::crd::testing;

    /// Four GPUs: NV18 within {0,1} and {2,3}, PIX across; GPU2 unhealthy, GPU1 in use.
    fn four() -> DeviceTopology {
        let mut t = testing::nvlink_node("n1", 4, 280, &[1], |i| format!("GPU-{i}"));
        t.spec.model = "H100".into();
        t.spec.super_node = Some(SuperNodeInfo {
            id: "rack-a".into(),
            source: "config".into(),
        });
        for l in &mut t.spec.links {
            *l = if l.a / 2 == l.b / 2 {
                LinkInfo {
                    kind: "nvlink".into(),
                    count: Some(18),
                    weight: 280,
                    ..l.clone()
                }
            } else {
                LinkInfo {
                    kind: "pcieSwitch".into(),
                    count: None,
                    weight: 50,
                    ..l.clone()
                }
            };
        }
        for (i, d) in t.spec.devices.iter_mut().enumerate() {
            d.local_cpus = if i < 2 { "0-7" } else { "8-15" }.into();
        }
        let s = t.status.as_mut().unwrap();
        let bad = s.devices.get_mut("GPU-2").unwrap();
        bad.health = "Unhealthy".into();
        bad.reason = Some("xid: XID 79 (GPU has fallen off the bus)".into());
        t
    }

    #[test]
    fn matrix_health_and_users() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train", "namespace": "ml", "annotations": {
                DEVICES_ANNOTATION: r#"{"nvidia.com/gpu":["GPU-3"]}"#}}
        }))
        .unwrap();
        let bad: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bad", "annotations": {DEVICES_ANNOTATION: "GPU-0"}}
        }))
        .unwrap();
        let elsewhere: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "moved", "annotations": {
                DEVICES_ANNOTATION: r#"{"nvidia.com/gpu":["GPU-0"]}"#,
                DEVICES_NODE_ANNOTATION: "n2"}}
        }))
        .unwrap();
        let chosen = chosen("n1", &[pod, bad, elsewhere]);
        assert_eq!(chosen.len(), 1, "{chosen:?}");
        let r = NodeReport::of(&four(), &chosen);
        assert_eq!(r.healthy, 3);
        assert_eq!(r.matrix[0], ["X", "NV18", "PIX", "PIX"]);
        assert_eq!(
            table(&r, false),
            "\
Node n1: 4 devices (H100), super-node rack-a (from config), 3/4 healthy

      GPU0  GPU1  GPU2  GPU3  NUMA  CPU AFFINITY
GPU0  X     NV18  PIX   PIX   0     0-7
GPU1  NV18  X     PIX   PIX   0     0-7
GPU2  PIX   PIX   X     NV18  1     8-15
GPU3  PIX   PIX   NV18  X     1     8-15

Legend:
  X    = self
  NV#  = NVLink with # links (weight 100 + 10 x #)
  PIX  = at most a single PCIe bridge (50)

DEVICE  ID     HEALTH     USED BY                 REASON
GPU0    GPU-0  Healthy    -
GPU1    GPU-1  Healthy    default/running-1/main
GPU2    GPU-2  Unhealthy  -                       xid: XID 79 (GPU has fallen off the bus)
GPU3    GPU-3  Healthy    ml/train (chosen)
"
        );
    }

    #[test]
    fn unknown_kinds_missing_links_and_no_status() {
        let mut t = four();
        t.status = None;
        t.spec.links.retain(|l| !(l.a == 0 && l.b == 3));
        t.spec.links[0].kind = "warpDrive".into();
        let r = NodeReport::of(&t, &BTreeMap::new());
        assert_eq!(r.matrix[0], ["X", "warpDrive", "PIX", "-"]);
        assert!(r.devices.iter().all(|d| d.health == "Unknown"));
        let text = table(&r, true);
        assert!(text.contains("  -    = no link published\n"), "{text}");
        assert!(
            text.contains("DEVICE  ID     HEALTH   USED BY  MODEL  PCI  UUID  REASON\n"),
            "{text}"
        );
    }

    #[test]
    fn a_shared_gpu_shows_its_holders() {
        use fumarole_topology::crd::device_topology::ShareAllocation;
        let mut t = four();
        let gpu0 = t.status.as_mut().unwrap().devices.get_mut("GPU-0").unwrap();
        gpu0.shares = ["infer-a", "infer-b"]
            .iter()
            .enumerate()
            .map(|(n, pod)| ShareAllocation {
                share: format!("GPU-0::{n}"),
                namespace: "serve".into(),
                pod: (*pod).into(),
                container: "main".into(),
            })
            .collect();
        let r = NodeReport::of(&t, &BTreeMap::new());
        assert_eq!(
            r.devices[0].shares,
            ["GPU-0::0 serve/infer-a/main", "GPU-0::1 serve/infer-b/main"]
        );
        let text = table(&r, false);
        assert!(
            text.contains(
                "GPU0    GPU-0  Healthy    2 shares: serve/infer-a/main, serve/infer-b/main"
            ),
            "{text}"
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["devices"][0]["shares"][1], "GPU-0::1 serve/infer-b/main");
    }

    #[test]
    fn json_names_every_field() {
        let v = serde_json::to_value(NodeReport::of(&four(), &BTreeMap::new())).unwrap();
        assert_eq!(v["superNode"], "rack-a");
        assert_eq!(v["devices"][2]["health"], "Unhealthy");
        assert_eq!(v["devices"][1]["usedBy"], "default/running-1/main");
        assert_eq!(v["matrix"][2][3], "NV18");
    }
}
