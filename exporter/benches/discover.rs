//! Discovery of each bundled fixture node, from its materialized sysfs tree (hwloc load, sysfs
//! reads, recorded NVML answers, override file, links). Target: an 8-accelerator node in
//! under 20 ms.
//!
//! `cargo bench -p fumarole-exporter --bench discover`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use fumarole_exporter::discover::nvml::{NoProbe, NvmlProbe, RecordedProbe};
use fumarole_exporter::discover::{self, DiscoverOptions, RECORDED_NVML_FILE, Source};
use fumarole_exporter::fixtures;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("discover");
    for name in fixtures::NAMES {
        let dir = tempfile::tempdir().unwrap();
        fixtures::get(name)
            .unwrap()
            .materialize(dir.path())
            .unwrap();
        // SAFETY: criterion measures on this thread and the bench starts no other thread.
        unsafe { discover::use_fsroot(dir.path()) };
        let recorded = dir.path().join(RECORDED_NVML_FILE.trim_start_matches('/'));
        let probe: Box<dyn NvmlProbe> = if recorded.is_file() {
            Box::new(RecordedProbe(recorded))
        } else {
            Box::new(NoProbe)
        };
        let opts = DiscoverOptions::new(Source::FsRoot(dir.path().to_path_buf()));
        let expected = discover::discover(&opts, probe.as_ref())
            .unwrap()
            .devices
            .len();
        group.bench_function(*name, |b| {
            b.iter(|| {
                let t = discover::discover(&opts, probe.as_ref()).unwrap();
                assert_eq!(t.devices.len(), expected);
                t
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
