//! Shared by the co-location tests: a fake kubelet cgroup layout on the real kernel's cgroup
//! v1 hierarchies (the kubelet's `cgroupRoot` is a test-owned cgroup, so nothing of the
//! machine's is touched), pods given the status a kubelet would report, CPU burners placed in
//! a pod's cgroups, and `fumarole-agent run --colocation` against the test cluster ([`agent`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::TestCluster;
use crate::agent::AgentBuilder;
use crate::cluster::free_port;
use crate::process::Proc;

/// Where the v1 hierarchies are mounted.
pub const V1_ROOT: &str = "/sys/fs/cgroup";

/// Names the file where skipped tests are recorded (e2e/ci.sh sets it and fails when a test
/// was skipped: CI runs as root on a machine with every hierarchy the tests need).
pub const ENV_SKIPPED: &str = "FUMAROLE_E2E_SKIPPED";

/// Says that the running test cannot run here and why, on its output and, when
/// [`ENV_SKIPPED`] names a file, as a line there (`<test>: <why>`): libtest has no "skipped"
/// verdict, so a test that returns early passes, and only this record tells it apart.
fn skipped(why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("an e2e test")
        .to_string();
    eprintln!("skipped: {why}");
    if let Some(file) = std::env::var_os(ENV_SKIPPED) {
        let line = format!("{test}: {why}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot record the skip in {}: {e}", file.to_string_lossy());
        }
    }
}

/// One test's cgroup (the kubelet's `cgroupRoot`) in each of some v1 hierarchies; removed,
/// deepest first, on drop (also when the test fails). Processes put in it must be gone by
/// then: declare them after the tree so they drop first.
pub struct CgroupTree {
    name: String,
    controllers: Vec<String>,
}

impl CgroupTree {
    /// `/sys/fs/cgroup/<controller>/fumarole-e2e-<tag>-<pid>` for each controller. `None`, with
    /// the reason printed and recorded ([`skipped`]), when this machine cannot run the test:
    /// every `(controller, file)` in `required` must exist (a v1 hierarchy with that kernel
    /// feature) and we must be root.
    pub fn create(tag: &str, controllers: &[&str], required: &[(&str, &str)]) -> Option<Self> {
        for (controller, file) in required {
            let path = Path::new(V1_ROOT).join(controller).join(file);
            if !path.exists() {
                skipped(&format!(
                    "no {} (needs a cgroup v1 {controller} hierarchy with {file})",
                    path.display()
                ));
                return None;
            }
        }
        let mut tree = CgroupTree {
            name: format!("fumarole-e2e-{tag}-{}", std::process::id()),
            controllers: Vec::new(),
        };
        for controller in controllers {
            let top = Path::new(V1_ROOT).join(controller).join(&tree.name);
            if let Err(e) = std::fs::create_dir(&top) {
                skipped(&format!(
                    "cannot create {} ({e}); run as root",
                    top.display()
                ));
                return None;
            }
            tree.controllers.push((*controller).to_string());
        }
        Some(tree)
    }

    /// The kubelet's `cgroupRoot` for this tree (`/fumarole-e2e-...`).
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.name)
    }

    /// `rel` under the tree in `controller`'s hierarchy.
    pub fn dir(&self, controller: &str, rel: &str) -> PathBuf {
        Path::new(V1_ROOT)
            .join(controller)
            .join(&self.name)
            .join(rel)
    }

    /// Creates `rel` in every hierarchy of the tree; returns it in `controller`'s.
    pub fn mkdir(&self, controller: &str, rel: &str) -> Result<PathBuf> {
        for c in &self.controllers {
            let dir = self.dir(c, rel);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Ok(self.dir(controller, rel))
    }

    /// Writes a kubelet configuration (cgroupfs driver, this tree as `cgroupRoot`) into `dir`.
    pub fn kubelet_config(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join("kubelet-config.yaml");
        std::fs::write(
            &path,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\ncgroupRoot: {}\n",
                self.cgroup_root()
            ),
        )?;
        Ok(path)
    }

    /// What the agent's DaemonSet mounts of the host for co-location on a cgroup v1 node
    /// (the chart's `qos.cgroupMounts` for v1 with the cgroupfs driver, e2e `deployment.rs`),
    /// set up under `host` for an agent started in its own mount namespace
    /// ([`AgentBuilder::in_mount_namespace`]): each hierarchy's `kubepods` cgroup of this tree
    /// bound at `<host>/sys/fs/cgroup/<controller>/<cgroupRoot>/kubepods`, `/proc/pressure`
    /// read-only at `<host>/proc/pressure`, and the host's `/sys/fs/cgroup` unmounted and
    /// replaced by an empty read-only tmpfs (so nothing else of the tree, the devices
    /// controller included, is reachable). `host` must be an existing directory. Returns the mount script and the
    /// agent's flags.
    pub fn daemonset_mounts(&self, host: &Path) -> Result<(String, Vec<(String, String)>)> {
        let quote = |p: &Path| {
            let p = p.display().to_string();
            anyhow::ensure!(
                p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b)),
                "{p}: not a plain path"
            );
            Ok(p)
        };
        let h = quote(host)?;
        let mut script = vec![format!("mount -t tmpfs fumarole-host {h}")];
        for c in &self.controllers {
            let source = quote(&self.dir(c, "kubepods"))?;
            let target = format!("{h}/sys/fs/cgroup/{c}/{}/kubepods", self.name);
            script.push(format!("mkdir -p {target}"));
            script.push(format!("mount --bind {source} {target}"));
        }
        script.push(format!("mkdir -p {h}/proc/pressure"));
        script.push(format!("mount --bind /proc/pressure {h}/proc/pressure"));
        script.push(format!("mount -o remount,bind,ro {h}/proc/pressure"));
        // Unmounted, not only covered: the agent's mount table lists no other cgroup.
        script.push(format!("umount -R {V1_ROOT}"));
        script.push(format!(
            "mount -t tmpfs -o ro fumarole-no-host-cgroups {V1_ROOT}"
        ));
        let flags = vec![
            ("--cgroup-root".to_string(), format!("{h}/sys/fs/cgroup")),
            (
                "--memory-pressure-file".to_string(),
                format!("{h}/proc/pressure/memory"),
            ),
        ];
        Ok((script.join("\n"), flags))
    }

    /// Moves process `pid` into `rel` in every hierarchy of the tree.
    pub fn enter(&self, rel: &str, pid: u32) -> Result<()> {
        for c in &self.controllers {
            let procs = self.dir(c, rel).join("cgroup.procs");
            std::fs::write(&procs, pid.to_string())
                .with_context(|| format!("writing {pid} to {}", procs.display()))?;
        }
        Ok(())
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
        for c in &self.controllers {
            let mut all = Vec::new();
            dirs(&self.dir(c, ""), &mut all);
            for dir in all {
                if let Err(e) = std::fs::remove_dir(&dir) {
                    eprintln!("cleanup: removing {}: {e}", dir.display());
                }
            }
        }
    }
}

