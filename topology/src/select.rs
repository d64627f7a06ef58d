//! `select`: which `k` devices of a node a pod should get, and what that choice costs the node.
//!
//! The device plugin (`GetPreferredAllocation`) and the scheduler extension (node scoring and
//! the device annotation) both call this, so the kubelet and the scheduler always agree on the
//! devices a pod gets.
//!
//! Start at [`SelectContext`]: build it once per node from the [`LinkMatrix`] (it keeps the
//! weights, the largest weight, the device classes and `Q_ideal(k)` for every `k`), then call
//! [`SelectContext::select`] per request. [`select`] is the one-shot form for cold paths.
//!
//! # What is optimal
//!
//! Given a free set `F`, a must-include set `M ⊆ F` and a size `k`, the answer is the set `S`
//! (`M ⊆ S ⊆ F`, `|S| = k`) that comes first in this order:
//!
//! 1. largest quality `Q(S) = Σ w(a,b)` over pairs `{a,b} ⊆ S` (fast links inside the pod);
//! 2. smallest loss `C(S) = Σ w(a,b)` over `a ∈ S`, `b ∈ F \ S` (fast links the allocation cuts
//!    away from devices that stay free: a 1-GPU pod takes the GPU whose NVLink partner is busy
//!    rather than breaking an idle pair; a 2-NPU pod on an Ascend 910 takes from the HCCS group
//!    that is already broken and keeps the other group of 4 whole);
//! 3. the lexicographically smallest sorted index list (deterministic).
//!
//! [`Selection`] also carries the normalised figures the scheduler scores with:
//! `q = Q(S) / Q_ideal(k)` (`Q_ideal(k)` = best `Q` for `k` devices on the empty node; `q = 1`
//! when that is 0, e.g. `k = 1`) and `loss = C(S) / (k · (|D| − k) · w_max)` (0 when `|D| = k`).
//!
//! # How
//!
//! One identity keeps every step cheap: with `r(a) = Σ_{b ∈ F} w(a,b)`,
//! `C(S) = Σ_{a ∈ S} r(a) − 2 Q(S)`. So both keys are sums that grow as devices are added, and
//! among sets of equal `Q` the smaller `Σ r` has the smaller loss.
//!
//! Three searches; [`SelectContext::select`] runs the cheapest that applies (a request with only
//! one candidate set is answered directly):
//!
//! 1. **Classes** (exact), used whenever it has fewer cases than the exhaustive search, and on
//!    large structured nodes. Devices `a` and `b` are *twins* when `w(a,c) = w(b,c)` for every
//!    other device `c`; twins form equivalence classes (an NVSwitch board is one class, an Ascend
//!    910 node two, `{0-3}` and `{4-7}`), with one weight inside each class and one between any
//!    two classes. `Q` and `C` then depend only on how many devices are taken from each class,
//!    so it walks the count vectors (at most [`CLASS_LIMIT`]) and takes the lowest free indices
//!    inside each class.
//! 2. **Exhaustive** (exact) when there are at most [`ENUMERATION_LIMIT`] candidate sets
//!    (`C(|F \ M|, k − |M|)`; this covers every request on a node of up to 16 devices):
//!    depth-first in lexicographic order, `O(|F|)` per step and `O(1)` per leaf, starting (on
//!    large trees) from the heuristic's answer and skipping every subtree whose upper bound on `Q` (see `Walk`)
//!    is below the best found. Ties on `Q` and `C` keep the lexicographically smaller set.
//! 3. **Heuristic** otherwise: greedy from `M` and from `M` plus each single free device (each
//!    step adds the device with the most weight to the set so far, then the least weight to the
//!    rest of `F`), the best of those, then 1-swap local search that only accepts strictly better
//!    sets. It is never worse than plain greedy, which is one of its starting points.
//!    `Q_ideal` on such a node comes from the same heuristic, so `q` is clamped to 1.
//!
//! Property tests (`tests/select.rs` and below) check both exact searches against brute force.
//!
//! A call allocates only a few small vectors. Building a context runs the search once per `k`
//! on the empty node (under a millisecond for 16 devices); `BENCHMARKS.md` has the figures.

use std::cmp::Ordering;

use crate::link::LinkMatrix;

/// Largest number of candidate sets the exhaustive search walks: `C(16, 8)`, the worst case of a
/// 16-device node, so that every request on such a node is exact and within the same time bound.
pub const ENUMERATION_LIMIT: u64 = 12_870;

/// Largest number of per-class count vectors the class search walks.
pub const CLASS_LIMIT: u64 = 100_000;

/// Up to this many twin classes, [`SelectContext::class_vectors`] counts exactly when the
/// cheap bound is too large.
const EXACT_COUNT_MAX_CLASSES: usize = 16;

/// The exhaustive search starts from the heuristic's answer when it has more candidate sets
/// than this; below, the heuristic costs more than it saves.
const SEED_WITH_HEURISTIC_ABOVE: u64 = 256;

/// Upper bound on accepted swaps in the local search (each costs `O(|F|)`); it stops earlier
/// when no swap improves, which is the usual case after a few swaps.
const MAX_SWAPS: usize = 1_000;

/// Why a selection request cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// `k = 0`: a pod that wants no devices should not ask.
    #[error("asked for 0 devices; a selection needs at least one")]
    ZeroCount,
    /// A free or must-include index is not a device of this node.
    #[error("device index {device} is out of range: the node has {n} devices")]
    OutOfRange { device: usize, n: usize },
    /// A must-include device is not in the free set.
    #[error("must-include device {device} is not free")]
    MustNotFree { device: usize },
    /// More must-include devices than the requested size.
    #[error("{must} must-include devices do not fit in a request for {k}")]
    TooManyMust { must: usize, k: usize },
    /// Fewer free devices than requested.
    #[error("asked for {k} devices but only {free} are free")]
    NotEnoughFree { k: usize, free: usize },
    /// A weight matrix row has the wrong length.
    #[error("weight matrix row {row} has {len} entries; a matrix over {n} devices needs {n}")]
    NotSquare { row: usize, len: usize, n: usize },
    /// `w(a,b) != w(b,a)`.
    #[error("weight matrix is not symmetric: w({a},{b}) = {ab} but w({b},{a}) = {ba}")]
    NotSymmetric {
        a: usize,
        b: usize,
        ab: u32,
        ba: u32,
    },
}

