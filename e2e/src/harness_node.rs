//! [`HarnessNode`]: one harness node, `kubelet-node`, the kubelet's own device manager and
//! topology manager admitting the pods bound to one Node of the test cluster.
//!
//! Start one with [`crate::TestCluster::start_harness_node`] (or
//! [`crate::TestCluster::start_harness_node_with`] for a topology-manager policy and NUMA
//! node count, see [`HarnessOptions`]). Point a device plugin (the agent's
//! `--device-plugin-dir`) at [`HarnessNode::plugin_dir`]; once it has registered, the Node's
//! capacity shows its devices, and every pod created with `spec.nodeName` set to the node is
//! admitted or refused by the kubelet's code. [`HarnessNode::wait_pod`] returns what the
//! device manager gave each container ([`PodRecord`]). Several harness nodes can run in one
//! cluster: each has its own directory, process and mount namespace.
//!
//! With DRA (on unless `--dra=false` is in [`HarnessOptions::extra_args`]) it also runs the
//! kubelet's DRA manager and plugin manager: a DRA kubelet plugin registers by creating
//! `<driver>-reg.sock` in [`HarnessNode::plugins_registry_dir`] (its service socket
//! conventionally in [`HarnessNode::dra_plugin_dir`]); a pod with ResourceClaims is prepared
//! before its containers start ([`PodRecord::dra`], [`ContainerRecord::cdi_devices`]) and
//! unprepared once it goes. [`HarnessNode::dra_plugins`] lists the registered plugins.
//!
//! The process runs under `unshare --mount --propagation private` (util-linux, root):
//! `devicemanager.NewManagerImpl` serves `/var/lib/kubelet/device-plugins/kubelet.sock` only,
//! so `kubelet-node` binds the node's directory there in its own mount namespace. The JSON
//! API is documented in `e2e/README.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

use crate::process::Proc;
use crate::upstream::Upstream;
use crate::wait::eventually;

/// How the harness node's kubelet is configured.
#[derive(Debug, Clone)]
pub struct HarnessOptions {
    /// `none`, `best-effort`, `restricted` or `single-numa-node` (the kubelet's
    /// `topologyManagerPolicy`); `none` by default.
    pub topology_policy: String,
    /// `container` or `pod` (`topologyManagerScope`); `container` by default.
    pub topology_scope: String,
    /// `topologyManagerPolicyOptions`, e.g. `prefer-closest-numa-nodes=true`.
    pub policy_options: Vec<(String, String)>,
    /// The machine's NUMA nodes (ids `0..n`), as cadvisor would report them; 1 by default.
    pub numa_nodes: u32,
    /// Also run the kubelet's predicate admit handler (resources, node affinity, taints,
    /// ports) after the topology manager; on by default.
    pub predicates: bool,
    /// More `kubelet-node` flags, e.g. `--v=4` for the kubelet packages' klog detail.
    pub extra_args: Vec<String>,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        HarnessOptions {
            topology_policy: "none".into(),
            topology_scope: "container".into(),
            policy_options: Vec::new(),
            numa_nodes: 1,
            predicates: true,
            extra_args: Vec::new(),
        }
    }
}

impl HarnessOptions {
    /// A topology-manager `policy` on a machine of `numa_nodes` NUMA nodes.
    pub fn topology(policy: &str, numa_nodes: u32) -> Self {
        HarnessOptions {
            topology_policy: policy.into(),
            numa_nodes,
            ..Default::default()
        }
    }

    /// The topology-manager scope (`container` or `pod`).
    pub fn scope(mut self, scope: &str) -> Self {
        self.topology_scope = scope.into();
        self
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--topology-manager-policy={}", self.topology_policy),
            format!("--topology-manager-scope={}", self.topology_scope),
            format!("--numa-nodes={}", self.numa_nodes),
            format!("--predicates={}", self.predicates),
        ];
        if !self.policy_options.is_empty() {
            let opts: Vec<String> = self
                .policy_options
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            args.push(format!(
                "--topology-manager-policy-options={}",
                opts.join(",")
            ));
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// What happened to one pod on the node (`GET /pods`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct PodRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `admitting`, `admitted`, `rejected`, `prepare_failed` (admitted, but the DRA manager's
    /// `PrepareResources` failed: no container started; see [`HarnessNode::retry_prepare`]),
    /// or `released` (admitted, then deleted).
    pub state: String,
    /// Admitted by every admit handler.
    pub admitted: bool,
    /// The kubelet's reason for a refusal (`UnexpectedAdmissionError`,
    /// `TopologyAffinityError`, `OutOf<resource>`, ...), or `FailedPrepareDynamicResources`.
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// Gone from the API server.
    pub deleted: bool,
    /// The device-manager generation (1, then +1 per restart) that decided.
    pub generation: u64,
    /// Init containers first, then the containers.
    pub containers: Vec<ContainerRecord>,
    /// What the DRA manager did for the pod's ResourceClaims; `None` for pods without any.
    #[serde(default)]
    pub dra: Option<DraRecord>,
}

/// What the kubelet's DRA manager did for one pod's ResourceClaims.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct DraRecord {
    /// The pod's ResourceClaim names, in spec order (those that could be resolved).
    #[serde(default)]
    pub claims: Vec<String>,
    /// `PrepareResources` succeeded.
    pub prepared: bool,
    /// `PrepareResources` calls so far.
    pub prepare_attempts: u32,
    /// The last `PrepareResources` error (cleared on success).
    #[serde(default)]
    pub prepare_error: Option<String>,
    /// `UnprepareResources` succeeded after the pod went.
    pub unprepared: bool,
    /// The last `UnprepareResources` error (cleared on success).
    #[serde(default)]
    pub unprepare_error: Option<String>,
}

