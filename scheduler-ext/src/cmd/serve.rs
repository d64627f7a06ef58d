//! `fumarole-scheduler-ext serve`: the extender APIs over the live cluster (API server
//! reflectors) or over a snapshot directory, until SIGINT / SIGTERM.
//!
//! Listeners: `--listen` for the schedulers (their verbs, each protocol guarded by its access
//! rule, `/healthz`, `/metrics`), `--ui-listen` (localhost by default) for `/ui`, and
//! `--webhook-listen` for the API server's admission webhook.
//! Verbs open to anyone are refused on any address but loopback unless
//! `--allow-unauthenticated` says so.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use scheduler_ext::cli::{self, CommitArgs, ReservationArgs, ScoringArgs, SuperPodArgs};
use scheduler_ext::controllers::dead_agents;
use scheduler_ext::controllers::leader::{self, LeaseConfig};
use scheduler_ext::core::view::ClusterView;
use scheduler_ext::http::access::{Rule, Token};
use scheduler_ext::http::metrics::{self, Metrics};
use scheduler_ext::http::router::{self, Options};
use scheduler_ext::http::server::{self, Limits, Tls, TlsFiles, TlsMetrics};
use scheduler_ext::live::{self, LiveOptions};
use scheduler_ext::service::Service;
use scheduler_ext::snapshot;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Build the cluster view from the YAML files in this directory instead of an API server
    /// (DeviceTopology, Numatopology, Node and Pod objects, as `kubectl get -o yaml` writes
    /// them). Without it the view comes from the API server (KUBECONFIG, ~/.kube/config or the
    /// in-cluster service account).
    #[arg(long)]
    cluster_snapshot: Option<PathBuf>,
    /// Kubeconfig file for the API server (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, conflicts_with = "cluster_snapshot")]
    kubeconfig: Option<PathBuf>,
    /// Address the schedulers call.
    #[arg(long, default_value = "0.0.0.0:8888")]
    listen: SocketAddr,
    /// Address of `/ui` (a page for people, off the schedulers' port); `off` for none. A busy
    /// address is logged and `/ui` is left out.
    #[arg(long, default_value = "127.0.0.1:8890")]
    ui_listen: String,
    /// Address of the admission webhook that keeps agents to their own node
    /// (`/admission/agent-writes`, HTTPS with the same certificate when TLS is on); off when
    /// not given.
    #[arg(long)]
    webhook_listen: Option<SocketAddr>,
    /// PEM certificate (chain) for HTTPS; with --tls-key-file. Reloaded when it changes.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key for HTTPS; with --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// CA bundle for client certificates (kube-scheduler's extender `tlsConfig.certFile`):
    /// with it, kube-scheduler's verbs need a client certificate this CA signed. Needs TLS.
    #[arg(long, requires = "tls_cert_file")]
    client_ca_file: Option<PathBuf>,
    /// File holding the token Volcano's verbs need (as `https://fumarole:<token>@host/volcano`
    /// in `extender.urlPrefix`, or `Authorization: Bearer <token>`); a client certificate
    /// signed by --client-ca-file is accepted too.
    #[arg(long)]
    volcano_token_file: Option<PathBuf>,
    /// Serve verbs that need no credentials on an address other than loopback.
    #[arg(long)]
    allow_unauthenticated: bool,
    /// How often the TLS files are checked for changes.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    tls_reload_interval: Duration,
    /// Most connections open at once on each listener.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Most connections open at once from one IP address on each listener, so that one
    /// client cannot take every slot from the schedulers.
    #[arg(long, default_value_t = 128)]
    max_connections_per_peer: usize,
    /// Longest a request may take.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
    /// Coalesce cluster changes for this long before rebuilding the view.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    view_debounce: Duration,
    /// Schedulers whose bound accelerator pods get `fumarole.dev/devices` written after the fact
    /// (those that bind without calling bind / allocateFunc); comma-separated, empty for none.
    #[arg(long, value_delimiter = ',', default_value = "volcano")]
    annotate_bound_pods_of: Vec<String>,
    /// Publish Volcano HyperNode objects (topology.volcano.sh/v1alpha1) for the super-nodes.
    #[arg(long)]
    publish_hypernodes: bool,
    /// How long a watch of the live view may fail before `/readyz` fails.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    max_view_staleness: Duration,
    /// Remove the `volcano.sh/offline-job-evicting` taint and the `kubernetes.io/batch-*`
    /// resources from nodes whose fumarole-agent heartbeat Lease has expired (the leader
    /// does; live mode).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    clean_up_dead_agents: bool,
    /// Namespace of the agents' heartbeat Leases (default: $POD_NAMESPACE, else kube-system).
    #[arg(long)]
    agent_heartbeat_namespace: Option<String>,
    #[command(flatten)]
    election: ElectionArgs,
    #[command(flatten)]
    scoring: ScoringArgs,
    #[command(flatten)]
    super_pods: SuperPodArgs,
    #[command(flatten)]
    commit: CommitArgs,
    #[command(flatten)]
    reservations: ReservationArgs,
}

