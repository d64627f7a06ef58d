//! `kubectl fumarole top`: accelerators free, in use, shared and unhealthy per super-node, and
//! per node with `-o wide` (JSON and YAML always carry both).
//!
//! "Free" is the scheduler extension's own word for it ([`ClusterView::free_mask`]): healthy,
//! not allocated in the node's status, not chosen for a bound or promised pod, not held by a
//! ResourceClaim. "Shared" devices are in use as shares (time-sliced or MPS replicas) or
//! partitions (MIG); "unhealthy" ones the node reports so; the rest are in use.
//! Nodes without a `DeviceTopology` have no accelerators fumarole knows and are left out.
//!
//! "Idle pods" hold devices and use little of them: the agent reports each holding pod's mean
//! utilisation over its window (`DeviceTopology` status `pods`) and since when it has been
//! under 5 %; they are listed under the table, longest idle first.

use anyhow::Result;
use serde::Serialize;

use fumarole_topology::crd::PodDeviceUsage;

use super::config::Connection;
use crate::core::view::{ClusterView, NodeView};
use crate::live;
use crate::text_table as table;

/// Device counts of one node or one super-node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub devices: u32,
    pub free: u32,
    pub in_use: u32,
    pub shared: u32,
    pub unhealthy: u32,
    /// Pods holding devices here that the agent reports idle (under 5 % over its window).
    pub idle_pods: u32,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.devices += o.devices;
        self.free += o.free;
        self.in_use += o.in_use;
        self.shared += o.shared;
        self.unhealthy += o.unhealthy;
        self.idle_pods += o.idle_pods;
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeUsage {
    pub node: String,
    pub super_node: String,
    #[serde(flatten)]
    pub counts: Counts,
    /// The idle pods themselves.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub idle: Vec<PodDeviceUsage>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SuperNodeUsage {
    pub super_node: String,
    pub nodes: usize,
    #[serde(flatten)]
    pub counts: Counts,
}

/// The whole report: super-nodes by id, nodes by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub super_nodes: Vec<SuperNodeUsage>,
    pub nodes: Vec<NodeUsage>,
}

/// Reads the cluster and counts.
pub async fn read(conn: &Connection) -> Result<Usage> {
    let view = live::read_once(&conn.client).await?;
    for w in view.warnings() {
        tracing::warn!("{w}");
    }
    Ok(Usage::of(&view))
}

/// One node's counts.
fn counts(view: &ClusterView, nv: &NodeView) -> Counts {
    let n = nv.device_ids.len();
    let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    // Free under any of the node's resources is free (each device has one extended resource).
    let free = nv
        .resource_masks
        .iter()
        .fold(0, |m, (r, _)| m | view.free_mask(nv, r))
        & all;
    let unhealthy = nv.unhealthy_mask & all;
    let shared = nv.shared.iter().fold(0u64, |m, (i, _)| {
        m | 1u64.checked_shl(*i as u32).unwrap_or(0)
    }) & all
        & !unhealthy;
    Counts {
        devices: all.count_ones(),
        free: free.count_ones(),
        in_use: (all & !free & !unhealthy & !shared).count_ones(),
        shared: shared.count_ones(),
        unhealthy: unhealthy.count_ones(),
        idle_pods: u32::try_from(nv.idle_pods().count()).unwrap_or(u32::MAX),
    }
}

impl Usage {
    pub fn of(view: &ClusterView) -> Self {
        let mut usage = Usage::default();
        for nv in view.nodes().filter(|nv| nv.has_topology) {
            usage.nodes.push(NodeUsage {
                node: nv.name.clone(),
                super_node: nv.group().to_string(),
                counts: counts(view, nv),
                idle: nv.idle_pods().cloned().collect(),
            });
        }
        for (id, members) in view.super_nodes() {
            let mut total = Counts::default();
            let mut nodes = 0;
            for node in usage.nodes.iter().filter(|u| members.contains(&u.node)) {
                total.add(node.counts);
                nodes += 1;
            }
            if nodes > 0 {
                usage.super_nodes.push(SuperNodeUsage {
                    super_node: id.clone(),
                    nodes,
                    counts: total,
                });
            }
        }
        usage
    }
}

