//! Pictures of a `NodeTopology`: [`svg`] (drawn here, no external program) and [`dot`]
//! (Graphviz text, for people who lay it out with their own tools).
//!
//! The SVG reads top to bottom the way the hardware is wired: packages with their NUMA nodes
//! (CPUs, memory), the PCIe tree from each host bridge through its switches, the accelerators
//! (model, bus id, health), then the vendor fabric below
//! them. A fabric whose devices are all linked pairwise by the same class (an NVSwitch
//! baseboard, an HCCS group, a MetaXLink zone) is drawn as one bus with a drop per device;
//! other fabric pairs as arcs labelled with their class. [`layout`] does the geometry; [`svg`]
//! only paints it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use fumarole_topology::{Health, LinkClass, NodeTopology};

use crate::render::{gib, label};
use html_escape::encode_double_quoted_attribute as esc;

const MARGIN: f64 = 24.0;
const SLOT_W: f64 = 150.0;
const DEV_W: f64 = 134.0;
const DEV_H: f64 = 70.0;
const NUMA_GAP: f64 = 24.0;
const TITLE_H: f64 = 56.0;
const PACKAGE_H: f64 = 84.0;
const NUMA_H: f64 = 34.0;
const LEVEL_H: f64 = 40.0;
const BRIDGE_W: f64 = 116.0;
const BRIDGE_H: f64 = 22.0;
const BUS_GAP: f64 = 36.0;

/// A box with a position, in SVG user units.
#[derive(Clone, Debug, PartialEq)]
pub struct Rect {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

impl Rect {
    fn cx(&self) -> f64 {
        self.x + self.w / 2.0
    }
    fn bottom(&self) -> f64 {
        self.y + self.h
    }
}

/// One drawn device.
#[derive(Clone, Debug)]
pub struct DeviceBox {
    /// Index into `NodeTopology::devices`.
    pub index: usize,
    pub rect: Rect,
    pub label: String,
    pub healthy: bool,
}

/// A fabric drawn as one bus: every pair of `members` has `class`.
#[derive(Clone, Debug)]
pub struct Bus {
    pub class: LinkClass,
    pub members: Vec<usize>,
    pub y: f64,
}

/// A fabric pair that is not part of a bus.
#[derive(Clone, Debug)]
pub struct Arc {
    pub class: LinkClass,
    pub a: usize,
    pub b: usize,
}

/// The geometry of the picture.
#[derive(Clone, Debug)]
pub struct Layout {
    pub width: f64,
    pub height: f64,
    pub title: String,
    /// Package boxes with their label.
    pub packages: Vec<(Rect, String)>,
    /// NUMA node boxes with their label.
    pub numa_nodes: Vec<(Rect, String)>,
    /// PCIe bridges (host bridges first in each tree) with their bus id.
    pub bridges: Vec<(Rect, String)>,
    /// PCIe wires, (x1, y1, x2, y2).
    pub wires: Vec<(f64, f64, f64, f64)>,
    pub devices: Vec<DeviceBox>,
    pub buses: Vec<Bus>,
    pub arcs: Vec<Arc>,
    /// Top of the fabric band (below the devices).
    fabric_top: f64,
    /// Rows of buses (buses that do not overlap share one).
    bus_rows: usize,
}

/// About how wide `text` is at 12 px (DejaVu Sans averages a little over half the size).
fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * 6.8
}

/// How a fabric class is named in the picture.
pub fn class_name(class: LinkClass) -> String {
    match class {
        LinkClass::Nvlink { count } => format!("NVLink x{count}"),
        LinkClass::Hccs => "HCCS".into(),
        LinkClass::MetaxLink => "MetaXLink zone".into(),
        LinkClass::Fabric => "fabric".into(),
        other => other.short_name(),
    }
}

/// Thicker for more NVLinks, so NV2 and NV18 look different at a glance.
fn class_width(class: LinkClass) -> f64 {
    match class {
        LinkClass::Nvlink { count } => 1.5 + f64::from(count.min(18)) / 4.0,
        _ => 3.0,
    }
}

