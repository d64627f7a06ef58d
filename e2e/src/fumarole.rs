//! Running fumarole's own parts against the cluster: our binaries (the agent is started with
//! [`crate::agent::AgentBuilder`]), our CRDs and the objects the agent publishes. Agents
//! serving devices through DRA are in [`crate::dra`].

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};

use scheduler_ext::protocol::kube_scheduler::KUBE_PREFIX;
use scheduler_ext::protocol::volcano::VOLCANO_PREFIX;

use crate::TestCluster;
use crate::cluster::volcano_conf;

/// The `fumarole-agent` binary in the running test's `target/<profile>/` ([`profile_dir`]);
/// e2e/ci.sh builds it first.
pub fn agent_bin() -> Result<PathBuf> {
    our_bin("fumarole-agent", "fumarole-agent")
}

/// The `fumarole-scheduler-ext` binary, like [`agent_bin`].
pub fn scheduler_ext_bin() -> Result<PathBuf> {
    our_bin("fumarole-scheduler-ext", "fumarole-scheduler-ext")
}

/// A controller reference to a ReplicaSet `name` (none exists; no kube-controller-manager runs
/// in the harness, so nothing collects the pod): a pod the defragmentation advisor may move.
pub fn replica_set_owner(
    name: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: name.into(),
        uid: "0b0d1c3e-0000-4000-8000-000000000001".into(),
        controller: Some(true),
        ..Default::default()
    }
}

/// The `kubectl-fumarole` plugin binary (a binary of the `fumarole-scheduler-ext` package),
/// like [`agent_bin`].
pub fn kubectl_plugin_bin() -> Result<PathBuf> {
    our_bin("kubectl-fumarole", "fumarole-scheduler-ext")
}

/// `vc-scheduler-fumarole`: Volcano's scheduler with fumarole's plugin compiled in, built by
/// `volcano-plugin/build.sh` beside our other binaries (e2e/ci.sh builds it; when it is missing
/// this runs the script).
pub fn volcano_plugin_bin() -> Result<PathBuf> {
    plugin_bin_built("vc-scheduler-fumarole", "volcano-plugin/build.sh", None)
}

/// [`volcano_plugin_bin`] built against Volcano `version` (e.g. `v1.14.1`):
/// `vc-scheduler-fumarole-<version>`, from `VOLCANO=<version> volcano-plugin/build.sh`.
pub fn volcano_plugin_bin_for(version: &str) -> Result<PathBuf> {
    plugin_bin_built(
        &format!("vc-scheduler-fumarole-{version}"),
        "volcano-plugin/build.sh",
        Some(("VOLCANO", version)),
    )
}

/// `kube-scheduler-fumarole`: kube-scheduler with fumarole's framework plugin compiled in, built
/// by `kube-plugin/build.sh` beside our other binaries (e2e/ci.sh builds it; when it is missing
/// this runs the script).
pub fn kube_plugin_bin() -> Result<PathBuf> {
    plugin_bin_built("kube-scheduler-fumarole", "kube-plugin/build.sh", None)
}

