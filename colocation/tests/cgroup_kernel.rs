//! The QoS cgroup code against the real kernel's cgroup v1 `cpu` (and `memory`) hierarchies:
//! CPU burst shows up in `cpu.stat` only when `burst` enables it, a BE pod becomes an idle group
//! and gets the kubelet's shares back when the annotation goes, a BestEffort pod's batch
//! resources become its shares, quota and memory limit (and hold a busy and a hungry process to
//! them), and every second apply changes nothing.
//!
//! Each test builds a kubelet-shaped tree (cgroupfs driver) under its own
//! `/sys/fs/cgroup/<controller>/fumarole-test-<pid>-<n>` and removes it, processes first, even
//! when it fails. Skipped with a message when not root or when the kernel lacks
//! `cpu.cfs_burst_us`; the memory half of the batch test, when there is no v1 `memory`
//! hierarchy.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fumarole_colocation::cgroup::{
    CgroupPath, Cgroups, Changed, Driver, Layout, batch_files, burst_files, level_files,
};
use fumarole_colocation::rules::batch_limits;
use fumarole_colocation::rules::burst::{BURST_TIME_ANNOTATION, BurstRequest, ENABLE_ANNOTATION};
use fumarole_colocation::rules::config::Features;
use fumarole_colocation::rules::kernel::{Kernel, Version};
use fumarole_colocation::rules::level::{self, PodResources, QOS_LEVEL_ANNOTATION, QosLevel};
use fumarole_colocation::rules::pod::QosClass;
use fumarole_colocation::tasks::pod_cgroups::Syncer;
use k8s_openapi::api::core::v1::Pod;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const ROOT: &str = "/sys/fs/cgroup";
const CPU: &str = "/sys/fs/cgroup/cpu";
const MEMORY: &str = "/sys/fs/cgroup/memory";
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
        self.mkdir_in("cpu", path)
    }

    /// [`Tree::mkdir`] in `controller`'s v1 hierarchy.
    fn mkdir_in(&mut self, controller: &str, path: &CgroupPath) -> PathBuf {
        let full = self.cgroups.dir(controller, path);
        let top = Path::new(ROOT).join(controller).join(&self.name);
        if !top.exists() {
            std::fs::create_dir(&top).unwrap();
            self.created.push(top.clone());
        }
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
        self.spawn_in_all(&["cpu"], path, script);
    }

    /// Starts `script` under `sh` and moves it into `path` of every hierarchy in
    /// `controllers`, before it runs its first command (the shell reads a line from a pipe
    /// first).
    fn spawn_in_all(&mut self, controllers: &[&str], path: &CgroupPath, script: &str) {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("read go; {script}"))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        for controller in controllers {
            std::fs::write(
                self.cgroups.dir(controller, path).join("cgroup.procs"),
                pid.to_string(),
            )
            .unwrap();
        }
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"go\n").unwrap();
        }
        self.children.push(child);
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
    let entries = [CPU, MEMORY]
        .into_iter()
        .filter_map(|h| std::fs::read_dir(h).ok())
        .flatten();
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

/// A second container of the batch pod.
const SECOND: &str =
    "containerd://9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d";

/// A BestEffort pod as the API server holds it, asking for batch resources: container `main`
/// batch-cpu 1500 (limit 2000), batch-memory about 48 MiB, not page aligned; container `side`
/// batch-cpu 250 (limit 250), batch-memory 1 GiB. Without a memory hierarchy, no batch-memory.
fn batch_pod(level: Option<&str>, memory: bool) -> Pod {
    let resources = |cpu_request: &str, cpu_limit: &str, bytes: &str| {
        let mut requests = serde_json::json!({"kubernetes.io/batch-cpu": cpu_request});
        let mut limits = serde_json::json!({"kubernetes.io/batch-cpu": cpu_limit});
        if memory {
            requests["kubernetes.io/batch-memory"] = bytes.into();
            limits["kubernetes.io/batch-memory"] = bytes.into();
        }
        serde_json::json!({"requests": requests, "limits": limits})
    };
    let annotations = match level {
        Some(level) => serde_json::json!({ QOS_LEVEL_ANNOTATION: level }),
        None => serde_json::json!({}),
    };
    let status = |name: &str, id: &str| {
        serde_json::json!({"name": name, "image": "x", "imageID": "", "ready": true,
                           "restartCount": 0, "containerID": id})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "batch", "namespace": "default", "uid": UID,
                     "annotations": annotations},
        "spec": {"containers": [
            {"name": "main", "resources": resources("1500", "2000", "50000001")},
            {"name": "side", "resources": resources("250", "250", "1Gi")},
        ]},
        "status": {"phase": "Running", "qosClass": "BestEffort",
                   "containerStatuses": [status("main", CONTAINER), status("side", SECOND)]},
    }))
    .unwrap()
}

