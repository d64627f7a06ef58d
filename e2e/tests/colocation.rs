//! `fumarole-agent run --colocation` against the real API server and the real kernel's cgroup
//! v1 `cpu` hierarchy: a fake kubelet layout under `/sys/fs/cgroup/cpu/fumarole-e2e-<pid>/`
//! (the kubelet's `cgroupRoot`), pods bound to the node with the container ids the kubelet
//! would report, and the volcano annotations. A BE pod's group goes idle, a burst pod's
//! containers and pod get `cpu.cfs_burst_us`; removing the annotations restores the kubelet's
//! values; a restarted agent writes nothing.
//!
//! Needs root and a kernel with `cpu.idle` and `cpu.cfs_burst_us` in the v1 `cpu` hierarchy;
//! skipped (with a message) otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port};
use fumarole_e2e::fumarole::agent_bin;
use fumarole_e2e::process::Proc;
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "colo-1";
const CPU: &str = "/sys/fs/cgroup/cpu";
const BE_ID: &str = "aaaa0001";
const BURST_ID: &str = "bbbb0002";
const PLAIN_ID: &str = "cccc0003";

/// The test's cgroup tree; removed (deepest first) on drop, also when the test fails.
struct CgroupTree {
    top: PathBuf,
}

impl CgroupTree {
    /// `None` when this machine cannot run the test.
    fn create() -> Option<CgroupTree> {
        let cpu = Path::new(CPU);
        for file in ["cpu.cfs_burst_us", "cpu.idle"] {
            if !cpu.join(file).exists() {
                eprintln!(
                    "skipped: {CPU} has no {file} (needs a cgroup v1 cpu hierarchy, kernel >= 5.15)"
                );
                return None;
            }
        }
        let top = cpu.join(format!("fumarole-e2e-{}", std::process::id()));
        match std::fs::create_dir(&top) {
            Ok(()) => Some(CgroupTree { top }),
            Err(e) => {
                eprintln!(
                    "skipped: cannot create {} ({e}); run as root",
                    top.display()
                );
                None
            }
        }
    }

    fn mkdir(&self, rel: &str) -> PathBuf {
        let dir = self.top.join(rel);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

impl Drop for CgroupTree {
    fn drop(&mut self) {
        fn dirs(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs(&entry.path(), out);
                }
            }
            out.push(dir.to_path_buf());
        }
        let mut all = Vec::new();
        dirs(&self.top, &mut all);
        for dir in all {
            if let Err(e) = std::fs::remove_dir(&dir) {
                eprintln!("cleanup: removing {}: {e}", dir.display());
            }
        }
    }
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap()
        .trim()
        .to_string()
}

fn write(dir: &Path, file: &str, value: &str) {
    std::fs::write(dir.join(file), value).unwrap();
}

/// Creates a pod bound to the node and gives it the status a kubelet would: Running, with one
/// container `c` whose id is `containerd://<container>`. Returns its uid.
async fn running_pod(
    pods: &Api<Pod>,
    name: &str,
    annotations: serde_json::Value,
    resources: serde_json::Value,
    container: &str,
) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c", "image": "busybox", "resources": resources}],
        },
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running",
            "containerStatuses": [{
                "name": "c", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
                "containerID": format!("containerd://{container}"),
                "state": {"running": {"startedAt": now}},
            }],
        }})),
    )
    .await
    .unwrap();
    created.metadata.uid.unwrap()
}

/// The value once the file holds `want`.
async fn file_becomes(dir: &Path, file: &str, want: &str) {
    let what = format!("{} = {want}", dir.join(file).display());
    eventually(&what, Duration::from_secs(30), move || async move {
        Ok((read(dir, file) == want).then_some(()))
    })
    .await
    .unwrap();
}