/// Leader election among replicas (kube-scheduler's flag names and defaults).
#[derive(clap::Args)]
struct ElectionArgs {
    /// Elect a leader over a Lease before handing out devices (live mode); only the leader
    /// commits and is ready. `--leader-elect=false` for a single replica that must never wait.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// The Lease's name.
    #[arg(long, default_value = "fumarole-scheduler-ext")]
    leader_elect_resource_name: String,
    /// The Lease's namespace (default: $POD_NAMESPACE, else kube-system).
    #[arg(long)]
    leader_elect_resource_namespace: Option<String>,
    /// This replica's identity, unique among replicas (default: $POD_NAME, else the host name
    /// and process id).
    #[arg(long)]
    leader_elect_identity: Option<String>,
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    leader_elect_lease_duration: Duration,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    leader_elect_renew_deadline: Duration,
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    leader_elect_retry_period: Duration,
}

impl ElectionArgs {
    /// The Lease to elect over, `None` when election is off.
    fn config(&self) -> Result<Option<LeaseConfig>> {
        if !self.leader_elect {
            return Ok(None);
        }
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let identity = match (&self.leader_elect_identity, env("POD_NAME")) {
            (Some(id), _) => id.clone(),
            (None, Some(pod)) => pod,
            (None, None) => format!(
                "{}_{}",
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "localhost".into()),
                std::process::id()
            ),
        };
        let config = LeaseConfig {
            name: self.leader_elect_resource_name.clone(),
            namespace: self
                .leader_elect_resource_namespace
                .clone()
                .or_else(|| env("POD_NAMESPACE"))
                .unwrap_or_else(|| "kube-system".into()),
            identity,
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        config.validate().map_err(anyhow::Error::msg)?;
        Ok(Some(config))
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    let settings = cli::settings(&[
        &args.scoring,
        &args.super_pods,
        &args.commit,
        &args.reservations,
    ])?;
    let tls = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => Some(Tls::load(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.client_ca_file.clone(),
        })?),
        _ => None,
    };
    let options = access_options(&args)?;
    let ui_listen: Option<SocketAddr> = match args.ui_listen.as_str() {
        "" | "off" => None,
        a => Some(
            a.parse()
                .with_context(|| format!("--ui-listen {a:?} is not an address or off"))?,
        ),
    };
    let limits = Limits {
        max_connections: args.max_connections,
        max_connections_per_peer: args.max_connections_per_peer,
        ..Limits::default()
    };
    let election = match args.cluster_snapshot {
        Some(_) => None,
        None => args.election.config()?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let mut elected = None;
        let builds = live::ViewBuilds::default();
        let svc = match &args.cluster_snapshot {
            Some(dir) => {
                let view = snapshot::load(dir)?;
                for w in view.warnings() {
                    tracing::warn!("{w}");
                }
                tracing::info!(nodes = view.len(), snapshot = %dir.display(), "cluster view loaded");
                Arc::new(Service::with_settings(view, settings))
            }
            None => {
                let config = kube_config(args.kubeconfig.as_deref()).await?;
                let client =
                    kube::Client::try_from(config.clone()).context("building the API client")?;
                let svc = Arc::new(Service::with_settings(ClusterView::default(), settings));
                let mut write_client = None;
                if let Some(lease) = &election {
                    // A commit's writes must land before another replica may lead.
                    let mut short = config;
                    let budget = Some(lease.write_budget());
                    (short.read_timeout, short.write_timeout, short.connect_timeout) =
                        (budget, budget, budget);
                    write_client =
                        Some(kube::Client::try_from(short).context("building the API client")?);
                    let leadership = leader::spawn(client.clone(), lease.clone());
                    svc.set_leadership(Arc::clone(&leadership));
                    tracing::info!(identity = %lease.identity, lease = %format!("{}/{}", lease.namespace, lease.name), "leader election on");
                    elected = Some((client.clone(), lease.clone(), leadership));
                }
                let opts = LiveOptions {
                    debounce: args.view_debounce,
                    annotate_schedulers: args
                        .annotate_bound_pods_of
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect(),
                    publish_hypernodes: args.publish_hypernodes,
                    max_staleness: args.max_view_staleness,
                    write_client,
                    own_pod: own_pod(),
                    builds: builds.clone(),
                    device_views: Default::default(),
                };
                if args.clean_up_dead_agents {
                    let namespace = args
                        .agent_heartbeat_namespace
                        .clone()
                        .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|v| !v.is_empty()))
                        .unwrap_or_else(|| "kube-system".into());
                    tracing::info!(%namespace, "removing what dead agents leave on their nodes");
                    tokio::spawn(dead_agents::run(client.clone(), namespace, Arc::clone(&svc)));
                }
                // The loop lives as long as the runtime; it ends with the process.
                drop(live::start(client, Arc::clone(&svc), opts).await?);
                svc
            }
        };
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let mut metrics = Metrics::new();
        builds.register(metrics.registry_mut());
        if let Some(tls) = &tls {
            let m = TlsMetrics::register(metrics.registry_mut());
            tokio::spawn(Arc::clone(tls).watch(args.tls_reload_interval, m));
        }
        if let Some(addr) = ui_listen {
            start_ui(addr, Arc::clone(&svc), limits).await;
        }
        if let Some(addr) = args.webhook_listen {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--webhook-listen {addr}"))?;
            tracing::info!(%addr, "serving the admission webhook");
            let app = router::webhook_router(Arc::clone(&svc));
            let tls = tls.clone();
            tokio::spawn(async move {
                if let Err(e) =
                    server::serve(listener, app, tls, limits, std::future::pending()).await
                {
                    tracing::error!(error = %format!("{e:#}"), "the admission webhook stopped");
                }
            });
        }
        tracing::info!(address = %listener.local_addr()?, https = tls.is_some(),
            kube_scheduler_open = options.kube.is_open(), volcano_open = options.volcano.is_open(), "serving");
        let app = metrics::instrument(router::router_with(svc, &options), Arc::new(metrics));
        let served = server::serve(listener, app, tls, limits, shutdown_signal()).await;
        // Hand over at once rather than after the lease expires.
        if let Some((client, lease, leadership)) = elected {
            leader::release(client, &lease, &leadership).await;
        }
        served
    })
}

