//! Shared by the `select` benches and `tests/select.rs`: the fixture link matrices
//! ([`fumarole_topology::shapes`]) by size, random matrices, and the NVIDIA-style partition
//! search used as the baseline ([`fumarole_topology::baseline`]).
// Each bench and test uses its own part of this module.
#![allow(dead_code, unused_imports)]

pub use fumarole_topology::baseline::{nvidia_baseline, nvidia_scores, partition_count};
pub use fumarole_topology::shapes::{
    atlas_800_910, atlas_910b_16, dgx_h100, dgx_h100_x2, metax_c500_8, metax_c500_16, pcie_4gpu,
    pcie_16gpu,
};
use fumarole_topology::{LinkClass, LinkMatrix};

/// The named fixture matrices of one size, for benches and tests.
pub fn fixtures_8() -> Vec<(&'static str, LinkMatrix)> {
    vec![
        ("dgx-h100", dgx_h100()),
        ("atlas-800-910", atlas_800_910()),
        ("pcie-4gpu", pcie_4gpu()),
        ("metax-c500-8", metax_c500_8()),
        ("random-8", random_links(8, 0x5eed_0008)),
    ]
}

pub fn fixtures_16() -> Vec<(&'static str, LinkMatrix)> {
    vec![
        ("dgx-h100-x2", dgx_h100_x2()),
        ("atlas-910b-16", atlas_910b_16()),
        ("pcie-16gpu", pcie_16gpu()),
        ("metax-c500-16", metax_c500_16()),
        ("random-16", random_links(16, 0x5eed_0016)),
    ]
}

/// Small deterministic PRNG (xorshift64*), so benches need no extra crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Every link class a real node can show.
pub const CLASSES: [LinkClass; 12] = [
    LinkClass::CrossNuma,
    LinkClass::SameNuma,
    LinkClass::PcieHostBridge,
    LinkClass::PcieMultiSwitch,
    LinkClass::PcieSwitch,
    LinkClass::Fabric,
    LinkClass::Hccs,
    LinkClass::MetaxLink,
    LinkClass::Nvlink { count: 1 },
    LinkClass::Nvlink { count: 4 },
    LinkClass::Nvlink { count: 12 },
    LinkClass::Nvlink { count: 18 },
];

/// A matrix with a random class for every pair.
pub fn random_links(n: usize, seed: u64) -> LinkMatrix {
    let mut rng = Rng::new(seed);
    LinkMatrix::from_fn(n, |_, _| CLASSES[rng.below(CLASSES.len())])
}

/// A hard case for branch and bound: every pair NV17 or NV18 at random, so nearly every set
/// looks as good as the best and little of the tree can be cut.
pub fn near_uniform_links(n: usize, seed: u64) -> LinkMatrix {
    let mut rng = Rng::new(seed);
    LinkMatrix::from_fn(n, |_, _| LinkClass::Nvlink {
        count: 17 + rng.below(2) as u32,
    })
}

/// The `p` quantile of `sorted` (nearest rank).
pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