/// Which search produced a [`Selection`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// Every candidate set was examined or bounded out (branch and bound): exact.
    Exhaustive,
    /// Count vectors over twin classes were examined: exact.
    Classes,
    /// Greedy plus local search: at least as good as greedy, not proven optimal.
    Heuristic,
}

/// The chosen devices and what they are worth.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// Chosen device indices, ascending.
    pub devices: Vec<usize>,
    /// `Q(S)`: sum of link weights over pairs inside the selection.
    pub quality: u64,
    /// `C(S)`: sum of link weights from the selection to free devices left out.
    pub cut: u64,
    /// `quality / Q_ideal(k)`, in [0, 1].
    pub q: f64,
    /// `cut / (k · (|D| − k) · w_max)`, in [0, 1].
    pub loss: f64,
    /// How the answer was found.
    pub method: Method,
}

impl Selection {
    /// True when the selection is proven optimal under the full order (not heuristic).
    pub fn is_exact(&self) -> bool {
        self.method != Method::Heuristic
    }
}

/// Everything `select` needs about one node, computed once: the dense weights, `w_max`, the twin
/// classes and `Q_ideal(k)` for every `k`. Cheap to share (`Arc`) between requests; never
/// changes after construction.
#[derive(Clone, Debug)]
pub struct SelectContext {
    n: usize,
    /// Row-major `n x n`, zero diagonal.
    w: Vec<u32>,
    w_max: u32,
    /// Twin class of each device.
    class_of: Vec<usize>,
    /// Members of each class, ascending; classes ordered by their first member.
    classes: Vec<Vec<usize>>,
    /// `g x g`: diagonal = weight inside a class (0 for a single device), else between classes.
    class_w: Vec<u32>,
    /// `Q_ideal(k)` at index `k` (`0..=n`).
    ideal: Vec<u64>,
}

impl SelectContext {
    /// Context for the node whose links are `links`.
    pub fn new(links: &LinkMatrix) -> Self {
        let n = links.len();
        let mut w = vec![0; n * n];
        for a in 0..n {
            for b in 0..n {
                w[a * n + b] = links.weight(a, b);
            }
        }
        Self::build(n, w)
    }

    /// Context from a dense weight matrix (`weights[a][b]`); the diagonal is ignored. Fails when
    /// the matrix is not square or not symmetric.
    pub fn from_weights(weights: &[Vec<u32>]) -> Result<Self, SelectError> {
        let n = weights.len();
        for (row, r) in weights.iter().enumerate() {
            if r.len() != n {
                return Err(SelectError::NotSquare {
                    row,
                    len: r.len(),
                    n,
                });
            }
        }
        let mut w = vec![0; n * n];
        for a in 0..n {
            for b in 0..n {
                let (ab, ba) = (weights[a][b], weights[b][a]);
                if ab != ba {
                    return Err(SelectError::NotSymmetric { a, b, ab, ba });
                }
                if a != b {
                    w[a * n + b] = ab;
                }
            }
        }
        Ok(Self::build(n, w))
    }