/// One prepared device of a container's ResourceClaim (the DRA manager's claim info).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ClaimDevice {
    pub claim: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// The claim's requests the device serves (empty: all).
    #[serde(default)]
    pub requests: Vec<String>,
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
    #[serde(default)]
    pub share_id: Option<String>,
}

/// A DRA plugin registered through the plugin manager (`GET /dra/plugins`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct DraPlugin {
    /// The DRA driver name (the plugin's `GetInfo` name).
    pub driver: String,
    /// Its DRA service socket, as its `GetInfo` endpoint said.
    pub endpoint: String,
    /// The gRPC services it advertised (e.g. `v1.DRAPlugin`).
    #[serde(default)]
    pub services: Vec<String>,
    /// RFC 3339.
    pub registered_at: String,
}

impl PodRecord {
    /// The container named `name`.
    pub fn container(&self, name: &str) -> Option<&ContainerRecord> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Every device id of `resource` given to any of its containers, sorted.
    pub fn devices(&self, resource: &str) -> Vec<String> {
        let mut all: Vec<String> = self
            .containers
            .iter()
            .flat_map(|c| c.devices.get(resource).cloned().unwrap_or_default())
            .collect();
        all.sort();
        all.dedup();
        all
    }
}

/// What the device manager gave one container.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ContainerRecord {
    pub name: String,
    #[serde(default)]
    pub init: bool,
    /// The container id given to the topology manager (`kubelet-node://<uid>/<name>`).
    pub id: String,
    /// Resource -> allocated device ids (the manager's `GetDevices`), sorted.
    #[serde(default)]
    pub devices: BTreeMap<String, Vec<String>>,
    /// Resource -> the NUMA nodes of those devices.
    #[serde(default)]
    pub numa_nodes: BTreeMap<String, Vec<i64>>,
    /// The topology manager's hint for the container, if it made one.
    #[serde(default)]
    pub affinity: Option<Affinity>,
    /// `GetDeviceRunContainerOptions`: the plugins' `Allocate` answers, merged.
    #[serde(default)]
    pub options: Option<RunOptions>,
    /// `GetDeviceRunContainerOptions` failed (e.g. `PreStartContainer`), or the DRA manager's
    /// `GetResources`.
    #[serde(default)]
    pub error: Option<String>,
    /// The DRA manager's `GetResources`: the CDI device ids of the container's claims'
    /// prepared devices (the runtime gets these, then `options.cdi_devices`).
    #[serde(default)]
    pub cdi_devices: Vec<String>,
    /// The prepared devices of the container's ResourceClaims.
    #[serde(default)]
    pub claims: Vec<ClaimDevice>,
}

/// A topology-manager hint.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Affinity {
    pub numa_nodes: Vec<i64>,
    pub preferred: bool,
}