/// The binary `name` in our profile's target folder, built by `script` (relative to the
/// repository, with `env`) when it is missing.
fn plugin_bin_built(name: &str, script: &str, env: Option<(&str, &str)>) -> Result<PathBuf> {
    let dir = profile_dir()?;
    let bin = dir.join(name);
    // The tests of one file run as threads of one process: the first to find the binary
    // missing builds it while the others wait (two builds at once trip over each other's
    // files).
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    if !bin.exists() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(script);
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(&script);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        if let Some((key, value)) = env {
            cmd.env(key, value);
        }
        let out = cmd.output()?;
        if !out.status.success() || !bin.exists() {
            bail!(
                "{} missing and {} failed: {}",
                bin.display(),
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(bin)
}

/// The seeds' `volcano-scheduler.conf`, byte for byte as MetaX's documents write it
/// (../shared/reference/volcano-scheduler-configs.md): `gpu-podaffinity` in the first tier after
/// `conformance`, `gpu-aware` with `weight: 1` and `loss.weight: 0.5` in the second after
/// `binpack`.
pub const SEED_VOLCANO_CONF: &str = r#"actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
  - name: gpu-podaffinity
- plugins:
  - name: overcommit
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
  - name: gpu-aware
    arguments:
      weight: 1          # this plugin's weight among all plugins
      loss.weight: 0.5   # weight of the loss score; higher leaves fewer GPU fragments
"#;

/// `target/<profile>/`: where a test binary (in its `deps/`) or one of this crate's own binaries
/// (like `fumarole-demo`) runs from.
fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().map(|d| match d.file_name() {
        Some(n) if n == "deps" => d.parent().unwrap_or(d),
        _ => d,
    });
    match dir {
        Some(d) => Ok(d.to_path_buf()),
        None => bail!("no target directory above {}", exe.display()),
    }
}

fn our_bin(name: &str, package: &str) -> Result<PathBuf> {
    let bin = profile_dir()?.join(name);
    if !bin.exists() {
        bail!(
            "{} missing: run `cargo build -p {package}` first",
            bin.display()
        );
    }
    Ok(bin)
}

/// A stand-in vendor library built by the workspace (`fumarole-standin-nvml`,
/// `fumarole-standin-dcmi`: `target/<profile>/libfumarole_standin_nvml.so`), beside the test
/// binaries like [`agent_bin`]; e2e/ci.sh builds them, and when one is missing this builds it
/// with cargo.
pub fn standin_lib(package: &str) -> Result<PathBuf> {
    let dir = profile_dir()?;
    let lib = dir.join(format!("lib{}.so", package.replace('-', "_")));
    if !lib.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "-p", package]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let out = cmd.output()?;
        if !out.status.success() || !lib.exists() {
            bail!(
                "{} missing and `cargo build -p {package}` failed: {}",
                lib.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(lib)
}

/// Our `DeviceTopology` CRD, as kept in `deploy/crds/`.
pub fn device_topology_crd() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/crds/devicetopologies.topology.fumarole.dev.yaml")
}

impl TestCluster {
    /// Every CRD the agent publishes to: Volcano's, NodeResourceTopology, ours.
    pub async fn install_fumarole_crds(&self) -> Result<()> {
        self.install_volcano_crds().await?;
        self.install_nrt_crd().await?;
        self.install_crd_file(&device_topology_crd()).await?;
        Ok(())
    }

    /// Starts `fumarole-scheduler-ext serve` against this cluster's API server on a free
    /// loopback port (plus `extra` arguments), waits for its `/readyz` and
    /// `/leaderz` and returns the port.
    pub async fn start_scheduler_ext(&self, extra: &[&str]) -> Result<u16> {
        let port = crate::cluster::free_port()?;
        let mut args = vec![
            "serve".to_string(),
            format!("--kubeconfig={}", self.admin_kubeconfig().display()),
            format!("--listen=127.0.0.1:{port}"),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        self.start_program(
            "fumarole-scheduler-ext",
            &scheduler_ext_bin()?,
            &args,
            &[("RUST_LOG", "info,scheduler_ext=debug")],
        )?;
        // Ready (its view is current) and leading (the lease taken, the promises read).
        let url = format!("http://127.0.0.1:{port}");
        self.wait_ok("fumarole-scheduler-ext", &url, "/readyz")
            .await?;
        self.wait_ok("fumarole-scheduler-ext", &url, "/leaderz")
            .await?;
        Ok(port)
    }
}

fn objects(
    client: Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::all_with(client, &ar)
}

/// Volcano `Numatopology` objects.
pub fn numatopologies(client: Client) -> Api<DynamicObject> {
    objects(
        client,
        "nodeinfo.volcano.sh",
        "v1alpha1",
        "Numatopology",
        "numatopologies",
    )
}

/// `NodeResourceTopology` objects.
pub fn node_resource_topologies(client: Client) -> Api<DynamicObject> {
    objects(
        client,
        "topology.node.k8s.io",
        "v1alpha2",
        "NodeResourceTopology",
        "noderesourcetopologies",
    )
}

/// Our `DeviceTopology` objects.
pub fn device_topologies(client: Client) -> Api<DynamicObject> {
    objects(
        client,
        "topology.fumarole.dev",
        "v1alpha1",
        "DeviceTopology",
        "devicetopologies",
    )
}

/// Writes the bundled fixture node `name` out as a filesystem root at `dir/root` (with
/// `fumarole-agent fixture`), so a test can change it (take a device node away).
pub fn fixture_root(name: &str, dir: &Path) -> Result<PathBuf> {
    let root = dir.join("root");
    let out = std::process::Command::new(agent_bin()?)
        .args(["fixture", name, "--out"])
        .arg(&root)
        .output()?;
    if !out.status.success() {
        bail!(
            "fumarole-agent fixture {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(root)
}

/// kube-scheduler configuration with fumarole-scheduler-ext (on loopback `port`) as filtering,
/// scoring and binding extender for pods asking for any of `resources`.
pub fn kube_scheduler_config(port: u16, resources: &[&str]) -> String {
    let managed: String = resources
        .iter()
        .map(|r| format!("  - name: {r}\n    ignoredByScheduler: false\n"))
        .collect();
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\n\
         kind: KubeSchedulerConfiguration\n\
         extenders:\n\
         - urlPrefix: http://127.0.0.1:{port}{KUBE_PREFIX}\n\
         \x20 filterVerb: filter\n\
         \x20 prioritizeVerb: prioritize\n\
         \x20 bindVerb: bind\n\
         \x20 nodeCacheCapable: true\n\
         \x20 weight: 5\n\
         \x20 managedResources:\n{managed}"
    )
}

/// The process name (and log name) [`start_kube_plugin`] gives `kube-scheduler-fumarole`.
pub const KUBE_PLUGIN: &str = "kube-scheduler-fumarole";

/// Starts `kube-scheduler-fumarole` on `cluster` with [`kube_plugin_config`]`(args)`, as
/// [`KUBE_PLUGIN`]; answers its HTTPS port once it is healthy.
pub async fn start_kube_plugin(cluster: &TestCluster, args: &str) -> Result<u16> {
    cluster
        .start_scheduler_program(
            KUBE_PLUGIN,
            &kube_plugin_bin()?,
            &kube_plugin_config(args),
            &[],
        )
        .await
}

/// kube-scheduler configuration for `kube-scheduler-fumarole` ([`kube_plugin_bin`]): the default
/// profile enables fumarole's framework plugin at every extension point it has (its score at
/// weight 5, as the extender's), binds through it before `DefaultBinder` (which binds the pods
/// it skips), and gives it `args` (a YAML flow mapping, `{}` for none) as pluginConfig args.
pub fn kube_plugin_config(args: &str) -> String {
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  plugins:
    multiPoint:
      enabled:
      - name: Fumarole
        weight: 5
    bind:
      disabled:
      - name: '*'
      enabled:
      - name: Fumarole
      - name: DefaultBinder
  pluginConfig:
  - name: Fumarole
    args: {args}
"
    )
}

/// A Volcano scheduler configuration with fumarole-scheduler-ext in the `extender` plugin.
/// Volcano v1.10 does not call `allocateFunc` / `deallocateFunc` yet; later versions do.
/// The allocate action's predicate error cache is off: it remembers a node's failure for every
/// pod of the same task, but a gpu-group-size pod's super-node depends on its rank.
pub fn volcano_conf_with_extender(port: u16) -> String {
    let extender = format!(
        "  - name: extender\n    arguments:\n      extender.urlPrefix: http://127.0.0.1:{port}{VOLCANO_PREFIX}\n      extender.httpTimeout: 5s\n      extender.predicateVerb: predicate\n      extender.prioritizeVerb: prioritize\n      extender.allocateFuncVerb: allocateFunc\n      extender.deallocateFuncVerb: deallocateFunc\n"
    );
    format!(
        "{}configurations:\n- name: allocate\n  arguments:\n    predicateErrorCacheEnable: false\n",
        volcano_conf(&extender)
    )
}