    fn build(n: usize, w: Vec<u32>) -> Self {
        let w_max = w.iter().copied().max().unwrap_or(0);
        let (class_of, classes, class_w) = twin_classes(n, &w);
        let mut ctx = Self {
            n,
            w,
            w_max,
            class_of,
            classes,
            class_w,
            ideal: vec![0; n + 1],
        };
        // Q_ideal(k) is the same search on the empty node.
        let all: Vec<usize> = (0..n).collect();
        let ideal: Vec<u64> = (0..=n)
            .map(|k| ctx.search(&all, &[], k).map_or(0, |f| f.quality))
            .collect();
        ctx.ideal = ideal;
        ctx
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// `w(a, b)`; 0 on the diagonal or out of range.
    pub fn weight(&self, a: usize, b: usize) -> u32 {
        if a < self.n && b < self.n {
            self.w[a * self.n + b]
        } else {
            0
        }
    }

    /// The largest link weight of the node (0 with fewer than two devices).
    pub fn w_max(&self) -> u32 {
        self.w_max
    }

    /// `Q_ideal(k)`: the best quality of `k` devices on the empty node (exact up to 16 devices
    /// or with class structure, else the heuristic's); `None` when `k > len()`.
    pub fn ideal_quality(&self, k: usize) -> Option<u64> {
        self.ideal.get(k).copied()
    }

    /// Number of twin classes (see the module doc); `len()` when the matrix has no structure.
    pub fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// `Q(S)` of any set of in-range device indices (duplicates must not appear).
    pub fn quality(&self, devices: &[usize]) -> u64 {
        let mut q = 0;
        for (i, &a) in devices.iter().enumerate() {
            for &b in &devices[i + 1..] {
                q += u64::from(self.weight(a, b));
            }
        }
        q
    }

    /// `C(S)` of `devices` against the free set `free` (members of `devices` are not counted as
    /// left free).
    pub fn cut(&self, devices: &[usize], free: &[usize]) -> u64 {
        let mut c = 0;
        for &a in devices {
            for &b in free {
                if !devices.contains(&b) {
                    c += u64::from(self.weight(a, b));
                }
            }
        }
        c
    }

    /// The best `k` devices out of `free` that include every device of `must`; see the module
    /// doc for the order. Duplicate indices in `free` or `must` are ignored.
    pub fn select(
        &self,
        free: &[usize],
        must: &[usize],
        k: usize,
    ) -> Result<Selection, SelectError> {
        let found = self.search(free, must, k)?;
        let ideal = self.ideal.get(k).copied().unwrap_or(0);
        let q = if ideal == 0 {
            1.0
        } else {
            (found.quality as f64 / ideal as f64).min(1.0)
        };
        let scale = (k as u64) * ((self.n - k) as u64) * u64::from(self.w_max);
        let loss = if scale == 0 {
            0.0
        } else {
            (found.cut as f64 / scale as f64).min(1.0)
        };
        Ok(Selection {
            devices: found.devices,
            quality: found.quality,
            cut: found.cut,
            q,
            loss,
            method: found.method,
        })
    }

    /// Validates the request and runs the cheapest search that applies: the class search when
    /// it has fewer count vectors than there are candidate sets, else the exhaustive search when
    /// it is within [`ENUMERATION_LIMIT`], else the class search when within [`CLASS_LIMIT`],
    /// else the heuristic.
    fn search(&self, free: &[usize], must: &[usize], k: usize) -> Result<Found, SelectError> {
        let req = self.request(free, must, k)?;
        let sets = binomial_capped(
            req.free.len() - req.must.len(),
            k - req.must.len(),
            ENUMERATION_LIMIT,
        );
        let vectors = self.class_vectors(&req);
        let (devices, method) = if sets <= 1 {
            // Only one candidate set (k = |M| or k = |F|): it is the answer.
            let only = if k == req.must.len() {
                &req.must
            } else {
                &req.free
            };
            (only.clone(), Method::Exhaustive)
        } else if vectors <= CLASS_LIMIT && vectors <= sets {
            (self.by_classes(&req), Method::Classes)
        } else if sets <= ENUMERATION_LIMIT {
            (self.exhaustive(&req, sets), Method::Exhaustive)
        } else if vectors <= CLASS_LIMIT {
            (self.by_classes(&req), Method::Classes)
        } else {
            (self.heuristic(&req), Method::Heuristic)
        };
        let scored = self.score(&req, devices);
        Ok(Found {
            devices: scored.devices,
            quality: scored.quality,
            cut: scored.cut,
            method,
        })
    }

    fn request(&self, free: &[usize], must: &[usize], k: usize) -> Result<Request, SelectError> {
        let n = self.n;
        if let Some(&device) = free.iter().chain(must).find(|&&d| d >= n) {
            return Err(SelectError::OutOfRange { device, n });
        }
        if k == 0 {
            return Err(SelectError::ZeroCount);
        }
        let mut in_free = vec![false; n];
        for &d in free {
            in_free[d] = true;
        }
        let mut is_must = vec![false; n];
        for &d in must {
            if !in_free[d] {
                return Err(SelectError::MustNotFree { device: d });
            }
            is_must[d] = true;
        }
        let free: Vec<usize> = (0..n).filter(|&d| in_free[d]).collect();
        let must: Vec<usize> = (0..n).filter(|&d| is_must[d]).collect();
        if must.len() > k {
            return Err(SelectError::TooManyMust {
                must: must.len(),
                k,
            });
        }
        if k > free.len() {
            return Err(SelectError::NotEnoughFree {
                k,
                free: free.len(),
            });
        }
        let mut r = vec![0u64; n];
        for &a in &free {
            let row = self.row(a);
            r[a] = free.iter().map(|&b| u64::from(row[b])).sum();
        }
        Ok(Request {
            is_must,
            free,
            must,
            k,
            r,
        })
    }

    fn row(&self, a: usize) -> &[u32] {
        &self.w[a * self.n..(a + 1) * self.n]
    }

    /// `Q`, `C` and the sorted list of a set chosen for `req`.
    fn score(&self, req: &Request, mut devices: Vec<usize>) -> Scored {
        devices.sort_unstable();
        let quality = self.quality(&devices);
        let r: u64 = devices.iter().map(|&d| req.r[d]).sum();
        Scored {
            devices,
            quality,
            cut: r - 2 * quality,
        }
    }

    /// Exact: every `(k − |M|)`-subset of `F \ M` in lexicographic order, with branch and
    /// bound (see [`Walk`]); `sets` is the number of candidate sets, which decides the first best.
    fn exhaustive(&self, req: &Request, sets: u64) -> Vec<usize> {
        let cand: Vec<usize> = req
            .free
            .iter()
            .copied()
            .filter(|&d| !req.is_must[d])
            .collect();
        let need = req.k - req.must.len();
        let c = cand.len();
        // What each candidate adds to Q through the must-include devices.
        let attach: Vec<u64> = cand
            .iter()
            .map(|&d| {
                let row = self.row(d);
                req.must.iter().map(|&m| u64::from(row[m])).sum()
            })
            .collect();
        let r: Vec<u64> = cand.iter().map(|&d| req.r[d]).collect();
        // top[i * need + j]: sum of the j largest weights from candidate i to other candidates.
        let mut top = vec![0u64; c * need.max(1)];
        let mut row: Vec<u64> = Vec::with_capacity(c);
        for (i, &a) in cand.iter().enumerate() {
            row.clear();
            row.extend(
                cand.iter()
                    .filter(|&&b| b != a)
                    .map(|&b| u64::from(self.w[a * self.n + b])),
            );
            row.sort_unstable_by(|x, y| y.cmp(x));
            for j in 1..need {
                top[i * need + j] = top[i * need + j - 1] + row.get(j - 1).copied().unwrap_or(0);
            }
        }
        // A first best to bound against: the heuristic's answer when the tree is large (most
        // of it is then cut), else simply the first candidate set (the heuristic would cost
        // more than the walk).
        let first = if sets > SEED_WITH_HEURISTIC_ABOVE {
            self.score(req, self.heuristic(req)).devices
        } else {
            req.must.iter().chain(&cand[..need]).copied().collect()
        };
        let seed_chosen: Vec<usize> = first.iter().copied().filter(|&d| !req.is_must[d]).collect();
        let seed_q = self.quality(&first) - self.quality(&req.must);
        let seed_rs: u64 = seed_chosen.iter().map(|&d| req.r[d]).sum();
        let mut walk = Walk {
            n: self.n,
            w: &self.w,
            cand: &cand,
            r: &r,
            top: &top,
            need,
            attach,
            chosen: Vec::with_capacity(need),
            best: (seed_q, seed_rs, seed_chosen),
            scratch: Vec::with_capacity(c),
        };
        walk.dfs(0, need, 0, 0);
        let mut devices = req.must.clone();
        devices.extend_from_slice(&walk.best.2);
        devices
    }

    /// How many count vectors [`Self::by_classes`] would walk, at most (saturating). First the
    /// cheap bound `Π (choices per class)`; when that is over [`CLASS_LIMIT`] on a node with few
    /// classes (a large node made of groups), the exact number of vectors that sum to `k`,
    /// which is often far smaller (a dynamic program over classes and sums).
    fn class_vectors(&self, req: &Request) -> u64 {
        let g = self.classes.len();
        let (mut lo, mut hi) = (vec![0usize; g], vec![0usize; g]);
        for &d in &req.free {
            let c = self.class_of[d];
            hi[c] += 1;
            lo[c] += usize::from(req.is_must[d]);
        }
        let bound = (0..g).fold(1u64, |acc, c| {
            acc.saturating_mul((hi[c].min(req.k) - lo[c] + 1) as u64)
        });
        if bound <= CLASS_LIMIT || g > EXACT_COUNT_MAX_CLASSES {
            return bound;
        }
        // ways[s]: vectors over the classes so far whose counts sum to s.
        let k = req.k;
        let mut ways = vec![0u64; k + 1];
        ways[0] = 1;
        for c in 0..g {
            let mut next = vec![0u64; k + 1];
            for (s, &wy) in ways.iter().enumerate().filter(|(_, w)| **w > 0) {
                for x in lo[c]..=hi[c].min(k - s) {
                    next[s + x] = next[s + x].saturating_add(wy).min(CLASS_LIMIT + 1);
                }
            }
            ways = next;
        }
        ways[k]
    }

    /// Exact over twin classes: walks the count vectors (see [`ClassWalk`]); the caller checks
    /// [`Self::class_vectors`] first.
    fn by_classes(&self, req: &Request) -> Vec<usize> {
        let g = self.classes.len();
        let k = req.k;
        // Per class: the must-include members and the other free members, ascending.
        let mut musts: Vec<Vec<usize>> = vec![Vec::new(); g];
        let mut rest: Vec<Vec<usize>> = vec![Vec::new(); g];
        for &d in &req.free {
            let c = self.class_of[d];
            if req.is_must[d] {
                musts[c].push(d);
            } else {
                rest[c].push(d);
            }
        }
        let lo: Vec<usize> = musts.iter().map(Vec::len).collect();
        let hi: Vec<usize> = (0..g).map(|c| lo[c] + rest[c].len()).collect();
        // r of any free member of class c (all members agree, that is what twins means).
        let cw = |a: usize, b: usize| u64::from(self.class_w[a * g + b]);
        let r: Vec<u64> = (0..g)
            .map(|c| {
                let inside = cw(c, c) * (hi[c].saturating_sub(1) as u64);
                let across: u64 = (0..g)
                    .filter(|&o| o != c)
                    .map(|o| cw(c, o) * hi[o] as u64)
                    .sum();
                inside + across
            })
            .collect();
        // Suffix sums bound how many devices the later classes can still take.
        let mut lo_after = vec![0usize; g + 1];
        let mut hi_after = vec![0usize; g + 1];
        for c in (0..g).rev() {
            lo_after[c] = lo_after[c + 1] + lo[c];
            hi_after[c] = hi_after[c + 1] + hi[c];
        }
        let mut walk = ClassWalk {
            g,
            class_w: &self.class_w,
            lo: &lo,
            hi: &hi,
            lo_after: &lo_after,
            hi_after: &hi_after,
            r: &r,
            musts: &musts,
            rest: &rest,
            x: vec![0; g],
            best: None,
        };
        walk.dfs(0, k, 0, 0);
        walk.best
            .map(|(_, _, x)| materialise(&musts, &rest, &x))
            .unwrap_or_default()
    }

    /// Greedy from several starts, then 1-swap local search.
    fn heuristic(&self, req: &Request) -> Vec<usize> {
        let mut best = self.score(req, self.greedy(req, &req.must));
        if req.must.len() < req.k {
            for &d in req.free.iter().filter(|&&d| !req.is_must[d]) {
                let mut seed = req.must.clone();
                seed.push(d);
                let s = self.score(req, self.greedy(req, &seed));
                if s.beats(&best) {
                    best = s;
                }
            }
        }
        self.improve_by_swaps(req, best.devices)
    }

    /// Starting from `seed`, repeatedly adds the free device with the most weight to the set so
    /// far; ties go to the least weight to all of `F` (less loss), then the lowest index.
    fn greedy(&self, req: &Request, seed: &[usize]) -> Vec<usize> {
        let mut in_set = vec![false; self.n];
        let mut attach = vec![0u64; self.n];
        let mut set = Vec::with_capacity(req.k);
        let add = |d: usize, set: &mut Vec<usize>, in_set: &mut [bool], attach: &mut [u64]| {
            set.push(d);
            in_set[d] = true;
            let row = self.row(d);
            for &x in &req.free {
                attach[x] += u64::from(row[x]);
            }
        };
        for &d in seed {
            add(d, &mut set, &mut in_set, &mut attach);
        }
        while set.len() < req.k {
            let mut pick: Option<usize> = None;
            for &x in &req.free {
                if in_set[x] {
                    continue;
                }
                let better = match pick {
                    None => true,
                    Some(p) => {
                        (attach[x], std::cmp::Reverse(req.r[x]))
                            > (attach[p], std::cmp::Reverse(req.r[p]))
                    }
                };
                if better {
                    pick = Some(x);
                }
            }
            match pick {
                Some(x) => add(x, &mut set, &mut in_set, &mut attach),
                // Unreachable: validation guarantees |F| >= k.
                None => break,
            }
        }
        set
    }

    /// Swaps one chosen non-must device for one free device while that gives a strictly better
    /// set (higher Q, else lower C, else lexicographically smaller). Each accepted swap moves
    /// strictly forward in a total order, so this terminates; [`MAX_SWAPS`] bounds the time.
    fn improve_by_swaps(&self, req: &Request, set: Vec<usize>) -> Vec<usize> {
        let mut in_set = vec![false; self.n];
        for &d in &set {
            in_set[d] = true;
        }
        // attach[x] = Σ_{s ∈ S} w(x, s) for every free x.
        let mut attach = vec![0u64; self.n];
        for &x in &req.free {
            let row = self.row(x);
            attach[x] = set.iter().map(|&s| u64::from(row[s])).sum();
        }
        let mut quality = self.quality(&set);
        let mut rsum: u64 = set.iter().map(|&d| req.r[d]).sum();
        let mut set = set;
        for _ in 0..MAX_SWAPS {
            let mut swap = None;
            'search: for (i, &a) in set.iter().enumerate() {
                if req.is_must[a] {
                    continue;
                }
                for &b in &req.free {
                    if in_set[b] {
                        continue;
                    }
                    let wab = u64::from(self.w[a * self.n + b]);
                    let q2 = quality - attach[a] + attach[b] - wab;
                    let r2 = rsum - req.r[a] + req.r[b];
                    let (c, c2) = (rsum - 2 * quality, r2 - 2 * q2);
                    // Swapping a for b makes the set lexicographically smaller iff b < a.
                    let better = match q2.cmp(&quality) {
                        Ordering::Greater => true,
                        Ordering::Less => false,
                        Ordering::Equal => c2 < c || (c2 == c && b < a),
                    };
                    if better {
                        swap = Some((i, a, b, q2, r2));
                        break 'search;
                    }
                }
            }
            let Some((i, a, b, q2, r2)) = swap else {
                break;
            };
            set[i] = b;
            in_set[a] = false;
            in_set[b] = true;
            let (row_a, row_b) = (self.row(a), self.row(b));
            for &x in &req.free {
                attach[x] = attach[x] - u64::from(row_a[x]) + u64::from(row_b[x]);
            }
            quality = q2;
            rsum = r2;
        }
        set
    }
}