/// The kubelet's `DeviceRunContainerOptions`, with the device-plugin proto's field names.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct RunOptions {
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default)]
    pub devices: Vec<DeviceSpec>,
    #[serde(default)]
    pub mounts: Vec<MountSpec>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub cdi_devices: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct DeviceSpec {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct MountSpec {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

/// One recorded event (`GET /events`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Event {
    pub seq: u64,
    /// `started`, `capacity`, `admitted`, `rejected`, `released` or `restarted`; with DRA
    /// also `prepared`, `prepare_failed`, `unprepared`, `unprepare_failed`,
    /// `dra_plugin_registered`, `dra_plugin_rejected`, `dra_plugin_deregistered` and
    /// `dra_health_update`.
    pub kind: String,
    #[serde(default)]
    pub resource: Option<String>,
    #[serde(default)]
    pub capacity: Option<i64>,
    #[serde(default)]
    pub allocatable: Option<i64>,
    /// `namespace/name`.
    #[serde(default)]
    pub pod: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// The pod's ResourceClaim names (`prepared`, `prepare_failed`, `unprepared`,
    /// `unprepare_failed`).
    #[serde(default)]
    pub claims: Vec<String>,
    /// A DRA plugin's driver name, service socket and advertised services (`dra_plugin_*`).
    #[serde(default)]
    pub driver: Option<String>,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub services: Vec<String>,
    pub generation: u64,
}

/// A running `kubelet-node`; stopped when dropped (its log tail printed if the test panics).
#[derive(Debug)]
pub struct HarnessNode {
    proc: Proc,
    node: String,
    addr: String,
    plugin_dir: PathBuf,
    socket: PathBuf,
    /// `None` with `--dra=false`.
    plugins_registry_dir: Option<PathBuf>,
    plugins_dir: Option<PathBuf>,
    dra_state_dir: Option<PathBuf>,
}

/// `unshare` from `$PATH`.
fn unshare() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("unshare"))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("harness nodes need util-linux's `unshare` on $PATH (and root)"))
}

impl HarnessNode {
    /// Starts `kubelet-node` for Node `node` in its own mount namespace, serving
    /// `plugin_dir/kubelet.sock` (created if missing), talking to the API server of
    /// `kubeconfig`; logs under `logs`. Waits until its pod informer has synced and the device
    /// manager serves.
    pub async fn start(
        node: &str,
        plugin_dir: &Path,
        kubeconfig: &Path,
        options: &HarnessOptions,
        logs: &Path,
    ) -> Result<HarnessNode> {
        std::fs::create_dir_all(plugin_dir)?;
        let bin = Upstream::get()?.bin("kubelet-node");
        let mut args: Vec<String> = [
            "--mount",
            "--propagation",
            "private",
            "--",
            bin.to_str()
                .ok_or_else(|| anyhow!("non-UTF-8 path {}", bin.display()))?,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(format!("--node-name={node}"));
        args.push(format!("--plugin-dir={}", plugin_dir.display()));
        args.push(format!("--kubeconfig={}", kubeconfig.display()));
        args.extend(options.args());
        let mut proc = Proc::spawn(&format!("kubelet-node-{node}"), &unshare()?, &args, logs)?;
        let stdout = proc.stdout_path().to_path_buf();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let hello: Value = loop {
            let text = std::fs::read_to_string(&stdout).unwrap_or_default();
            if let Some(line) = text.lines().next().filter(|_| text.contains('\n')) {
                break serde_json::from_str(line)
                    .with_context(|| format!("kubelet-node hello line {line:?}"))?;
            }
            proc.check_running()?;
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "kubelet-node for {node} printed nothing in 60 s; log:\n{}",
                    proc.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let field = |k: &str| -> Result<String> {
            hello[k]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("no {k} in {hello}"))
        };
        let optional = |k: &str| hello[k].as_str().map(PathBuf::from);
        Ok(HarnessNode {
            addr: field("addr")?,
            plugin_dir: PathBuf::from(field("plugin_dir")?),
            socket: PathBuf::from(field("socket")?),
            plugins_registry_dir: optional("plugins_registry_dir"),
            plugins_dir: optional("plugins_dir"),
            dra_state_dir: optional("dra_state_dir"),
            node: node.to_string(),
            proc,
        })
    }

    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// The host directory the kubelet serves in: give it to the device plugins (the agent's
    /// `--device-plugin-dir`). It also holds the device manager's checkpoint
    /// (`kubelet_internal_checkpoint`).
    pub fn plugin_dir(&self) -> &Path {
        &self.plugin_dir
    }

    /// `plugin_dir/kubelet.sock`.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The kubelet's `plugins_registry` (`<node dir>/plugins_registry`, beside
    /// [`HarnessNode::plugin_dir`]), watched by the kubelet's plugin manager: a DRA plugin
    /// registers by serving `<driver>-reg.sock` here. `None` with `--dra=false`.
    pub fn plugins_registry_dir(&self) -> Option<&Path> {
        self.plugins_registry_dir.as_deref()
    }

    /// `<node dir>/plugins/<driver>`: where a DRA plugin for `driver` conventionally serves its
    /// DRA service socket (`dra.sock`), as `/var/lib/kubelet/plugins/<driver>` on a real node.
    /// kubelet-node only creates `<node dir>/plugins`; the plugin creates its directory and
    /// names the socket in its registration (`GetInfo` endpoint). `None` with `--dra=false`.
    pub fn dra_plugin_dir(&self, driver: &str) -> Option<PathBuf> {
        self.plugins_dir.as_ref().map(|d| d.join(driver))
    }

    /// The DRA manager's checkpoint directory (`dra_manager_state`, `dra_health_state`):
    /// `<node dir>/dra-state`. `None` with `--dra=false`.
    pub fn dra_state_dir(&self) -> Option<&Path> {
        self.dra_state_dir.as_deref()
    }

    /// `127.0.0.1:<port>` of the JSON API.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Process id (also the process group id).
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The last `n` lines of its log (the kubelet packages log with klog).
    pub fn log_tail(&self, n: usize) -> String {
        self.proc.log_tail(n)
    }

    /// One request to the JSON API; returns the status and JSON body.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        crate::json_api::request("kubelet-node", &self.addr, method, path, body).await
    }