fn class_color(class: LinkClass) -> &'static str {
    match class {
        LinkClass::Nvlink { .. } => "#76b900",
        LinkClass::Hccs => "#c7000b",
        LinkClass::MetaxLink => "#1565c0",
        _ => "#6a1b9a",
    }
}

/// Lays out `t`.
pub fn layout(t: &NodeTopology) -> Layout {
    // Devices in NUMA order, then along the PCIe tree, so siblings sit side by side.
    let mut order: Vec<usize> = (0..t.devices.len()).collect();
    order.sort_by(|&a, &b| {
        let (da, db) = (&t.devices[a], &t.devices[b]);
        (da.numa_node.unwrap_or(u32::MAX), &da.pci_path, da.index).cmp(&(
            db.numa_node.unwrap_or(u32::MAX),
            &db.pci_path,
            db.index,
        ))
    });

    // Columns: one group per NUMA node (at least one slot wide), then devices without one.
    let mut groups: Vec<(Option<u32>, Vec<usize>)> = t
        .numa_nodes
        .iter()
        .map(|n| {
            let devs = order
                .iter()
                .copied()
                .filter(|&i| t.devices[i].numa_node == Some(n.id))
                .collect();
            (Some(n.id), devs)
        })
        .collect();
    let known: BTreeSet<u32> = t.numa_nodes.iter().map(|n| n.id).collect();
    let orphans: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| t.devices[i].numa_node.is_none_or(|n| !known.contains(&n)))
        .collect();
    if !orphans.is_empty() {
        groups.push((None, orphans));
    }

    let max_depth = t
        .devices
        .iter()
        .map(|d| d.pci_path.len())
        .max()
        .unwrap_or(0);
    let numa_y = TITLE_H + 36.0;
    let tree_top = TITLE_H + PACKAGE_H + 28.0;
    let dev_y = tree_top + max_depth as f64 * LEVEL_H + 12.0;

    let numa_label = |id: u32| {
        let n = t.numa_nodes.iter().find(|n| n.id == id)?;
        let cpus = if n.cpus.is_empty() {
            "memory only".to_string()
        } else {
            format!("CPUs {}", n.cpus)
        };
        Some(format!("NUMA {}: {cpus} · {}", n.id, gib(n.memory_bytes)))
    };
    let mut x = MARGIN;
    let mut numa_boxes: BTreeMap<Option<u32>, Rect> = BTreeMap::new();
    let mut devices = Vec::new();
    for (numa, devs) in &groups {
        // Wide enough for its devices and for its label.
        let label_w = numa
            .and_then(numa_label)
            .map_or(0.0, |l| text_width(&l) + 16.0);
        let devs_w = devs.len() as f64 * SLOT_W - (SLOT_W - DEV_W);
        let w = devs_w.max(label_w).max(DEV_W);
        numa_boxes.insert(
            *numa,
            Rect {
                x,
                y: numa_y,
                w,
                h: NUMA_H,
            },
        );
        let first = x + (w - devs_w.max(0.0)) / 2.0;
        for (k, &i) in devs.iter().enumerate() {
            let d = &t.devices[i];
            devices.push(DeviceBox {
                index: i,
                rect: Rect {
                    x: first + k as f64 * SLOT_W,
                    y: dev_y,
                    w: DEV_W,
                    h: DEV_H,
                },
                label: label(t, i),
                healthy: d.health == Health::Healthy,
            });
        }
        x += w + NUMA_GAP;
    }
    let width = (x - NUMA_GAP + MARGIN).max(640.0);

    let numa_nodes = t
        .numa_nodes
        .iter()
        .filter_map(|n| Some((numa_boxes.get(&Some(n.id))?.clone(), numa_label(n.id)?)))
        .collect();

    // Packages span the NUMA nodes whose CPUs they hold.
    let mut packages = Vec::new();
    for p in &t.packages {
        let spans: Vec<&Rect> = t
            .numa_nodes
            .iter()
            .filter(|n| !n.cpus.intersection(&p.cpus).is_empty())
            .filter_map(|n| numa_boxes.get(&Some(n.id)))
            .collect();
        let (Some(lo), Some(hi)) = (
            spans.iter().map(|r| r.x).reduce(f64::min),
            spans.iter().map(|r| r.x + r.w).reduce(f64::max),
        ) else {
            continue;
        };
        let id = p.id.map_or("?".to_string(), |i| i.to_string());
        packages.push((
            Rect {
                x: lo - 8.0,
                y: TITLE_H,
                w: hi - lo + 16.0,
                h: PACKAGE_H,
            },
            format!("Package {id}: CPUs {}", p.cpus),
        ));
    }

    // The PCIe tree: one node per path prefix, centred over the devices below it.
    let mut below: BTreeMap<Vec<String>, Vec<f64>> = BTreeMap::new();
    for b in &devices {
        let path = &t.devices[b.index].pci_path;
        for depth in 1..=path.len() {
            below
                .entry(path[..depth].to_vec())
                .or_default()
                .push(b.rect.cx());
        }
    }
    let centre = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let mut bridges = Vec::new();
    let mut wires = Vec::new();
    for (prefix, xs) in &below {
        let cx = centre(xs);
        let y = tree_top + (prefix.len() - 1) as f64 * LEVEL_H;
        bridges.push((
            Rect {
                x: cx - BRIDGE_W / 2.0,
                y,
                w: BRIDGE_W,
                h: BRIDGE_H,
            },
            prefix.last().cloned().unwrap_or_default(),
        ));
        if prefix.len() > 1 {
            let parent = centre(&below[&prefix[..prefix.len() - 1]]);
            wires.push((parent, y - LEVEL_H + BRIDGE_H, cx, y));
        }
    }
    for b in &devices {
        let d = &t.devices[b.index];
        let top = b.rect.y;
        match d.pci_path.len() {
            0 => {
                let numa = numa_boxes
                    .get(&d.numa_node.filter(|n| known.contains(n)))
                    .map_or(numa_y + NUMA_H, Rect::bottom);
                wires.push((b.rect.cx(), numa, b.rect.cx(), top));
            }
            n => {
                let parent = centre(&below[&d.pci_path[..n]]);
                let y = tree_top + (n - 1) as f64 * LEVEL_H + BRIDGE_H;
                wires.push((parent, y, b.rect.cx(), top));
            }
        }
    }
    // Each host bridge hangs from the package band above it.
    for (prefix, xs) in &below {
        if prefix.len() == 1 {
            let cx = centre(xs);
            wires.push((cx, PACKAGE_H + TITLE_H, cx, tree_top));
        }
    }

    // The fabric: buses for uniform cliques, arcs for the rest.
    let position: BTreeMap<usize, f64> = devices.iter().map(|b| (b.index, b.rect.cx())).collect();
    let fabric = |a: usize, b: usize| t.links.class(a, b).filter(|c| c.is_fabric());
    // The fabric components, in the order of their first device, left to right within.
    let mut components: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, group) in t.links.fabric_groups().into_iter().enumerate() {
        if let Some(g) = group {
            components.entry(g).or_default().push(i);
        }
    }
    let components: Vec<Vec<usize>> = components
        .into_values()
        .map(|mut members| {
            members.sort_by(|a, b| position[a].total_cmp(&position[b]));
            members
        })
        .collect();
    let fabric_top = dev_y + DEV_H;
    let mut buses = Vec::new();
    let mut arcs = Vec::new();
    let mut rows: Vec<Vec<(f64, f64)>> = Vec::new();
    for members in components {
        let first = fabric(members[0], members[1 % members.len()]);
        let uniform = first.is_some()
            && members
                .iter()
                .enumerate()
                .all(|(i, &a)| members[i + 1..].iter().all(|&b| fabric(a, b) == first));
        match first {
            Some(class) if uniform => {
                // The first row whose buses this one does not overlap.
                let span = |m: &[usize]| {
                    let xs = m.iter().map(|i| position[i]);
                    (
                        xs.clone().fold(f64::MAX, f64::min),
                        xs.fold(f64::MIN, f64::max),
                    )
                };
                let (lo, hi) = span(&members);
                let row = (0..)
                    .find(|&r| {
                        rows.get(r).is_none_or(|spans: &Vec<(f64, f64)>| {
                            spans
                                .iter()
                                .all(|&(a, b)| hi + SLOT_W / 2.0 < a || b + SLOT_W / 2.0 < lo)
                        })
                    })
                    .unwrap_or(rows.len());
                if row == rows.len() {
                    rows.push(Vec::new());
                }
                rows[row].push((lo, hi));
                buses.push(Bus {
                    class,
                    members,
                    y: fabric_top + BUS_GAP * (row as f64 + 1.0),
                });
            }
            _ => {
                for (i, &a) in members.iter().enumerate() {
                    for &b in &members[i + 1..] {
                        if let Some(class) = fabric(a, b) {
                            arcs.push(Arc { class, a, b });
                        }
                    }
                }
            }
        }
    }
    let arc_depth = if arcs.is_empty() { 0.0 } else { 90.0 };
    let classes_h = 30.0;
    let bus_rows = rows.len() as f64;
    let height = fabric_top + BUS_GAP * (bus_rows + 1.0) + arc_depth + classes_h + MARGIN;

    let s = t.summary();
    let mut title = format!(
        "{} — {} packages, {} NUMA nodes, {} cores, {} PUs, {} accelerators",
        if t.hostname.is_empty() {
            "node"
        } else {
            &t.hostname
        },
        s.packages,
        s.numa_nodes,
        s.cores,
        s.pus,
        s.accelerators
    );
    if let Some(sn) = &t.super_node {
        let _ = write!(title, " — super-node {}", sn.id);
    }
    // The title is 16 px bold: about 1.45 times as wide as body text.
    let width = width.max(text_width(&title) * 1.45 + 2.0 * MARGIN);
    Layout {
        width,
        height,
        title,
        packages,
        numa_nodes,
        bridges,
        wires,
        devices,
        buses,
        arcs,
        fabric_top,
        bus_rows: rows.len(),
    }
}

