//! How two accelerators of one node are connected, and what that connection is worth.
//!
//! A [`LinkClass`] names the best path between two devices: a vendor fabric (NVLink with its
//! link count, Ascend HCCS, a MetaX link zone) or, without one, the closest PCIe relation
//! derived from the PCI tree. Each class has a numeric [`LinkClass::weight`]: larger is faster.
//! Placement (`select`) adds weights over device pairs, so the weights are chosen so that any
//! fabric link beats any PCIe path and nearer PCIe paths beat farther ones:
//!
//! | class          | short | weight        | meaning                                          |
//! |----------------|-------|---------------|--------------------------------------------------|
//! | `nvlink`       | NV#   | 100 + 10 x #  | # NVLink lanes between the two GPUs              |
//! | `hccs`         | HCCS  | 200           | Huawei Cache Coherence System (Ascend)           |
//! | `metaxLink`    | MXL   | 200           | same MetaX link zone                             |
//! | `fabric`       | FAB   | 150           | other vendor fabric, from an override file       |
//! | `pcieSwitch`   | PIX   | 50            | behind one PCIe switch (at most one bridge)      |
//! | `pcieMultiSwitch` | PXB | 40           | several bridges, no host bridge crossed          |
//! | `pcieHostBridge` | PHB | 30            | same PCIe host bridge (root complex)             |
//! | `sameNuma`     | NODE  | 20            | different host bridges of one NUMA node          |
//! | `crossNuma`    | SYS   | 10            | across NUMA nodes / sockets (SMP interconnect)   |
//!
//! The short names follow `nvidia-smi topo -m`, which operators already read.

use serde::{Deserialize, Serialize};

/// The best connection between two devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum LinkClass {
    /// NVIDIA NVLink with `count` links between the pair.
    #[serde(rename_all = "camelCase")]
    Nvlink { count: u32 },
    /// Huawei Ascend HCCS.
    Hccs,
    /// MetaX GPUs in the same MetaXLink zone.
    MetaxLink,
    /// Another vendor fabric declared in a topology override file.
    Fabric,
    /// At most one PCIe bridge between the devices (`PIX`).
    PcieSwitch,
    /// Several PCIe bridges, same host bridge not crossed (`PXB`).
    PcieMultiSwitch,
    /// Through the PCIe host bridge (`PHB`).
    PcieHostBridge,
    /// Different host bridges within one NUMA node (`NODE`).
    SameNuma,
    /// Across NUMA nodes or sockets (`SYS`).
    CrossNuma,
}

impl LinkClass {
    /// Relative bandwidth of the class; see the module table.
    pub fn weight(self) -> u32 {
        match self {
            LinkClass::Nvlink { count } => 100u32.saturating_add(count.saturating_mul(10)),
            LinkClass::Hccs | LinkClass::MetaxLink => 200,
            LinkClass::Fabric => 150,
            LinkClass::PcieSwitch => 50,
            LinkClass::PcieMultiSwitch => 40,
            LinkClass::PcieHostBridge => 30,
            LinkClass::SameNuma => 20,
            LinkClass::CrossNuma => 10,
        }
    }

    /// The short legend used by the matrix view (`NV18`, `HCCS`, `PIX`, ...).
    pub fn short_name(self) -> String {
        match self {
            LinkClass::Nvlink { count } => format!("NV{count}"),
            LinkClass::Hccs => "HCCS".into(),
            LinkClass::MetaxLink => "MXL".into(),
            LinkClass::Fabric => "FAB".into(),
            LinkClass::PcieSwitch => "PIX".into(),
            LinkClass::PcieMultiSwitch => "PXB".into(),
            LinkClass::PcieHostBridge => "PHB".into(),
            LinkClass::SameNuma => "NODE".into(),
            LinkClass::CrossNuma => "SYS".into(),
        }
    }

    /// True for vendor fabrics (as opposed to PCIe / system paths).
    pub fn is_fabric(self) -> bool {
        matches!(
            self,
            LinkClass::Nvlink { .. } | LinkClass::Hccs | LinkClass::MetaxLink | LinkClass::Fabric
        )
    }