    async fn ok(&self, method: &str, path: &str) -> Result<Value> {
        let (status, value) = self.request(method, path, None).await?;
        if status != 200 {
            bail!("kubelet-node {method} {path}: HTTP {status}: {value}");
        }
        Ok(value)
    }

    /// Every pod record, in admission order.
    pub async fn pods(&self) -> Result<Vec<PodRecord>> {
        Ok(serde_json::from_value(self.ok("GET", "/pods").await?)?)
    }

    /// The newest record of pod `namespace/name` (a name can be reused by a new pod).
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodRecord>> {
        let v = self
            .ok("GET", &format!("/pods?namespace={namespace}&name={name}"))
            .await?;
        let mut all: Vec<PodRecord> = serde_json::from_value(v)?;
        Ok(all.pop())
    }

    /// Waits until `pod` (as returned by the API server's create: by its uid, so a reused name
    /// is no trouble) is admitted or rejected; returns its record.
    pub async fn wait_decided(&self, pod: &Pod, timeout: Duration) -> Result<PodRecord> {
        let uid = pod
            .metadata
            .uid
            .clone()
            .ok_or_else(|| anyhow!("pod without a uid: create it first"))?;
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let what = format!("{namespace}/{name} ({uid}) on harness node {}", self.node);
        let result = eventually(&what, timeout, || async {
            let v = self
                .ok("GET", &format!("/pods?namespace={namespace}&name={name}"))
                .await?;
            let all: Vec<PodRecord> = serde_json::from_value(v)?;
            Ok(all
                .into_iter()
                .find(|r| r.uid == uid && r.state != "admitting"))
        })
        .await;
        result.with_context(|| format!("kubelet-node log:\n{}", self.log_tail(30)))
    }

    /// Waits until the newest record of pod `namespace/name` is admitted or rejected; returns
    /// it. A record of an earlier pod of the same name counts: see [`HarnessNode::wait_decided`].
    pub async fn wait_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<PodRecord> {
        self.wait_pod_until(namespace, name, timeout, |r| r.state != "admitting")
            .await
    }

    /// Waits until the newest record of pod `namespace/name` satisfies `pred`.
    pub async fn wait_pod_until(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
        pred: impl Fn(&PodRecord) -> bool,
    ) -> Result<PodRecord> {
        let what = format!("{namespace}/{name} on harness node {}", self.node);
        let result = eventually(&what, timeout, || async {
            Ok(self.pod(namespace, name).await?.filter(|r| pred(r)))
        })
        .await;
        result.with_context(|| format!("kubelet-node log:\n{}", self.log_tail(30)))
    }

    /// `GET /devices`: `{"resources": {r: {"capacity", "allocatable"}}, "healthy": {r:
    /// [Device]}, "in_use": {r: [id]}, "generation", "serving"}`.
    pub async fn devices(&self) -> Result<Value> {
        self.ok("GET", "/devices").await
    }

    /// Waits until the device manager reports `allocatable` healthy devices of `resource`.
    pub async fn wait_allocatable(
        &self,
        resource: &str,
        allocatable: i64,
        timeout: Duration,
    ) -> Result<()> {
        let result = eventually(
            &format!("{allocatable} {resource} on harness node {}", self.node),
            timeout,
            || async {
                let d = self.devices().await?;
                Ok(
                    (d["resources"][resource]["allocatable"].as_i64() == Some(allocatable))
                        .then_some(()),
                )
            },
        )
        .await;
        result.with_context(|| format!("kubelet-node log:\n{}", self.log_tail(30)))
    }

