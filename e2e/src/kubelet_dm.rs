//! [`KubeletDm`]: a handle on a running `kubelet-dm`, the kubelet's own
//! device-manager registration server and plugin client, driven over its
//! loopback JSON API (documented in `e2e/README.md`).
//!
//! Requests and responses use the device-plugin proto field names
//! (`devices_ids`, `container_requests`, `ID`, `health`, ...), as JSON values. Started with
//! [`KubeletDm::start_with_pod_resources`] it also serves the kubelet's PodResources API, whose
//! pods are set with [`KubeletDm::set_pod_resources`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::process::Proc;
use crate::upstream::Upstream;
use crate::wait::eventually;

/// One recorded event (see `e2e/README.md`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Event {
    /// 1, 2, ... in order of happening.
    pub seq: u64,
    /// `registered`, `disconnected` or `list_and_watch`.
    pub kind: String,
    /// The plugin's resource name.
    pub resource: String,
    /// Plugin socket path (`registered`).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `GetDevicePluginOptions` at registration (`registered`).
    #[serde(default)]
    pub options: Option<Value>,
    /// The full device list of one `ListAndWatch` response (`list_and_watch`).
    #[serde(default)]
    pub devices: Option<Vec<Value>>,
    /// Kubelet generation: 1, then +1 per simulated restart.
    pub generation: u64,
}

/// A running `kubelet-dm`; stopped when dropped.
#[derive(Debug)]
pub struct KubeletDm {
    proc: Proc,
    addr: String,
    socket: PathBuf,
    pod_resources_socket: Option<PathBuf>,
}

impl KubeletDm {
    /// Starts `kubelet-dm --socket-dir <socket_dir>`, logs under `logs`, and
    /// waits until it serves `kubelet.sock` and its HTTP API.
    pub async fn start(socket_dir: &Path, logs: &Path) -> Result<KubeletDm> {
        Self::spawn(socket_dir, None, logs).await
    }

    /// Like [`KubeletDm::start`], and also serves the kubelet's PodResources API (v1 and
    /// v1alpha1, the kubelet's own server) on the unix socket `pod_resources_socket`. What it
    /// reports is set with [`KubeletDm::set_pod_resources`]; until then, no pods.
    pub async fn start_with_pod_resources(
        socket_dir: &Path,
        pod_resources_socket: &Path,
        logs: &Path,
    ) -> Result<KubeletDm> {
        Self::spawn(socket_dir, Some(pod_resources_socket), logs).await
    }

