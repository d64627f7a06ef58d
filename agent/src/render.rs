//! Text forms of a `NodeTopology`: `json` / `yaml` (the model plus a `summary`), `table` (a
//! readable overview) and `matrix` (the device link matrix, as `nvidia-smi topo -m` prints it).

use std::fmt::Write as _;

use anyhow::Result;
use fumarole_topology::{DeviceKind, LinkClass, NodeTopology, Summary};
use serde::Serialize;

/// The JSON / YAML document: `summary` first, then the model's own keys.
#[derive(Serialize)]
struct Document<'a> {
    summary: Summary,
    #[serde(flatten)]
    topology: &'a NodeTopology,
}

pub fn json(t: &NodeTopology) -> Result<String> {
    let mut s = serde_json::to_string_pretty(&Document {
        summary: t.summary(),
        topology: t,
    })?;
    s.push('\n');
    Ok(s)
}

pub fn yaml(t: &NodeTopology) -> Result<String> {
    Ok(serde_norway::to_string(&Document {
        summary: t.summary(),
        topology: t,
    })?)
}

/// `GPU3`, `NPU0`, `ACC1`: the device's kind and index, as `nvidia-smi topo -m` names them.
pub fn label(t: &NodeTopology, i: usize) -> String {
    let prefix = match t.devices[i].kind {
        DeviceKind::Gpu => "GPU",
        DeviceKind::Npu => "NPU",
        DeviceKind::Other => "ACC",
    };
    format!("{prefix}{i}")
}

pub fn gib(bytes: u64) -> String {
    format!("{:.0} GiB", bytes as f64 / f64::from(1u32 << 30))
}

pub fn table(t: &NodeTopology) -> String {
    let s = t.summary();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Node {}: {} packages, {} NUMA nodes, {} cores, {} PUs, {} accelerators",
        t.hostname, s.packages, s.numa_nodes, s.cores, s.pus, s.accelerators
    );
    let _ = writeln!(
        out,
        "Super-node: {}",
        t.super_node.as_ref().map_or("-".to_string(), |sn| format!(
            "{} (from {:?})",
            sn.id, sn.source
        ))
    );
    if t.allowed_cpus != t.cpus() {
        let _ = writeln!(out, "CPUs allowed to this process: {}", t.allowed_cpus);
    }
    let _ = writeln!(
        out,
        "\n{:<6} {:<24} {:>10}  {:<10} DISTANCES",
        "NUMA", "CPUS", "MEMORY", "KIND"
    );
    for n in &t.numa_nodes {
        let distances: Vec<String> = n.distances.iter().map(u32::to_string).collect();
        let _ = writeln!(
            out,
            "{:<6} {:<24} {:>10}  {:<10} {}",
            n.id,
            if n.cpus.is_empty() {
                "-".to_string()
            } else {
                n.cpus.to_string()
            },
            gib(n.memory_bytes),
            n.kind.as_deref().unwrap_or("-"),
            distances.join(" ")
        );
    }
    if t.devices.is_empty() {
        let _ = writeln!(out, "\nNo accelerators.");
        return out;
    }
    let _ = writeln!(
        out,
        "\n{:<6} {:<44} {:<24} {:<13} {:<5} {:<9} DEVICE NODES",
        "DEVICE", "ID", "MODEL", "PCI", "NUMA", "HEALTH"
    );
    for (i, d) in t.devices.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:<6} {:<44} {:<24} {:<13} {:<5} {:<9} {}",
            label(t, i),
            d.id,
            d.model,
            d.pci_bus_id,
            d.numa_node.map_or("-".into(), |n| n.to_string()),
            format!("{:?}", d.health),
            d.dev_nodes.join(" ")
        );
    }
    let mut classes: Vec<(LinkClass, usize)> = Vec::new();
    for l in t.links.links() {
        match classes.iter_mut().find(|(c, _)| *c == l.class) {
            Some((_, n)) => *n += 1,
            None => classes.push((l.class, 1)),
        }
    }
    classes.sort_by_key(|(c, _)| std::cmp::Reverse(c.weight()));
    let pairs: Vec<String> = classes
        .iter()
        .map(|(c, n)| format!("{} x{n}", c.short_name()))
        .collect();
    if !pairs.is_empty() {
        let _ = writeln!(out, "\nLinks between device pairs: {}", pairs.join(", "));
    }
    out
}

pub fn matrix(t: &NodeTopology) -> String {
    let mut out = String::new();
    if t.devices.is_empty() {
        let _ = writeln!(out, "No accelerators on {}.", t.hostname);
        return out;
    }
    let n = t.devices.len();
    let width = (0..n).map(|i| label(t, i).len()).max().unwrap_or(4).max(5) + 1;
    let _ = write!(out, "{:<width$}", "");
    for i in 0..n {
        let _ = write!(out, "{:<width$}", label(t, i));
    }
    let _ = writeln!(out, "{:<20} NUMA Affinity", "CPU Affinity");
    for a in 0..n {
        let _ = write!(out, "{:<width$}", label(t, a));
        for b in 0..n {
            let cell = t
                .links
                .class(a, b)
                .map_or("X".to_string(), LinkClass::short_name);
            let _ = write!(out, "{cell:<width$}");
        }
        let d = &t.devices[a];
        let _ = writeln!(
            out,
            "{:<20} {}",
            d.local_cpus.to_string(),
            d.numa_node.map_or("N/A".into(), |x| x.to_string())
        );
    }
    let _ = writeln!(out, "\nLegend:\n\n  X    = Self");
    for (name, meaning) in LinkClass::legend() {
        let _ = writeln!(out, "  {name:<4} = {meaning}");
    }
    out
}
