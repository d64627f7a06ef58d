//! The QoS cgroup code against the real kernel's cgroup v1 `cpu` hierarchy: CPU burst shows up
//! in `cpu.stat` only when `burst` enables it, a BE pod becomes an idle group and gets the
//! kubelet's shares back when the annotation goes, and every second apply changes nothing.
//!
//! Each test builds a kubelet-shaped tree (cgroupfs driver) under its own
//! `/sys/fs/cgroup/cpu/fumarole-test-<pid>-<n>` and removes it, processes first, even when it
//! fails. Skipped with a message when not root or when the kernel lacks `cpu.cfs_burst_us`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fumarole_colocation::cgroup::{
    CgroupPath, Cgroups, Changed, Driver, Layout, burst_files, level_files,
};
use fumarole_colocation::rules::burst::{BURST_TIME_ANNOTATION, BurstRequest, ENABLE_ANNOTATION};
use fumarole_colocation::rules::kernel::{Kernel, Version};
use fumarole_colocation::rules::level::{self, PodResources, QOS_LEVEL_ANNOTATION, QosLevel};
use fumarole_colocation::rules::pod::QosClass;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const ROOT: &str = "/sys/fs/cgroup";
const CPU: &str = "/sys/fs/cgroup/cpu";
const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const CONTAINER: &str =
    "containerd://4d1f5c0e9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e";
/// The CPU-bound tests run one at a time so they do not compete for the machine's cores.
static CPU_BOUND: Mutex<()> = Mutex::new(());
static SEQ: AtomicUsize = AtomicUsize::new(0);

fn skip() -> bool {
    let reason = if !nix::unistd::geteuid().is_root() {
        "not root".to_string()
    } else if !Path::new(CPU).join("cpu.cfs_burst_us").is_file() {
        format!(
            "{CPU}/cpu.cfs_burst_us is missing (no writable cgroup v1 cpu hierarchy with burst)"
        )
    } else {
        return false;
    };
    eprintln!("skipping the cgroup kernel test: {reason}");
    true
}

/// A kubelet-shaped cgroup tree of its own plus the processes put in it; dropping it kills
/// the processes and removes the cgroups leaf-first.
struct Tree {
    name: String,
    cgroups: Cgroups,
    created: Vec<PathBuf>,
    children: Vec<Child>,
}

impl Tree {
    fn new() -> Self {
        remove_stale_trees();
        let name = format!(
            "fumarole-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let layout = Layout::new(Version::V1, Driver::Cgroupfs)
            .with_cgroup_root(&format!("/{name}"))
            .unwrap();
        let mut tree = Tree {
            cgroups: Cgroups::new(ROOT, layout),
            created: Vec::new(),
            children: Vec::new(),
            name,
        };
        let top = Path::new(CPU).join(&tree.name);
        std::fs::create_dir(&top).unwrap();
        tree.created.push(top.clone());
        // The largest weight: a busy build beside the test must not starve the workload below
        // the quota, or it could never use a burst.
        std::fs::write(top.join("cpu.shares"), "262144").unwrap();
        tree
    }

    /// Creates `path` and any missing parents, as the kubelet and the runtime would.
    fn mkdir(&mut self, path: &CgroupPath) -> PathBuf {
        let full = self.cgroups.dir("cpu", path);
        let top = Path::new(CPU).join(&self.name);
        let below = full.strip_prefix(&top).unwrap().to_path_buf();
        let mut dir = top;
        for part in below.components() {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap();
                self.created.push(dir.clone());
            }
        }
        full
    }

    /// Starts `script` under `sh` and moves it into `path`.
    fn spawn_in(&mut self, path: &CgroupPath, script: &str) {
        let child = Command::new("sh").arg("-c").arg(script).spawn().unwrap();
        let pid = child.id();
        self.children.push(child);
        std::fs::write(
            self.cgroups.dir("cpu", path).join("cgroup.procs"),
            pid.to_string(),
        )
        .unwrap();
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in self.created.iter().rev() {
            remove_cgroup(dir);
        }
    }
}