    /// Events with `seq > since`, waiting up to `wait` for at least one.
    pub async fn events(&self, since: u64, wait: Duration) -> Result<Vec<Event>> {
        let v = self
            .ok(
                "GET",
                &format!("/events?since={since}&wait={}", wait.as_secs_f64()),
            )
            .await?;
        Ok(serde_json::from_value(v)?)
    }

    /// Waits until an event with `seq > since` matches `pred`; returns it.
    pub async fn wait_event(
        &self,
        since: u64,
        timeout: Duration,
        pred: impl Fn(&Event) -> bool,
    ) -> Result<Event> {
        let mut seen = since;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                bail!(
                    "no matching kubelet-node event in {timeout:?} since {since}; log:\n{}",
                    self.log_tail(30)
                );
            }
            for e in self.events(seen, left.min(Duration::from_secs(5))).await? {
                seen = seen.max(e.seq);
                if pred(&e) {
                    return Ok(e);
                }
            }
        }
    }

    /// Waits until the record of `pod` (as returned by the API server's create, by uid)
    /// satisfies `pred`; returns it.
    pub async fn wait_record(
        &self,
        pod: &Pod,
        timeout: Duration,
        pred: impl Fn(&PodRecord) -> bool,
    ) -> Result<PodRecord> {
        let uid = pod
            .metadata
            .uid
            .clone()
            .ok_or_else(|| anyhow!("pod without a uid: create it first"))?;
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let what = format!("{namespace}/{name} ({uid}) on harness node {}", self.node);
        let result = eventually(&what, timeout, || async {
            let v = self
                .ok("GET", &format!("/pods?namespace={namespace}&name={name}"))
                .await?;
            let all: Vec<PodRecord> = serde_json::from_value(v)?;
            Ok(all.into_iter().find(|r| r.uid == uid && pred(r)))
        })
        .await;
        result.with_context(|| format!("kubelet-node log:\n{}", self.log_tail(30)))
    }

    /// `GET /dra/plugins`: the DRA plugins registered with the current DRA manager, in
    /// registration order (a restart starts the list afresh; the plugin manager registers the
    /// plugins whose sockets are in the registry directory again).
    pub async fn dra_plugins(&self) -> Result<Vec<DraPlugin>> {
        let v = self.ok("GET", "/dra/plugins").await?;
        Ok(serde_json::from_value(v["plugins"].clone())?)
    }

    /// Waits until a plugin of DRA driver `driver` is registered; returns it.
    pub async fn wait_dra_plugin(&self, driver: &str, timeout: Duration) -> Result<DraPlugin> {
        let result = eventually(
            &format!(
                "DRA driver {driver} registered on harness node {}",
                self.node
            ),
            timeout,
            || async {
                Ok(self
                    .dra_plugins()
                    .await?
                    .into_iter()
                    .find(|p| p.driver == driver))
            },
        )
        .await;
        result.with_context(|| format!("kubelet-node log:\n{}", self.log_tail(30)))
    }

    /// `POST /pods/prepare?uid=`: the kubelet's next sync of a pod in `prepare_failed`: the pod
    /// is read again from the API server and `PrepareResources` called again; on success its
    /// containers start as on admission. Returns the record after the try (state `admitted`,
    /// or still `prepare_failed` with the new error).
    pub async fn retry_prepare(&self, uid: &str) -> Result<PodRecord> {
        let v = self.ok("POST", &format!("/pods/prepare?uid={uid}")).await?;
        Ok(serde_json::from_value(v)?)
    }

    /// `POST /pods/unprepare?uid=`: `UnprepareResources` again for a released pod whose
    /// unprepare failed (a terminating pod is then deleted for good). Returns the record
    /// after the try (`dra.unprepared`, or the new `dra.unprepare_error`).
    pub async fn retry_unprepare(&self, uid: &str) -> Result<PodRecord> {
        let v = self
            .ok("POST", &format!("/pods/unprepare?uid={uid}"))
            .await?;
        Ok(serde_json::from_value(v)?)
    }

    /// A kubelet restart: the device manager stops (plugins disconnected, `kubelet.sock`
    /// removed), then new topology and device managers start over the same directory, reading
    /// the checkpoint; the DRA manager and plugin manager likewise (DRA plugins whose
    /// registration sockets are still there register again). Returns the new generation.
    pub async fn restart(&self) -> Result<u64> {
        let v = self.ok("POST", "/restart").await?;
        v["generation"]
            .as_u64()
            .ok_or_else(|| anyhow!("no generation in {v}"))
    }
}

impl Drop for HarnessNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- {} ({}) last log lines ----\n{}",
                self.proc.name(),
                self.proc.log_path().display(),
                self.proc.log_tail(30)
            );
        }
        self.proc.stop();
    }
}
