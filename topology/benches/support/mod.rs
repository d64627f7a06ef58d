//! Shared by the `select` benches and `tests/select.rs`: the fixture link matrices written out by
//! hand (the topology crate must not depend on the exporter that owns the fixtures), random
//! matrices, and the NVIDIA-style partition search used as the baseline.
#![allow(dead_code)]

use fumarole_topology::{LinkClass, LinkMatrix};

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

/// NVIDIA's pair score (gpuallocator): cross-CPU 10, same CPU 20, host bridge 30, multi-switch
/// 40, single switch 50, +100 per NVLink. Our matrix keeps only the best class of a pair, so an
/// NVLink pair scores its links only; fabrics NVIDIA does not know (HCCS, MetaX, other) score
/// as one NVLink.
pub fn nvidia_score(class: LinkClass) -> u32 {
    match class {
        LinkClass::Nvlink { count } => 100 * count,
        LinkClass::Hccs | LinkClass::MetaxLink | LinkClass::Fabric => 100,
        LinkClass::PcieSwitch => 50,
        LinkClass::PcieMultiSwitch => 40,
        LinkClass::PcieHostBridge => 30,
        LinkClass::SameNuma => 20,
        LinkClass::CrossNuma => 10,
    }
}

/// Dense NVIDIA pair scores for `links`.
pub fn nvidia_scores(links: &LinkMatrix) -> Vec<Vec<u32>> {
    let n = links.len();
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| links.class(a, b).map_or(0, nvidia_score))
                .collect()
        })
        .collect()
}

/// Number of partitions the baseline walks: `m` devices padded up to a multiple of `k`, split
/// into sets of `k`: `m! / (k!^(m/k) (m/k)!)`. Saturates at `u128::MAX`.
pub fn partition_count(free: usize, k: usize) -> u128 {
    if k == 0 || k >= free {
        return 1;
    }
    let m = free.div_ceil(k) * k;
    // Product over sets: C(remaining - 1, k - 1) (the first remaining device picks its partners).
    let mut count: u128 = 1;
    let mut left = m;
    while left > 0 {
        count = count.saturating_mul(binomial(left - 1, k - 1));
        left -= k;
    }
    count
}

fn binomial(n: usize, k: usize) -> u128 {
    let mut c: u128 = 1;
    for i in 0..k as u128 {
        c = c * (n as u128 - i) / (i + 1);
    }
    c
}

/// NVIDIA's best-effort allocator, implemented from its description: pad the available devices
/// with empty slots up to a multiple of `k`, enumerate every partition into sets of `k` (the
/// first unplaced slot picks its `k - 1` partners), score a partition as the sum of its sets'
/// pair scores, keep the first best partition that has a usable set (`k` real devices, every
/// `must` device), and return that partition's best-scoring usable set. Exponential: 16 devices in
/// pairs are 2 027 025 partitions.
pub fn nvidia_baseline(score: &[Vec<u32>], free: &[usize], must: &[usize], k: usize) -> Vec<usize> {
    if k == 0 || k > free.len() {
        return Vec::new();
    }
    if k == free.len() {
        return free.to_vec();
    }
    if must.len() == k {
        return must.to_vec();
    }
    let m = free.len().div_ceil(k) * k;
    // Slots: Some(device) or None (padding).
    let mut slots: Vec<Option<usize>> = free.iter().map(|&d| Some(d)).collect();
    slots.resize(m, None);
    let mut search = Partitions {
        score,
        must,
        k,
        slots: &slots,
        used: vec![false; m],
        sets: Vec::new(),
        best: None,
    };
    search.partition(0);
    let Some((_, sets)) = search.best else {
        return Vec::new();
    };
    let mut pick: Option<(u64, Vec<usize>)> = None;
    for set in sets {
        let devices: Vec<usize> = set.iter().filter_map(|&s| slots[s]).collect();
        if devices.len() < k || !must.iter().all(|d| devices.contains(d)) {
            continue;
        }
        let s = set_score(score, &devices);
        if pick.as_ref().is_none_or(|(best, _)| s > *best) {
            pick = Some((s, devices));
        }
    }
    let mut out = pick.map(|(_, d)| d).unwrap_or_default();
    out.sort_unstable();
    out
}

fn set_score(score: &[Vec<u32>], devices: &[usize]) -> u64 {
    let mut s = 0;
    for (i, &a) in devices.iter().enumerate() {
        for &b in &devices[i + 1..] {
            s += u64::from(score[a][b]);
        }
    }
    s
}

struct Partitions<'a> {
    score: &'a [Vec<u32>],
    must: &'a [usize],
    k: usize,
    slots: &'a [Option<usize>],
    used: Vec<bool>,
    /// Sets of slot indices placed so far.
    sets: Vec<Vec<usize>>,
    best: Option<(u64, Vec<Vec<usize>>)>,
}

impl Partitions<'_> {
    /// Places the first unused slot with every choice of partners, then recurses.
    fn partition(&mut self, total: u64) {
        let Some(first) = self.used.iter().position(|u| !u) else {
            // A usable set has `k` real devices (no padding) and every `must` device.
            let has_must = self.sets.iter().any(|set| {
                set.iter().all(|&s| self.slots[s].is_some())
                    && self
                        .must
                        .iter()
                        .all(|d| set.iter().any(|&s| self.slots[s] == Some(*d)))
            });
            if has_must && self.best.as_ref().is_none_or(|(b, _)| total > *b) {
                self.best = Some((total, self.sets.clone()));
            }
            return;
        };
        self.used[first] = true;
        let mut set = vec![first];
        self.partners(first + 1, total, 0, &mut set);
        self.used[first] = false;
    }

    /// Chooses the remaining members of the set being built (slots after `from`).
    fn partners(&mut self, from: usize, total: u64, set_score: u64, set: &mut Vec<usize>) {
        if set.len() == self.k {
            self.sets.push(set.clone());
            self.partition(total + set_score);
            self.sets.pop();
            return;
        }
        // Unused slots from `s` on; stop when too few are left to fill the set.
        let mut open = self.used[from..].iter().filter(|u| !**u).count();
        for s in from..self.slots.len() {
            if self.used[s] {
                continue;
            }
            if open < self.k - set.len() {
                break;
            }
            open -= 1;
            let add: u64 = match self.slots[s] {
                Some(d) => set
                    .iter()
                    .filter_map(|&t| self.slots[t])
                    .map(|e| u64::from(self.score[d][e]))
                    .sum(),
                None => 0,
            };
            self.used[s] = true;
            set.push(s);
            self.partners(s + 1, total, set_score + add, set);
            set.pop();
            self.used[s] = false;
        }
    }
}
