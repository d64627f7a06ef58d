//! [`TestCluster`]: etcd + kube-apiserver on loopback, plus optional
//! kube-scheduler, Volcano, `kubelet-dm` and harness nodes, all torn down on drop.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::Deserialize;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::harness_node::{HarnessNode, HarnessOptions};
use crate::kubelet_dm::KubeletDm;
use crate::pki::Pki;
use crate::process::Proc;
use crate::upstream::{Upstream, e2e_dir};
pub use crate::wait::{Fatal, eventually};

/// Set to keep the temp dir (certs, logs, etcd data) after the test.
pub const ENV_KEEP: &str = "FUMAROLE_E2E_KEEP";

/// `k/n`: this process is lane k (1-based) of n test processes running at once (e2e/ci.sh), and
/// [`free_port`] draws only from the k-th of n equal parts of its range, so two processes never
/// hand out the same port (each one's registry knows only its own).
pub const ENV_PORT_LANE: &str = "FUMAROLE_E2E_PORT_LANE";

/// The server-side-apply field manager the helper uses.
pub const FIELD_MANAGER: &str = "fumarole-e2e";

/// Volcano controllers started by [`TestCluster::start_volcano`]; the others
/// (jobflow, jobtemplate) need CRDs Volcano ships separately.
pub const VOLCANO_CONTROLLERS: &str = "pg-controller,queue-controller,job-controller,gc-controller";

/// A Node object to create: no kubelet behind it, just the API object with
/// capacity (= allocatable), labels and a `Ready` condition.
#[derive(Debug, Clone, Default)]
pub struct NodeSpec {
    /// Node name; also the `kubernetes.io/hostname` label.
    pub name: String,
    /// Resource name to quantity, e.g. `cpu` => `4`. `pods` defaults to `110`.
    pub capacity: BTreeMap<String, String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

impl NodeSpec {
    /// A node with no resources beyond `pods: 110`.
    pub fn new(name: &str) -> Self {
        NodeSpec {
            name: name.to_string(),
            ..Default::default()
        }
    }

    /// Adds one capacity entry.
    pub fn capacity(mut self, resource: &str, quantity: &str) -> Self {
        self.capacity
            .insert(resource.to_string(), quantity.to_string());
        self
    }

    /// Adds one label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }
}

/// Who a client or kubeconfig acts as: the admin token impersonates the user, groups and
/// extra fields, so RBAC and admission decide as they would for that identity.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    pub fn user(user: &str, groups: &[&str]) -> Self {
        Identity {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: BTreeMap::new(),
        }
    }

    /// ServiceAccount `namespace/name`, with the groups a real token carries.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        let ns_group = format!("system:serviceaccounts:{namespace}");
        Self::user(
            &format!("system:serviceaccount:{namespace}:{name}"),
            &["system:serviceaccounts", &ns_group],
        )
    }

    /// The same identity with a token bound to a pod on `node`, as the kubelet projects
    /// ServiceAccount tokens (the node's name in the user's extra).
    pub fn on_node(mut self, node: &str) -> Self {
        self.extra.insert(
            "authentication.kubernetes.io/node-name".into(),
            vec![node.into()],
        );
        self
    }
}

/// The API server's audit policy: metadata of every write (not reads: they are most requests).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
";

/// The audit log, under the cluster's root.
const AUDIT_LOG: &str = "audit.log";

/// A real control plane for one test. See the crate docs.
pub struct TestCluster {
    procs: Mutex<Vec<Proc>>,
    /// kube-apiserver's program and arguments, to start it again after [`TestCluster::stop_apiserver`].
    apiserver: (PathBuf, Vec<String>),
    dir: Option<TempDir>,
    root: PathBuf,
    server: String,
    admin_token: String,
    admin_kubeconfig: PathBuf,
    client: Client,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("root", &self.root)
            .field("server", &self.server)
            .finish()
    }
}

/// A Volcano scheduler configuration: the usual actions and plugin tiers, with `extra`
/// appended to the second tier (YAML list items indented by two spaces, e.g.
/// `"  - name: numa-aware\n"`).
pub fn volcano_conf(extra: &str) -> String {
    format!(
        "actions: \"enqueue, allocate, backfill\"\ntiers:\n- plugins:\n  - name: priority\n  - name: gang\n  - name: conformance\n- plugins:\n  - name: drf\n  - name: predicates\n  - name: proportion\n  - name: nodeorder\n{extra}"
    )
}

