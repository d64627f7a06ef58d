//! Link matrices of the fixture node shapes, written out by hand (this crate must not depend on
//! the exporter that owns the fixtures), and the `DeviceTopology` a node of each shape
//! publishes ([`device_topology`]). The `select` benches and tests, the placement simulator
//! (`fumarole-sim`) and the scheduler extension's load bench build their nodes from these.
//!
//! [`SHAPES`] is the one list: each shape names the bundled fixture it mirrors, and
//! `agent/tests/fixtures.rs` checks that discovering that fixture gives exactly this matrix
//! and these published link weights. The other shapes are 16-device variants with no fixture.

use crate::crd::device_topology::{DeviceInfo, LinkInfo, SuperNodeInfo};
use crate::crd::{DeviceTopology, DeviceTopologySpec};
use crate::{LinkClass, LinkMatrix};

/// One node shape.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// The name `fumarole-sim --cluster NxNAME` and the benches use.
    pub name: &'static str,
    /// The bundled fixture (`fumarole-agent fixture`) whose discovered links this mirrors.
    pub fixture: Option<&'static str>,
    /// The link matrix.
    pub links: fn() -> LinkMatrix,
}

/// Every shape: the 8-device ones (and `pcie-4gpu`), then the 16-device ones.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "dgx-h100",
        fixture: Some("dgx-h100"),
        links: dgx_h100,
    },
    Shape {
        name: "atlas-800-910",
        fixture: Some("atlas-800-910"),
        links: atlas_800_910,
    },
    Shape {
        name: "pcie-4gpu",
        fixture: Some("pcie-4gpu"),
        links: pcie_4gpu,
    },
    Shape {
        name: "metax-c500-8",
        fixture: Some("metax-c500-8"),
        links: metax_c500_8,
    },
    Shape {
        name: "dgx-h100-x2",
        fixture: None,
        links: dgx_h100_x2,
    },
    Shape {
        name: "atlas-910b-16",
        fixture: Some("atlas-a3-16"),
        links: atlas_910b_16,
    },
    Shape {
        name: "pcie-16gpu",
        fixture: None,
        links: pcie_16gpu,
    },
    Shape {
        name: "metax-c500-16",
        fixture: None,
        links: metax_c500_16,
    },
];

const NV18: LinkClass = LinkClass::Nvlink { count: 18 };

/// Mirrors fixture `dgx-h100`: 8 GPUs, NV18 between every pair (NVSwitch).
pub fn dgx_h100() -> LinkMatrix {
    LinkMatrix::from_fn(8, |_, _| NV18)
}

/// Mirrors fixture `atlas-800-910`: 8 NPUs, HCCS within {0-3} and {4-7}, SYS across.
pub fn atlas_800_910() -> LinkMatrix {
    halves(8, LinkClass::Hccs)
}

/// Mirrors fixture `pcie-4gpu`: 4 GPUs, PIX within {0,1} and {2,3}, PHB across.
pub fn pcie_4gpu() -> LinkMatrix {
    LinkMatrix::from_fn(4, |a, b| {
        if a / 2 == b / 2 {
            LinkClass::PcieSwitch
        } else {
            LinkClass::PcieHostBridge
        }
    })
}

/// Mirrors fixture `metax-c500-8`: 8 GPUs, MXL within {0-3} and {4-7}, SYS across.
pub fn metax_c500_8() -> LinkMatrix {
    halves(8, LinkClass::MetaxLink)
}

/// 16-device variant of `dgx-h100`: two 8-GPU NVSwitch boards, SYS between them.
pub fn dgx_h100_x2() -> LinkMatrix {
    halves(16, NV18)
}

/// Mirrors fixture `atlas-a3-16`: 16 Ascend 910B, HCCS within the halves 0-7 / 8-15, SYS
/// across.
pub fn atlas_910b_16() -> LinkMatrix {
    halves(16, LinkClass::Hccs)
}