/// The indices of the set bits of `mask`, ascending: the free list `select` takes, from the
/// bit masks callers keep.
pub fn indices(mask: u64) -> Vec<usize> {
    let mut out = Vec::with_capacity(mask.count_ones() as usize);
    let mut m = mask;
    while m != 0 {
        out.push(m.trailing_zeros() as usize);
        m &= m - 1;
    }
    out
}

/// The one-shot form of [`SelectContext::select`]: builds the context (including `Q_ideal` for
/// every `k`) and answers one request. Hot paths should keep a [`SelectContext`] per node.
pub fn select(
    links: &LinkMatrix,
    free: &[usize],
    must: &[usize],
    k: usize,
) -> Result<Selection, SelectError> {
    SelectContext::new(links).select(free, must, k)
}

/// A validated request: `free` and `must` sorted and deduplicated, `r[a] = Σ_{b ∈ F} w(a,b)`.
struct Request {
    is_must: Vec<bool>,
    free: Vec<usize>,
    must: Vec<usize>,
    k: usize,
    r: Vec<u64>,
}

/// A search result before normalisation.
struct Found {
    devices: Vec<usize>,
    quality: u64,
    cut: u64,
    method: Method,
}

/// A complete candidate set with its keys, compared in the selection order.
struct Scored {
    devices: Vec<usize>,
    quality: u64,
    cut: u64,
}