/// The super-node table; with `wide`, the node table after it.
pub fn table(u: &Usage, wide: bool) -> String {
    if u.nodes.is_empty() {
        return "No node publishes a DeviceTopology.\n".into();
    }
    let cells = |c: &Counts| {
        [
            c.devices,
            c.free,
            c.in_use,
            c.shared,
            c.unhealthy,
            c.idle_pods,
        ]
        .into_iter()
        .map(|v| v.to_string())
    };
    let mut rows = vec![
        [
            "SUPER-NODE",
            "NODES",
            "DEVICES",
            "FREE",
            "IN-USE",
            "SHARED",
            "UNHEALTHY",
            "IDLE-PODS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for s in &u.super_nodes {
        rows.push(
            [s.super_node.clone(), s.nodes.to_string()]
                .into_iter()
                .chain(cells(&s.counts))
                .collect(),
        );
    }
    let mut out = table::render(&rows);
    if wide {
        let mut rows = vec![
            [
                "NODE",
                "SUPER-NODE",
                "DEVICES",
                "FREE",
                "IN-USE",
                "SHARED",
                "UNHEALTHY",
                "IDLE-PODS",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for n in &u.nodes {
            rows.push(
                [n.node.clone(), n.super_node.clone()]
                    .into_iter()
                    .chain(cells(&n.counts))
                    .collect(),
            );
        }
        out.push('\n');
        out.push_str(&table::render(&rows));
    }
    // Longest idle first (RFC 3339 times sort as text).
    let mut idle: Vec<(&str, &PodDeviceUsage)> = u
        .nodes
        .iter()
        .flat_map(|n| n.idle.iter().map(move |p| (n.node.as_str(), p)))
        .collect();
    idle.sort_by(|a, b| a.1.idle_since.cmp(&b.1.idle_since));
    if !idle.is_empty() {
        let mut rows = vec![
            ["IDLE POD", "NODE", "DEVICES", "UTILIZATION", "IDLE SINCE"]
                .map(String::from)
                .to_vec(),
        ];
        for (node, p) in idle {
            rows.push(vec![
                format!("{}/{}", p.namespace, p.pod),
                node.to_string(),
                p.devices.to_string(),
                format!("{}%", p.utilization_percent),
                p.idle_since.clone().unwrap_or_default(),
            ]);
        }
        out.push('\n');
        out.push_str(&table::render(&rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fumarole_topology::annotation::DEVICES_ANNOTATION;
    use fumarole_topology::crd::device_topology::SuperNodeInfo;
    use fumarole_topology::crd::testing;
    use k8s_openapi::api::core::v1::Pod;

    fn node(name: &str, rack: &str, allocated: &[u32]) -> fumarole_topology::crd::DeviceTopology {
        let mut t = testing::nvlink_node(name, 8, 180, allocated, |i| format!("{name}-gpu{i}"));
        t.spec.super_node = Some(SuperNodeInfo {
            id: rack.into(),
            source: "config".into(),
        });
        t
    }

    /// a0 (rack-a): 2 allocated in status, 1 unhealthy; a1 (rack-a): 2 chosen for a bound pod;
    /// b0 (rack-b): 1 in MIG mode, the rest free; cpu-0: no DeviceTopology.
    fn view() -> ClusterView {
        let mut b0 = node("b0", "rack-b", &[]);
        b0.spec.devices[3].mig = vec![fumarole_topology::crd::device_topology::MigInfo {
            uuid: "MIG-0".into(),
            profile: "3g.40gb".into(),
        }];
        let mut a0 = node("a0", "rack-a", &[0, 1]);
        // The agent reports the pod on a0's GPUs 0-1 idle, another busy.
        a0.status.as_mut().unwrap().pods = vec![
            PodDeviceUsage {
                namespace: "ml".into(),
                pod: "train-0".into(),
                devices: 2,
                utilization_percent: 0,
                idle_since: Some("2026-11-29T18:00:00Z".into()),
            },
            PodDeviceUsage {
                namespace: "ml".into(),
                pod: "busy".into(),
                devices: 1,
                utilization_percent: 90,
                idle_since: None,
            },
        ];
        let s = a0
            .status
            .as_mut()
            .unwrap()
            .devices
            .get_mut("a0-gpu7")
            .unwrap();
        s.health = "Unhealthy".into();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "annotations": {
                DEVICES_ANNOTATION: r#"{"nvidia.com/gpu":["a1-gpu4","a1-gpu5"]}"#}},
            "spec": {"nodeName": "a1", "containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "2"}}}]}
        }))
        .unwrap();
        let cpu = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("cpu-0".into()),
            ..Default::default()
        };
        ClusterView::build(&[a0, node("a1", "rack-a", &[]), b0], &[], [&cpu], [&pod]).unwrap()
    }

    #[test]
    fn counts_per_super_node_and_node() {
        let u = Usage::of(&view());
        assert_eq!(u.nodes.len(), 3, "cpu-0 has no devices: {u:?}");
        let a0 = &u.nodes[0].counts;
        assert_eq!(
            (a0.devices, a0.free, a0.in_use, a0.shared, a0.unhealthy),
            (8, 5, 2, 0, 1)
        );
        assert_eq!(u.nodes[1].counts.free, 6);
        assert_eq!(
            table(&u, false),
            "\
SUPER-NODE  NODES  DEVICES  FREE  IN-USE  SHARED  UNHEALTHY  IDLE-PODS
rack-a      2      16       11    4       0       1          1
rack-b      1      8        7     0       1       0          0

IDLE POD    NODE  DEVICES  UTILIZATION  IDLE SINCE
ml/train-0  a0    2        0%           2026-11-29T18:00:00Z
"
        );
        let wide = table(&u, true);
        assert!(
            wide.contains(
                "\
NODE  SUPER-NODE  DEVICES  FREE  IN-USE  SHARED  UNHEALTHY  IDLE-PODS
a0    rack-a      8        5     2       0       1          1
a1    rack-a      8        6     2       0       0          0
b0    rack-b      8        7     0       1       0          0
"
            ),
            "{wide}"
        );
    }

    #[test]
    fn json_keys() {
        let v = serde_json::to_value(Usage::of(&view())).unwrap();
        assert_eq!(v["superNodes"][0]["superNode"], "rack-a");
        assert_eq!(v["superNodes"][0]["inUse"], 4);
        assert_eq!(v["nodes"][2]["node"], "b0");
        assert_eq!(v["nodes"][2]["free"], 7);
        assert_eq!(v["nodes"][2]["shared"], 1);
        assert_eq!(v["nodes"][0]["idlePods"], 1);
        assert_eq!(v["nodes"][0]["idle"][0]["pod"], "train-0");
        assert_eq!(
            v["nodes"][0]["idle"][0]["idleSince"],
            "2026-11-29T18:00:00Z"
        );
        assert!(v["nodes"][1].get("idle").is_none(), "{v}");
    }

    #[test]
    fn empty_cluster_says_so() {
        assert_eq!(
            table(&Usage::default(), false),
            "No node publishes a DeviceTopology.\n"
        );
    }
}
