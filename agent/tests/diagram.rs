//! `discover --format svg` and `--format dot` for every bundled fixture, through the binary.
//!
//! The SVG is parsed (it must be well-formed XML) and reduced to its structure: the title, the
//! packages and NUMA nodes, the PCIe bridges, each device with its health, each fabric bus with
//! its class and members, arcs, and the legend. That outline is compared with
//! `tests/snapshots/<fixture>.svg.txt`; run with `UPDATE_SNAPSHOTS=1` to rewrite them after a
//! deliberate change (and look at the pictures: `rsvg-convert` turns them into PNG).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

fn discover(fixture: &str, format: &str) -> String {
    common::discover_text(&["--fixture", fixture], format)
}

/// The texts directly inside `node` and its descendants, joined.
fn text(node: roxmltree::Node) -> String {
    node.descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The outline of the picture, one line per drawn thing, in document order.
fn outline(svg: &str) -> String {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let mut out = String::new();
    for node in root.children().filter(|n| n.is_element()) {
        let class = node.attribute("class").unwrap_or("");
        let next_text = || {
            node.next_siblings()
                .skip(1)
                .find(|n| n.is_element())
                .filter(|n| n.tag_name().name() == "text")
                .map(text)
                .unwrap_or_default()
        };
        match class {
            "title" => writeln!(out, "title: {}", text(node)),
            "package" | "numa" | "bridge" => writeln!(out, "{class}: {}", next_text()),
            "device" => writeln!(
                out,
                "device {} [{}]: {}",
                node.attribute("data-id").unwrap(),
                node.attribute("data-health").unwrap(),
                node.children()
                    .filter(|n| n.tag_name().name() == "text")
                    .map(text)
                    .collect::<Vec<_>>()
                    .join(" | ")
            ),
            "bus" | "arc" => writeln!(
                out,
                "{class} {}: {} drops, label {}",
                node.attribute("data-class").unwrap(),
                // A bus is its bar plus one drop per device; an arc has none.
                node.children()
                    .filter(|n| n.tag_name().name() == "line")
                    .count()
                    .saturating_sub(1),
                text(node)
            ),
            "legend" => writeln!(out, "legend: {}", text(node)),
            _ => Ok(()),
        }
        .unwrap();
    }
    out
}

#[test]
fn svg_structure_matches_the_snapshots() {
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let mut stale = Vec::new();
    for fixture in fumarole_exporter::fixtures::NAMES {
        let got = outline(&discover(fixture, "svg"));
        let path = dir.join(format!("{fixture}.svg.txt"));
        if update {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if got != want {
            stale.push(format!("--- {fixture}: got\n{got}--- want\n{want}"));
        }
    }
    assert!(
        stale.is_empty(),
        "SVG outline differs (UPDATE_SNAPSHOTS=1 after a deliberate change):\n{}",
        stale.join("\n")
    );
}

#[test]
fn fabrics_are_drawn_as_buses_by_class() {
    let count = |svg: &str, class: &str| {
        roxmltree::Document::parse(svg)
            .unwrap()
            .descendants()
            .filter(|n| n.attribute("class") == Some("bus"))
            .filter(|n| n.attribute("data-class") == Some(class))
            .count()
    };
    // One NVSwitch baseboard; two HCCS groups of four; two MetaXLink zones; no fabric on PCIe.
    assert_eq!(count(&discover("dgx-h100", "svg"), "NVLink x18"), 1);
    assert_eq!(count(&discover("atlas-800-910", "svg"), "HCCS"), 2);
    // 16 NPUs: two HCCS halves of eight, each one bus.
    let a3 = discover("atlas-a3-16", "svg");
    assert_eq!(count(&a3, "HCCS"), 2);
    assert_eq!(a3.matches(r#"<g class="device""#).count(), 16);
    assert_eq!(count(&discover("metax-c500-8", "svg"), "MetaXLink zone"), 2);
    let pcie = discover("pcie-4gpu", "svg");
    assert!(!pcie.contains(r#"class="bus""#) && !pcie.contains(r#"class="arc""#));
}

#[test]
fn a_mixed_fabric_is_drawn_as_labelled_arcs() {
    // An override file gives pcie-4gpu NVLink pairs of two widths: no uniform clique, so every
    // fabric pair is an arc with its class, and the PCIe-only pairs have none.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("topology.yaml");
    std::fs::write(
        &file,
        "matrix:\n  devices: [\"0000:43:00.0\", \"0000:44:00.0\", \"0000:47:00.0\", \"0000:48:00.0\"]\n  classes:\n    - [X, NV4, NV2, PHB]\n    - [NV4, X, PHB, NV2]\n    - [NV2, PHB, X, NV4]\n    - [PHB, NV2, NV4, X]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fumarole-agent"))
        .args([
            "discover",
            "--fixture",
            "pcie-4gpu",
            "--format",
            "svg",
            "--override",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = String::from_utf8(out.stdout).unwrap();
    let got = outline(&svg);
    let arcs: Vec<&str> = got.lines().filter(|l| l.starts_with("arc ")).collect();
    assert_eq!(
        arcs,
        [
            "arc NVLink x4: 0 drops, label NV4",
            "arc NVLink x2: 0 drops, label NV2",
            "arc NVLink x2: 0 drops, label NV2",
            "arc NVLink x4: 0 drops, label NV4",
        ],
        "{got}"
    );
    assert!(!got.contains("bus "), "{got}");
    assert!(
        got.contains("legend: NVLink x2 | NVLink x4 | PCIe"),
        "{got}"
    );
}

#[test]
fn dot_has_every_device_and_fabric_link() {
    let dgx = discover("dgx-h100", "dot");
    assert!(dgx.starts_with("graph "), "{dgx}");
    assert!(dgx.trim_end().ends_with('}'));
    for i in 0..8 {
        assert!(dgx.contains(&format!("  dev{i} [label=")), "dev{i}: {dgx}");
    }
    // 8 GPUs all-to-all over NVLink: 28 labelled fabric edges.
    assert_eq!(dgx.matches("[label=\"NV18\"").count(), 28, "{dgx}");
    let pcie = discover("pcie-4gpu", "dot");
    assert_eq!(pcie.matches("constraint=false").count(), 0);
    assert!(pcie.contains("\"pci0000:40\""), "{pcie}");
}