/// The raw HTTP/1.0 response to `GET path` on `127.0.0.1:port` (headers and body).
pub async fn http_get(port: u16, path: &str) -> Result<String> {
    http_request(port, &format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")).await
}

/// The body of the HTTP/1.0 response to `POST path` with a JSON `body` on `127.0.0.1:port`.
pub async fn http_post_json(port: u16, path: &str, body: &Value) -> Result<String> {
    let body = body.to_string();
    let response = http_request(
        port,
        &format!(
            "POST {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await?;
    match response.split_once("\r\n\r\n") {
        Some((_, body)) => Ok(body.to_string()),
        None => bail!("no HTTP body in {response:?}"),
    }
}

async fn http_request(port: u16, request: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream.write_all(request.as_bytes()).await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text)
}

/// The sum of the samples of Prometheus metric lines starting with `prefix` in `text` (a
/// `/metrics` body): `name` for all label sets, `name{label="x"}` for one.
pub fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A TCP port on 127.0.0.1 that is free when this returns and that no earlier call in this
/// process returned.
///
/// Asking the kernel for port 0 hands out a port from the ephemeral range, which every outgoing
/// connection draws from too: between this call and the server's own bind, a client socket of
/// the same test could take it (etcd once failed so with "address already in use"). So the port
/// is drawn at random below that range, where the kernel never picks one by itself; and, when
/// [`ENV_PORT_LANE`] says so, from this process's lane of it.
pub fn free_port() -> Result<u16> {
    use std::hash::BuildHasher;
    static GIVEN: Mutex<std::collections::BTreeSet<u16>> =
        Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN
        .lock()
        .map_err(|_| anyhow!("port registry poisoned"))?;
    let (low, high) = match ephemeral_ports() {
        (ephemeral_low, _) if ephemeral_low > 12_000 => (10_000, ephemeral_low - 1),
        // No room below the range: draw from it, still never twice.
        range => range,
    };
    let (low, high) = lane_of(low, high, std::env::var(ENV_PORT_LANE).ok().as_deref())?;
    let random = std::collections::hash_map::RandomState::new();
    for attempt in 0..1_000u32 {
        let span = u64::from(high - low) + 1;
        let port = low + (random.hash_one(attempt) % span) as u16;
        if given.contains(&port) || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        given.insert(port);
        return Ok(port);
    }
    bail!("no free port in {low}..={high} after 1000 tries")
}

/// The `k/n` lane of `low..=high` (all of it without a lane).
fn lane_of(low: u16, high: u16, lane: Option<&str>) -> Result<(u16, u16)> {
    let Some(lane) = lane else {
        return Ok((low, high));
    };
    let parsed = lane
        .split_once('/')
        .and_then(|(k, n)| Some((k.parse::<u32>().ok()?, n.parse::<u32>().ok()?)));
    let (k, n) = match parsed {
        Some((k, n)) if (1..=n).contains(&k) => (k, n),
        _ => bail!("{ENV_PORT_LANE}={lane:?}: expected k/n with 1 <= k <= n"),
    };
    let width = (u32::from(high) - u32::from(low) + 1) / n;
    if width == 0 {
        bail!("{ENV_PORT_LANE}={lane}: {low}..={high} has too few ports for {n} lanes");
    }
    let start = u32::from(low) + (k - 1) * width;
    // Both ends lie within low..=high, so they fit in u16.
    Ok((start as u16, (start + width - 1) as u16))
}

/// The kernel's ephemeral port range (`ip_local_port_range`), or Linux's default.
fn ephemeral_ports() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .unwrap_or((32_768, 60_999))
}

fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

impl TestCluster {
    /// Starts etcd and kube-apiserver and waits until the apiserver is ready. A start that
    /// fails because another program took one of its ports between [`free_port`] and the
    /// server's bind is tried again with new ports, twice at most.
    pub async fn start() -> Result<TestCluster> {
        let mut tries = 0;
        loop {
            tries += 1;
            match Self::start_once().await {
                Err(e) if tries < 3 && format!("{e:#}").contains("address already in use") => {
                    eprintln!("cluster start lost a port race, starting again: {e:#}");
                }
                result => return result,
            }
        }
    }

    async fn start_once() -> Result<TestCluster> {
        let up = Upstream::get()?;
        let dir = tempfile::Builder::new()
            .prefix("fumarole-e2e-")
            .tempdir()
            .context("creating the cluster temp dir")?;
        let root = dir.path().to_path_buf();
        let logs = root.join("logs");
        let pki = Pki::write(&root.join("pki"))?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let api_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");

        let mut procs = Vec::new();
        procs.push(Proc::spawn(
            "etcd",
            &up.bin("etcd"),
            &[
                "--name=e2e".to_string(),
                format!("--data-dir={}", root.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=e2e={peer_url}"),
                "--unsafe-no-fsync=true".to_string(),
                "--log-level=warn".to_string(),
            ],
            &logs,
        )?);

        let admin_token = random_hex(24)?;
        let tokens = root.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{admin_token},fumarole-e2e-admin,fumarole-e2e-admin,\"system:masters\"\n"),
        )?;
        // Every write the API server accepts or refuses, one JSON line each (TestCluster::audited_writes).
        let audit_policy = root.join("audit-policy.yaml");
        std::fs::write(&audit_policy, AUDIT_POLICY)?;
        let issuer = "https://kubernetes.default.svc.cluster.local";
        let apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", root.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            format!("--token-auth-file={}", tokens.display()),
            "--authorization-mode=RBAC".to_string(),
            format!("--service-account-issuer={issuer}"),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            "--service-cluster-ip-range=10.96.0.0/16".to_string(),
            // No kubelets and no node-lifecycle controller: created nodes must
            // not get the not-ready taint; no token controller: pods must not
            // need the default ServiceAccount to exist.
            "--disable-admission-plugins=TaintNodesByCondition,ServiceAccount".to_string(),
            "--allow-privileged=true".to_string(),
            "--profiling=false".to_string(),
            // Endpoints may not be loopback; nothing here needs the
            // `kubernetes` service endpoints.
            "--endpoint-reconciler-type=none".to_string(),
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--audit-log-path={}", root.join(AUDIT_LOG).display()),
        ];
        procs.push(Proc::spawn(
            "kube-apiserver",
            &up.bin("kube-apiserver"),
            &apiserver_args,
            &logs,
        )?);

        let server = format!("https://127.0.0.1:{api_port}");
        let admin_kubeconfig = root.join("admin.kubeconfig");
        std::fs::write(
            &admin_kubeconfig,
            kubeconfig_yaml(&server, &pki.ca_cert, &admin_token, None),
        )?;

        let client = make_client(&server, &pki.ca_cert, &admin_token, None).await?;
        let cluster = TestCluster {
            procs: Mutex::new(procs),
            apiserver: (up.bin("kube-apiserver"), apiserver_args),
            dir: Some(dir),
            root,
            server,
            admin_token,
            admin_kubeconfig,
            client,
        };
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    async fn wait_ready(&self) -> Result<()> {
        let client = self.client.clone();
        eventually("kube-apiserver /readyz", Duration::from_secs(120), || {
            let client = client.clone();
            async move {
                self.check_processes()?;
                let req = http::Request::get("/readyz").body(Vec::new())?;
                Ok(match client.request_text(req).await {
                    Ok(body) if body.trim() == "ok" => Some(()),
                    _ => None,
                })
            }
        })
        .await?;
        let ns: Api<Namespace> = Api::all(self.client.clone());
        eventually("namespace default", Duration::from_secs(60), || {
            let ns = ns.clone();
            async move { Ok(ns.get_opt("default").await?.map(|_| ())) }
        })
        .await
    }

    /// Stops kube-apiserver (etcd keeps running): clients see connection errors until
    /// [`TestCluster::start_apiserver`].
    pub fn stop_apiserver(&self) -> Result<()> {
        self.stop("kube-apiserver")
    }

    /// Stops the cluster's process `name` (e.g. `kube-scheduler`) for good.
    pub fn stop(&self, name: &str) -> Result<()> {
        let mut procs = self
            .procs
            .lock()
            .map_err(|_| anyhow!("process list poisoned"))?;
        let i = procs
            .iter()
            .position(|p| p.name() == name)
            .ok_or_else(|| anyhow!("{name} is not running"))?;
        procs.remove(i).stop();
        Ok(())
    }

    /// Starts kube-apiserver again on the same port with the same certificates and waits
    /// until it is ready.
    pub async fn start_apiserver(&self) -> Result<()> {
        {
            let mut procs = self
                .procs
                .lock()
                .map_err(|_| anyhow!("process list poisoned"))?;
            let restarts = procs
                .iter()
                .filter(|p| p.name().starts_with("kube-apiserver"))
                .count();
            let name = if restarts == 0 {
                "kube-apiserver".to_string()
            } else {
                format!("kube-apiserver-{restarts}")
            };
            let (program, args) = &self.apiserver;
            procs.push(Proc::spawn(&name, program, args, &self.root.join("logs"))?);
        }
        self.wait_ready().await
    }

    /// Starts the cluster's process `name` again if it has exited (as a Deployment would
    /// restart its pod); returns whether it did.
    pub fn restart_if_exited(&self, name: &str) -> Result<bool> {
        let mut procs = self
            .procs
            .lock()
            .map_err(|_| anyhow!("process list poisoned"))?;
        match procs.iter_mut().find(|p| p.name() == name) {
            Some(p) => p.restart_if_exited(),
            None => bail!("no process {name} in the cluster"),
        }
    }

    /// Fails (with a [`Fatal`] error) if any started process has exited,
    /// with its log tail.
    pub fn check_processes(&self) -> Result<()> {
        let mut procs = self
            .procs
            .lock()
            .map_err(|_| anyhow!("process list poisoned"))?;
        for p in procs.iter_mut() {
            p.check_running()
                .map_err(|e| anyhow::Error::new(Fatal(format!("{e:#}"))))?;
        }
        Ok(())
    }

    fn ca_cert(&self) -> PathBuf {
        self.root.join("pki").join("ca.crt")
    }

    /// The cluster-admin client (group `system:masters`).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// `https://127.0.0.1:<port>`
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The temp dir holding certs, logs (`logs/`) and etcd data.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The writes the API server has audited so far (`audit.k8s.io/v1` Events, metadata level,
    /// stage `ResponseComplete` or `Panic`), oldest first. The log is written as requests finish
    /// (the log backend blocks), so a write that returned is in it.
    pub fn audited_writes(&self) -> Result<Vec<Value>> {
        let text = std::fs::read_to_string(self.root.join(AUDIT_LOG))
            .context("reading the API server's audit log")?;
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let event: Value = serde_json::from_str(line).context("an audit log line")?;
            if event["stage"] != "ResponseStarted" {
                out.push(event);
            }
        }
        Ok(out)
    }

    /// A kubeconfig file with the admin token, for other processes.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A client that acts as `user` in `groups` (impersonation), so RBAC
    /// decides what it may do. `system:authenticated` is added by the apiserver.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Result<Client> {
        self.client_for(&Identity::user(user, groups)).await
    }

    /// A client acting as ServiceAccount `namespace/name`, with the groups a
    /// real ServiceAccount token carries.
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> Result<Client> {
        self.client_for(&Identity::service_account(namespace, name))
            .await
    }

    /// A client acting as `who` (impersonated by the admin token).
    pub async fn client_for(&self, who: &Identity) -> Result<Client> {
        make_client(&self.server, &self.ca_cert(), &self.admin_token, Some(who)).await
    }

    /// Writes a kubeconfig for `user`/`groups` (impersonated by the admin
    /// token) into the temp dir, for a process under test.
    pub fn kubeconfig_as(&self, file_name: &str, user: &str, groups: &[&str]) -> Result<PathBuf> {
        self.kubeconfig_for(file_name, &Identity::user(user, groups))
    }

    /// Writes a kubeconfig acting as `who` into the temp dir, for a process under test.
    pub fn kubeconfig_for(&self, file_name: &str, who: &Identity) -> Result<PathBuf> {
        let path = self.root.join(file_name);
        std::fs::write(
            &path,
            kubeconfig_yaml(&self.server, &self.ca_cert(), &self.admin_token, Some(who)),
        )?;
        Ok(path)
    }

    /// Creates a namespace (no-op if it exists).
    pub async fn create_namespace(&self, name: &str) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Installs (server-side applies) every CRD in a YAML text (multi-document
    /// allowed) and waits until each is `Established`. Returns the CRD names.
    pub async fn install_crds_yaml(&self, yaml: &str) -> Result<Vec<String>> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let mut names = Vec::new();
        for doc in serde_norway::Deserializer::from_str(yaml) {
            let v = Value::deserialize(doc)?;
            if v.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(v)?;
            let name = crd
                .metadata
                .name
                .clone()
                .ok_or_else(|| anyhow!("CRD without a name"))?;
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("applying CRD {name}"))?;
            names.push(name);
        }
        for name in &names {
            let api = api.clone();
            eventually(
                &format!("CRD {name} Established"),
                Duration::from_secs(30),
                || {
                    let api = api.clone();
                    async move {
                        let crd = api.get(name).await?;
                        let established = crd
                            .status
                            .and_then(|s| s.conditions)
                            .unwrap_or_default()
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True");
                        Ok(established.then_some(()))
                    }
                },
            )
            .await?;
        }
        Ok(names)
    }

    /// Installs the CRDs in one file.
    pub async fn install_crd_file(&self, path: &Path) -> Result<Vec<String>> {
        let yaml =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        self.install_crds_yaml(&yaml).await
    }

    /// Volcano's CRDs: those of the pinned Volcano module, except that files
    /// in `e2e/crds/volcano-overrides/` (copied from `shared/reference/`:
    /// the newer `numatopologies` and `hypernodes` schemas) replace or add to them.
    pub async fn install_volcano_crds(&self) -> Result<Vec<String>> {
        let overrides = e2e_dir().join("crds").join("volcano-overrides");
        let mut files: BTreeMap<String, PathBuf> = BTreeMap::new();
        for d in [Upstream::get()?.volcano_crds(), overrides] {
            for entry in
                std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))?
            {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "yaml")
                    && let Some(name) = path.file_name().and_then(|n| n.to_str())
                {
                    files.insert(name.to_string(), path.clone());
                }
            }
        }
        let mut names = Vec::new();
        for path in files.values() {
            names.extend(self.install_crd_file(path).await?);
        }
        Ok(names)
    }

    /// Installs every `*.yaml` file in `dir` (sorted by name), e.g. the
    /// project's own CRDs.
    pub async fn install_crd_dir(&self, dir: &Path) -> Result<Vec<String>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
        files.sort();
        let mut names = Vec::new();
        for path in &files {
            names.extend(self.install_crd_file(path).await?);
        }
        Ok(names)
    }

    /// The `NodeResourceTopology` CRD (topology.node.k8s.io/v1alpha2).
    pub async fn install_nrt_crd(&self) -> Result<Vec<String>> {
        self.install_crd_file(
            &e2e_dir()
                .join("crds")
                .join("noderesourcetopology-v1alpha2.crd.yaml"),
        )
        .await
    }

    /// Creates a Node with capacity = allocatable, the given labels, and a
    /// `Ready` condition, as a kubelet would.
    pub async fn create_node(&self, spec: &NodeSpec) -> Result<Node> {
        let mut labels = spec.labels.clone();
        labels
            .entry("kubernetes.io/hostname".to_string())
            .or_insert_with(|| spec.name.clone());
        labels
            .entry("kubernetes.io/os".to_string())
            .or_insert_with(|| "linux".to_string());
        let mut capacity = spec.capacity.clone();
        capacity
            .entry("pods".to_string())
            .or_insert_with(|| "110".to_string());
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = json!({
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "fumarole-e2e node object", "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
        });
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": spec.name, "labels": labels},
            "status": status,
        }))?;
        let api: Api<Node> = Api::all(self.client());
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating node {}", spec.name))?;
        let node = api
            .patch_status(
                &spec.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .with_context(|| format!("setting status of node {}", spec.name))?;
        Ok(node)
    }

    /// Starts any program as part of the cluster (stopped on drop), with `KUBECONFIG` set
    /// to the admin kubeconfig plus `env`. Its stderr is `log_tail(name, ..)`.
    pub fn start_program(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<()> {
        let kubeconfig = self.admin_kubeconfig.display().to_string();
        let mut all_env = vec![("KUBECONFIG", kubeconfig.as_str())];
        all_env.extend_from_slice(env);
        let p = Proc::spawn_with_env(name, program, args, &all_env, &self.root.join("logs"))?;
        self.adopt(p)
    }

    /// Makes a started process part of the cluster, as [`TestCluster::start_program`] does:
    /// stopped on drop or by [`TestCluster::stop`], watched by
    /// [`TestCluster::check_processes`].
    pub fn adopt(&self, p: Proc) -> Result<()> {
        self.procs
            .lock()
            .map_err(|_| anyhow!("process list poisoned"))?
            .push(p);
        Ok(())
    }

    /// Waits until `url`/healthz answers (the cluster's processes still running).
    pub async fn wait_healthz(&self, what: &str, url: &str) -> Result<()> {
        self.wait_ok(what, url, "/healthz").await
    }

    /// Waits until `url``path` answers 200 (the cluster's processes still running).
    pub async fn wait_ok(&self, what: &str, url: &str, path: &str) -> Result<()> {
        let mut config = Config::new(url.parse()?);
        config.accept_invalid_certs = true;
        config.auth_info.token = Some(self.admin_token.clone().into());
        let client = Client::try_from(config)?;
        eventually(&format!("{what} {path}"), Duration::from_secs(60), || {
            let client = client.clone();
            async move {
                self.check_processes()?;
                let req = http::Request::get(path).body(Vec::new())?;
                Ok(client.request_text(req).await.ok().map(|_| ()))
            }
        })
        .await
    }

    /// Starts kube-scheduler with a `KubeSchedulerConfiguration` (YAML; empty
    /// for the default). `clientConnection.kubeconfig` is set to the admin
    /// kubeconfig and leader election is turned off. Waits for `/healthz`; returns the HTTPS
    /// port, whose `/metrics` anyone may read (`curl -k`).
    pub async fn start_kube_scheduler(&self, config_yaml: &str) -> Result<u16> {
        self.start_scheduler_binary("kube-scheduler", config_yaml, &[])
            .await
    }

    /// [`TestCluster::start_kube_scheduler`] with another kube-scheduler build from the
    /// upstream `bin/`: `nrt-scheduler` is kube-scheduler v1.34.7 with scheduler-plugins'
    /// NodeResourceTopologyMatch. `extra` are more flags (`--v=4`). Its log is
    /// `log_tail(bin, ..)`.
    pub async fn start_scheduler_binary(
        &self,
        bin: &str,
        config_yaml: &str,
        extra: &[&str],
    ) -> Result<u16> {
        self.start_scheduler_program(bin, &Upstream::get()?.bin(bin), config_yaml, extra)
            .await
    }

    /// [`TestCluster::start_scheduler_binary`] with a kube-scheduler build from anywhere
    /// (fumarole's, with its plugin compiled in: [`crate::fumarole::kube_plugin_bin`]), known
    /// to the cluster as `name`.
    pub async fn start_scheduler_program(
        &self,
        name: &str,
        program: &Path,
        config_yaml: &str,
        extra: &[&str],
    ) -> Result<u16> {
        self.start_scheduler_program_as(name, program, config_yaml, None, extra)
            .await
    }

    /// [`TestCluster::start_scheduler_program`] acting as `kubeconfig` says (one
    /// [`TestCluster::kubeconfig_for`] wrote: a ServiceAccount's rights), with leader election
    /// as the configuration has it; `None`: as admin, without leader election.
    pub async fn start_scheduler_program_as(
        &self,
        name: &str,
        program: &Path,
        config_yaml: &str,
        kubeconfig: Option<&Path>,
        extra: &[&str],
    ) -> Result<u16> {
        let mut cfg: Value = if config_yaml.trim().is_empty() {
            json!({})
        } else {
            serde_norway::from_str(config_yaml).context("parsing KubeSchedulerConfiguration")?
        };
        let obj = cfg
            .as_object_mut()
            .ok_or_else(|| anyhow!("KubeSchedulerConfiguration must be a mapping"))?;
        obj.entry("apiVersion")
            .or_insert_with(|| json!("kubescheduler.config.k8s.io/v1"));
        obj.entry("kind")
            .or_insert_with(|| json!("KubeSchedulerConfiguration"));
        let admin = self.admin_kubeconfig.display().to_string();
        let client = kubeconfig.map_or(admin.clone(), |k| k.display().to_string());
        merge(obj, "clientConnection", json!({ "kubeconfig": client }));
        if kubeconfig.is_none() {
            merge(obj, "leaderElection", json!({ "leaderElect": false }));
        }
        let path = self.root.join(format!("{name}.yaml"));
        std::fs::write(&path, serde_norway::to_string(&cfg)?)?;
        let port = free_port()?;
        self.start_program(
            name,
            program,
            &[
                format!("--config={}", path.display()),
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={port}"),
                format!("--authentication-kubeconfig={admin}"),
                format!("--authorization-kubeconfig={admin}"),
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".to_string(),
            ]
            .into_iter()
            .chain(extra.iter().map(|a| a.to_string()))
            .collect::<Vec<_>>(),
            &[],
        )?;
        self.wait_healthz(name, &format!("https://127.0.0.1:{port}"))
            .await?;
        Ok(port)
    }

    /// Installs Volcano's CRDs, then starts vc-controller-manager (the
    /// [`VOLCANO_CONTROLLERS`]) and vc-scheduler with `scheduler_conf` (the
    /// `actions:`/`tiers:` YAML of `--scheduler-conf`; empty for Volcano's
    /// built-in default). Waits for both `/healthz`.
    pub async fn start_volcano(&self, scheduler_conf: &str) -> Result<()> {
        self.start_volcano_with(&Upstream::get()?.bin("vc-scheduler"), scheduler_conf)
            .await
    }

    /// [`TestCluster::start_volcano`] with another vc-scheduler binary (fumarole's, with its
    /// plugin compiled in: [`crate::fumarole::volcano_plugin_bin`]); its log is still
    /// `log_tail("vc-scheduler", ..)`.
    pub async fn start_volcano_with(&self, scheduler: &Path, scheduler_conf: &str) -> Result<()> {
        self.start_volcano_as(scheduler, scheduler_conf, &self.admin_kubeconfig)
            .await
    }

    /// [`TestCluster::start_volcano_with`], the scheduler acting as `scheduler_kubeconfig`
    /// says (one [`TestCluster::kubeconfig_for`] wrote: a ServiceAccount's rights); the
    /// controller manager stays admin.
    pub async fn start_volcano_as(
        &self,
        scheduler: &Path,
        scheduler_conf: &str,
        scheduler_kubeconfig: &Path,
    ) -> Result<()> {
        self.install_volcano_crds().await?;
        let controller_manager = Upstream::get()?.bin("vc-controller-manager");
        self.start_volcano_parts(
            &controller_manager,
            scheduler,
            scheduler_conf,
            scheduler_kubeconfig,
        )
        .await
    }

    /// [`TestCluster::start_volcano_with`] on another Volcano release: its CRDs (only its own,
    /// no overrides) and its vc-controller-manager, with `scheduler` (built against it).
    pub async fn start_volcano_release(
        &self,
        release: &crate::upstream::VolcanoRelease,
        scheduler: &Path,
        scheduler_conf: &str,
    ) -> Result<()> {
        self.install_crd_dir(&release.crds).await?;
        self.start_volcano_parts(
            &release.controller_manager,
            scheduler,
            scheduler_conf,
            &self.admin_kubeconfig,
        )
        .await
    }

    async fn start_volcano_parts(
        &self,
        controller_manager: &Path,
        scheduler: &Path,
        scheduler_conf: &str,
        scheduler_kubeconfig: &Path,
    ) -> Result<()> {
        let kubeconfig = self.admin_kubeconfig.display().to_string();
        let cm_health = free_port()?;
        self.start_program(
            "vc-controller-manager",
            controller_manager,
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--leader-elect=false".to_string(),
                format!("--controllers={VOLCANO_CONTROLLERS}"),
                // Level 2 adds the line for a Job whose sync failed and is tried again: the
                // reason a Job got no pods, when one does not.
                "-v=2".to_string(),
                "--enable-healthz=true".to_string(),
                format!("--healthz-address=127.0.0.1:{cm_health}"),
            ],
            &[],
        )?;
        let mut args = vec![
            format!("--kubeconfig={}", scheduler_kubeconfig.display()),
            "--leader-elect=false".to_string(),
            // Level 2: a task resynced after a failed bind, and fumarole's plugin naming a task
            // Volcano put elsewhere than fumarole's best node (a few lines a run).
            "-v=2".to_string(),
            format!("--listen-address=127.0.0.1:{}", free_port()?),
            "--enable-healthz=true".to_string(),
            // SIGUSR1 writes the nodes of its cache to a file there: how the harness knows
            // the scheduler has every node ([`TestCluster::wait_volcano_has_every_node`]).
            "--cache-dumper=true".to_string(),
            format!("--cache-dump-dir={}", self.volcano_dump_dir()?.display()),
        ];
        let sched_health = free_port()?;
        args.push(format!("--healthz-address=127.0.0.1:{sched_health}"));
        if !scheduler_conf.trim().is_empty() {
            let path = self.root.join("volcano-scheduler.conf");
            std::fs::write(&path, scheduler_conf)?;
            args.push(format!("--scheduler-conf={}", path.display()));
        }
        self.start_program("vc-scheduler", scheduler, &args, &[])?;
        self.wait_healthz(
            "vc-controller-manager",
            &format!("http://127.0.0.1:{cm_health}"),
        )
        .await?;
        self.wait_healthz("vc-scheduler", &format!("http://127.0.0.1:{sched_health}"))
            .await?;
        self.wait_volcano_has_every_node().await
    }

    fn volcano_dump_dir(&self) -> Result<PathBuf> {
        let dir = self.root.join("volcano-cache-dumps");
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Waits until vc-scheduler's cache holds every Ready Node the API server lists. Its
    /// healthz and informer sync say nothing of that: Volcano adds nodes to its cache from a
    /// work queue that `WaitForCacheSync` does not wait for, so a session opened just after the
    /// start sees only the nodes synced so far and places a pod on the rest (the exact-fit
    /// flake in docs/testing.md). Volcano's cache dumper (SIGUSR1) writes the nodes a session
    /// would see, as a JSON object keyed by name (v1.14 writes more values after it).
    pub async fn wait_volcano_has_every_node(&self) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client());
        let want: Vec<String> = nodes
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(node_is_ready)
            .filter_map(|n| n.metadata.name)
            .collect();
        let pid = self
            .pids()?
            .into_iter()
            .rev()
            .find(|(name, _)| name == "vc-scheduler")
            .map(|(_, pid)| pid)
            .context("vc-scheduler is not running")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        let dir = self.volcano_dump_dir()?;
        let mut missing = want.clone();
        let mut said = false;
        for _ in 0..300 {
            self.check_processes()?;
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            // A dump being written does not parse yet; the next round reads it.
            for entry in std::fs::read_dir(&dir)? {
                let Ok(text) = std::fs::read_to_string(entry?.path()) else {
                    continue;
                };
                let first = serde_json::Deserializer::from_str(&text)
                    .into_iter::<Value>()
                    .next();
                let Some(Ok(Value::Object(cached))) = first else {
                    continue;
                };
                missing = want
                    .iter()
                    .filter(|n| !cached.contains_key(n.as_str()))
                    .cloned()
                    .collect();
                if missing.is_empty() {
                    return Ok(());
                }
                if !said {
                    // In the test's output: how often a session would have missed nodes.
                    eprintln!("vc-scheduler's cache lacks nodes {missing:?} after its start");
                    said = true;
                }
            }
        }
        bail!("vc-scheduler's cache still lacks nodes {missing:?} after 30 s")
    }

    /// Starts `kubelet-dm` serving `kubelet.sock` in `socket_dir`. The
    /// returned handle stops it when dropped.
    pub async fn start_kubelet_dm(&self, socket_dir: &Path) -> Result<KubeletDm> {
        KubeletDm::start(socket_dir, &self.root.join("logs")).await
    }

    /// Like [`TestCluster::start_kubelet_dm`], and also serves the kubelet's PodResources API
    /// on `pod_resources_socket` (see [`KubeletDm::set_pod_resources`]).
    pub async fn start_kubelet_dm_with_pod_resources(
        &self,
        socket_dir: &Path,
        pod_resources_socket: &Path,
    ) -> Result<KubeletDm> {
        KubeletDm::start_with_pod_resources(
            socket_dir,
            pod_resources_socket,
            &self.root.join("logs"),
        )
        .await
    }

    /// Starts a harness node for Node `node` (create the Node object too): `kubelet-node`, the
    /// kubelet's device manager and topology manager (policy `none`) admitting the pods bound
    /// to `node`, serving `kubelet.sock` in `<root>/harness/<node>/device-plugins`
    /// ([`HarnessNode::plugin_dir`]). The handle stops it when dropped.
    pub async fn start_harness_node(&self, node: &str) -> Result<HarnessNode> {
        self.start_harness_node_with(node, &HarnessOptions::default())
            .await
    }

    /// [`TestCluster::start_harness_node`] with a topology-manager policy, scope and NUMA
    /// node count.
    pub async fn start_harness_node_with(
        &self,
        node: &str,
        options: &HarnessOptions,
    ) -> Result<HarnessNode> {
        let dir = self.root.join("harness").join(node).join("device-plugins");
        HarnessNode::start(
            node,
            &dir,
            &self.admin_kubeconfig,
            options,
            &self.root.join("logs"),
        )
        .await
    }

    /// Name and pid (= process group id) of every process started so far.
    pub fn pids(&self) -> Result<Vec<(String, u32)>> {
        let procs = self
            .procs
            .lock()
            .map_err(|_| anyhow!("process list poisoned"))?;
        Ok(procs
            .iter()
            .map(|p| (p.name().to_string(), p.pid()))
            .collect())
    }

    /// The last `n` log lines of a started process (by name).
    pub fn log_tail(&self, name: &str, n: usize) -> Result<String> {
        let procs = self
            .procs
            .lock()
            .map_err(|_| anyhow!("process list poisoned"))?;
        match procs.iter().find(|p| p.name() == name) {
            Some(p) => Ok(p.log_tail(n)),
            None => bail!("no process named {name}"),
        }
    }
}