impl Scored {
    fn beats(&self, other: &Scored) -> bool {
        match self.quality.cmp(&other.quality) {
            Ordering::Greater => true,
            Ordering::Less => false,
            Ordering::Equal => match self.cut.cmp(&other.cut) {
                Ordering::Less => true,
                Ordering::Greater => false,
                Ordering::Equal => self.devices < other.devices,
            },
        }
    }
}

/// State of the exhaustive depth-first walk over candidate sets in lexicographic order.
///
/// `q` and `rs` count only what the chosen candidates add to `Q` and to `Σ r` (the
/// must-include part is the same for every set); with equal `q`, a smaller `Σ r` is a smaller
/// loss. `attach[i]` is what candidate `i` would add to `Q` now (its weight to `M` and to the
/// chosen ones), so each step costs `O(|F|)` and each leaf `O(1)`.
///
/// Bound: a completion `T` of `left` more candidates adds `Σ_{t∈T} attach[t] + Q(T)` and
/// `2 Q(T) ≤ Σ_{t∈T} top_{left−1}(t)` (each device's `left − 1` heaviest links to other
/// candidates), so `2q + Σ of the largest left values of (2 attach[t] + top_{left−1}(t))` bounds
/// `2 Q` of the whole subtree; subtrees below the best `Q` so far are skipped. Equal bounds are
/// walked, because a set of equal `Q` may still win on loss or order.
struct Walk<'a> {
    n: usize,
    w: &'a [u32],
    cand: &'a [usize],
    r: &'a [u64],
    /// `top[i * need + j]`, see [`SelectContext::exhaustive`].
    top: &'a [u64],
    need: usize,
    attach: Vec<u64>,
    chosen: Vec<usize>,
    /// (q, Σ r, chosen devices ascending) of the best set so far.
    best: (u64, u64, Vec<usize>),
    scratch: Vec<u64>,
}