/// The node as an SVG document.
pub fn svg(t: &NodeTopology) -> String {
    let l = layout(t);
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#,
        w = l.width,
        h = l.height
    );
    let _ = writeln!(
        o,
        r##"<rect class="background" x="0" y="0" width="{:.0}" height="{:.0}" fill="#ffffff"/>"##,
        l.width, l.height
    );
    let _ = writeln!(
        o,
        r#"<text class="title" x="{MARGIN}" y="30" font-size="16" font-weight="bold">{}</text>"#,
        esc(&l.title)
    );
    for (r, label) in &l.packages {
        let _ = writeln!(
            o,
            r##"<rect class="package" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="6" fill="#eceff1" stroke="#546e7a"/><text x="{:.1}" y="{:.1}" font-weight="bold">{}</text>"##,
            r.x,
            r.y,
            r.w,
            r.h,
            r.x + 8.0,
            r.y + 18.0,
            esc(label)
        );
    }
    for (r, label) in &l.numa_nodes {
        let _ = writeln!(
            o,
            r##"<rect class="numa" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="4" fill="#ffffff" stroke="#78909c"/><text x="{:.1}" y="{:.1}">{}</text>"##,
            r.x,
            r.y,
            r.w,
            r.h,
            r.x + 8.0,
            r.y + 20.0,
            esc(label)
        );
    }
    for (x1, y1, x2, y2) in &l.wires {
        let _ = writeln!(
            o,
            r##"<line class="pcie" x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="#90a4ae" stroke-width="2"/>"##
        );
    }
    for (r, label) in &l.bridges {
        let _ = writeln!(
            o,
            r##"<rect class="bridge" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="3" fill="#f5f5f5" stroke="#90a4ae"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"##,
            r.x,
            r.y,
            r.w,
            r.h,
            r.cx(),
            r.y + 15.0,
            esc(label)
        );
    }
    for b in &l.buses {
        let color = class_color(b.class);
        let xs: Vec<f64> = b
            .members
            .iter()
            .filter_map(|i| l.devices.iter().find(|d| d.index == *i))
            .map(|d| d.rect.cx())
            .collect();
        let (lo, hi) = (
            xs.iter().copied().fold(f64::MAX, f64::min),
            xs.iter().copied().fold(f64::MIN, f64::max),
        );
        let _ = writeln!(
            o,
            r#"<g class="bus" data-class="{}"><line x1="{lo:.1}" y1="{y:.1}" x2="{hi:.1}" y2="{y:.1}" stroke="{color}" stroke-width="{w:.1}"/>"#,
            esc(&class_name(b.class)),
            y = b.y,
            w = class_width(b.class) + 1.0,
        );
        for x in &xs {
            let _ = writeln!(
                o,
                r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{color}" stroke-width="3"/>"#,
                l.fabric_top, b.y
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" fill="{color}" font-weight="bold">{} · all-to-all · {} devices</text></g>"#,
            lo + 6.0,
            b.y + 16.0,
            esc(&class_name(b.class)),
            b.members.len()
        );
    }
    let arc_top = l.fabric_top + BUS_GAP * l.bus_rows as f64 + 6.0;
    for a in &l.arcs {
        let x = |i: usize| {
            l.devices
                .iter()
                .find(|d| d.index == i)
                .map_or(0.0, |d| d.rect.cx())
        };
        let (x1, x2) = (x(a.a), x(a.b));
        let depth = (20.0 + (x2 - x1).abs() * 0.12).min(80.0);
        let color = class_color(a.class);
        let _ = writeln!(
            o,
            r##"<g class="arc" data-class="{}"><path d="M {x1:.1} {y:.1} Q {mx:.1} {c:.1} {x2:.1} {y:.1}" fill="none" stroke="{color}" stroke-width="{w:.1}"/><text x="{mx:.1}" y="{t:.1}" font-size="10" text-anchor="middle" fill="{color}" stroke="#ffffff" stroke-width="3" paint-order="stroke">{}</text></g>"##,
            esc(&class_name(a.class)),
            esc(&a.class.short_name()),
            y = arc_top,
            mx = (x1 + x2) / 2.0,
            c = arc_top + 2.0 * depth,
            t = arc_top + depth + 14.0,
            w = class_width(a.class),
        );
    }
    for d in &l.devices {
        let dev = &t.devices[d.index];
        let (stroke, fill, health) = if d.healthy {
            ("#2e7d32", "#e8f5e9", "healthy")
        } else {
            ("#c62828", "#ffebee", "UNHEALTHY")
        };
        let r = &d.rect;
        let model = if dev.model.chars().count() > 20 {
            let short: String = dev.model.chars().take(19).collect();
            format!("{short}…")
        } else {
            dev.model.clone()
        };
        let _ = writeln!(
            o,
            r#"<g class="device" data-id="{}" data-health="{health}"><title>{} {} {}</title><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="5" fill="{fill}" stroke="{stroke}" stroke-width="2"/>"#,
            esc(&dev.id),
            esc(&d.label),
            esc(&dev.model),
            esc(&dev.id),
            r.x,
            r.y,
            r.w,
            r.h
        );
        let lines = [
            (format!("{} · {health}", d.label), "bold"),
            (model, "normal"),
            (dev.pci_bus_id.clone(), "normal"),
        ];
        for (k, (text, weight)) in lines.iter().enumerate() {
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" font-size="11" font-weight="{weight}">{}</text>"#,
                r.x + 6.0,
                r.y + 15.0 + k as f64 * 15.0,
                esc(text)
            );
        }
        let _ = writeln!(o, "</g>");
    }
    // Legend: the fabric classes drawn, and what the boxes mean.
    let classes: BTreeSet<String> = l
        .buses
        .iter()
        .map(|b| b.class)
        .chain(l.arcs.iter().map(|a| a.class))
        .map(class_name)
        .collect();
    let class_of = |name: &str| {
        l.buses
            .iter()
            .map(|b| b.class)
            .chain(l.arcs.iter().map(|a| a.class))
            .find(|c| class_name(*c) == name)
            .unwrap_or(LinkClass::Fabric)
    };
    let y = l.height - MARGIN;
    let mut x = MARGIN;
    let _ = write!(o, r#"<g class="legend">"#);
    for name in classes {
        let _ = write!(
            o,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="{:.1}"/><text x="{:.1}" y="{y:.1}">{}</text>"#,
            y - 4.0,
            x + 24.0,
            y - 4.0,
            class_color(class_of(&name)),
            class_width(class_of(&name)),
            x + 30.0,
            esc(&name)
        );
        x += 50.0 + name.len() as f64 * 7.0;
    }
    let _ = writeln!(
        o,
        r##"<line x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#90a4ae" stroke-width="2"/><text x="{:.1}" y="{y:.1}">PCIe</text></g>"##,
        y - 4.0,
        x + 24.0,
        y - 4.0,
        x + 30.0
    );
    o.push_str("</svg>\n");
    o
}