/// Kills what is left in the cgroup (a `sleep` the killed shell had started) and removes it,
/// retrying while the kernel still counts exiting tasks.
fn remove_cgroup(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
        {
            if let Ok(pid) = pid.trim().parse() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() > deadline => {
                eprintln!("could not remove test cgroup {}: {e}", dir.display());
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Trees left by a test process that was killed before its guards ran.
fn remove_stale_trees() {
    let Ok(entries) = std::fs::read_dir(CPU) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("fumarole-test-")
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            remove_tree(&entry.path());
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    remove_cgroup(dir);
}

fn cpu_stat(cgroups: &Cgroups, path: &CgroupPath) -> BTreeMap<String, u64> {
    cgroups
        .read(path, "cpu.stat")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Sleeps 0.3 s (3 periods: the group banks its unused quota up to quota + burst), then runs
/// ~0.3 s of shell arithmetic (far more than the 50 ms quota of one period), over and over.
const PHASED_LOAD: &str =
    "while :; do sleep 0.3; i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; done";

/// A Burstable pod with one container, both with the kubelet's quota for a 500m limit
/// (50 ms per 100 ms period).
fn pod_with_quota(tree: &mut Tree) -> (CgroupPath, CgroupPath) {
    let layout = tree.cgroups.layout().clone();
    let pod = layout.pod(QosClass::Burstable, UID).unwrap();
    let container = layout
        .container(QosClass::Burstable, UID, &CONTAINER.parse().unwrap())
        .unwrap();
    for path in [&pod, &container] {
        let dir = tree.mkdir(path);
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000").unwrap();
        std::fs::write(dir.join("cpu.cfs_quota_us"), "50000").unwrap();
    }
    (pod, container)
}

#[test]
fn burst_enabled_through_annotations_shows_in_cpu_stat() {
    if skip() {
        return;
    }
    let _one_at_a_time = CPU_BOUND.lock().unwrap_or_else(|e| e.into_inner());
    let mut tree = Tree::new();
    let (pod, container) = pod_with_quota(&mut tree);
    let request = BurstRequest::from_annotations(&annotations(&[
        (ENABLE_ANNOTATION, "true"),
        (BURST_TIME_ANNOTATION, "80000"),
    ]))
    .unwrap();

    let applied = burst_files::sync(
        &tree.cgroups,
        &pod,
        std::slice::from_ref(&container),
        request,
    )
    .unwrap();
    assert_eq!(applied.changed.len(), 2, "{applied:?}");
    // 80 ms asked, capped at the 50 ms quota; the pod gets the sum (capped at its own quota).
    assert_eq!(
        tree.cgroups.read(&container, "cpu.cfs_burst_us").unwrap(),
        "50000"
    );
    assert_eq!(
        tree.cgroups.read(&pod, "cpu.cfs_burst_us").unwrap(),
        "50000"
    );
    let again = burst_files::sync(
        &tree.cgroups,
        &pod,
        std::slice::from_ref(&container),
        request,
    )
    .unwrap();
    assert!(again.is_noop(), "{again:?}");

    tree.spawn_in(&container, PHASED_LOAD);
    let start = Instant::now();
    let stat = loop {
        std::thread::sleep(Duration::from_millis(250));
        let stat = cpu_stat(&tree.cgroups, &container);
        let bursting = stat["nr_bursts"] > 0 && stat["burst_time"] > 0;
        if (bursting && start.elapsed() >= Duration::from_secs(2))
            || start.elapsed() > Duration::from_secs(10)
        {
            break stat;
        }
    };
    eprintln!(
        "burst 50000 us, {:.1} s: container cpu.stat {stat:?}, pod cpu.stat {:?}",
        start.elapsed().as_secs_f64(),
        cpu_stat(&tree.cgroups, &pod)
    );
    assert!(
        stat["nr_bursts"] > 0,
        "no bursts with burst enabled: {stat:?}"
    );
    assert!(
        stat["burst_time"] > 0,
        "no burst time with burst enabled: {stat:?}"
    );
}

#[test]
fn burst_removed_from_annotations_means_no_bursts() {
    if skip() {
        return;
    }
    let _one_at_a_time = CPU_BOUND.lock().unwrap_or_else(|e| e.into_inner());
    let mut tree = Tree::new();
    let (pod, container) = pod_with_quota(&mut tree);
    let containers = std::slice::from_ref(&container);
    let on = BurstRequest::from_annotations(&annotations(&[(ENABLE_ANNOTATION, "true")])).unwrap();
    assert_eq!(
        burst_files::sync(&tree.cgroups, &pod, containers, on)
            .unwrap()
            .changed
            .len(),
        2
    );
    assert_eq!(
        tree.cgroups.read(&container, "cpu.cfs_burst_us").unwrap(),
        "50000"
    );

    // The annotation goes away: burst 0 everywhere, once.
    let off = BurstRequest::from_annotations(&BTreeMap::new()).unwrap();
    assert_eq!(off, BurstRequest::Disabled);
    assert_eq!(
        burst_files::sync(&tree.cgroups, &pod, containers, off)
            .unwrap()
            .changed
            .len(),
        2
    );
    assert!(
        burst_files::sync(&tree.cgroups, &pod, containers, off)
            .unwrap()
            .is_noop()
    );
    assert_eq!(
        tree.cgroups.read(&container, "cpu.cfs_burst_us").unwrap(),
        "0"
    );
    assert_eq!(tree.cgroups.read(&pod, "cpu.cfs_burst_us").unwrap(), "0");

    tree.spawn_in(&container, PHASED_LOAD);
    std::thread::sleep(Duration::from_secs(2));
    let stat = cpu_stat(&tree.cgroups, &container);
    eprintln!("burst 0, 2 s: container cpu.stat {stat:?}");
    assert!(
        stat["nr_throttled"] > 0,
        "the load never reached the quota: {stat:?}"
    );
    assert_eq!((stat["nr_bursts"], stat["burst_time"]), (0, 0), "{stat:?}");
}

#[test]
fn be_pod_becomes_idle_and_gets_kubelet_shares_back() {
    if skip() {
        return;
    }
    if !Path::new(CPU).join("cpu.idle").is_file() {
        eprintln!("skipping: no cpu.idle (kernel < 5.15)");
        return;
    }
    let mut tree = Tree::new();
    let pod = tree.cgroups.layout().pod(QosClass::Burstable, UID).unwrap();
    tree.mkdir(&pod);
    // What the kubelet writes for a pod requesting 500m.
    std::fs::write(tree.cgroups.dir("cpu", &pod).join("cpu.shares"), "512").unwrap();
    let resources = PodResources {
        cpu_request_millis: 500,
        memory_limit_bytes: None,
    };
    let kernel = Kernel::probe(&tree.cgroups, &pod);
    assert!(kernel.cpu_idle && !kernel.cpu_qos_level, "{kernel:?}");

    let be = QosLevel::from_annotations(&annotations(&[(QOS_LEVEL_ANNOTATION, "BE")])).unwrap();
    let applied = level_files::apply(
        &tree.cgroups,
        &pod,
        &level::desired(be, &resources, &kernel),
    )
    .unwrap();
    assert_eq!(applied.changed.len(), 1, "{applied:?}");
    let shares: u64 = tree
        .cgroups
        .read(&pod, "cpu.shares")
        .unwrap()
        .parse()
        .unwrap();
    eprintln!(
        "BE pod: cpu.idle {}, cpu.shares {shares}",
        tree.cgroups.read(&pod, "cpu.idle").unwrap()
    );
    assert_eq!(tree.cgroups.read(&pod, "cpu.idle").unwrap(), "1");
    // The kernel gives an idle group its minimal weight (WEIGHT_IDLEPRIO, 3).
    assert!(shares <= 3, "cpu.shares {shares}");
    assert!(
        level_files::apply(
            &tree.cgroups,
            &pod,
            &level::desired(be, &resources, &kernel)
        )
        .unwrap()
        .is_noop()
    );

    // The annotation goes away: not idle, and the kubelet's shares again.
    let unset = QosLevel::from_annotations(&BTreeMap::new()).unwrap();
    let applied = level_files::apply(
        &tree.cgroups,
        &pod,
        &level::desired(unset, &resources, &kernel),
    )
    .unwrap();
    assert_eq!(applied.changed.len(), 2, "{applied:?}");
    assert_eq!(tree.cgroups.read(&pod, "cpu.idle").unwrap(), "0");
    assert_eq!(tree.cgroups.read(&pod, "cpu.shares").unwrap(), "512");
    assert!(
        level_files::apply(
            &tree.cgroups,
            &pod,
            &level::desired(unset, &resources, &kernel)
        )
        .unwrap()
        .is_noop()
    );

    // A kernel without cpu.idle gets the minimal shares instead, and the same restore.
    let old_kernel = Kernel {
        cpu_idle: false,
        ..kernel
    };
    level_files::apply(
        &tree.cgroups,
        &pod,
        &level::desired(be, &resources, &old_kernel),
    )
    .unwrap();
    assert_eq!(tree.cgroups.read(&pod, "cpu.shares").unwrap(), "2");
    assert_eq!(tree.cgroups.read(&pod, "cpu.idle").unwrap(), "0");
    level_files::apply(
        &tree.cgroups,
        &pod,
        &level::desired(unset, &resources, &kernel),
    )
    .unwrap();
    assert_eq!(tree.cgroups.read(&pod, "cpu.shares").unwrap(), "512");
}

#[test]
fn detection_and_unsupported_files_on_this_kernel() {
    if skip() {
        return;
    }
    let mut tree = Tree::new();
    let cgroup_root = format!("/{}", tree.name);
    let kubepods = tree.cgroups.layout().kubepods();
    tree.mkdir(&kubepods);
    let mountinfo = Path::new("/proc/self/mountinfo");
    let detected = Cgroups::detect(ROOT, mountinfo, None, Some(&cgroup_root)).unwrap();
    assert_eq!(
        detected.layout(),
        tree.cgroups.layout(),
        "v1 and cgroupfs from the tree"
    );
    let configured = Cgroups::detect(ROOT, mountinfo, Some("systemd"), Some(&cgroup_root)).unwrap();
    assert_eq!(configured.layout().driver, Driver::Systemd);

    // openEuler's file is not on a mainline kernel: reported, not an error, never created.
    assert_eq!(
        tree.cgroups
            .write_if_changed(&kubepods, "cpu.qos_level", "-1")
            .unwrap(),
        Changed::Unsupported
    );
    // The kernel's refusal names the file and the value.
    let e = tree
        .cgroups
        .write_if_changed(&kubepods, "cpu.shares", "not-a-number")
        .unwrap_err();
    assert!(
        e.to_string().contains("cpu.shares") && e.to_string().contains("not-a-number"),
        "{e}"
    );
}