impl Walk<'_> {
    /// Replaces the best when `chosen + last` is strictly better: higher q, else lower Σ r, else
    /// lexicographically smaller (the first best may come from the heuristic, so order is checked
    /// too).
    fn offer(&mut self, q: u64, rs: u64, last: Option<usize>) {
        let (bq, brs, ref bset) = self.best;
        let better = match q.cmp(&bq).then(brs.cmp(&rs)) {
            Ordering::Greater => true,
            Ordering::Less => false,
            Ordering::Equal => self
                .chosen
                .iter()
                .copied()
                .chain(last)
                .lt(bset.iter().copied()),
        };
        if better {
            let (best_q, best_rs, set) = &mut self.best;
            *best_q = q;
            *best_rs = rs;
            set.clone_from(&self.chosen);
            set.extend(last);
        }
    }

    fn dfs(&mut self, start: usize, left: usize, q: u64, rs: u64) {
        let c = self.cand.len();
        if left == 0 {
            self.offer(q, rs, None);
            return;
        }
        if left == 1 {
            // Leaves directly: nothing below needs `attach` updated.
            for i in start..c {
                self.offer(q + self.attach[i], rs + self.r[i], Some(self.cand[i]));
            }
            return;
        }
        self.scratch.clear();
        for i in start..c {
            self.scratch
                .push(2 * self.attach[i] + self.top[i * self.need + left - 1]);
        }
        if self.scratch.len() > left {
            self.scratch
                .select_nth_unstable_by(left - 1, |x, y| y.cmp(x));
        }
        let bound = 2 * q + self.scratch.iter().take(left).sum::<u64>();
        if bound < 2 * self.best.0 {
            return;
        }
        for i in start..=c - left {
            let d = self.cand[i];
            let row = &self.w[d * self.n..(d + 1) * self.n];
            for j in i + 1..c {
                self.attach[j] += u64::from(row[self.cand[j]]);
            }
            self.chosen.push(d);
            self.dfs(i + 1, left - 1, q + self.attach[i], rs + self.r[i]);
            self.chosen.pop();
            for j in i + 1..c {
                self.attach[j] -= u64::from(row[self.cand[j]]);
            }
        }
    }
}

/// State of the walk over count vectors `x` (devices taken per twin class).
struct ClassWalk<'a> {
    g: usize,
    class_w: &'a [u32],
    lo: &'a [usize],
    hi: &'a [usize],
    lo_after: &'a [usize],
    hi_after: &'a [usize],
    r: &'a [u64],
    musts: &'a [Vec<usize>],
    rest: &'a [Vec<usize>],
    x: Vec<usize>,
    /// (Q, Σ r, x) of the best vector so far.
    best: Option<(u64, u64, Vec<usize>)>,
}

impl ClassWalk<'_> {
    fn dfs(&mut self, c: usize, left: usize, q: u64, rs: u64) {
        if c == self.g {
            let order = match &self.best {
                None => Ordering::Greater,
                Some((bq, brs, bx)) => q.cmp(bq).then(brs.cmp(&rs)).then_with(|| {
                    // Same Q and C: the lexicographically smaller device list wins.
                    let mine = materialise(self.musts, self.rest, &self.x);
                    let theirs = materialise(self.musts, self.rest, bx);
                    theirs.cmp(&mine)
                }),
            };
            if order == Ordering::Greater {
                self.best = Some((q, rs, self.x.clone()));
            }
            return;
        }
        // Leave enough for the later classes' musts, take no more than they cannot absorb.
        let min = self.lo[c].max(left.saturating_sub(self.hi_after[c + 1]));
        let max = self.hi[c].min(left.saturating_sub(self.lo_after[c + 1]));
        let g = self.g;
        for take in min..=max {
            let t = take as u64;
            let inside = u64::from(self.class_w[c * g + c]) * t * t.saturating_sub(1) / 2;
            let across: u64 = (0..c)
                .map(|o| u64::from(self.class_w[c * g + o]) * self.x[o] as u64)
                .sum();
            self.x[c] = take;
            self.dfs(
                c + 1,
                left - take,
                q + inside + t * across,
                rs + t * self.r[c],
            );
        }
        self.x[c] = 0;
    }
}

/// The device list for count vector `x`: each class's musts plus its lowest other free members.
fn materialise(musts: &[Vec<usize>], rest: &[Vec<usize>], x: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    for c in 0..x.len() {
        out.extend_from_slice(&musts[c]);
        let extra = x[c].saturating_sub(musts[c].len());
        out.extend_from_slice(&rest[c][..extra.min(rest[c].len())]);
    }
    out.sort_unstable();
    out
}