async fn make_client(
    server: &str,
    ca: &Path,
    token: &str,
    user: Option<&Identity>,
) -> Result<Client> {
    let kc = Kubeconfig::from_yaml(&kubeconfig_yaml(server, ca, token, user))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn merge(obj: &mut serde_json::Map<String, Value>, key: &str, add: Value) {
    let slot = obj.entry(key).or_insert_with(|| json!({}));
    if let (Some(slot), Value::Object(add)) = (slot.as_object_mut(), add) {
        for (k, v) in add {
            slot.insert(k, v);
        }
    }
}

fn kubeconfig_yaml(server: &str, ca: &Path, token: &str, user: Option<&Identity>) -> String {
    let mut user_entry = json!({ "token": token });
    if let Some(who) = user {
        user_entry["as"] = json!(who.user);
        if !who.groups.is_empty() {
            user_entry["as-groups"] = json!(who.groups);
        }
        if !who.extra.is_empty() {
            user_entry["as-user-extra"] = json!(who.extra);
        }
    }
    let kc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": ca.display().to_string()}}],
        "users": [{"name": "e2e", "user": user_entry}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    });
    // JSON is YAML.
    kc.to_string()
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let mut procs = match self.procs.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        if std::thread::panicking() {
            for p in &procs {
                eprintln!(
                    "---- {} ({}) last log lines ----\n{}",
                    p.name(),
                    p.log_path().display(),
                    p.log_tail(30)
                );
            }
        }
        // Newest first: schedulers before the apiserver before etcd.
        while let Some(mut p) = procs.pop() {
            p.stop();
        }
        if let Some(dir) = self.dir.take()
            && std::env::var_os(ENV_KEEP).is_some()
        {
            eprintln!("{ENV_KEEP}: keeping {}", dir.keep().display());
        }
    }
}

/// Whether a Node's `Ready` condition is `True` (Volcano leaves the others out of its sessions).
fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_never_repeated_and_stay_out_of_the_ephemeral_range() {
        let (ephemeral_low, _) = ephemeral_ports();
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        if ephemeral_low > 12_000 {
            assert!(ports.iter().all(|&p| p < ephemeral_low), "{ports:?}");
        }
    }

    #[test]
    fn lanes_split_the_range_without_overlap() {
        assert_eq!(lane_of(10_000, 32_767, None).unwrap(), (10_000, 32_767));
        let first = lane_of(10_000, 32_767, Some("1/2")).unwrap();
        let second = lane_of(10_000, 32_767, Some("2/2")).unwrap();
        assert_eq!(first, (10_000, 21_383));
        assert_eq!(second, (21_384, 32_767));
        for bad in ["0/2", "3/2", "2", "a/b", "1/0"] {
            let err = lane_of(10_000, 32_767, Some(bad)).unwrap_err().to_string();
            assert!(err.contains(ENV_PORT_LANE), "{bad}: {err}");
        }
        assert!(lane_of(10, 12, Some("1/4")).is_err());
    }
}
