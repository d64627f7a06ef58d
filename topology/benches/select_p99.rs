//! Tail latency of `topology::select` on 16-device nodes, which criterion's mean and median do
//! not show, and the speed and quality against the NVIDIA-style partition search. Prints
//! markdown tables; asserts nothing (timing belongs in benchmarks, not tests).
//!
//! `cargo bench -p fumarole-topology --bench select_p99`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use fumarole_topology::{LinkClass, LinkMatrix, SelectContext};

/// The baseline is exponential; cases above this many partitions are reported, not run.
const BASELINE_PARTITION_LIMIT: u128 = 3_000_000;

/// Calls timed per (fixture, k) on the empty node.
const CALLS: usize = 2_000;

/// Calls timed in the mixed workload (random busy devices, k, must-include) per fixture.
const MIXED_CALLS: usize = 20_000;

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    println!("## select on 16 devices, empty node (all free, no must), {CALLS} calls per k\n");
    println!("| matrix | k | mean µs | p50 µs | p99 µs | max µs |");
    println!("|---|---|---|---|---|---|");
    let mut worst_p99 = Duration::ZERO;
    let mut fixtures = support::fixtures_16();
    fixtures.push((
        "near-uniform-16",
        support::near_uniform_links(16, 0x5eed_0017),
    ));
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
            let p99 = support::percentile(&times, 0.99);
            worst_p99 = worst_p99.max(p99);
            println!(
                "| {name} | {k} | {} | {} | {} | {} |",
                us(mean),
                us(support::percentile(&times, 0.5)),
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
            us(support::percentile(&times, 0.5)),
            us(support::percentile(&times, 0.99)),
            us(support::percentile(&times, 0.999)),
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
                "| {name} | {k} | {partitions} | {} | {} | {:.1}x | {} | {} | {} | {} |",
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
    compare_on_used_nodes();
    larger_nodes();
}

/// Nodes above 16 devices: groups of 8 (exact through the twin classes) and random matrices
/// (the heuristic). Every k on a node with every seventh device busy, 20 calls each.
fn larger_nodes() {
    println!("\n## larger nodes\n");
    println!("Every k on a node with every seventh device busy, 20 calls per k.\n");
    println!(
        "| matrix | SelectContext::new ms | select p50 µs | select p99 µs | select max µs | exact answers |"
    );
    println!("|---|---|---|---|---|---|");
    for n in [32usize, 48, 64] {
        let groups = LinkMatrix::from_fn(n, |a, b| {
            if a / 8 == b / 8 {
                LinkClass::Hccs
            } else {
                LinkClass::CrossNuma
            }
        });
        let random = support::random_links(n, 0x5eed_0000 + n as u64);
        for (name, links) in [
            (format!("groups-of-8-{n}"), groups),
            (format!("random-{n}"), random),
        ] {
            let t = Instant::now();
            let ctx = SelectContext::new(&links);
            let build = t.elapsed();
            let free: Vec<usize> = (0..n).filter(|d| d % 7 != 3).collect();
            let mut times = Vec::new();
            let (mut exact, mut all) = (0, 0);
            for k in 1..=free.len() {
                for _ in 0..20 {
                    let t = Instant::now();
                    let s = black_box(ctx.select(black_box(&free), &[], k).unwrap());
                    times.push(t.elapsed());
                    all += 1;
                    exact += usize::from(s.is_exact());
                }
            }
            times.sort_unstable();
            println!(
                "| {name} | {:.1} | {} | {} | {} | {exact} of {all} |",
                build.as_secs_f64() * 1e3,
                us(support::percentile(&times, 0.5)),
                us(support::percentile(&times, 0.99)),
                us(times[times.len() - 1]),
            );
        }
    }
}

/// Answers of select and the baseline on random partially used nodes (no timing): how often
/// select's Q is higher / equal / lower, and among equal Q how often its loss C is lower.
fn compare_on_used_nodes() {
    println!("\n## against the NVIDIA-style partition search, partially used nodes\n");
    println!("200 requests per matrix: each device busy with probability 1/4, k uniform in");
    println!(
        "1..=free (requests above 200 000 partitions skipped). Q and C under fumarole's weights.\n"
    );
    println!(
        "| matrix | requests | Q higher | Q equal | Q lower | equal Q, C lower | equal Q, C equal | equal Q, C higher |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut rng = support::Rng::new(2024);
    for (name, links) in support::fixtures_8()
        .into_iter()
        .chain(support::fixtures_16())
    {
        let ctx = SelectContext::new(&links);
        let n = ctx.len();
        let score = support::nvidia_scores(&links);
        let mut t = [0usize; 7];
        while t[0] < 200 {
            let free: Vec<usize> = (0..n).filter(|_| rng.below(4) != 0).collect();
            if free.is_empty() {
                continue;
            }
            let k = 1 + rng.below(free.len());
            if support::partition_count(free.len(), k) > 200_000 {
                continue;
            }
            let ours = ctx.select(&free, &[], k).unwrap();
            let theirs = support::nvidia_baseline(&score, &free, &[], k);
            let (q, c) = (ctx.quality(&theirs), ctx.cut(&theirs, &free));
            t[0] += 1;
            match ours.quality.cmp(&q) {
                std::cmp::Ordering::Greater => t[1] += 1,
                std::cmp::Ordering::Less => t[3] += 1,
                std::cmp::Ordering::Equal => {
                    t[2] += 1;
                    match ours.cut.cmp(&c) {
                        std::cmp::Ordering::Less => t[4] += 1,
                        std::cmp::Ordering::Equal => t[5] += 1,
                        std::cmp::Ordering::Greater => t[6] += 1,
                    }
                }
            }
        }
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            t[0], t[1], t[2], t[3], t[4], t[5], t[6]
        );
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