    /// Legend lines for the matrix view, in weight order.
    pub fn legend() -> &'static [(&'static str, &'static str)] {
        &[
            ("NV#", "NVLink with # links (weight 100 + 10 x #)"),
            ("HCCS", "Huawei HCCS (200)"),
            ("MXL", "same MetaX link zone (200)"),
            ("FAB", "other vendor fabric, from an override file (150)"),
            ("PIX", "at most a single PCIe bridge (50)"),
            ("PXB", "multiple PCIe bridges, no host bridge crossed (40)"),
            ("PHB", "through a PCIe host bridge (30)"),
            ("NODE", "across host bridges within a NUMA node (20)"),
            ("SYS", "across NUMA nodes / the SMP interconnect (10)"),
        ]
    }
}

/// The PCIe / system class between two devices from their PCIe paths (host bridge first, then
/// bridges, see `Device::pci_path`) and NUMA nodes, with the rules of `nvidia-smi topo -m`:
/// no common host bridge -> `NODE` when both sit on the same NUMA node, else `SYS`; only the
/// host bridge in common -> `PHB`; a common PCI bridge with at most one bridge below it on
/// either side -> `PIX`, more -> `PXB`.
pub fn pcie_class(
    a_path: &[String],
    a_numa: Option<u32>,
    b_path: &[String],
    b_numa: Option<u32>,
) -> LinkClass {
    let common = a_path
        .iter()
        .zip(b_path)
        .take_while(|(x, y)| x == y)
        .count();
    match common {
        0 => match (a_numa, b_numa) {
            (Some(x), Some(y)) if x == y => LinkClass::SameNuma,
            _ => LinkClass::CrossNuma,
        },
        1 => LinkClass::PcieHostBridge,
        _ => {
            let below = (a_path.len() - common).max(b_path.len() - common);
            if below <= 1 {
                LinkClass::PcieSwitch
            } else {
                LinkClass::PcieMultiSwitch
            }
        }
    }
}

/// One unordered device pair and its connection, as serialized. `a < b`, both indices into
/// `NodeTopology::devices`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub a: usize,
    pub b: usize,
    #[serde(flatten)]
    pub class: LinkClass,
    /// `class.weight()`, written out so consumers need not know the table.
    pub weight: u32,
}

/// Why a list of links does not form a valid matrix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkMatrixError {
    #[error("link {a}-{b} names a device outside 0..{n}")]
    OutOfRange { a: usize, b: usize, n: usize },
    #[error("link {a}-{b} connects a device to itself")]
    SelfLink { a: usize, b: usize },
    #[error("link {a}-{b} is listed twice")]
    Duplicate { a: usize, b: usize },
    #[error("the pair {a}-{b} has no link; every pair of devices needs one")]
    Missing { a: usize, b: usize },
    #[error("link {a}-{b} has weight {got}, but its class has weight {want}")]
    WrongWeight {
        a: usize,
        b: usize,
        got: u32,
        want: u32,
    },
}

/// Symmetric matrix of [`LinkClass`] over `n` devices, dense (n is at most a few dozen).
/// Serialized as the list of [`Link`]s for every pair `a < b`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkMatrix {
    n: usize,
    /// Row-major n x n; the diagonal is unused and always [`DIAGONAL`], so equal matrices
    /// compare equal.
    classes: Vec<LinkClass>,
}

const DIAGONAL: LinkClass = LinkClass::CrossNuma;

impl LinkMatrix {
    /// A matrix over `n` devices with every pair set to `fill`.
    pub fn filled(n: usize, fill: LinkClass) -> Self {
        let mut classes = vec![fill; n * n];
        for i in 0..n {
            classes[i * n + i] = DIAGONAL;
        }
        Self { n, classes }
    }

