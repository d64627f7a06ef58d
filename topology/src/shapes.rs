//! Link matrices of the fixture node shapes, written out by hand (this crate must not depend on
//! the exporter that owns the fixtures; each function names the fixture it mirrors). The
//! `select` benches and tests and the scheduler extension's placement simulator
//! (`fumarole-scheduler-ext simulate`) build their nodes from these.

use crate::{LinkClass, LinkMatrix};

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

/// 16-NPU Ascend 910B board (reference: halves 0-7 / 8-15): HCCS within a half, SYS across.
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

/// The 8-device shapes by fixture name (`dgx-h100`, `atlas-800-910`, `pcie-4gpu` (4 devices),
/// `metax-c500-8`) and the 16-device ones (`dgx-h100-x2`, `atlas-910b-16`, `pcie-16gpu`,
/// `metax-c500-16`).
pub const NAMES: [&str; 8] = [
    "dgx-h100",
    "atlas-800-910",
    "pcie-4gpu",
    "metax-c500-8",
    "dgx-h100-x2",
    "atlas-910b-16",
    "pcie-16gpu",
    "metax-c500-16",
];

/// The matrix of the shape called `name` (one of [`NAMES`]).
pub fn by_name(name: &str) -> Option<LinkMatrix> {
    Some(match name {
        "dgx-h100" => dgx_h100(),
        "atlas-800-910" => atlas_800_910(),
        "pcie-4gpu" => pcie_4gpu(),
        "metax-c500-8" => metax_c500_8(),
        "dgx-h100-x2" => dgx_h100_x2(),
        "atlas-910b-16" => atlas_910b_16(),
        "pcie-16gpu" => pcie_16gpu(),
        "metax-c500-16" => metax_c500_16(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_a_symmetric_matrix() {
        for name in NAMES {
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
