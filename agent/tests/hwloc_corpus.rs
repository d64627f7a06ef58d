//! hwloc's own corpus of real machines (`../shared/fixtures/hwloc-linux`, or the directory in
//! `FUMAROLE_HWLOC_CORPUS`): every `NAME.tar.bz2` is unpacked, discovered with
//! `fumarole-agent discover --root` (with `NAME.env` applied, as hwloc's runner does), and its
//! package / NUMA node / core / PU counts are checked against hwloc's expected `NAME.output`
//! (`depth N: count Type` lines, or the objects of its XML form).
//!
//! lstopo prints the view restricted to the dumped process's cgroup, so every entry is checked
//! twice: the restricted view (`--restrict-to-allowed`) must equal `NAME.output`, and the
//! default whole-machine view must equal it too, unless the dump's cgroup hides CPUs or NUMA
//! nodes (the `cpusets` / `cgroup` entries, and others whose cpuset cgroup restricts): there
//! the whole-machine view must equal counts read straight from the dump's sysfs, independent
//! of hwloc.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use fumarole_topology::CpuSet;

fn corpus_dir() -> PathBuf {
    match std::env::var_os("FUMAROLE_HWLOC_CORPUS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/hwloc-linux"),
    }
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
struct Counts {
    packages: u64,
    numa_nodes: u64,
    cores: u64,
    pus: u64,
}

/// Counts from lstopo's console (`depth 1: 2 Package (type #1)`) or XML output.
fn expected_counts(output: &str) -> Counts {
    let mut c = Counts::default();
    if output.trim_start().starts_with("<?xml") {
        let count = |ty: &str| output.matches(&format!("<object type=\"{ty}\"")).count() as u64;
        c.packages = count("Package");
        c.numa_nodes = count("NUMANode");
        c.cores = count("Core");
        c.pus = count("PU");
        return c;
    }
    for line in output.lines() {
        let Some((_, rest)) = line.split_once("depth") else {
            continue;
        };
        let Some((_, rest)) = rest.split_once(':') else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(n), Some(ty)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match ty {
            "Package" => c.packages = n,
            "NUMANode" => c.numa_nodes = n,
            "Core" => c.cores = n,
            "PU" => c.pus = n,
            _ => {}
        }
    }
    c
}

/// Whole-machine counts read straight from sysfs, independent of hwloc: online CPUs, their
/// distinct packages, their distinct thread-sibling sets (the kernel's cores; none when the
/// dump has no such files), online NUMA nodes.
fn sysfs_counts(root: &Path) -> Counts {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    // `online` lists, or else the `<prefix>N` directories.
    let ids = |dir: &str, prefix: &str| -> CpuSet {
        if let Some(list) = read(&format!("{dir}/online")) {
            return CpuSet::parse(&list).unwrap();
        }
        std::fs::read_dir(root.join(dir))
            .map(|rd| {
                rd.filter_map(|e| {
                    e.ok()?
                        .file_name()
                        .to_str()?
                        .strip_prefix(prefix)?
                        .parse()
                        .ok()
                })
                .collect()
            })
            .unwrap_or_default()
    };
    let online = ids("sys/devices/system/cpu", "cpu");
    let mut packages = BTreeSet::new();
    let mut cores = BTreeSet::new();
    for cpu in online.iter() {
        let pkg = read(&format!(
            "sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"
        ));
        // Newer kernels write core_cpus*, older ones thread_siblings*; lists or masks.
        let topo = |f: &str| read(&format!("sys/devices/system/cpu/cpu{cpu}/topology/{f}"));
        let siblings = topo("core_cpus_list")
            .or_else(|| topo("thread_siblings_list"))
            .map(|l| CpuSet::parse(&l).unwrap())
            .or_else(|| {
                topo("core_cpus")
                    .or_else(|| topo("thread_siblings"))
                    .map(|m| CpuSet::parse_mask(&m).unwrap())
            })
            .map(|set| set.intersection(&online));
        packages.insert(pkg);
        if let Some(siblings) = siblings {
            cores.insert(siblings.to_string());
        }
    }
    Counts {
        packages: packages.len() as u64,
        numa_nodes: ids("sys/devices/system/node", "node").len() as u64,
        cores: cores.len() as u64,
        pus: online.len() as u64,
    }
}