    /// Builds the matrix from a class function evaluated once per unordered pair.
    pub fn from_fn(n: usize, mut class: impl FnMut(usize, usize) -> LinkClass) -> Self {
        let mut m = Self::filled(n, LinkClass::CrossNuma);
        for a in 0..n {
            for b in a + 1..n {
                m.set(a, b, class(a, b));
            }
        }
        m
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The class between `a` and `b`; `None` on the diagonal or out of range.
    pub fn class(&self, a: usize, b: usize) -> Option<LinkClass> {
        (a != b && a < self.n && b < self.n).then(|| self.classes[a * self.n + b])
    }

    /// The weight between `a` and `b`; 0 on the diagonal or out of range.
    pub fn weight(&self, a: usize, b: usize) -> u32 {
        self.class(a, b).map_or(0, LinkClass::weight)
    }

    /// For each device (same indices), its fabric group: the connected component of fabric
    /// links (NVLink, HCCS, MetaXLink, override fabric) it belongs to, numbered by the
    /// component's first device; `None` for a device with no fabric link. Links lowered by a
    /// fault (`NodeTopology::with_health`) no longer join devices.
    pub fn fabric_groups(&self) -> Vec<Option<usize>> {
        let fabric = |a: usize, b: usize| self.class(a, b).is_some_and(LinkClass::is_fabric);
        let mut group = vec![None; self.n];
        for start in 0..self.n {
            if group[start].is_some() || !(0..self.n).any(|o| fabric(start, o)) {
                continue;
            }
            group[start] = Some(start);
            let mut members = vec![start];
            while let Some(a) = members.pop() {
                for (b, g) in group.iter_mut().enumerate() {
                    if g.is_none() && fabric(a, b) {
                        *g = Some(start);
                        members.push(b);
                    }
                }
            }
        }
        group
    }

    /// Sets both `(a, b)` and `(b, a)`. Ignores the diagonal and out-of-range indices.
    pub fn set(&mut self, a: usize, b: usize, class: LinkClass) {
        if a != b && a < self.n && b < self.n {
            self.classes[a * self.n + b] = class;
            self.classes[b * self.n + a] = class;
        }
    }

    /// Dense weight matrix, row-major, zeros on the diagonal: the form `select` consumes.
    pub fn weights(&self) -> Vec<Vec<u32>> {
        (0..self.n)
            .map(|a| (0..self.n).map(|b| self.weight(a, b)).collect())
            .collect()
    }

    /// Every pair `a < b` in order.
    pub fn links(&self) -> Vec<Link> {
        let mut out = Vec::with_capacity(self.n * self.n.saturating_sub(1) / 2);
        for a in 0..self.n {
            for b in a + 1..self.n {
                let class = self.classes[a * self.n + b];
                out.push(Link {
                    a,
                    b,
                    class,
                    weight: class.weight(),
                });
            }
        }
        out
    }

    /// Rebuilds the matrix over `n` devices from its pair list, checking that every pair is
    /// present exactly once and weights agree with classes.
    pub fn from_links(n: usize, links: &[Link]) -> Result<Self, LinkMatrixError> {
        let mut seen = vec![false; n * n];
        let mut m = Self::filled(n, LinkClass::CrossNuma);
        for l in links {
            let (a, b) = (l.a.min(l.b), l.a.max(l.b));
            if b >= n {
                return Err(LinkMatrixError::OutOfRange { a, b, n });
            }
            if a == b {
                return Err(LinkMatrixError::SelfLink { a, b });
            }
            if std::mem::replace(&mut seen[a * n + b], true) {
                return Err(LinkMatrixError::Duplicate { a, b });
            }
            if l.weight != l.class.weight() {
                return Err(LinkMatrixError::WrongWeight {
                    a,
                    b,
                    got: l.weight,
                    want: l.class.weight(),
                });
            }
            m.set(a, b, l.class);
        }
        for a in 0..n {
            for b in a + 1..n {
                if !seen[a * n + b] {
                    return Err(LinkMatrixError::Missing { a, b });
                }
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_beats_every_pcie_class() {
        let pcie = [
            LinkClass::PcieSwitch,
            LinkClass::PcieMultiSwitch,
            LinkClass::PcieHostBridge,
            LinkClass::SameNuma,
            LinkClass::CrossNuma,
        ];
        let fabric = [
            LinkClass::Nvlink { count: 1 },
            LinkClass::Hccs,
            LinkClass::MetaxLink,
            LinkClass::Fabric,
        ];
        for f in fabric {
            assert!(f.is_fabric());
            for p in pcie {
                assert!(!p.is_fabric());
                assert!(f.weight() > p.weight(), "{f:?} vs {p:?}");
            }
        }
        // Nearer PCIe paths weigh more.
        assert!(pcie.windows(2).all(|w| w[0].weight() > w[1].weight()));
        assert_eq!(LinkClass::Nvlink { count: 18 }.weight(), 280);
        assert_eq!(LinkClass::Nvlink { count: 18 }.short_name(), "NV18");
    }

    #[test]
    fn matrix_is_symmetric_and_round_trips_through_links() {
        let m = LinkMatrix::from_fn(4, |a, b| {
            if a / 2 == b / 2 {
                LinkClass::Nvlink { count: 2 }
            } else {
                LinkClass::CrossNuma
            }
        });
        assert_eq!(m.weight(0, 1), m.weight(1, 0));
        assert_eq!(m.weight(0, 1), 120);
        assert_eq!(m.weight(1, 2), 10);
        assert_eq!(m.weight(2, 2), 0);
        assert_eq!(m.weight(9, 0), 0);
        let links = m.links();
        assert_eq!(links.len(), 6);
        assert_eq!(LinkMatrix::from_links(4, &links).unwrap(), m);
    }

    #[test]
    fn from_links_rejects_bad_lists() {
        let m = LinkMatrix::filled(3, LinkClass::SameNuma);
        let mut links = m.links();
        links.pop();
        assert!(matches!(
            LinkMatrix::from_links(3, &links),
            Err(LinkMatrixError::Missing { .. })
        ));
        let mut links = m.links();
        links.push(links[0]);
        assert!(matches!(
            LinkMatrix::from_links(3, &links),
            Err(LinkMatrixError::Duplicate { .. })
        ));
        let mut links = m.links();
        links[0].weight = 7;
        assert!(matches!(
            LinkMatrix::from_links(3, &links),
            Err(LinkMatrixError::WrongWeight { .. })
        ));
        assert!(matches!(
            LinkMatrix::from_links(2, &m.links()),
            Err(LinkMatrixError::OutOfRange { .. })
        ));
    }

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pcie_classes_follow_nvidia_smi_rules() {
        // Two GPUs behind one switch: root port, switch upstream port, one downstream port each.
        let a = path(&["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]);
        let b = path(&["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0"]);
        assert_eq!(pcie_class(&a, Some(0), &b, Some(0)), LinkClass::PcieSwitch);
        // Two levels of switch below the common bridge.
        let c = path(&[
            "pci0000:00",
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:02.0",
            "0000:05:00.0",
        ]);
        assert_eq!(
            pcie_class(&a, Some(0), &c, Some(0)),
            LinkClass::PcieMultiSwitch
        );
        // Different root ports of one host bridge.
        let d = path(&["pci0000:00", "0000:00:02.0"]);
        assert_eq!(
            pcie_class(&a, Some(0), &d, Some(0)),
            LinkClass::PcieHostBridge
        );
        // Different host bridges, same or other NUMA node, or unknown.
        let e = path(&["pci0000:17", "0000:17:01.0"]);
        assert_eq!(pcie_class(&a, Some(0), &e, Some(0)), LinkClass::SameNuma);
        assert_eq!(pcie_class(&a, Some(0), &e, Some(1)), LinkClass::CrossNuma);
        assert_eq!(pcie_class(&a, None, &e, None), LinkClass::CrossNuma);
        assert_eq!(pcie_class(&[], Some(0), &[], Some(0)), LinkClass::SameNuma);
    }

    #[test]
    fn link_json_is_flat() {
        let l = Link {
            a: 0,
            b: 1,
            class: LinkClass::Nvlink { count: 18 },
            weight: 280,
        };
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(
            json,
            r#"{"a":0,"b":1,"kind":"nvlink","count":18,"weight":280}"#
        );
        let back: Link = serde_json::from_str(&json).unwrap();
        assert_eq!(back, l);
    }
}