/// A process that keeps one CPU busy until dropped.
pub fn cpu_burner(cluster: &TestCluster, name: &str) -> Result<Proc> {
    Proc::spawn(
        name,
        Path::new("/bin/sh"),
        &["-c".to_string(), "while :; do :; done".to_string()],
        &cluster.root().join("logs"),
    )
}

/// Creates a pod bound to `node` and gives it the status a kubelet would: Running, with one
/// container `c` whose id is `containerd://<container>`. Returns its uid.
pub async fn running_pod(
    pods: &Api<Pod>,
    node: &str,
    name: &str,
    annotations: serde_json::Value,
    spec: serde_json::Value,
    container: &str,
) -> Result<String> {
    let mut pod_spec = json!({
        "nodeName": node,
        "containers": [{"name": "c", "image": "busybox", "resources": spec["resources"]}],
    });
    if let Some(class) = spec.get("priorityClassName") {
        pod_spec["priorityClassName"] = class.clone();
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": pod_spec,
    }))?;
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {name}"))?;
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
    .await?;
    match created.metadata.uid {
        Some(uid) => Ok(uid),
        None => bail!("pod {name} came back without a uid"),
    }
}

/// `fumarole-agent run --colocation` for `node` on the dgx-h100 fixture (change it with
/// [`AgentBuilder::on_root`]), with the kubelet configuration `kubelet_config`, the other
/// kubelet files absent under `scratch`, metrics on a free port, looking for the ConfigMap in
/// `default` (set `--colocation-config-namespace` again to change it), debug logs of the agent
/// and co-location. Start it with [`AgentBuilder::spawn_in`]: it acts as the cluster's admin
/// unless [`AgentBuilder::kubeconfig`] says otherwise.
pub fn agent(node: &str, kubelet_config: &Path, scratch: &Path) -> Result<AgentBuilder> {
    Ok(AgentBuilder::fixture("dgx-h100")
        .node(node)
        .kubelet_config(kubelet_config)
        .cpu_manager_state(&scratch.join("absent_state"))
        .pod_resources_socket(&scratch.join("absent.sock"))
        .metrics_on_port(free_port()?)
        .arg("--colocation")
        .flag("--colocation-config-namespace", "default")
        .env(
            "FUMAROLE_LOG",
            "info,fumarole_agent=debug,fumarole_colocation=debug",
        ))
}

/// The log a [`Proc`] has written so far.
pub fn log(proc: &Proc) -> String {
    std::fs::read_to_string(proc.log_path()).unwrap_or_default()
}

/// A file's content, trimmed ("" when unreadable).
pub fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The `volcano-agent-configuration` ConfigMap holding `doc` as its `colocation-config`.
pub fn config_map(doc: &serde_json::Value) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("volcano-agent-configuration".into());
    cm.data = Some([("colocation-config".to_string(), doc.to_string())].into());
    cm
}

/// Whether `events` (core v1 view) holds one that `matches`.
pub async fn event_seen(events: &Api<Event>, matches: impl Fn(&Event) -> bool) -> Result<bool> {
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(matches))
}