/// Who may call the verbs, from the flags; refuses open verbs on a non-loopback address of a
/// live service unless `--allow-unauthenticated`.
fn access_options(args: &ServeArgs) -> Result<Options> {
    let token = match &args.volcano_token_file {
        Some(path) => {
            let secret = std::fs::read_to_string(path)
                .with_context(|| format!("reading --volcano-token-file {}", path.display()))?;
            if secret.trim().is_empty() {
                bail!("--volcano-token-file {} is empty", path.display());
            }
            Some(Token::new(&secret))
        }
        None => None,
    };
    let client_cert = args.client_ca_file.is_some();
    let options = Options {
        kube: Rule {
            client_cert,
            token: None,
        },
        volcano: Rule { client_cert, token },
        request_timeout: args.request_timeout,
    };
    let open: Vec<&str> = [
        ("kube-scheduler", options.kube.is_open()),
        ("Volcano", options.volcano.is_open()),
    ]
    .into_iter()
    .filter_map(|(name, open)| open.then_some(name))
    .collect();
    // A snapshot is read only: its verbs write nothing (bind and allocateFunc need the API
    // server), so only a live service must not serve open verbs beyond loopback.
    let live = args.cluster_snapshot.is_none();
    if !open.is_empty() {
        if live && !args.listen.ip().is_loopback() && !args.allow_unauthenticated {
            bail!(
                "the {} verbs would be open to anyone who reaches {}: give --client-ca-file (kube-scheduler) and --volcano-token-file (Volcano), or --allow-unauthenticated",
                open.join(" and "),
                args.listen
            );
        }
        tracing::warn!(verbs = ?open, "these verbs need no credentials");
    }
    Ok(options)
}

/// Serves `/ui` on `addr` in the background; an address that cannot be bound is logged and
/// `/ui` left out (it is not what the schedulers need).
async fn start_ui(addr: SocketAddr, svc: Arc<Service>, limits: Limits) {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => {
            tracing::info!(%addr, "serving /ui");
            let app = router::ui_router(svc);
            tokio::spawn(async move {
                if let Err(e) =
                    server::serve(listener, app, None, limits, std::future::pending()).await
                {
                    tracing::warn!(error = %format!("{e:#}"), "/ui stopped");
                }
            });
        }
        Err(e) => tracing::warn!(%addr, error = %e, "cannot serve /ui there; going on without it"),
    }
}

/// Resolves on SIGINT or SIGTERM (what the kubelet sends on pod deletion).
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

/// This replica's Pod, from the downward API's `POD_NAMESPACE` and `POD_NAME`.
fn own_pod() -> Option<(String, String)> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    Some((env("POD_NAMESPACE")?, env("POD_NAME")?))
}

/// The client configuration from `--kubeconfig`, else the usual inference (KUBECONFIG,
/// ~/.kube/config, in-cluster).
async fn kube_config(kubeconfig: Option<&std::path::Path>) -> Result<kube::Config> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding the API server (KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    // No retries inside the client: kube's retry 429/503/504 up to 15 times from 5 ms apart,
    // a burst per call, and would stretch a commit's writes past the leader's fence. The
    // watches back off on their own (jittered) and a failed write fails the verb.
    config.default_retry = false;
    Ok(config)
}