fn log(proc: &Proc) -> String {
    std::fs::read_to_string(proc.log_path()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn qos_levels_and_burst_on_the_real_kernel_and_no_rewrite_after_restart() {
    let Some(tree) = CgroupTree::create() else {
        return;
    };
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(
            &NodeSpec::new(NODE)
                .capacity("cpu", "8")
                .capacity("memory", "32Gi"),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");

    let be_uid = running_pod(
        &pods,
        "offline",
        json!({"volcano.sh/qos-level": "BE"}),
        json!({"requests": {"cpu": "500m"}}),
        BE_ID,
    )
    .await;
    let burst_uid = running_pod(
        &pods,
        "bursty",
        json!({"volcano.sh/enable-quota-burst": "true", "volcano.sh/quota-burst-time": "30000"}),
        json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "500m"}}),
        BURST_ID,
    )
    .await;
    let plain_uid = running_pod(&pods, "plain", json!({}), json!({}), PLAIN_ID).await;
    let qos = |p: Pod| p.status.unwrap().qos_class.unwrap();
    assert_eq!(qos(pods.get("offline").await.unwrap()), "Burstable");
    assert_eq!(qos(pods.get("plain").await.unwrap()), "BestEffort");

    // The kubelet's side: pod and container cgroups, the burst pod's quota from its limit.
    let be_pod = tree.mkdir(&format!("kubepods/burstable/pod{be_uid}"));
    tree.mkdir(&format!("kubepods/burstable/pod{be_uid}/{BE_ID}"));
    let burst_pod = tree.mkdir(&format!("kubepods/burstable/pod{burst_uid}"));
    let burst_container = tree.mkdir(&format!("kubepods/burstable/pod{burst_uid}/{BURST_ID}"));
    let plain_pod = tree.mkdir(&format!("kubepods/besteffort/pod{plain_uid}"));
    tree.mkdir(&format!("kubepods/besteffort/pod{plain_uid}/{PLAIN_ID}"));
    write(&be_pod, "cpu.shares", "512");
    write(&burst_pod, "cpu.cfs_quota_us", "50000");
    write(&burst_container, "cpu.cfs_quota_us", "50000");
    write(&plain_pod, "cpu.shares", "2");

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let top = tree.top.file_name().unwrap().to_str().unwrap().to_string();
    std::fs::write(
        &config,
        format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\ncgroupRoot: /{top}\n"),
    )
    .unwrap();
    let start = |name: &str| {
        let args: Vec<String> = [
            "run",
            "--fixture",
            "dgx-h100",
            "--node-name",
            NODE,
            "--kubelet-config",
            config.to_str().unwrap(),
            "--cpu-manager-state",
            dir.path().join("absent_state").to_str().unwrap(),
            "--pod-resources-socket",
            dir.path().join("absent.sock").to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{}", free_port().unwrap()),
            "--colocation",
            "--qos-interval",
            "1s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let kubeconfig = cluster.admin_kubeconfig().display().to_string();
        Proc::spawn_with_env(
            name,
            &agent_bin().unwrap(),
            &args,
            &[
                ("KUBECONFIG", kubeconfig.as_str()),
                ("FUMAROLE_LOG", "info"),
            ],
            &cluster.root().join("logs"),
        )
        .unwrap()
    };

    let mut agent = start("fumarole-agent-colo");
    file_becomes(&be_pod, "cpu.idle", "1").await;
    file_becomes(&burst_container, "cpu.cfs_burst_us", "30000").await;
    file_becomes(&burst_pod, "cpu.cfs_burst_us", "30000").await;
    // Never annotated: left as the kubelet set it.
    assert_eq!(read(&plain_pod, "cpu.shares"), "2");
    assert_eq!(read(&plain_pod, "cpu.idle"), "0");

    // Annotations removed: the kubelet's values come back.
    for (name, key) in [
        ("offline", "volcano.sh/qos-level"),
        ("bursty", "volcano.sh/enable-quota-burst"),
        ("bursty", "volcano.sh/quota-burst-time"),
    ] {
        pods.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: null}}})),
        )
        .await
        .unwrap();
    }
    file_becomes(&be_pod, "cpu.idle", "0").await;
    file_becomes(&be_pod, "cpu.shares", "512").await;
    file_becomes(&burst_container, "cpu.cfs_burst_us", "0").await;
    file_becomes(&burst_pod, "cpu.cfs_burst_us", "0").await;
    assert!(
        log(&agent).contains("cgroup value changed"),
        "{}",
        log(&agent)
    );
    agent.stop();

    // A restarted agent finds everything in place: it syncs and writes nothing.
    let again = start("fumarole-agent-colo-restarted");
    let restarted = &again;
    eventually(
        "the restarted agent's first round",
        Duration::from_secs(30),
        move || async move {
            Ok(log(restarted)
                .contains("co-location: pods synced")
                .then_some(()))
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = log(&again);
    assert!(!text.contains("cgroup value changed"), "{text}");
    assert!(!text.contains("not fully applied"), "{text}");
    assert_eq!(read(&be_pod, "cpu.idle"), "0");
    assert_eq!(read(&be_pod, "cpu.shares"), "512");
    assert_eq!(read(&burst_pod, "cpu.cfs_burst_us"), "0");
    drop(again);
    drop(cluster);
    drop(tree);
}
