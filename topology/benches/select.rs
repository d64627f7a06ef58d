//! Criterion benches for `topology::select`: 8 and 16 devices, every `k`, on the fixture
//! matrices and random ones (empty node: the largest search), against the NVIDIA-style
//! exhaustive partition search (`support::nvidia_baseline`), plus building a `SelectContext`.
//!
//! `cargo bench -p fumarole-topology --bench select`; tail latencies (p99) come from the
//! `select_p99` bench, Q comparisons from `tests/select.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use fumarole_topology::{LinkMatrix, SelectContext};

/// The baseline is exponential; cases above this many partitions would take seconds each.
const BASELINE_PARTITION_LIMIT: u128 = 3_000_000;

fn all_fixtures() -> Vec<(usize, Vec<(&'static str, LinkMatrix)>)> {
    vec![(8, support::fixtures_8()), (16, support::fixtures_16())]
}

fn bench_select(c: &mut Criterion) {
    for (size, fixtures) in all_fixtures() {
        let mut group = c.benchmark_group(format!("select/{size}"));
        group
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(600))
            .sample_size(20);
        for (name, links) in &fixtures {
            let ctx = SelectContext::new(links);
            // pcie-4gpu has 4 devices; it sits with the 8-device fixtures.
            let n = links.len();
            let free: Vec<usize> = (0..n).collect();
            for k in 1..=n {
                group.bench_with_input(BenchmarkId::new(*name, k), &k, |b, &k| {
                    b.iter(|| ctx.select(black_box(&free), &[], black_box(k)).unwrap())
                });
            }
        }
        group.finish();
    }
}

fn bench_baseline(c: &mut Criterion) {
    for (size, fixtures) in all_fixtures() {
        let mut group = c.benchmark_group(format!("nvidia_baseline/{size}"));
        group
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_secs(1))
            .sample_size(10);
        for (name, links) in &fixtures {
            let score = support::nvidia_scores(links);
            let n = links.len();
            let free: Vec<usize> = (0..n).collect();
            for k in 1..=n {
                if support::partition_count(n, k) > BASELINE_PARTITION_LIMIT {
                    continue;
                }
                group.bench_with_input(BenchmarkId::new(*name, k), &k, |b, &k| {
                    b.iter(|| support::nvidia_baseline(&score, black_box(&free), &[], black_box(k)))
                });
            }
        }
        group.finish();
    }
}

fn bench_context(c: &mut Criterion) {
    let mut group = c.benchmark_group("select_context_new");
    group
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    for (_, fixtures) in all_fixtures() {
        for (name, links) in &fixtures {
            group.bench_function(*name, |b| b.iter(|| SelectContext::new(black_box(links))));
        }
    }
    group.finish();
}

criterion_group!(benches, bench_select, bench_baseline, bench_context);
criterion_main!(benches);