/// 16-device variant of `pcie-4gpu`: four such switches; PIX within a pair, PHB within a quad,
/// NODE between quads of one socket (0-7, 8-15), SYS across sockets.
pub fn pcie_16gpu() -> LinkMatrix {
    LinkMatrix::from_fn(16, |a, b| {
        if a / 2 == b / 2 {
            LinkClass::PcieSwitch
        } else if a / 4 == b / 4 {
            LinkClass::PcieHostBridge
        } else if a / 8 == b / 8 {
            LinkClass::SameNuma
        } else {
            LinkClass::CrossNuma
        }
    })
}

/// 16-device MetaX node: MXL within the zones {0-3}, {4-7}, {8-11}, {12-15}, NODE between the
/// two zones of one socket, SYS across sockets.
pub fn metax_c500_16() -> LinkMatrix {
    LinkMatrix::from_fn(16, |a, b| {
        if a / 4 == b / 4 {
            LinkClass::MetaxLink
        } else if a / 8 == b / 8 {
            LinkClass::SameNuma
        } else {
            LinkClass::CrossNuma
        }
    })
}

/// `fabric` within each half of `n` devices, SYS across.
fn halves(n: usize, fabric: LinkClass) -> LinkMatrix {
    LinkMatrix::from_fn(n, |a, b| {
        if (a < n / 2) == (b < n / 2) {
            fabric
        } else {
            LinkClass::CrossNuma
        }
    })
}

/// The names of [`SHAPES`], in order.
pub fn names() -> Vec<&'static str> {
    SHAPES.iter().map(|s| s.name).collect()
}

/// The matrix of the shape called `name`.
pub fn by_name(name: &str) -> Option<LinkMatrix> {
    SHAPES.iter().find(|s| s.name == name).map(|s| (s.links)())
}

/// Vendor, kind and device id of device `i` of a node of shape `shape`.
fn device_identity(shape: &str, i: usize) -> (&'static str, &'static str, String) {
    if shape.starts_with("atlas") {
        ("huawei", "npu", format!("Ascend910-{i}"))
    } else if shape.starts_with("metax") {
        ("metax", "gpu", format!("GPU-metax-{i}"))
    } else {
        ("nvidia", "gpu", format!("GPU-{i}"))
    }
}

/// The `DeviceTopology` the agent publishes for node `node` of shape `shape` with links
/// `links`: devices `0..n` (the first half on NUMA node 0, the rest on 1), every pair's link
/// as the agent publishes it ([`LinkInfo::all`]), the super-node; no status (every device
/// healthy and free).
pub fn device_topology(
    node: &str,
    shape: &str,
    links: &LinkMatrix,
    super_node: &str,
) -> DeviceTopology {
    let n = links.len();
    let index = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
    let devices = (0..n)
        .map(|i| {
            let (vendor, kind, id) = device_identity(shape, i);
            DeviceInfo {
                id,
                index: index(i),
                vendor: vendor.into(),
                kind: kind.into(),
                numa_node: Some(u32::from(i >= n / 2)),
                ..Default::default()
            }
        })
        .collect();
    DeviceTopology::new(
        node,
        DeviceTopologySpec {
            accelerator_count: index(n),
            devices,
            links: LinkInfo::all(links),
            super_node: Some(SuperNodeInfo {
                id: super_node.into(),
                source: "config".into(),
            }),
            ..Default::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_a_symmetric_matrix() {
        for name in names() {
            let m = by_name(name);
            assert!(m.is_some(), "{name}");
            let m = m.unwrap_or_else(|| LinkMatrix::from_fn(0, |_, _| LinkClass::CrossNuma));
            for a in 0..m.len() {
                for b in 0..m.len() {
                    assert_eq!(m.class(a, b), m.class(b, a), "{name} {a} {b}");
                }
            }
        }
        assert!(by_name("dgx-a100").is_none());
    }
}
