//! `kubectl fumarole top`: accelerators free, in use and unhealthy per super-node, and per
//! node with `-o wide` (JSON and YAML always carry both).
//!
//! "Free" is the scheduler extension's own word for it ([`ClusterView::free_mask`]): healthy,
//! not allocated in the node's status, not chosen for a bound or promised pod, not held by a
//! ResourceClaim. "Unhealthy" devices are the ones the node reports so; the rest are in use.
//! Nodes without a `DeviceTopology` have no accelerators fumarole knows and are left out.

use anyhow::Result;
use serde::Serialize;

use super::config::Connection;
use super::table;
use crate::core::view::{ClusterView, NodeView};
use crate::live;

/// Device counts of one node or one super-node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub devices: u32,
    pub free: u32,
    pub in_use: u32,
    pub unhealthy: u32,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.devices += o.devices;
        self.free += o.free;
        self.in_use += o.in_use;
        self.unhealthy += o.unhealthy;
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeUsage {
    pub node: String,
    pub super_node: String,
    #[serde(flatten)]
    pub counts: Counts,
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
    for w in &view.warnings {
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
    Counts {
        devices: all.count_ones(),
        free: free.count_ones(),
        in_use: (all & !free & !unhealthy).count_ones(),
        unhealthy: unhealthy.count_ones(),
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
        [c.devices, c.free, c.in_use, c.unhealthy]
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
            "UNHEALTHY",
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
                "UNHEALTHY",
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
    out
}
