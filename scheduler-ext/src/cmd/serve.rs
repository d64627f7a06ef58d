//! `fumarole-scheduler-ext serve`: the extender APIs over the live cluster (API server
//! reflectors) or over a snapshot directory, until SIGINT / SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use scheduler_ext::cli::ScoringArgs;
use scheduler_ext::core::view::ClusterView;
use scheduler_ext::http::metrics::{self, Metrics};
use scheduler_ext::http::router::router;
use scheduler_ext::http::tls::{self, TlsFiles};
use scheduler_ext::live::{self, LiveOptions};
use scheduler_ext::service::{Service, Settings};
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
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8888")]
    listen: SocketAddr,
    /// PEM certificate (chain) for HTTPS; with --tls-key-file.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key for HTTPS; with --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// How long devices committed to a pod are held until the pod shows up bound with them.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    commit_ttl: Duration,
    /// How long a gpu-group-size unit's super-node reservation waits for the unit's next pod.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    reservation_ttl: Duration,
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
    #[command(flatten)]
    scoring: ScoringArgs,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let settings = Settings {
        scorer: args.scoring.gpu_aware()?,
        commit_ttl: args.commit_ttl,
        reservation_ttl: args.reservation_ttl,
    };
    let tls = match (args.tls_cert_file, args.tls_key_file) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let svc = match &args.cluster_snapshot {
            Some(dir) => {
                let view = snapshot::load(dir)?;
                for w in &view.warnings {
                    tracing::warn!("{w}");
                }
                tracing::info!(nodes = view.len(), snapshot = %dir.display(), "cluster view loaded");
                Arc::new(Service::with_settings(view, settings))
            }
            None => {
                let client = kube_client(args.kubeconfig.as_deref()).await?;
                let svc = Arc::new(Service::with_settings(ClusterView::default(), settings));
                let opts = LiveOptions {
                    debounce: args.view_debounce,
                    annotate_schedulers: args
                        .annotate_bound_pods_of
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect(),
                    publish_hypernodes: args.publish_hypernodes,
                };
                // The loop lives as long as the runtime; it ends with the process.
                drop(live::start(client, Arc::clone(&svc), opts).await?);
                svc
            }
        };
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        tracing::info!(address = %listener.local_addr()?, https = tls.is_some(), "serving");
        let app = metrics::instrument(router(svc), Arc::new(Metrics::new()));
        tls::serve(listener, app, tls, shutdown_signal()).await
    })
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

/// A client from `--kubeconfig`, else the usual inference (KUBECONFIG, ~/.kube/config,
/// in-cluster).
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
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
    kube::Client::try_from(config).context("building the API client")
}