fn dot_id(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The node as a Graphviz graph: NUMA nodes in package clusters, the PCIe tree as edges, fabric
/// links as labelled undirected edges between devices.
pub fn dot(t: &NodeTopology) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "graph {} {{", dot_id(&t.hostname));
    let _ = writeln!(o, "  rankdir=TB; node [shape=box, fontname=\"Helvetica\"];");
    for (k, p) in t.packages.iter().enumerate() {
        let _ = writeln!(o, "  subgraph cluster_package{k} {{");
        let id = p.id.map_or("?".to_string(), |i| i.to_string());
        let _ = writeln!(
            o,
            "    label={};",
            dot_id(&format!("Package {id}: CPUs {}", p.cpus))
        );
        for n in t
            .numa_nodes
            .iter()
            .filter(|n| !n.cpus.intersection(&p.cpus).is_empty())
        {
            let label = format!("NUMA {}\\nCPUs {}\\n{}", n.id, n.cpus, gib(n.memory_bytes));
            let _ = writeln!(o, "    numa{} [label=\"{}\"];", n.id, label);
        }
        let _ = writeln!(o, "  }}");
    }
    let mut edges = BTreeSet::new();
    for (i, d) in t.devices.iter().enumerate() {
        let mut parent = d.numa_node.map(|n| format!("numa{n}"));
        for hop in &d.pci_path {
            let id = dot_id(hop);
            if let Some(p) = &parent {
                edges.insert(format!("  {p} -- {id} [color=gray];"));
            }
            parent = Some(id);
        }
        let name = format!("dev{i}");
        let health = if d.health == Health::Healthy {
            "green"
        } else {
            "red"
        };
        let _ = writeln!(
            o,
            "  {name} [label={}, color={health}, penwidth=2];",
            dot_id(&format!("{}\n{}\n{}", label(t, i), d.model, d.pci_bus_id))
        );
        if let Some(p) = parent {
            edges.insert(format!("  {p} -- {name} [color=gray];"));
        }
    }
    for e in edges {
        let _ = writeln!(o, "{e}");
    }
    for link in t.links.links() {
        if link.class.is_fabric() {
            let _ = writeln!(
                o,
                "  dev{} -- dev{} [label={}, color=\"{}\", constraint=false];",
                link.a,
                link.b,
                dot_id(&link.class.short_name()),
                class_color(link.class)
            );
        }
    }
    o.push_str("}\n");
    o
}
