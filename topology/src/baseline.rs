//! The NVIDIA k8s-device-plugin's preferred allocation (`gpuallocator`'s best-effort policy),
//! implemented from its description, as the comparison for `select`: the `select` benches and
//! tests and the scheduler extension's placement simulator (policy `nvidia`) use it.
//! Exponential: do not use it on a hot path.

use crate::{LinkClass, LinkMatrix};

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
