//! Tail latency of `topology::select` on 16-device nodes, which criterion's mean and median do
//! not show, and the speed and quality against the NVIDIA-style partition search. Prints
//! markdown tables; asserts nothing (timing belongs in benchmarks, not tests).
//!
//! `cargo bench -p fumarole-topology --bench select_p99`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use fumarole_topology::SelectContext;

/// The baseline is exponential; cases above this many partitions are reported, not run.
const BASELINE_PARTITION_LIMIT: u128 = 3_000_000;

/// Calls timed per (fixture, k) on the empty node.
const CALLS: usize = 2_000;

/// Calls timed in the mixed workload (random busy devices, k, must-include) per fixture.
const MIXED_CALLS: usize = 20_000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    println!("## select on 16 devices, empty node (all free, no must), {CALLS} calls per k\n");
    println!("| matrix | k | mean µs | p50 µs | p99 µs | max µs |");
    println!("|---|---|---|---|---|---|");
    let mut worst_p99 = Duration::ZERO;
    let fixtures = support::fixtures_16();
    let free: Vec<usize> = (0..16).collect();
    for (name, links) in &fixtures {
        let ctx = SelectContext::new(links);
        for k in 1..=16 {
            let mut times = Vec::with_capacity(CALLS);
            for _ in 0..CALLS {
                let t = Instant::now();
                black_box(ctx.select(black_box(&free), &[], black_box(k)).unwrap());
                times.push(t.elapsed());
            }
            times.sort_unstable();
            let mean = times.iter().sum::<Duration>() / CALLS as u32;
            let p99 = percentile(&times, 0.99);
            worst_p99 = worst_p99.max(p99);
            println!(
                "| {name} | {k} | {} | {} | {} | {} |",
                us(mean),
                us(percentile(&times, 0.5)),
                us(p99),
                us(times[CALLS - 1])
            );
        }
    }
    println!(
        "\nworst p99 over all 16-device matrices and k: {} µs\n",
        us(worst_p99)
    );

    println!("## select on 16 devices, mixed requests ({MIXED_CALLS} per matrix)\n");
    println!("Random busy devices (each busy with probability 1/4), k uniform in 1..=free, one");
    println!("must-include device in a quarter of the requests.\n");
    println!("| matrix | mean µs | p50 µs | p99 µs | p99.9 µs | max µs |");
    println!("|---|---|---|---|---|---|");
    let mut rng = support::Rng::new(99);
    for (name, links) in &fixtures {
        let ctx = SelectContext::new(links);
        let mut times = Vec::with_capacity(MIXED_CALLS);
        while times.len() < MIXED_CALLS {
            let free: Vec<usize> = (0..16).filter(|_| rng.below(4) != 0).collect();
            if free.is_empty() {
                continue;
            }
            let k = 1 + rng.below(free.len());
            let must: Vec<usize> = if rng.below(4) == 0 {
                vec![free[rng.below(free.len())]]
            } else {
                Vec::new()
            };
            let t = Instant::now();
            black_box(ctx.select(black_box(&free), &must, k).unwrap());
            times.push(t.elapsed());
        }
        times.sort_unstable();
        let mean = times.iter().sum::<Duration>() / MIXED_CALLS as u32;
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            us(mean),
            us(percentile(&times, 0.5)),
            us(percentile(&times, 0.99)),
            us(percentile(&times, 0.999)),
            us(times[MIXED_CALLS - 1])
        );
    }

    println!("\n## against the NVIDIA-style partition search (empty node)\n");
    println!("Median of repeated runs; Q and C under fumarole's weights for both answers.\n");
    println!(
        "| matrix | k | partitions | baseline µs | select µs | speed-up | Q select | Q baseline | C select | C baseline |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let all = support::fixtures_8()
        .into_iter()
        .chain(support::fixtures_16());
    for (name, links) in all {
        let ctx = SelectContext::new(&links);
        let n = ctx.len();
        let free: Vec<usize> = (0..n).collect();
        let score = support::nvidia_scores(&links);
        for k in 1..=n {
            let partitions = support::partition_count(n, k);
            if partitions > BASELINE_PARTITION_LIMIT {
                println!("| {name} | {k} | {partitions} | not run | | | | | | |");
                continue;
            }
            let theirs = support::nvidia_baseline(&score, &free, &[], k);
            let ours = ctx.select(&free, &[], k).unwrap();
            let base_t = median_time(|| {
                black_box(support::nvidia_baseline(&score, black_box(&free), &[], k));
            });
            let ours_t = median_time(|| {
                black_box(ctx.select(black_box(&free), &[], k).unwrap());
            });
            println!(
                "| {name} | {k} | {partitions} | {} | {} | {:.0}x | {} | {} | {} | {} |",
                us(base_t),
                us(ours_t),
                base_t.as_secs_f64() / ours_t.as_secs_f64(),
                ours.quality,
                ctx.quality(&theirs),
                ours.cut,
                ctx.cut(&theirs, &free),
            );
        }
    }
}

/// Median of runs of `f`, repeating for at least ~50 ms or 5 runs.
fn median_time(mut f: impl FnMut()) -> Duration {
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < Duration::from_millis(50) && times.len() < 2_000) {
        let t = Instant::now();
        f();
        times.push(t.elapsed());
    }
    times.sort_unstable();
    times[times.len() / 2]
}