    async fn spawn(
        socket_dir: &Path,
        pod_resources_socket: Option<&Path>,
        logs: &Path,
    ) -> Result<KubeletDm> {
        std::fs::create_dir_all(socket_dir)?;
        let mut args = vec![format!("--socket-dir={}", socket_dir.display())];
        if let Some(p) = pod_resources_socket {
            args.push(format!("--pod-resources-socket={}", p.display()));
        }
        let mut proc = Proc::spawn(
            "kubelet-dm",
            &Upstream::get()?.bin("kubelet-dm"),
            &args,
            logs,
        )?;
        let stdout = proc.stdout_path().to_path_buf();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let hello: Value = loop {
            let text = std::fs::read_to_string(&stdout).unwrap_or_default();
            if let Some(line) = text.lines().next().filter(|_| text.contains('\n')) {
                break serde_json::from_str(line)
                    .with_context(|| format!("kubelet-dm hello line {line:?}"))?;
            }
            proc.check_running()?;
            if tokio::time::Instant::now() > deadline {
                bail!("kubelet-dm printed nothing in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let addr = hello["addr"]
            .as_str()
            .ok_or_else(|| anyhow!("no addr in {hello}"))?
            .to_string();
        let socket = PathBuf::from(
            hello["socket"]
                .as_str()
                .ok_or_else(|| anyhow!("no socket in {hello}"))?,
        );
        let pod_resources_socket = hello["pod_resources_socket"].as_str().map(PathBuf::from);
        if pod_resources_socket.is_none() && args.len() > 1 {
            bail!("kubelet-dm hello {hello} names no pod_resources_socket");
        }
        Ok(KubeletDm {
            proc,
            addr,
            socket,
            pod_resources_socket,
        })
    }

    /// The `kubelet.sock` path it serves Registration on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The PodResources socket, when started with one.
    pub fn pod_resources_socket(&self) -> Option<&Path> {
        self.pod_resources_socket.as_deref()
    }

    /// `127.0.0.1:<port>` of the JSON API.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.proc.log_tail(n)
    }

    /// One HTTP/1.0 request to the API; returns the status and JSON body.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        crate::json_api::request("kubelet-dm", &self.addr, method, path, body).await
    }

    async fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, value) = self.request(method, path, body).await?;
        if status != 200 {
            bail!("kubelet-dm {method} {path}: HTTP {status}: {value}");
        }
        Ok(value)
    }

    /// Events with `seq > since`, waiting up to `wait` for at least one.
    pub async fn events(&self, since: u64, wait: Duration) -> Result<Vec<Event>> {
        let v = self
            .ok(
                "GET",
                &format!("/events?since={since}&wait={}", wait.as_secs_f64()),
                None,
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
        let mut all = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                bail!(
                    "no matching kubelet-dm event in {timeout:?}; events since {since}: {all:#?}\nlog:\n{}",
                    self.log_tail(30)
                );
            }
            for e in self.events(seen, left.min(Duration::from_secs(5))).await? {
                seen = seen.max(e.seq);
                if pred(&e) {
                    return Ok(e);
                }
                all.push(e);
            }
        }
    }

    /// `GET /state`: connected plugins, latest devices, generation.
    pub async fn state(&self) -> Result<Value> {
        self.ok("GET", "/state", None).await
    }

    /// `GetDevicePluginOptions` through the kubelet's client.
    pub async fn options(&self, resource: &str) -> Result<Value> {
        self.ok("POST", "/options", Some(&json!({"resource": resource})))
            .await
    }

    /// `GetPreferredAllocation`; `request` is a `PreferredAllocationRequest`.
    pub async fn preferred(&self, resource: &str, request: Value) -> Result<Value> {
        self.ok(
            "POST",
            "/preferred",
            Some(&json!({"resource": resource, "request": request})),
        )
        .await
    }

    /// `GetPreferredAllocation` for one container asking `size` of `available`: the ids the
    /// plugin prefers.
    pub async fn preferred_ids(
        &self,
        resource: &str,
        available: &[String],
        size: i32,
    ) -> Result<Vec<String>> {
        let r = self
            .preferred(
                resource,
                json!({"container_requests": [{"available_deviceIDs": available, "allocation_size": size}]}),
            )
            .await?;
        r["container_responses"][0]["deviceIDs"]
            .as_array()
            .ok_or_else(|| anyhow!("no deviceIDs in {r}"))?
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| anyhow!("a device id that is not a string in {r}"))
            })
            .collect()
    }

    /// `Allocate`; `request` is an `AllocateRequest`.
    pub async fn allocate(&self, resource: &str, request: Value) -> Result<Value> {
        self.ok(
            "POST",
            "/allocate",
            Some(&json!({"resource": resource, "request": request})),
        )
        .await
    }

    /// `PreStartContainer`; `request` is a `PreStartContainerRequest`.
    pub async fn prestart(&self, resource: &str, request: Value) -> Result<Value> {
        self.ok(
            "POST",
            "/prestart",
            Some(&json!({"resource": resource, "request": request})),
        )
        .await
    }

    /// Simulates a kubelet restart; returns the new generation.
    pub async fn restart(&self) -> Result<u64> {
        let v = self.ok("POST", "/restart", None).await?;
        v["generation"]
            .as_u64()
            .ok_or_else(|| anyhow!("no generation in {v}"))
    }

    /// Waits until the latest device list of `resource` satisfies `pred`.
    pub async fn wait_devices(
        &self,
        resource: &str,
        timeout: Duration,
        pred: impl Fn(&[Value]) -> bool,
    ) -> Result<Vec<Value>> {
        eventually(
            &format!("kubelet-dm devices of {resource}"),
            timeout,
            || async {
                let st = self.state().await?;
                let devs: Vec<Value> = st["devices"][resource]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                Ok(pred(&devs).then_some(devs))
            },
        )
        .await
    }

    /// `POST /podresources`: sets what the PodResources API reports from now on. `state` is
    /// either an array of pods or `{"pods": [...], "allocatable": {...}}` (see
    /// `e2e/README.md`); a pod is `{"name", "namespace", "uid", "containers": [{"name",
    /// "cpu_ids": [..], "devices": [{"resource_name", "device_ids": [..]}]}]}`. Returns what
    /// `GET /podresources` does, including the kubelet server's own `List` answer.
    pub async fn set_pod_resources(&self, state: Value) -> Result<Value> {
        self.ok("POST", "/podresources", Some(&state)).await
    }

    /// `GET /podresources`: `{"state", "list", "serving", "socket"}`; `list` is the
    /// `ListPodResourcesResponse` of the kubelet's server for the state set.
    pub async fn pod_resources(&self) -> Result<Value> {
        self.ok("GET", "/podresources", None).await
    }

    /// Stops serving PodResources. The socket file stays and refuses connections, as after a
    /// kubelet crash.
    pub async fn stop_pod_resources(&self) -> Result<()> {
        self.ok("POST", "/podresources/stop", None).await.map(drop)
    }

    /// Serves PodResources again (same state) after [`KubeletDm::stop_pod_resources`].
    pub async fn start_pod_resources(&self) -> Result<()> {
        self.ok("POST", "/podresources/start", None).await.map(drop)
    }
}
