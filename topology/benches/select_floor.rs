//! A lower bound for `topology::select` on 8 and 16 devices, next to `select` itself.
//!
//! Whatever a caller does, answering "the best `k` of these free devices" costs at least
//! reading the free set (`read_free`: a 64-bit free mask to the index list `select` takes) and,
//! for an answer already known, one hash lookup of (free mask, `k`) and a shared-pointer copy
//! (`memo_hit`: what the scheduler extension's per-context memo costs on a hit). Criterion
//! times those and `select` at the slowest `k` of each fixture (empty node); then a plain loop
//! times every `k` per call and prints median and p99 per fixture against the bound.
//!
//! `cargo bench -p fumarole-topology --bench select_floor`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use fumarole_topology::select::indices;
use fumarole_topology::{LinkMatrix, SelectContext, Selection};

/// Calls timed per (fixture, k) in the p99 table.
const CALLS: usize = 500;

fn fixtures() -> Vec<(&'static str, LinkMatrix)> {
    let mut f: Vec<_> = support::fixtures_8()
        .into_iter()
        .filter(|(name, _)| matches!(*name, "dgx-h100" | "random-8"))
        .collect();
    f.extend(
        support::fixtures_16()
            .into_iter()
            .filter(|(name, _)| matches!(*name, "dgx-h100-x2" | "atlas-910b-16" | "random-16")),
    );
    f
}

/// A memo of every (free mask, k) answer for the busy patterns the bench asks about.
fn memo(ctx: &SelectContext, n: usize) -> HashMap<(u64, usize), Arc<Selection>> {
    let mut memo = HashMap::new();
    let full = (1u64 << n) - 1;
    for busy in 0..n {
        let free = full & !((1u64 << busy) - 1);
        for k in 1..=free.count_ones() as usize {
            let s = ctx.select(&indices(free), &[], k).unwrap();
            memo.insert((free, k), Arc::new(s));
        }
    }
    memo
}

/// The `k` whose `select` on the empty node is slowest (by a short timing).
fn slowest_k(ctx: &SelectContext, n: usize) -> usize {
    let free: Vec<usize> = (0..n).collect();
    (1..=n)
        .max_by_key(|&k| {
            let t = Instant::now();
            for _ in 0..20 {
                black_box(ctx.select(&free, &[], k).unwrap());
            }
            t.elapsed()
        })
        .unwrap_or(1)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("select_floor");
    group
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800))
        .sample_size(30);
    for n in [8usize, 16] {
        let half = ((1u64 << n) - 1) & 0x5555_5555_5555_5555;
        group.bench_with_input(BenchmarkId::new("read_free", n), &n, |b, _| {
            b.iter(|| indices(black_box(half)))
        });
        let links = if n == 8 {
            support::dgx_h100()
        } else {
            support::dgx_h100_x2()
        };
        let ctx = SelectContext::new(&links);
        let memo = memo(&ctx, n);
        let key = (((1u64 << n) - 1) & !0b11, n / 2);
        group.bench_with_input(BenchmarkId::new("memo_hit", n), &n, |b, _| {
            b.iter(|| memo.get(black_box(&key)).map(Arc::clone))
        });
    }
    for (name, links) in fixtures() {
        let ctx = SelectContext::new(&links);
        let n = links.len();
        let free: Vec<usize> = (0..n).collect();
        let k = slowest_k(&ctx, n);
        group.bench_with_input(
            BenchmarkId::new(format!("select/{name}"), k),
            &k,
            |b, &k| b.iter(|| ctx.select(black_box(&free), &[], black_box(k)).unwrap()),
        );
    }
    group.finish();
}

/// Per fixture: every `k` on the empty node and with the first quarter of the devices busy,
/// [`CALLS`] timed calls each, pooled.
fn p99_table() {
    println!();
    println!("| fixture | devices | select median, µs | select p99, µs | calls |");
    println!("|---|---|---|---|---|");
    for (name, links) in fixtures() {
        let ctx = SelectContext::new(&links);
        let n = links.len();
        let mut times = Vec::new();
        for busy in [0, n / 4] {
            let free: Vec<usize> = (busy..n).collect();
            for k in 1..=free.len() {
                for _ in 0..CALLS {
                    let t = Instant::now();
                    black_box(ctx.select(black_box(&free), &[], k).unwrap());
                    times.push(t.elapsed());
                }
            }
        }
        times.sort_unstable();
        let us = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e6);
        println!(
            "| {name} | {n} | {} | {} | {} |",
            us(support::percentile(&times, 0.5)),
            us(support::percentile(&times, 0.99)),
            times.len()
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    p99_table();
}