/// `VAR=value` / `VAR="value"` lines of a `NAME.env` file (the `export` lines are implied).
fn env_file(path: &Path) -> BTreeMap<String, String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    text.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| !k.trim().starts_with('#') && !k.contains(' '))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().trim_matches('"').to_owned()))
        .collect()
}

fn unpack(tarball: &Path, into: &Path) -> PathBuf {
    let file = std::fs::File::open(tarball).unwrap();
    tar::Archive::new(bzip2::read::BzDecoder::new(file))
        .unpack(into)
        .unwrap();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(into)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "{} should hold one top directory",
        tarball.display()
    );
    entries.pop().unwrap()
}

fn discover(root: &Path, env: &BTreeMap<String, String>, restrict: bool) -> Counts {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fumarole-agent"));
    cmd.args(["discover", "--format", "json", "--root"])
        .arg(root)
        .envs(env);
    if restrict {
        cmd.arg("--restrict-to-allowed");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "discover {} failed: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["summary"];
    Counts {
        packages: s["packages"].as_u64().unwrap(),
        numa_nodes: s["numa_nodes"].as_u64().unwrap(),
        cores: s["cores"].as_u64().unwrap(),
        pus: s["pus"].as_u64().unwrap(),
    }
}

#[test]
fn every_corpus_machine_matches_hwloc() {
    let dir = corpus_dir();
    let mut tarballs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "hwloc corpus {}: {e} (set FUMAROLE_HWLOC_CORPUS)",
                dir.display()
            )
        })
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".tar.bz2"))
        .collect();
    tarballs.sort();
    assert!(!tarballs.is_empty(), "no .tar.bz2 in {}", dir.display());

    let mut failures = Vec::new();
    for tarball in &tarballs {
        let name = tarball
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".tar.bz2")
            .to_owned();
        let Ok(output) = std::fs::read_to_string(dir.join(format!("{name}.output"))) else {
            failures.push(format!("{name}: no {name}.output beside the tarball"));
            continue;
        };
        let env = env_file(&dir.join(format!("{name}.env")));
        let tmp = tempfile::tempdir().unwrap();
        let root = unpack(tarball, tmp.path());
        let expected = expected_counts(&output);
        let restricted = discover(&root, &env, true);
        if restricted != expected {
            failures.push(format!(
                "{name} (restricted): hwloc says {expected:?}, got {restricted:?}"
            ));
        }
        let whole = discover(&root, &env, false);
        let cgroup_hides_something = whole != restricted;
        let want = if cgroup_hides_something {
            sysfs_counts(&root)
        } else {
            expected
        };
        if whole != want {
            failures.push(format!(
                "{name} (whole machine): expected {want:?}, got {whole:?}"
            ));
        }
        eprintln!("{name}: hwloc {expected:?}; restricted {restricted:?}; whole {whole:?}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} machines differ:\n{}",
        failures.len(),
        tarballs.len(),
        failures.join("\n")
    );
}

#[test]
fn expected_counts_reads_both_output_forms() {
    let console = "depth 0: 1 Machine\n depth 1:  2 Package (type #1)\n   depth 3: 4 Core (type #2)\n    depth 4: 8 PU (type #3)\nSpecial depth -3:  2 NUMANode (type #13)\n";
    assert_eq!(
        expected_counts(console),
        Counts {
            packages: 2,
            numa_nodes: 2,
            cores: 4,
            pus: 8
        }
    );
    let xml = "<?xml version=\"1.0\"?>\n<object type=\"Machine\"><object type=\"Package\"><object type=\"NUMANode\"/><object type=\"Core\"><object type=\"PU\"/></object></object>";
    assert_eq!(
        expected_counts(xml),
        Counts {
            packages: 1,
            numa_nodes: 1,
            cores: 1,
            pus: 1
        }
    );
}