/// Twin classes of a symmetric `n x n` matrix: `a ~ b` iff `w(a,c) = w(b,c)` for every
/// `c ∉ {a, b}`. This is an equivalence (if `a ~ b` and `b ~ c` then `w(a,b) = w(b,c) = w(a,c)`
/// and the rows agree elsewhere), so comparing with each class's first member suffices.
/// Returns the class of each device, the members of each class and the `g x g` class weights.
fn twin_classes(n: usize, w: &[u32]) -> (Vec<usize>, Vec<Vec<usize>>, Vec<u32>) {
    let twins =
        |a: usize, b: usize| (0..n).all(|c| c == a || c == b || w[a * n + c] == w[b * n + c]);
    let mut class_of = Vec::with_capacity(n);
    let mut classes: Vec<Vec<usize>> = Vec::new();
    for d in 0..n {
        match classes.iter().position(|members| twins(members[0], d)) {
            Some(c) => {
                class_of.push(c);
                classes[c].push(d);
            }
            None => {
                class_of.push(classes.len());
                classes.push(vec![d]);
            }
        }
    }
    let g = classes.len();
    let mut class_w = vec![0; g * g];
    for i in 0..g {
        for j in 0..g {
            let (a, b) = if i == j {
                match classes[i].get(1) {
                    Some(&second) => (classes[i][0], second),
                    None => continue,
                }
            } else {
                (classes[i][0], classes[j][0])
            };
            class_w[i * g + j] = w[a * n + b];
        }
    }
    (class_of, classes, class_w)
}

