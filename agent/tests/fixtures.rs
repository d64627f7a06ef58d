//! Every bundled fixture discovered through the binary (`discover --fixture NAME --format
//! json`), parsed back into the model, and checked against its full expected topology: counts,
//! NUMA layout, every device, every link of the matrix, the super-node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::discover;
use fumarole_topology::{DeviceKind, Health, NodeTopology, SuperNodeSource, Vendor};

/// The link matrix as `matrix` prints it, one string per row, `X` on the diagonal.
fn matrix(t: &NodeTopology) -> Vec<String> {
    (0..t.devices.len())
        .map(|a| {
            (0..t.devices.len())
                .map(|b| {
                    t.links
                        .class(a, b)
                        .map_or("X".to_string(), |c| c.short_name())
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn summary(v: &serde_json::Value) -> [u64; 5] {
    let s = &v["summary"];
    ["packages", "numa_nodes", "cores", "pus", "accelerators"].map(|k| s[k].as_u64().unwrap())
}

fn numa_layout(t: &NodeTopology) -> Vec<(u32, String, u64)> {
    t.numa_nodes
        .iter()
        .map(|n| (n.id, n.cpus.to_string(), n.memory_bytes >> 30))
        .collect()
}

#[test]
fn dgx_h100() {
    let (t, v) = discover(&["--fixture", "dgx-h100"]);
    assert_eq!(summary(&v), [2, 2, 112, 224, 8]);
    assert_eq!(t.hostname, "dgx-h100");
    assert_eq!(
        numa_layout(&t),
        vec![
            (0, "0-55,112-167".into(), 1024),
            (1, "56-111,168-223".into(), 1024)
        ]
    );
    assert_eq!(t.numa_nodes[0].distances, vec![10, 20]);
    // The ASPEED VGA, the ConnectX NICs and the NVSwitches are not accelerators.
    let buses = ["13", "14", "33", "34", "93", "94", "b3", "b4"];
    for (i, d) in t.devices.iter().enumerate() {
        assert_eq!(d.vendor, Vendor::Nvidia);
        assert_eq!(d.kind, DeviceKind::Gpu);
        assert_eq!(d.index, i as u32);
        assert_eq!(d.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(d.pci_bus_id, format!("0000:{}:00.0", buses[i]));
        assert_eq!(d.id, format!("GPU-f55b88b0-0000-4000-8000-{i:012x}"));
        assert_eq!(d.uuid.as_deref(), Some(d.id.as_str()));
        assert!(d.serial.is_some());
        // Device memory from the recorded NVML answers.
        assert_eq!(d.memory_bytes, Some(81_559 << 20));
        assert_eq!(d.numa_node, Some(if i < 4 { 0 } else { 1 }));
        assert_eq!(
            d.local_cpus.to_string(),
            if i < 4 {
                "0-55,112-167"
            } else {
                "56-111,168-223"
            }
        );
        assert_eq!(d.dev_nodes, vec![format!("/dev/nvidia{i}")]);
        assert_eq!(d.health, Health::Healthy);
        // Host bridge, root port, switch upstream port, downstream port.
        assert_eq!(d.pci_path.len(), 4, "{:?}", d.pci_path);
    }
    let row = |i: usize| {
        (0..8)
            .map(|j| if i == j { "X" } else { "NV18" })
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(matrix(&t), (0..8).map(row).collect::<Vec<_>>());
    assert!(t.super_node.is_none());
}

#[test]
fn dgx_h100_without_nvml_falls_back_to_pcie_classes() {
    let empty = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(empty.path(), r#"{"gpus": []}"#).unwrap();
    let (t, _) = discover(&[
        "--fixture",
        "dgx-h100",
        "--nvml-answers",
        empty.path().to_str().unwrap(),
    ]);
    let m = matrix(&t);
    assert_eq!(m[0], "X PIX NODE NODE SYS SYS SYS SYS");
    assert_eq!(m[2], "NODE NODE X PIX SYS SYS SYS SYS");
    assert_eq!(m[7], "SYS SYS SYS SYS NODE NODE PIX X");
    // Without NVML the uuid comes from the driver's /proc entry.
    assert_eq!(t.devices[0].id, "GPU-f55b88b0-0000-4000-8000-000000000000");
    // Only NVML knows the memory.
    assert_eq!(t.devices[0].memory_bytes, None);
}

fn atlas_devices(t: &NodeTopology, model: &str) {
    let buses = ["02", "22", "42", "62", "82", "a2", "c2", "e2"];
    for (i, d) in t.devices.iter().enumerate() {
        assert_eq!(d.vendor, Vendor::Huawei);
        assert_eq!(d.kind, DeviceKind::Npu);
        assert_eq!(d.id, format!("Ascend910-{i}"));
        assert_eq!(d.model, model);
        assert_eq!(d.pci_bus_id, format!("0000:{}:00.0", buses[i]));
        assert_eq!(d.numa_node, Some((i as u32 / 2) * 2));
        assert_eq!(d.dev_nodes, vec![format!("/dev/davinci{i}")]);
        assert_eq!(d.health, Health::Healthy);
    }
}

#[test]
fn atlas_800t_a2() {
    let (t, v) = discover(&["--fixture", "atlas-800t-a2"]);
    assert_eq!(summary(&v), [4, 8, 192, 192, 8]);
    assert_eq!(numa_layout(&t)[7], (7, "168-191".into(), 128));
    assert_eq!(
        t.numa_nodes[0].distances,
        vec![10, 12, 20, 20, 20, 20, 20, 20]
    );
    atlas_devices(&t, "Ascend910B");
    let row = |i: usize| {
        (0..8)
            .map(|j| if i == j { "X" } else { "HCCS" })
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(matrix(&t), (0..8).map(row).collect::<Vec<_>>());
}

#[test]
fn atlas_800_910() {
    let (t, v) = discover(&["--fixture", "atlas-800-910"]);
    assert_eq!(summary(&v), [4, 8, 192, 192, 8]);
    atlas_devices(&t, "Ascend910");
    // HCCS inside {0-3} and {4-7}; between groups, PCIe derived: NPU pairs sit behind their own
    // host bridges on NUMA nodes 0, 2, 4, 6, so every cross-group pair crosses sockets.
    assert_eq!(
        matrix(&t),
        vec![
            "X HCCS HCCS HCCS SYS SYS SYS SYS",
            "HCCS X HCCS HCCS SYS SYS SYS SYS",
            "HCCS HCCS X HCCS SYS SYS SYS SYS",
            "HCCS HCCS HCCS X SYS SYS SYS SYS",
            "SYS SYS SYS SYS X HCCS HCCS HCCS",
            "SYS SYS SYS SYS HCCS X HCCS HCCS",
            "SYS SYS SYS SYS HCCS HCCS X HCCS",
            "SYS SYS SYS SYS HCCS HCCS HCCS X",
        ]
    );
}

#[test]
fn atlas_a3_16() {
    let (t, v) = discover(&["--fixture", "atlas-a3-16"]);
    assert_eq!(summary(&v), [4, 8, 192, 192, 16]);
    for (i, d) in t.devices.iter().enumerate() {
        assert_eq!(d.id, format!("Ascend910-{i}"));
        assert_eq!(d.model, "Ascend910B");
        assert_eq!(d.pci_bus_id, format!("0000:{:02x}:00.0", 0x02 + i * 0x10));
        // Two NPUs on every NUMA node.
        assert_eq!(d.numa_node, Some(i as u32 / 2));
        assert_eq!(d.dev_nodes, vec![format!("/dev/davinci{i}")]);
    }
    // 910B: a full HCCS mesh inside each half of 8, the halves across sockets.
    let row = |i: usize| {
        (0..16)
            .map(|j| match (i == j, i / 8 == j / 8) {
                (true, _) => "X",
                (false, true) => "HCCS",
                (false, false) => "SYS",
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(matrix(&t), (0..16).map(row).collect::<Vec<_>>());
}

#[test]
fn metax_c500_8() {
    let (t, v) = discover(&["--fixture", "metax-c500-8"]);
    assert_eq!(summary(&v), [2, 2, 64, 128, 8]);
    let sn = t.super_node.as_ref().unwrap();
    assert_eq!(
        (sn.id.as_str(), sn.source),
        ("metax-sn-a", SuperNodeSource::OverrideFile)
    );
    for (i, d) in t.devices.iter().enumerate() {
        assert_eq!(d.vendor, Vendor::Metax);
        assert_eq!(d.kind, DeviceKind::Gpu);
        assert_eq!(d.model, "MetaX C500");
        assert_eq!(d.id, d.pci_bus_id);
        assert_eq!(d.numa_node, Some(if i < 4 { 0 } else { 1 }));
        assert_eq!(
            d.dev_nodes,
            vec![
                format!("/dev/dri/card{i}"),
                format!("/dev/dri/renderD{}", 128 + i)
            ]
        );
    }
    assert_eq!(
        matrix(&t),
        vec![
            "X MXL MXL MXL SYS SYS SYS SYS",
            "MXL X MXL MXL SYS SYS SYS SYS",
            "MXL MXL X MXL SYS SYS SYS SYS",
            "MXL MXL MXL X SYS SYS SYS SYS",
            "SYS SYS SYS SYS X MXL MXL MXL",
            "SYS SYS SYS SYS MXL X MXL MXL",
            "SYS SYS SYS SYS MXL MXL X MXL",
            "SYS SYS SYS SYS MXL MXL MXL X",
        ]
    );
}

#[test]
fn pcie_4gpu() {
    let (t, v) = discover(&["--fixture", "pcie-4gpu"]);
    assert_eq!(summary(&v), [1, 1, 32, 64, 4]);
    for (i, d) in t.devices.iter().enumerate() {
        assert_eq!(d.model, "NVIDIA L40S");
        assert_eq!(d.index, i as u32);
        assert!(d.id.starts_with("GPU-"), "{}", d.id);
        assert_eq!(d.local_cpus.to_string(), "0-63");
    }
    assert_eq!(
        matrix(&t),
        vec![
            "X PIX PHB PHB",
            "PIX X PHB PHB",
            "PHB PHB X PIX",
            "PHB PHB PIX X"
        ]
    );
}

#[test]
fn cpu_only() {
    let (t, v) = discover(&["--fixture", "cpu-only"]);
    assert_eq!(summary(&v), [2, 2, 32, 64, 0]);
    assert!(t.devices.is_empty());
    assert!(t.links.is_empty());
    assert_eq!(
        numa_layout(&t),
        vec![
            (0, "0-15,32-47".into(), 128),
            (1, "16-31,48-63".into(), 128)
        ]
    );
}

#[test]
fn super_node_flag_wins_over_the_override_file() {
    let (t, _) = discover(&["--fixture", "metax-c500-8", "--super-node", "rack-9"]);
    let sn = t.super_node.unwrap();
    assert_eq!(
        (sn.id.as_str(), sn.source),
        ("rack-9", SuperNodeSource::Config)
    );
}

/// `topology::shapes` writes the fixture nodes' link matrices out by hand for the `select`
/// benches, the simulator and the load bench. Each shape that names a fixture must be exactly
/// what discovering that fixture gives: the same class for every pair, and the same published
/// `DeviceTopology` links (kind, count, weight) as the agent writes.
#[test]
fn shapes_are_what_discovery_finds() {
    use fumarole_topology::crd::DeviceTopologySpec;
    use fumarole_topology::shapes::{self, SHAPES};

    let mut checked = 0;
    for shape in SHAPES {
        let Some(fixture) = shape.fixture else {
            continue;
        };
        let (t, _) = discover(&["--fixture", fixture]);
        let links = (shape.links)();
        assert_eq!(t.devices.len(), links.len(), "{}", shape.name);
        for a in 0..links.len() {
            for b in 0..links.len() {
                assert_eq!(
                    t.links.class(a, b),
                    links.class(a, b),
                    "{} ({fixture}): devices {a}-{b}",
                    shape.name
                );
            }
        }
        let published = DeviceTopologySpec::from_topology(&t).links;
        let built = shapes::device_topology("n", shape.name, &links, "sn")
            .spec
            .links;
        let key = |l: &fumarole_topology::crd::device_topology::LinkInfo| {
            (l.a, l.b, l.kind.clone(), l.count, l.weight)
        };
        assert_eq!(
            published.iter().map(key).collect::<Vec<_>>(),
            built.iter().map(key).collect::<Vec<_>>(),
            "{} ({fixture}): published links",
            shape.name
        );
        checked += 1;
    }
    assert_eq!(checked, 5, "every shape with a fixture was checked");
}