/// The `name value` lines of a v1 stat-like file (`memory.oom_control`, `cpu.stat`).
fn stat_of(cgroups: &Cgroups, path: &CgroupPath, file: &str) -> BTreeMap<String, u64> {
    cgroups
        .read(path, file)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn batch_resources_become_the_pods_limits_on_the_kernel() {
    if skip() {
        return;
    }
    let memory = Path::new(MEMORY).join("memory.limit_in_bytes").is_file();
    if !memory {
        eprintln!(
            "{MEMORY}/memory.limit_in_bytes is missing (no cgroup v1 memory hierarchy): \
             batch-memory not tested, CPU only"
        );
    }
    let _one_at_a_time = CPU_BOUND.lock().unwrap_or_else(|e| e.into_inner());
    let mut tree = Tree::new();
    let layout = tree.cgroups.layout().clone();
    let pod = layout.pod(QosClass::BestEffort, UID).unwrap();
    let main = layout
        .container(QosClass::BestEffort, UID, &CONTAINER.parse().unwrap())
        .unwrap();
    let side = layout
        .container(QosClass::BestEffort, UID, &SECOND.parse().unwrap())
        .unwrap();
    for path in [&pod, &main, &side] {
        let dir = tree.mkdir(path);
        // What the kubelet and the runtime leave a BestEffort pod: minimal shares, no quota.
        std::fs::write(dir.join("cpu.shares"), "2").unwrap();
        if memory {
            tree.mkdir_in("memory", path);
        }
    }
    let cgroups = tree.cgroups.clone();
    let read = |path: &CgroupPath, file: &str| cgroups.read(path, file).unwrap();

    // One round of the agent's pod loop, with every feature off: the limits are not optional.
    let mut syncer = Syncer::new(tree.cgroups.clone());
    let summary = syncer.sync(&[batch_pod(None, memory)], Features::default());
    assert_eq!(
        (summary.batch_limited, summary.failed),
        (1, 0),
        "{summary:?}"
    );
    // 1500m: 1536 shares, 2000m: 200 ms per 100 ms; 250m: 256 shares, 25 ms; the pod the sums.
    let want = [
        (&main, "1536", "200000"),
        (&side, "256", "25000"),
        (&pod, "1792", "225000"),
    ];
    for (path, shares, quota) in want {
        assert_eq!(read(path, "cpu.shares"), shares, "{path}");
        assert_eq!(read(path, "cpu.cfs_quota_us"), quota, "{path}");
        assert_eq!(read(path, "cpu.cfs_period_us"), "100000", "{path}");
    }
    if memory {
        // 50000001 bytes, rounded down to 64 KiB: the kernel keeps it exactly.
        assert_eq!(read(&main, "memory.limit_in_bytes"), "49938432");
        assert_eq!(read(&side, "memory.limit_in_bytes"), "1073741824");
        assert_eq!(read(&pod, "memory.limit_in_bytes"), "1123680256");
    }
    eprintln!(
        "batch pod on the kernel: pod cpu.shares {}, cpu.cfs_quota_us {}, memory.limit_in_bytes {}",
        read(&pod, "cpu.shares"),
        read(&pod, "cpu.cfs_quota_us"),
        if memory {
            read(&pod, "memory.limit_in_bytes")
        } else {
            "-".into()
        },
    );

    // What the kernel stores is what the plan says: the next apply writes nothing.
    let containers =
        batch_limits::from_spec(batch_pod(None, memory).spec.as_ref().unwrap()).unwrap();
    let plan = batch_limits::desired(QosClass::BestEffort, &containers, Version::V1).unwrap();
    let started = [
        ("main".to_string(), main.clone()),
        ("side".to_string(), side.clone()),
    ]
    .into_iter()
    .collect();
    let again = batch_files::apply(&tree.cgroups, &pod, &started, &plan, true).unwrap();
    assert!(again.is_noop(), "{again:?}");

    // BE on a kernel with cpu.idle: the pod becomes idle (no EINVAL from a weight write), the
    // limits stay; the level goes: the batch weight comes back, not the kubelet's 2.
    if Path::new(CPU).join("cpu.idle").is_file() {
        let cpu_qos = Features {
            cpu_qos: true,
            ..Features::default()
        };
        let be = syncer.sync(&[batch_pod(Some("BE"), memory)], cpu_qos);
        assert_eq!((be.batch_limited, be.failed), (1, 0), "{be:?}");
        assert_eq!(read(&pod, "cpu.idle"), "1");
        assert_eq!(read(&pod, "cpu.cfs_quota_us"), "225000");
        assert_eq!(read(&main, "cpu.shares"), "1536");
        let unset = syncer.sync(&[batch_pod(None, memory)], cpu_qos);
        assert_eq!(unset.failed, 0, "{unset:?}");
        assert_eq!(read(&pod, "cpu.idle"), "0");
        assert_eq!(read(&pod, "cpu.shares"), "1792");
    }

    // The kernel holds a busy loop in `side` to its 25 ms per period.
    tree.spawn_in(&side, "while :; do :; done");
    std::thread::sleep(Duration::from_millis(1500));
    let stat = stat_of(&tree.cgroups, &side, "cpu.stat");
    eprintln!("busy loop under batch-cpu 250: cpu.stat {stat:?}");
    assert!(stat["nr_throttled"] > 0, "never throttled: {stat:?}");
    assert!(stat["throttled_time"] > 0, "{stat:?}");

    // And a shell filling a 200 MB string in `main` to its 48 MiB: the OOM killer ends it.
    if memory {
        tree.spawn_in_all(
            &["cpu", "memory"],
            &main,
            "x=$(head -c 200000000 /dev/zero | tr '\\0' a); sleep 60",
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let oom = loop {
            let oom = stat_of(&tree.cgroups, &main, "memory.oom_control");
            if oom.get("oom_kill").is_some_and(|&n| n > 0) || Instant::now() > deadline {
                break oom;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let max_usage: u64 = read(&main, "memory.max_usage_in_bytes").parse().unwrap();
        let failcnt: u64 = read(&main, "memory.failcnt").parse().unwrap();
        eprintln!(
            "200 MB string under batch-memory 48 MiB: max usage {max_usage}, failcnt {failcnt}, \
             oom_control {oom:?}"
        );
        assert!(max_usage <= 49_938_432, "{max_usage}");
        assert!(failcnt > 0, "the limit was never hit");
        assert!(oom.get("oom_kill").is_some_and(|&n| n > 0), "{oom:?}");
    }
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