/// `C(n, k)`, or `cap + 1` when it is larger than `cap` (no overflow).
fn binomial_capped(n: usize, k: usize, cap: u64) -> u64 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k) as u64;
    let mut c: u64 = 1;
    for i in 0..k {
        // C(n, i+1) = C(n, i) * (n - i) / (i + 1), exact at every step; C(n, i) only grows
        // up to i = n / 2, so passing the cap early means the result passes it too.
        c = match c.checked_mul(n as u64 - i) {
            Some(v) => v / (i + 1),
            None => return cap.saturating_add(1),
        };
        if c > cap {
            return cap.saturating_add(1);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::LinkClass;
    use proptest::prelude::*;

    /// The optimum by definition (see `tests/select.rs` for the property tests of the public
    /// API; these check the paths a small node never takes).
    fn brute_force(ctx: &SelectContext, free: &[usize], must: &[usize], k: usize) -> Vec<usize> {
        let n = ctx.len();
        let mut best: Option<Scored> = None;
        for mask in 0u32..(1 << n) {
            let set: Vec<usize> = (0..n).filter(|&d| mask >> d & 1 == 1).collect();
            if set.len() != k
                || !set.iter().all(|d| free.contains(d))
                || !must.iter().all(|d| set.contains(d))
            {
                continue;
            }
            let s = Scored {
                quality: ctx.quality(&set),
                cut: ctx.cut(&set, free),
                devices: set,
            };
            if best.as_ref().is_none_or(|b| s.beats(b)) {
                best = Some(s);
            }
        }
        best.map(|b| b.devices).unwrap_or_default()
    }

    /// Matrices with twin classes: `sizes[c]` devices per class, weight `inside[c]` within a
    /// class and `across[c][o]` between classes, device positions shuffled by `order`.
    fn blown_up(sizes: &[usize], inside: &[u32], across: &[u32], order: &[usize]) -> Vec<Vec<u32>> {
        let g = sizes.len();
        let class: Vec<usize> = (0..g)
            .flat_map(|c| std::iter::repeat_n(c, sizes[c]))
            .collect();
        let n = class.len();
        let mut w = vec![vec![0; n]; n];
        for a in 0..n {
            for b in 0..n {
                let (ca, cb) = (class[order[a]], class[order[b]]);
                if a != b {
                    w[a][b] = if ca == cb {
                        inside[ca]
                    } else {
                        across[ca.min(cb) * g + ca.max(cb)]
                    };
                }
            }
        }
        w
    }

    fn structured() -> impl Strategy<Value = Vec<Vec<u32>>> {
        prop::collection::vec(1usize..=4, 1..=4).prop_flat_map(|sizes| {
            let g = sizes.len();
            let n: usize = sizes.iter().sum();
            let weight = prop_oneof![
                prop::sample::select(vec![10u32, 20, 30, 50, 150, 200, 280]),
                0u32..=3
            ];
            (
                Just(sizes),
                prop::collection::vec(weight.clone(), g),
                prop::collection::vec(weight, g * g),
                Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
            )
                .prop_map(|(sizes, inside, across, order)| {
                    blown_up(&sizes, &inside, &across, &order)
                })
        })
    }

    fn random_request(
        n: usize,
        free_bits: u16,
        must_bits: u16,
        k_raw: usize,
    ) -> Option<(Vec<usize>, Vec<usize>, usize)> {
        let free: Vec<usize> = (0..n).filter(|&d| free_bits >> d & 1 == 1).collect();
        let must: Vec<usize> = free
            .iter()
            .copied()
            .filter(|&d| must_bits >> d & 1 == 1 && d % 3 == 0)
            .collect();
        if free.is_empty() {
            return None;
        }
        let k = (must.len() + k_raw % (free.len() - must.len() + 1)).max(1);
        Some((free, must, k))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn class_and_exhaustive_search_equal_brute_force_on_twins(
            w in structured(),
            free_bits in any::<u16>(),
            must_bits in any::<u16>(),
            k_raw in any::<usize>(),
        ) {
            let ctx = SelectContext::from_weights(&w).unwrap();
            let Some((free, must, k)) = random_request(ctx.len(), free_bits, must_bits, k_raw) else {
                return Ok(());
            };
            let req = ctx.request(&free, &must, k).unwrap();
            let want = brute_force(&ctx, &free, &must, k);
            prop_assert_eq!(&ctx.score(&req, ctx.by_classes(&req)).devices, &want);
            // Both first bests: the first candidate set and the heuristic's answer.
            prop_assert_eq!(&ctx.score(&req, ctx.exhaustive(&req, 0)).devices, &want);
            prop_assert_eq!(&ctx.score(&req, ctx.exhaustive(&req, u64::MAX)).devices, &want);
        }

        #[test]
        fn heuristic_never_worse_than_greedy_and_exhaustive_exact(
            raw in prop::collection::vec(prop::sample::select(vec![10u32, 20, 30, 40, 50, 150, 200, 280]), 100),
            free_bits in any::<u16>(),
            must_bits in any::<u16>(),
            k_raw in any::<usize>(),
        ) {
            let n = 10;
            let mut w = vec![vec![0; n]; n];
            for a in 0..n {
                for b in a + 1..n {
                    w[a][b] = raw[a * n + b];
                    w[b][a] = raw[a * n + b];
                }
            }
            let ctx = SelectContext::from_weights(&w).unwrap();
            let Some((free, must, k)) = random_request(n, free_bits, must_bits, k_raw) else {
                return Ok(());
            };
            let req = ctx.request(&free, &must, k).unwrap();
            let got = ctx.score(&req, ctx.heuristic(&req));
            let greedy = ctx.score(&req, ctx.greedy(&req, &req.must));
            prop_assert_eq!(got.devices.len(), k);
            prop_assert!(got.devices.iter().all(|d| free.contains(d)));
            prop_assert!(must.iter().all(|d| got.devices.contains(d)));
            prop_assert!(!greedy.beats(&got), "greedy {:?} beats {:?}", greedy.devices, got.devices);
            // The exhaustive search from either first best is exact on unstructured matrices too.
            let want = brute_force(&ctx, &free, &must, k);
            prop_assert_eq!(&ctx.score(&req, ctx.exhaustive(&req, 0)).devices, &want);
            prop_assert_eq!(&ctx.score(&req, ctx.exhaustive(&req, u64::MAX)).devices, &want);
        }
    }

    #[test]
    fn twin_classes_of_fixture_shapes() {
        // atlas-800-910: two HCCS groups.
        let atlas = LinkMatrix::from_fn(8, |a, b| {
            if a / 4 == b / 4 {
                LinkClass::Hccs
            } else {
                LinkClass::CrossNuma
            }
        });
        let ctx = SelectContext::new(&atlas);
        assert_eq!(ctx.classes, [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(ctx.class_w, [200, 10, 10, 200]);
        // NVSwitch: one class; a single device: one class with no inside weight.
        let dgx = LinkMatrix::filled(8, LinkClass::Nvlink { count: 18 });
        assert_eq!(SelectContext::new(&dgx).class_count(), 1);
        assert_eq!(
            SelectContext::new(&LinkMatrix::filled(1, LinkClass::Hccs)).class_w,
            [0]
        );
    }

    #[test]
    fn large_nodes_use_classes_or_the_heuristic() {
        // 32 NPUs in four HCCS groups of 8: exact through the classes.
        let groups = LinkMatrix::from_fn(32, |a, b| {
            if a / 8 == b / 8 {
                LinkClass::Hccs
            } else {
                LinkClass::CrossNuma
            }
        });
        let ctx = SelectContext::new(&groups);
        assert_eq!(ctx.class_count(), 4);
        assert_eq!(ctx.ideal_quality(8), Some(28 * 200));
        // Group 0 has one NPU busy, group 2 three: 5 NPUs fit in group 2's 5 free ones, which
        // leaves the other groups as they are.
        let free: Vec<usize> = (0..32).filter(|d| ![0, 16, 17, 18].contains(d)).collect();
        let s = ctx.select(&free, &[], 5).unwrap();
        assert_eq!(s.method, Method::Classes);
        assert_eq!(s.devices, [19, 20, 21, 22, 23]);
        assert_eq!(s.q, 1.0);
        assert_eq!(s.cut, 5 * 23 * 10);

        // 48 NPUs in six groups of 8: the cheap bound (9^6 vectors) is over the limit, the
        // exact count is not. Groups 0 and 1 are partly busy: 8 NPUs take group 2 whole.
        let groups = LinkMatrix::from_fn(48, |a, b| {
            if a / 8 == b / 8 {
                LinkClass::Hccs
            } else {
                LinkClass::CrossNuma
            }
        });
        let ctx = SelectContext::new(&groups);
        let free: Vec<usize> = (0..48).filter(|d| ![0, 9, 10].contains(d)).collect();
        let s = ctx.select(&free, &[], 8).unwrap();
        assert_eq!(s.method, Method::Classes);
        assert_eq!(s.devices, (16..24).collect::<Vec<_>>());
        let s = ctx.select(&free, &[], 7).unwrap();
        assert_eq!(s.method, Method::Classes);
        assert_eq!(s.devices, (1..8).collect::<Vec<_>>());

        // No structure: the heuristic, valid and deterministic.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let random = LinkMatrix::from_fn(24, |_, _| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            [LinkClass::CrossNuma, LinkClass::PcieSwitch, LinkClass::Hccs][(x % 3) as usize]
        });
        let ctx = SelectContext::new(&random);
        let free: Vec<usize> = (0..24).filter(|d| d % 5 != 0).collect();
        let s = ctx.select(&free, &[3], 9).unwrap();
        assert_eq!(s.method, Method::Heuristic);
        assert!(!s.is_exact());
        assert_eq!(s.devices.len(), 9);
        assert!(s.devices.contains(&3));
        assert!((0.0..=1.0).contains(&s.q) && (0.0..=1.0).contains(&s.loss));
        assert_eq!(ctx.select(&free, &[3], 9).unwrap(), s);
    }

    #[test]
    fn binomial_cap() {
        assert_eq!(binomial_capped(16, 8, 12_870), 12_870);
        assert_eq!(binomial_capped(16, 8, 100), 101);
        assert_eq!(binomial_capped(100, 0, 1), 1);
        assert_eq!(binomial_capped(100, 100, 1), 1);
        assert_eq!(binomial_capped(64, 32, u64::MAX / 2), u64::MAX / 2 + 1);
        assert_eq!(binomial_capped(3, 5, 0), 0);
    }
}
